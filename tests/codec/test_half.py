"""The codec in half precision (float16, bfloat16) on the test device (MIMI_TEST_DEVICE).

Half precision runs the candle engine in that dtype on every device: the SEANet, the
transformers and the (de)convolutions compute in half precision, and the quantizer keeps
float32 (its codes are an argmin over nearby centroids, and latents are cast to float32 on
the way in). Outputs are float32 arrays.

Bounds, measured against the float32 reference (the fixtures' codes and audio, computed by
PyTorch, which our float32 CPU engine matches exactly):

* fixture codec (4 codebooks, 19 frames): float16 gave 100% equal codes and 58.3 dB audio SNR,
  bfloat16 94.7% and 39.9 dB. The tests ask float16 >= 95% and 45 dB, bfloat16 >= 85% and 30 dB.
* real-size seeded weights (8 codebooks, 1 s of noise): float16 gave 100% and 54.6 dB,
  bfloat16 100% and 37.0 dB. The tests ask the same bounds as above.

Per-row streams (masked steps, row resets, last=True) are compared with the same rows streamed
alone and with offline encode, in the same dtype: on the CPU every code was equal and masked
decode audio was bit-identical to the rows' own streams; the tests ask 99.5% of codes and the
dtype's SNR bound.

bfloat16 keeps 8 significant bits, float16 11: their bounds differ by about the 18 dB that
3 bits are worth. A code can flip where two centroids are nearly tied, hence agreement, not
equality.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import mimi_py
from support.ondevice import DEVICE, make_codec
from support.paths import CODEC_DIR
from support.reference import assert_same

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
    assert_same(streamed, offline[..., :18])
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


# Per-row streaming in half precision (the candle engine, on every device): a batched stream's
# rows are compared with the same rows streamed alone, and a stream ended with last=True with
# offline encode, in the same dtype. Batching changes the order of half-precision sums, so
# codes must agree on at least ROW_AGREEMENT of entries (each test compares at least 200
# codes, so one flipped code is allowed) and audio keep the dtype's SNR bound.
ROW_AGREEMENT = 0.995
FRAME = 1920


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, f"{a.shape} != {b.shape}"
    return float((a == b).mean())


def noise(batch: int, samples: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((batch, 1, samples)) * 0.1).astype(np.float32)


def solo_codes(c, pcm: np.ndarray, chunks: list[int]) -> np.ndarray:
    """pcm (1, 1, n) streamed alone on a clone of c, in chunks of these sizes."""
    s = c.clone()
    s.reset_state()
    out, t = [], 0
    for n in chunks:
        out.append(s.encode_step(pcm[..., t : t + n]))
        t += n
    return np.concatenate([o for o in out if o is not None], axis=-1)


MASKS = [[1, 1, 1], [1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 0, 1], [1, 1, 1]]


def check_rows(dtype: str, batched: list[np.ndarray], alone: list[np.ndarray], what: str) -> None:
    """Codes of every row, batched against alone, at least 200 of them."""
    a, b = np.concatenate([x.ravel() for x in batched]), np.concatenate([x.ravel() for x in alone])
    assert a.size == b.size >= 200, (a.size, b.size)
    agree = agreement(a, b)
    print(f"{dtype} on {DEVICE}: {what}: {agree:.2%} of {a.size} codes equal")
    assert agree >= ROW_AGREEMENT, f"{what}: {agree:.2%} of codes equal, need {ROW_AGREEMENT:.1%}"


def test_masked_rows_stream_as_independent_streams(half):
    dtype, c = half
    c.reset_state()
    masks = MASKS * 4
    pcm = noise(3, len(masks) * FRAME, 21)
    steps = [0, 0, 0]
    got: list[list[np.ndarray]] = [[], [], []]
    for i, mask in enumerate(masks):
        x = noise(3, FRAME, 100 + i)  # what inactive rows hold must not matter
        for r in range(3):
            if mask[r]:
                x[r] = pcm[r, :, steps[r] * FRAME : (steps[r] + 1) * FRAME]
        codes = c.encode_step(x, active=np.array(mask, bool))
        for r in range(3):
            if mask[r]:
                got[r].append(codes[r : r + 1])
                steps[r] += 1
            else:
                assert not codes[r].any(), "an inactive row's output is zeros"
    assert_same(c.positions, steps)
    alone = [solo_codes(c, pcm[r : r + 1], [FRAME] * steps[r]) for r in range(3)]
    check_rows(dtype, [np.concatenate(g, axis=-1) for g in got], alone, "masked rows vs own streams")
    c.reset_state()


def test_masked_decode_rows_give_each_rows_own_audio(half):
    dtype, c = half
    c.reset_state()
    codes = np.stack([np.roll(IO["codes"][0], 3 * r, axis=-1) for r in range(3)])[..., : len(MASKS)]
    steps = [0, 0, 0]
    got: list[list[np.ndarray]] = [[], [], []]
    for mask in MASKS:
        x = np.stack([codes[r, :, steps[r] : steps[r] + 1] for r in range(3)])
        audio = c.decode_step(x, active=np.array(mask, bool))
        for r in range(3):
            if mask[r]:
                got[r].append(audio[r : r + 1])
                steps[r] += 1
    for r in range(3):
        s = c.clone()
        s.reset_state()
        alone = np.concatenate([s.decode_step(codes[r : r + 1, :, t : t + 1]) for t in range(steps[r])], -1)
        snr = snr_db(alone, np.concatenate(got[r], axis=-1))
        print(f"{dtype} on {DEVICE}, row {r}: masked decode vs the row's own stream, SNR {snr:.1f} dB")
        assert snr >= BOUNDS[dtype][1]
    c.reset_state()


def test_a_row_reset_restarts_only_that_row(half):
    """Rows reset at a partial frame: the reset row restarts, the others continue, and the
    steps that follow (whole frames) keep every row on its own stream."""
    dtype, c = half
    c.reset_state()
    n = 20 * FRAME
    pcm = noise(3, 1000 + n, 22)
    first = c.encode_step(pcm[..., :1000])
    assert first is None
    c.reset_state(rows=[1])
    assert_same(c.positions, [0, 0, 0])
    fresh = noise(1, n, 23)
    x = pcm[..., 1000:].copy()
    x[1] = fresh[0]
    codes = np.concatenate([c.encode_step(x[..., t : t + 4 * FRAME]) for t in range(0, n, 4 * FRAME)], -1)
    own = [(pcm[:1], [1000, n]), (fresh, [n]), (pcm[2:3], [1000, n])]
    alone = [solo_codes(c, audio, chunks) for audio, chunks in own]
    check_rows(dtype, [codes[r] for r in range(3)], alone, "rows after a reset of row 1 vs own streams")
    c.reset_state()


@pytest.mark.parametrize("last_chunk", [0, 777, 2500])
def test_a_stream_ended_with_last_true_gives_the_offline_codes(half, last_chunk):
    dtype, c = half
    c.reset_state()
    pcm = noise(2, 30 * FRAME + 1234 + last_chunk, 24)
    cut = pcm.shape[-1] - last_chunk
    parts = [c.encode_step(pcm[:, :, a : min(a + 7777, cut)]) for a in range(0, cut, 7777)]
    parts.append(c.encode_step(pcm[:, :, cut:], last=True))
    streamed = np.concatenate([p for p in parts if p is not None], axis=-1)
    check_rows(dtype, [streamed], [c.encode(pcm)], "a last=True stream vs offline encode")
    assert c.positions.size == 0
    c.reset_state()


def test_a_rejected_step_changes_nothing(half):
    dtype, c = half
    c.reset_state()
    pcm = noise(2, 3 * FRAME, 25)
    c.encode_step(pcm[..., :FRAME])
    before, twin = c.positions.copy(), c.clone()
    refused = [
        (
            lambda: c.encode_step(pcm[..., FRAME : FRAME + 100], active=np.array([True, False])),
            mimi_py.ShapeError,
        ),
        (
            lambda: c.encode_step(pcm[..., FRAME:], active=np.array([True, False]), last=True),
            mimi_py.InvalidInputError,
        ),
        (lambda: c.encode_step(pcm[:1, :, FRAME:]), mimi_py.ShapeError),
    ]
    for call, error in refused:
        with pytest.raises(error):
            call()
    assert_same(c.positions, before)
    assert_same(c.encode_step(pcm[..., FRAME:]), twin.encode_step(pcm[..., FRAME:]))
    c.reset_state()


@pytest.mark.parametrize("dtype", ["float64", "int8", "half2"])
def test_other_dtypes_are_refused(dtype):
    with pytest.raises(mimi_py.ConfigError, match="float32"):
        mimi_py.MimiCodec(CODEC_DIR / "mimi_small.safetensors", config=CFG, dtype=dtype)
