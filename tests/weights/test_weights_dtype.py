"""bfloat16 weights on the native CPU engine (``weights_dtype="bfloat16"``) against float32 weights.

The engine stores the transformers' linear layers and the large frame-rate convolutions in bfloat16 and
computes in float32; the quantizer keeps float32. Bounds (docs/weights-dtype.md's table, "bfloat16
weights"): codebook 0 at least 99% equal to float32's codes, all codebooks at least 95%,
and the bf16 codec's decoding of float32's codes at least 30 dB SNR against float32's.
Measured (AVX-512 BF16 and AVX2 alike): fixture codec 100% / 100% / 61.9 dB, its bf16
checkpoint 100% / 100% / 44.9 dB; real-size seeded weights, 32 codebooks, 20 s: see that
page. A code can flip where two centroids are nearly tied, and a flip in one codebook
changes the residual the next ones see, hence agreement, not equality.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import mimi_py
from support.paths import CODEC_DIR
from support.reference import assert_close, assert_same

CFG = mimi_py.CodecConfig(**json.loads((CODEC_DIR / "mimi_small_candle_config.json").read_text()))
IO = dict(np.load(CODEC_DIR / "mimi_small_io.npz"))
# minimum fraction of codebook 0's codes, of all codes, and decoded SNR in dB
MIN_CODEBOOK0, MIN_ALL, MIN_SNR_DB = 0.99, 0.95, 30.0


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    ref = ref.astype(np.float64)
    err = float(((ref - x) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(float((ref**2).sum()) / err)


def agreement(f32: mimi_py.MimiCodec, bf16: mimi_py.MimiCodec, pcm: np.ndarray, what: str) -> None:
    codes, codes16 = f32.encode(pcm), bf16.encode(pcm)
    equal = codes == codes16
    snr = snr_db(f32.decode(codes), bf16.decode(codes))
    cb0, every = float(equal[:, 0].mean()), float(equal.mean())
    print(f"{what}: codebook 0 {cb0:.1%}, all {every:.1%} equal to float32's; decoded SNR {snr:.1f} dB")
    assert cb0 >= MIN_CODEBOOK0, f"{what}: codebook 0 {cb0:.1%} equal, need {MIN_CODEBOOK0:.0%}"
    assert every >= MIN_ALL, f"{what}: {every:.1%} of codes equal, need {MIN_ALL:.0%}"
    assert snr >= MIN_SNR_DB, f"{what}: decoded SNR {snr:.1f} dB, need {MIN_SNR_DB} dB"


def test_fixture_codec_agrees_with_float32():
    f = CODEC_DIR / "mimi_small.safetensors"
    f32 = mimi_py.MimiCodec(f, config=CFG)
    bf16 = mimi_py.MimiCodec(f, config=CFG, weights_dtype="bfloat16")
    assert (f32.weights_dtype, bf16.weights_dtype) == ("float32", "bfloat16")
    assert bf16.dtype == "float32"
    agreement(f32, bf16, IO["waveform"], "fixture codec")
    # the bf16 checkpoint, read as stored
    stored = mimi_py.MimiCodec(
        CODEC_DIR / "mimi_small_moshi_bf16.safetensors", config=CFG, weights_dtype="bfloat16"
    )
    agreement(f32, stored, IO["waveform"], "fixture codec, bf16 checkpoint")


def test_real_size_seeded_codec_agrees_with_float32():
    sr = 24000
    t = np.arange(20 * sr) / sr  # 250 frames: one flipped code is 0.4% of a codebook
    rng = np.random.default_rng(1)
    tone = np.sin(2 * np.pi * (200 + 150 * np.sin(2 * np.pi * 0.3 * t)) * t) * (
        0.5 + 0.5 * np.sin(4 * np.pi * t)
    )
    pcm = (0.3 * tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)[None, None]
    f32 = mimi_py.MimiCodec(seed=0, num_codebooks=32)
    bf16 = mimi_py.MimiCodec(seed=0, num_codebooks=32, weights_dtype="bfloat16")
    agreement(f32, bf16, pcm, "real-size seeded codec, 32 codebooks, 20 s")


def test_bf16_rows_are_independent_streams():
    """12 rows (24 transformer rows a step: three register groups) against each row alone."""
    f = CODEC_DIR / "mimi_small.safetensors"
    batch, frames = 12, 2
    batched = mimi_py.MimiCodec(f, config=CFG, weights_dtype="bfloat16")
    alone = mimi_py.MimiCodec(f, config=CFG, weights_dtype="bfloat16")
    rng = np.random.default_rng(3)
    pcm = (rng.standard_normal((batch, 1, frames * batched.frame_size)) * 0.1).astype(np.float32)
    active = np.ones(batch, dtype=bool)
    active[[2, 7]] = False
    codes = batched.encode_step(pcm, active=active)
    audio = batched.decode_step(codes, active=active)
    for r in range(batch):
        if not active[r]:
            assert not codes[r].any() and not audio[r].any()
            continue
        alone.reset_state()
        ref = alone.encode_step(pcm[r : r + 1])
        assert_same(codes[r : r + 1], ref)
        # Decoded rows match to rounding, as with float32 weights (tests/streaming/test_batched.py).
        assert_close(audio[r : r + 1], alone.decode_step(ref), atol=1e-5, rtol=1e-5)


def test_bf16_transformer_is_close_to_float32():
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=2, dim_feedforward=128, context=16)
    f32 = mimi_py.StreamingTransformer(cfg, seed=5)
    bf16 = mimi_py.StreamingTransformer(cfg, seed=5, weights_dtype="bfloat16")
    assert bf16.weights_dtype == "bfloat16" and f32.weights_dtype == "float32"
    x = np.random.default_rng(4).standard_normal((3, 20, 64)).astype(np.float32)
    y, y16 = f32.forward(x), bf16.forward(x)
    # bf16 keeps 8 significant bits of each weight: a relative error of a few 1e-3
    assert snr_db(y, y16) >= 40.0
    assert bf16.state_dict()["layers.0.self_attn.q_proj.weight"].dtype == np.float32


@pytest.mark.parametrize("cls", [mimi_py.MimiCodec, mimi_py.StreamingTransformer])
def test_bad_weights_dtypes_are_config_errors(cls):
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=1, dim_feedforward=128, context=16)
    make = (
        (lambda **kw: cls(seed=0, **kw))
        if cls is mimi_py.MimiCodec
        else (lambda **kw: cls(cfg, seed=0, **kw))
    )
    with pytest.raises(mimi_py.ConfigError, match='"float32" or "bfloat16".*int8'):
        make(weights_dtype="int8")
    # bf16 storage is the native engine's; candle's half-precision engine is dtype=
    with pytest.raises(mimi_py.ConfigError, match='dtype="bfloat16" instead'):
        make(weights_dtype="bfloat16", dtype="bfloat16")


def test_weights_nbytes_counts_the_weights_as_stored():
    cfg = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=2, dim_feedforward=128, context=16)
    f32 = mimi_py.StreamingTransformer(cfg, seed=5)
    bf16 = mimi_py.StreamingTransformer(cfg, seed=5, weights_dtype="bfloat16")
    tensors = f32.state_dict()
    assert f32.weights_nbytes == sum(a.nbytes for a in tensors.values())
    # bf16 halves the matrices only (norms, biases and layer scales stay float32)
    matrices = sum(a.nbytes for a in tensors.values() if a.ndim == 2)
    assert bf16.weights_nbytes == f32.weights_nbytes - matrices // 2

    f = CODEC_DIR / "mimi_small.safetensors"
    codec = mimi_py.MimiCodec(f, config=CFG)
    # at least the transformers and every codebook of the checkpoint's four, all float32
    books = CFG.quantizer_n_q * CFG.quantizer_bins * CFG.quantizer_dim * 4
    assert codec.weights_nbytes > 2 * f32.weights_nbytes // 2 + books
    real = mimi_py.MimiCodec(seed=0)
    real16 = mimi_py.MimiCodec(seed=0, weights_dtype="bfloat16")
    # the real codec: 2 transformers of 8 layers (d 512, ff 2048), 26 M convolution weights
    # (the strided ones padded to whole phases), its codebooks of 2048 x 256 (and their norms)
    transformer_params = 2 * 8 * (4 * 512 * 512 + 2 * 512 * 2048)
    books = real.num_codebooks * 2048 * 257
    least = 4 * (transformer_params + 26_000_000 + books)
    assert least < real.weights_nbytes < 1.1 * least
    assert 0.5 * real.weights_nbytes < real16.weights_nbytes < 0.6 * real.weights_nbytes
