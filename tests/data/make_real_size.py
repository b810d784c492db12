"""Write codec/mimi_real_size.json and codec/mimi_real_size_io.npz: Kyutai's moshi 0.2.13 Mimi
at its real size (32 codebooks), float32 on the CPU, on seeded random weights.

    /path/to/venv-with-moshi/bin/python tests/data/make_real_size.py

Needs numpy, torch, safetensors, einops and ``moshi==0.2.13`` (``pip install --no-deps
moshi==0.2.13`` is enough for the Mimi parts). No download: the weights are the benches' random
weights of the real architecture (tests/support/real_size.py), regenerated from their seed, hashed,
written in Kyutai's checkpoint layout to a temporary file and loaded by moshi's own
``loaders.get_mimi`` (strict). The inputs are made here from their seeds and stored.

moshi computes: offline ``encode`` (codes), ``encode_to_latent(quantize=False)`` (latents),
``decode_latent`` and ``decode`` of the codes (quantized, audio); and, as checks recorded in the
json, a streaming encode of 1920 samples per call and a streaming decode of one frame per call.
Reruns give the same files up to torch's float32 summation order on another machine.
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent / "scripts")]
from safetensors_file import write_safetensors  # noqa: E402
from support.real_size import REFERENCE_JSON, REFERENCE_NPZ, moshi_weights  # noqa: E402
from support.reference import weights_digest  # noqa: E402

SAMPLE_RATE = 24_000
FRAME_SIZE = 1920
WEIGHTS_SEED = 0  # benches/common.py's bench_weights(small=False)
SPEECH_SEED, NOISE_SEED = 5101, 5102
NUM_SAMPLES = 84_000  # 3.5 s: 43.75 frames, so the last frame is padded
NUM_CODEBOOKS = 32

# Bounds of mimi_py against these arrays, |actual - expected| <= atol + rtol * |expected|: about ten
# times the largest error measured on the CPU, float32, in both checkpoint layouts, offline and
# streaming (latents 2.6e-6, quantized 5.7e-6, audio 2.3e-6; tests/codec/test_real_size.py prints
# the errors it measures). README.md relates them to the arrays' magnitudes.
TOLERANCE = {
    "codes": "exact",
    "latents": {"atol": 3e-5, "rtol": 0.0},
    "quantized": {"atol": 6e-5, "rtol": 0.0},
    "audio": {"atol": 3e-5, "rtol": 0.0},
}


def speech_like(n: int, seed: int) -> np.ndarray:
    """A voiced, speech-like signal: up to 60 harmonics of a gliding pitch (95 to 205 Hz, with
    vibrato), each weighted by three moving formant peaks, under a syllable envelope (the positive
    lobes of a 2.1 Hz sine raised by a random offset: two syllables a second, pauses between),
    plus a little breath noise; RMS 0.1, float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SAMPLE_RATE
    f0 = 150 + 45 * np.sin(2 * np.pi * 0.6 * t + rng.uniform(0, 6.3)) + 10 * np.sin(2 * np.pi * 5.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    formants = [  # (centre Hz, sway Hz, sway rate Hz, width Hz, gain)
        (500, 200, 1.9, 90, 1.0),
        (1500, 600, 1.3, 140, 0.5),
        (2600, 300, 0.8, 220, 0.25),
    ]
    voiced = np.zeros(n)
    for k in range(1, 61):
        fk = k * f0
        gain = sum(
            g * np.exp(-0.5 * ((fk - (c + s * np.sin(2 * np.pi * r * t))) / w) ** 2)
            for c, s, r, w, g in formants
        )
        voiced += (fk < 0.45 * SAMPLE_RATE) * gain * np.sin(k * phase + rng.uniform(0, 6.3)) / np.sqrt(k)
    syllables = np.clip(np.sin(2 * np.pi * 2.1 * t) * 1.4 + 0.2 * rng.standard_normal(), 0, 1) ** 2
    breath = 0.02 * rng.standard_normal(n)
    x = voiced * syllables + breath
    return (0.1 * x / x.std()).astype(np.float32)


def white_noise(n: int, seed: int) -> np.ndarray:
    """White Gaussian noise of RMS 0.1, float32."""
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def load_moshi(weights: dict[str, np.ndarray]):
    """moshi's ``get_mimi`` on ``weights`` written in the moshi layout (strict load), 32
    codebooks, and whether its state dict then holds exactly those values."""
    from moshi.models import loaders

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mimi_real_size_moshi.safetensors"
        write_safetensors(path, weights)
        model = loaders.get_mimi(str(path), device="cpu", num_codebooks=NUM_CODEBOOKS)
    model.eval()
    # moshi's attention keeps the checkpoint's in_proj_weight / out_proj.weight as in_projs.0 / out_projs.0.
    renames = {".in_projs.0.weight": ".in_proj_weight", ".out_projs.0.weight": ".out_proj.weight"}
    state = {}
    for name, value in model.state_dict().items():
        for old, new in renames.items():
            name = name.replace(old, new)
        state[name] = value.numpy()
    same = set(state) == set(weights) and all(np.array_equal(state[k], weights[k]) for k in weights)
    return model, same


def offline(model, waveform: np.ndarray) -> dict[str, np.ndarray]:
    """moshi's offline results for ``waveform`` (B, 1, T)."""
    x = torch.from_numpy(waveform)
    codes = model.encode(x)
    return {
        "waveform": waveform,
        "codes": codes.numpy(),
        "latents": model.encode_to_latent(x, quantize=False).numpy(),
        "quantized": model.decode_latent(codes).numpy(),
        "audio": model.decode(codes).numpy(),
    }


def streaming(model, waveform: np.ndarray, codes: np.ndarray) -> dict[str, np.ndarray]:
    """moshi's streaming encode (the zero-padded waveform, 1920 samples per call) and streaming
    decode (one frame of ``codes`` per call)."""
    b, _, n = waveform.shape
    frames = -(-n // FRAME_SIZE)
    padded = np.zeros((b, 1, frames * FRAME_SIZE), np.float32)
    padded[..., :n] = waveform
    with model.streaming(b):
        enc = [
            model.encode(torch.from_numpy(padded[..., i * FRAME_SIZE : (i + 1) * FRAME_SIZE]))
            for i in range(frames)
        ]
    c = torch.from_numpy(codes.astype(np.int64))
    with model.streaming(b):
        dec = [model.decode(c[..., i : i + 1]) for i in range(frames)]
    return {"codes": torch.cat(enc, -1).numpy(), "audio": torch.cat(dec, -1).numpy()}


def code_margins(model, latents: np.ndarray) -> dict[str, dict[str, float]]:
    """For each quantizer, the smallest gap between the nearest and the second nearest centroid
    over every frame and codebook, in Euclidean distance (``absolute``: d2 - d1) and relative to
    the nearest (``relative``: (d2 - d1) / d1): how far the latents may move before a code flips."""
    out = {}
    x = torch.from_numpy(latents)
    for name, rvq in (("semantic", model.quantizer.rvq_first), ("acoustic", model.quantizer.rvq_rest)):
        residual = rvq.input_proj(x).transpose(1, 2).reshape(-1, rvq.input_proj.out_channels).double()
        gaps, relative = [], []
        for layer in rvq.vq.layers[: rvq.n_q]:
            e = layer._codebook.embedding.double()
            d = torch.cdist(residual[None], e[None])[0]
            two = d.topk(2, largest=False).values
            gaps.append(two[:, 1] - two[:, 0])
            relative.append(gaps[-1] / two[:, 0])
            residual = residual - e[d.argmin(-1)]
        out[name] = {
            "absolute": float(f"{float(torch.cat(gaps).min()):.3g}"),
            "relative": float(f"{float(torch.cat(relative).min()):.3g}"),
        }
    return out


def checks(model, arrays: dict, stream: dict, loaded_exactly: bool) -> dict:
    """What the json records about moshi's own results."""
    n = arrays["waveform"].shape[-1]
    return {
        "moshi_strict_load_state_dict_equals_weights": loaded_exactly,
        "moshi_streaming_encode_1920_samples_per_call_equals_codes": bool(
            np.array_equal(stream["codes"], arrays["codes"])
        ),
        "moshi_streaming_decode_one_frame_per_call_max_abs_vs_offline": float(
            np.abs(stream["audio"] - arrays["audio"]).max()
        ),
        "min_code_margin": code_margins(model, arrays["latents"]),
        "frames": int(arrays["codes"].shape[-1]),
        "padded_samples": int(arrays["codes"].shape[-1] * FRAME_SIZE - n),
        "latents_std": float(arrays["latents"].std()),
        "latents_max_abs": float(np.abs(arrays["latents"]).max()),
        "quantized_max_abs": float(np.abs(arrays["quantized"]).max()),
        "audio_std": float(arrays["audio"].std()),
        "audio_max_abs": float(np.abs(arrays["audio"]).max()),
        "codes_distinct_per_codebook_min": int(
            min(len(np.unique(arrays["codes"][:, k])) for k in range(NUM_CODEBOOKS))
        ),
    }


def metadata(weights: dict, arrays: dict, checks_: dict) -> dict:
    """The json: where everything came from, the shapes, the checks and the tolerances."""
    return {
        "name": "mimi_real_size",
        "description": "The real Mimi (32 codebooks) of Kyutai's moshi 0.2.13 on seeded random weights, "
        "float32 on the CPU: codes, latents, quantized latents and decoded audio of two 3.5 s inputs.",
        "script": "tests/data/make_real_size.py",
        "reference": {
            "implementation": "moshi.models.loaders.get_mimi (MimiModel), eval, torch.no_grad",
            "moshi": version("moshi"),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "device": "cpu",
            "dtype": "float32",
        },
        "weights": {
            "layout": "moshi (Kyutai's checkpoint: in_proj_weight = [q; k; v], q/k rows interleaved)",
            "manifest": "kyutai_moshi_mimi_manifest.json",
            "num_tensors": len(weights),
            "seed": WEIGHTS_SEED,
            "recipe": "benches/common.py random_tensor over the manifest's shapes in sorted name order, "
            "one np.random.default_rng(seed): N(0, 1/fan_in) weights, zero biases, unit norms, "
            "layer scale 0.01, N(0, 1) codebooks, cluster usage 1 (support.real_size.moshi_weights)",
            "sha256": weights_digest(weights),
            "sha256_rule": "support.reference.weights_digest: name, repr(shape), little-endian float32 bytes, "
            "in sorted name order",
        },
        "inputs": {
            "row 0": f"speech_like(84000, seed={SPEECH_SEED}): harmonics of a gliding pitch shaped by three "
            "moving formants under a syllable envelope, plus breath noise; RMS 0.1",
            "row 1": f"white_noise(84000, seed={NOISE_SEED}): N(0, 0.1^2)",
        },
        "padding": "moshi's offline encode pads the waveform with zeros at the end to a whole number of "
        "frames (pad_for_conv1d(x, 1920, 1920)): 84000 samples -> 44 frames (84480 samples, 480 zeros); "
        "the streaming check feeds the same zero-padded waveform, 1920 samples per call. mimi_py given "
        "that zero-padded waveform computes what moshi does on every frame. Given the 84000 samples, "
        "mimi_py pads each convolution's input as transformers' MimiModel does (the small codec's "
        "fixture), so its last, partial frame is not moshi's (latents up to 0.08 apart there); the "
        "frames before it are",
        "arrays": {
            "waveform": "(2, 1, 84000) float32, the input (row 0 speech-like, row 1 white noise)",
            "codes": "(2, 32, 44) int64, MimiModel.encode; codebook 0 semantic, 1..31 acoustic",
            "latents": "(2, 512, 44) float32, encode_to_latent(quantize=False): SEANet, encoder transformer, "
            "downsample (mimi_py's encode_latents)",
            "quantized": "(2, 512, 44) float32, decode_latent(codes): the quantizer's output (mimi_py's "
            "decode_latents)",
            "audio": "(2, 1, 84480) float32, decode(codes)",
        },
        "shapes": {k: list(v.shape) for k, v in arrays.items()},
        "checks": checks_,
        "tolerance": TOLERANCE,
        "tolerance_reason": "atol about ten times the largest error of mimi_py's float32 CPU engine "
        "measured when the bounds were set (latents 2.6e-6, quantized 5.7e-6, audio 2.3e-6, in both "
        "checkpoint layouts, offline and streaming), i.e. 3e-5 of the latents' and audio's largest "
        "values (1.02, 1.26) and 6e-6 of the quantized latents' (10.9); rtol 0. The test device's "
        "scale applies on a GPU (tests/support/ondevice.py)",
    }


def main() -> None:
    """Run moshi and write the two files."""
    torch.set_grad_enabled(False)
    weights = moshi_weights(WEIGHTS_SEED)
    model, loaded_exactly = load_moshi(weights)
    waveform = np.stack([speech_like(NUM_SAMPLES, SPEECH_SEED), white_noise(NUM_SAMPLES, NOISE_SEED)])[
        :, None
    ]
    arrays = offline(model, waveform)
    stream = streaming(model, waveform, arrays["codes"])
    meta = metadata(weights, arrays, checks(model, arrays, stream, loaded_exactly))
    np.savez_compressed(REFERENCE_NPZ, **arrays)
    REFERENCE_JSON.write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta["checks"], indent=1))
    print(f"{REFERENCE_NPZ.name}: {REFERENCE_NPZ.stat().st_size} bytes")


if __name__ == "__main__":
    main()
