"""Variable-length batches (`lengths=`): each item's result is exactly its result alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mimi_py as M
from support.models import new_codec
from support.reference import assert_same

FRAME = 1920


@pytest.fixture(scope="module")
def codec():
    return new_codec()


def clips(rng, lengths, width):
    pcm = np.zeros((len(lengths), 1, width), np.float32)
    for i, n in enumerate(lengths):
        pcm[i, 0, :n] = 0.2 * np.sin(np.arange(n) * (0.01 + 0.003 * i)) + 0.05 * rng.standard_normal(n)
    # What a padded batch holds past each clip must not matter: fill it with noise.
    for i, n in enumerate(lengths):
        pcm[i, 0, n:] = rng.standard_normal(width - n)
    return pcm


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(0, 3 * FRAME + 100), min_size=1, max_size=3),
    pad=st.integers(0, 500),
    seed=st.integers(0, 2**16),
)
def test_each_item_of_a_padded_batch_gets_its_codes_alone(codec, lengths, pad, seed):
    width = max(lengths) + pad
    pcm = clips(np.random.default_rng(seed), lengths, width)
    codes = codec.encode(pcm, lengths=np.array(lengths))
    frames = [-(-n // FRAME) for n in lengths]
    assert codes.shape == (len(lengths), codec.num_codebooks, max(frames))
    for i, (n, f) in enumerate(zip(lengths, frames)):
        alone = codec.encode(pcm[i : i + 1, :, :n])
        assert_same(codes[i : i + 1, :, :f], alone)
        assert not codes[i, :, f:].any()
    latents = codec.encode_latents(pcm, lengths=lengths)
    for i, (n, f) in enumerate(zip(lengths, frames)):
        assert_same(latents[i : i + 1, :, :f], codec.encode_latents(pcm[i : i + 1, :, :n]))
        assert not latents[i, :, f:].any()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(st.integers(0, 5), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_each_item_of_a_padded_code_batch_gets_its_audio_alone(codec, frames, seed):
    rng = np.random.default_rng(seed)
    t = max(frames) + 1
    codes = rng.integers(0, codec.cardinality, (len(frames), codec.num_codebooks, t)).astype(np.uint32)
    audio = codec.decode(codes, lengths=np.array(frames, np.int64))
    assert audio.shape == (len(frames), 1, max(frames) * FRAME)
    latents = codec.decode_latents(codes, lengths=frames)
    for i, f in enumerate(frames):
        alone = codec.decode(codes[i : i + 1, :, :f]) if f else np.zeros((1, 1, 0), np.float32)
        assert_same(audio[i : i + 1, :, : f * FRAME], alone)
        assert not audio[i, :, f * FRAME :].any()
        assert_same(latents[i : i + 1, :, :f], codec.decode_latents(codes[i : i + 1, :, :f]))


def test_bad_lengths_are_typed_errors_and_change_nothing(codec):
    pcm = np.zeros((2, 1, 3000), np.float32)
    codes = np.zeros((2, codec.num_codebooks, 3), np.uint32)
    cases = [
        (M.ShapeError, [100]),  # one entry for two items
        (M.ShapeError, [100, 3001]),  # longer than the input
        (M.ShapeError, [100, -1]),
        (M.ShapeError, [[100, 200]]),
        (M.DTypeError, [100.0, 200.0]),
        (M.DTypeError, ["a", "b"]),
    ]
    codec.encode_step(pcm[:, :, :FRAME])  # a stream in progress must not be disturbed
    before = codec.positions.copy()
    for error, bad in cases:
        with pytest.raises(error):
            codec.encode(pcm, lengths=bad)
        with pytest.raises(error):
            codec.encode_latents(pcm, lengths=bad)
    for error, bad in [(M.ShapeError, [1]), (M.ShapeError, [1, 4]), (M.DTypeError, [0.5, 1.0])]:
        with pytest.raises(error):
            codec.decode(codes, lengths=bad)
        with pytest.raises(error):
            codec.decode_latents(codes, lengths=bad)
    assert_same(codec.positions, before)
