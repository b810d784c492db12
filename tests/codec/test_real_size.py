"""The real-size Mimi (32 codebooks) against Kyutai's moshi 0.2.13, float32 (tests/data/codec/
mimi_real_size*, made by tests/data/make_real_size.py), in both checkpoint layouts: Kyutai's
(q/k interleaved) and Hugging Face kyutai/mimi's (q/k half-split). Codes equal moshi's; latents,
quantized latents and audio within the json's ``tolerance`` (about ten times the error measured
when it was set; see tests/data/README.md); offline and streaming.

moshi pads the 84000-sample input with zeros to whole frames before encoding; given that padded
input mimi_py must compute what moshi does on all 44 frames. Given the input itself, mimi_py pads
each convolution as transformers does (tests/codec/test_codec.py checks that on the small codec),
so only its 43 whole frames are moshi's.

The 384 MB of weights are regenerated from the json's seed, checked against its sha256 and
written once per module in each layout.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from safetensors_file import read_safetensors, write_safetensors
from support.ondevice import assert_codes, make_codec, tolerance
from support.paths import CODEC_DIR
from support.real_size import REFERENCE_JSON, REFERENCE_NPZ, moshi_weights, to_hf_checkpoint
from support.reference import assert_close, weights_digest

META = json.loads(REFERENCE_JSON.read_text())
TOL = META["tolerance"]
REF = dict(np.load(REFERENCE_NPZ))
WAVE, CODES = REF["waveform"], REF["codes"]
FRAME = 1920
FRAMES = CODES.shape[-1]
# moshi's input: WAVE with zeros up to a whole number of frames (the json's "padding").
PADDED = np.pad(WAVE, ((0, 0), (0, 0), (0, FRAMES * FRAME - WAVE.shape[-1])))
LAYOUTS = ("moshi", "hf")


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory) -> dict:
    """The reference weights, checked against the json's sha256, in each layout's file."""
    weights = moshi_weights(META["weights"]["seed"])
    digest = weights_digest(weights)
    assert digest == META["weights"]["sha256"], (
        f"the regenerated weights' digest {digest} is not the reference's: the recipe "
        "(benches/common.py random_tensor) or numpy's draws changed; rerun tests/data/make_real_size.py"
    )
    folder = tmp_path_factory.mktemp("real_size")
    files = {"moshi": folder / "mimi_moshi.safetensors", "hf": folder / "model.safetensors"}
    write_safetensors(files["moshi"], weights)
    write_safetensors(files["hf"], to_hf_checkpoint(weights))
    return files


@pytest.fixture(scope="module", params=LAYOUTS)
def codec(request, weight_files):
    """The real-size codec with all 32 codebooks, from the file of one layout."""
    c = make_codec(weight_files[request.param], num_codebooks=32)
    assert c.checkpoint_layout == request.param
    return c


def within(actual, name: str) -> None:
    """``actual`` within the json's tolerance of the reference ``name``; prints the error."""
    expected = REF[name]
    err = float(np.abs(np.asarray(actual, np.float64) - expected).max())
    print(f"{name}: max abs error {err:.3g} (reference max abs {np.abs(expected).max():.3g})")
    assert_close(actual, expected, *tolerance(TOL[name]), name)


# ---------------------------------------------------------------- offline


def test_codes_equal_moshis(codec):
    codes = codec.encode(PADDED)
    assert codes.shape == CODES.shape and codes.dtype == np.uint32
    assert_codes(codes, CODES, f"{codec.checkpoint_layout} codes")


def test_latents_are_moshis(codec):
    within(codec.encode_latents(PADDED), "latents")


def test_decoding_moshis_codes_gives_moshis_latents_and_audio(codec):
    within(codec.decode_latents(CODES), "quantized")
    audio = codec.decode(CODES)
    assert audio.dtype == np.float32
    within(audio, "audio")


def test_a_partial_last_frame_leaves_the_whole_frames_moshis(codec):
    codes, latents = codec.encode(WAVE), codec.encode_latents(WAVE)
    assert codes.shape == CODES.shape and latents.shape == REF["latents"].shape
    assert_codes(codes[..., :-1], CODES[..., :-1], "whole frames' codes")
    assert_close(
        latents[..., :-1], REF["latents"][..., :-1], *tolerance(TOL["latents"]), "whole frames' latents"
    )


def test_eight_codebooks_are_moshis_first_eight(weight_files):
    c = make_codec(weight_files["moshi"], num_codebooks=8)
    assert_codes(c.encode(PADDED), CODES[:, :8], "8 codebooks")


# ---------------------------------------------------------------- streaming


def test_streaming_encode_one_frame_per_call_gives_moshis_codes(codec):
    assert META["checks"]["moshi_streaming_encode_1920_samples_per_call_equals_codes"]
    codec.reset_state()
    streamed = np.concatenate(
        [codec.encode_step(PADDED[..., t * FRAME : (t + 1) * FRAME]) for t in range(FRAMES)], -1
    )
    assert_codes(streamed, CODES, f"{codec.checkpoint_layout} streamed codes")


def test_a_stream_ended_with_last_gives_the_offline_codes(codec):
    codec.reset_state()
    cut = (FRAMES - 1) * FRAME
    parts = [codec.encode_step(WAVE[..., s : s + FRAME]) for s in range(0, cut, FRAME)]
    parts.append(codec.encode_step(WAVE[..., cut:], last=True))  # 480 samples, padded
    assert_codes(np.concatenate(parts, -1), codec.encode(WAVE), "last=True stream vs offline encode")


def test_streaming_decode_one_frame_per_call_gives_moshis_audio(codec):
    codec.reset_state()
    streamed = np.concatenate([codec.decode_step(CODES[..., t : t + 1]) for t in range(FRAMES)], -1)
    within(streamed, "audio")
    assert_close(streamed, codec.decode(CODES), *tolerance(TOL["audio"]), "streamed vs offline audio")


# ---------------------------------------------------------------- the layouts


def test_the_qk_layout_matters(weight_files):
    """Hugging Face names with moshi's interleaved q/k rows (the layout mistake) move the latents
    far outside their bound and change codes: the comparisons above see the q/k layout."""
    wrong = make_codec(
        to_hf_checkpoint(read_safetensors(weight_files["moshi"]), permute_qk=False), num_codebooks=32
    )
    changed = float((wrong.encode(PADDED) != CODES).mean())
    moved = float(np.abs(wrong.encode_latents(PADDED) - REF["latents"]).max())
    print(f"the q/k layout mistake: {changed:.1%} of codes changed, latents moved by up to {moved:.3g}")
    assert changed > 0.01 and moved > 100 * TOL["latents"]["atol"]


def test_hf_conversion_reproduces_the_small_codecs_hf_file():
    """support.real_size's moshi -> kyutai/mimi conversion gives, bit for bit, the fixtures'
    small codec file that transformers wrote for the same weights."""
    small = json.loads((CODEC_DIR / "mimi_small.json").read_text())["transformer_config"]
    converted = to_hf_checkpoint(read_safetensors(CODEC_DIR / "mimi_small_moshi.safetensors"), small)
    expected = read_safetensors(CODEC_DIR / "mimi_small.safetensors")
    assert sorted(converted) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(converted[name], value, err_msg=name)
