"""The codec in half precision (float16, bfloat16) on the test device (MIMI_TEST_DEVICE).

Half precision runs candle's modules in that dtype on every device: the SEANet, the
transformers and the (de)convolutions compute in half precision, and the quantizer keeps
float32 (its codes are an argmin over nearby centroids, and latents are cast to float32 on
the way in). Outputs are float32 arrays.

Bounds, measured against the float32 reference (the fixtures' codes and audio, computed by
PyTorch, which our float32 CPU engine matches exactly):

* fixture codec (4 codebooks, 19 frames): float16 gave 100% equal codes and 57.9 dB audio SNR,
  bfloat16 94.7% and 39.6 dB. The tests ask float16 >= 95% and 45 dB, bfloat16 >= 85% and 30 dB.
* real-size seeded weights (8 codebooks, 1 s of noise): float16 gave 100% and 54.7 dB,
  bfloat16 97% and 36.9 dB. The tests ask the same bounds as above.

bfloat16 keeps 8 significant bits, float16 11: their bounds differ by about the 18 dB that
3 bits are worth. A code can flip where two centroids are nearly tied, hence agreement, not
equality.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import mimi_py
from fixtures import CODEC_DIR
from ondevice import DEVICE, make_codec

CFG = mimi_py.CodecConfig(**json.loads((CODEC_DIR / "mimi_small_candle_config.json").read_text()))
IO = dict(np.load(CODEC_DIR / "mimi_small_io.npz"))
# dtype -> (minimum fraction of codes equal to float32's, minimum decoded-audio SNR in dB)
BOUNDS = {"float16": (0.95, 45.0), "bfloat16": (0.85, 30.0)}
HALF = pytest.mark.parametrize("dtype", sorted(BOUNDS))


def snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    err = float(((ref.astype(np.float64) - x) ** 2).sum())
    return float("inf") if err == 0 else 10 * np.log10(float((ref.astype(np.float64) ** 2).sum()) / err)


def check(dtype: str, codes, ref_codes, audio, ref_audio, what: str, bounds=None) -> None:
    min_agree, min_snr = bounds or BOUNDS[dtype]
    agree = float((codes == ref_codes).mean())
    snr = snr_db(ref_audio, audio)
    print(f"{what} {dtype} on {DEVICE}: {agree:.1%} codes equal float32's, audio SNR {snr:.1f} dB")
    assert agree >= min_agree, f"{what} {dtype}: {agree:.1%} of codes equal float32's, need {min_agree:.0%}"
    assert snr >= min_snr, f"{what} {dtype}: audio SNR {snr:.1f} dB, need {min_snr} dB"


@pytest.fixture(scope="module", params=sorted(BOUNDS))
def half(request):
    return request.param, make_codec(CODEC_DIR / "mimi_small.safetensors", config=CFG, dtype=request.param)


def test_fixture_codes_and_audio(half):
    dtype, c = half
    assert c.dtype == dtype and f"dtype='{dtype}'" in repr(c)
    codes = c.encode(IO["waveform"])
    audio = c.decode(IO["codes"])
    assert codes.dtype == np.uint32 and audio.dtype == np.float32
    check(dtype, codes, IO["codes"], audio, IO["audio"], "fixture codec")


def test_streaming_gives_the_same_codes_and_audio_as_offline(half):
    dtype, c = half
    c.reset_state()
    offline = c.encode(IO["waveform"])
    out = [c.encode_step(IO["waveform"][..., s : s + 1000]) for s in range(0, 36000, 1000)]
    streamed = np.concatenate([o for o in out if o is not None], axis=-1)
    np.testing.assert_array_equal(streamed, offline[..., :18])
    audio = c.decode(IO["codes"])
    c.reset_state()
    parts = np.concatenate([c.decode_step(IO["codes"][..., s : s + 3]) for s in range(0, 19, 3)], -1)
    # Chunking changes the order of half-precision sums a little, not the result's shape.
    assert snr_db(audio, parts) >= BOUNDS[dtype][1]
    c.reset_state()


@HALF
def test_a_bfloat16_checkpoint(dtype):
    """Weights stored in bfloat16 hold bfloat16's precision whatever the compute dtype."""
    c = make_codec(CODEC_DIR / "mimi_small_moshi_bf16.safetensors", config=CFG, dtype=dtype)
    codes, audio = c.encode(IO["waveform"]), c.decode(IO["codes"])
    check(dtype, codes, IO["codes"], audio, IO["audio"], "bf16 file", BOUNDS["bfloat16"])


@pytest.fixture(scope="module")
def real_f32():
    x = (np.random.default_rng(3).standard_normal((1, 1, 24000)) * 0.1).astype(np.float32)
    c = make_codec(seed=0, num_codebooks=8, device="cpu")
    codes = c.encode(x)
    return x, codes, c.decode(codes)


@HALF
def test_real_size_seeded_weights(real_f32, dtype):
    x, codes, audio = real_f32
    c = make_codec(seed=0, num_codebooks=8, dtype=dtype)
    check(dtype, c.encode(x), codes, c.decode(codes), audio, "real-size seeded")


def test_what_only_the_native_engine_does_is_refused_without_changing_state(half):
    dtype, c = half
    c.reset_state()
    c.encode_step(IO["waveform"][..., :2500])
    before = c.positions.copy()
    frame = np.zeros((1, 1, 1920), np.float32)
    refused = [
        lambda: c.encode_step(frame, active=np.array([True])),
        lambda: c.encode_step(frame, last=True),
        lambda: c.decode_step(IO["codes"][..., :1], active=np.array([True])),
        lambda: c.reset_state(rows=[0]),
    ]
    for call in refused:
        with pytest.raises(mimi_py.DeviceError, match="native CPU engine"):
            call()
    np.testing.assert_array_equal(c.positions, before)
    c.reset_state()


@pytest.mark.parametrize("dtype", ["float64", "int8", "half2"])
def test_other_dtypes_are_refused(dtype):
    with pytest.raises(mimi_py.ConfigError, match="float32"):
        mimi_py.MimiCodec(CODEC_DIR / "mimi_small.safetensors", config=CFG, dtype=dtype)
