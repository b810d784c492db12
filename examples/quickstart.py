"""Quickstart: the real-size Mimi transformer streaming a few seconds of frames.

Runs with no downloads: the weights are seeded random weights of the real architecture
(d_model 512, 8 heads, 8 layers, context 250). Pass a checkpoint path to use real weights,
e.g. StreamingTransformer(cfg, "model.safetensors", prefix="encoder_transformer.",
qk_layout="hf") for kyutai/mimi's Hugging Face checkpoint.
"""

from __future__ import annotations

import time

import numpy as np

import mimi_py


def main() -> None:
    cfg = mimi_py.TransformerConfig.mimi()
    model = mimi_py.StreamingTransformer(cfg, seed=0)
    print(model)

    # Mimi's transformers run at 25 Hz (encoder side, before downsampling to 12.5 Hz):
    # 4 seconds of audio is 100 frames of d_model features.
    rng = np.random.default_rng(0)
    frames = rng.standard_normal((1, 100, cfg.d_model)).astype(np.float32)

    latencies = []
    outputs = []
    for i in range(frames.shape[1]):
        t0 = time.perf_counter()
        outputs.append(model.step(frames[:, i : i + 1]))
        latencies.append((time.perf_counter() - t0) * 1e3)
    lat = np.array(latencies[5:])  # skip warm-up
    print(
        f"streamed {model.position} steps: median {np.median(lat):.2f} ms/step, "
        f"p99 {np.percentile(lat, 99):.2f} ms/step"
    )

    # The stream is chunk-invariant: one call over everything gives the same answer.
    fresh = mimi_py.StreamingTransformer(cfg, seed=0)
    full = fresh.forward(frames)
    err = np.abs(np.concatenate(outputs, axis=1) - full).max()
    print(f"step-by-step vs one call: max abs difference {err:.2e}")

    # Branch the stream: the fork continues exactly like the original would.
    fork = model.clone()
    nxt = rng.standard_normal((1, 1, cfg.d_model)).astype(np.float32)
    print(
        "fork == original on the same continuation:", np.allclose(fork.step(nxt), model.step(nxt), atol=1e-6)
    )

    # Typed errors instead of crashes.
    shallow = mimi_py.StreamingTransformer(cfg.replace(num_layers=4), seed=0)
    try:
        shallow.copy_state(model)
    except mimi_py.DepthMismatchError as e:
        print(f"DepthMismatchError: {e}")
    try:
        mimi_py.StreamingTransformer(cfg.replace(kv_repeat=2))
    except mimi_py.UnsupportedKvRepeatError as e:
        print(f"UnsupportedKvRepeatError: {e}")
    try:
        model.step(np.zeros((1, 1, 256), np.float32))
    except mimi_py.ShapeError as e:
        print(f"ShapeError: {e}")


if __name__ == "__main__":
    main()
