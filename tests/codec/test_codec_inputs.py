"""MimiCodec fed hostile inputs: encode, encode_latents, decode, decode_latents, encode_step
and decode_step with generated audio and codes (any rank, dtype, layout, NaN/Inf, out-of-range
codes, wrong batch) and wrong Python types, and wrong constructor argument types. Each call
gives the result of the same values passed C-contiguous (float32 audio, uint32 codes), or a
typed error that leaves both streams unchanged (the contract is stated in
tests/support/hostile.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import mimi_py as M
from support.hostile import (
    INT_DTYPES,
    LAYOUTS,
    PROFILE,
    as_ndarray_or_none,
    assert_allowed,
    call,
    count_case,
    hostile_array,
    lay_out,
    python_objects,
    reference_input,
    same,
)
from support.models import BINS, FRAME, K, new_codec
from support.ondevice import make_codec
from support.reference import assert_same


@st.composite
def pcm_shapes(draw):
    kind = draw(st.sampled_from(["mono", "batched", "batched", "rank", "channels", "batch0"]))
    s = draw(st.sampled_from([0, 1, 100, FRAME - 1, FRAME, FRAME + 7, 2 * FRAME + 500]))
    if kind == "mono":
        return (s,)
    if kind == "batched":
        return (draw(st.integers(1, 2)), 1, s)
    if kind == "channels":
        return (1, draw(st.sampled_from([0, 2, 3])), s)
    if kind == "batch0":
        return (0, 1, s)
    rank = draw(st.sampled_from([0, 2, 4]))
    return tuple(draw(st.lists(st.sampled_from([0, 1, 2, 5]), min_size=rank, max_size=rank)))


# Integer PCM the codec scales (native byte order only): its full scale.
INT_PCM = {np.dtype("int16"): 32768.0, np.dtype("int32"): 2.0**31}


def pcm_reference(arr: np.ndarray) -> np.ndarray:
    """The C-contiguous float32 audio a call with pcm `arr` must be equivalent to."""
    if arr.dtype in INT_PCM and arr.dtype.isnative:
        return (np.asarray(arr, np.float64) / INT_PCM[arr.dtype]).astype(np.float32)
    return reference_input(arr)


def pcm_expect(arr, stream_batch=None):
    """(valid, allowed errors) for pcm `arr` (an ndarray or None)."""
    if arr is None:
        return False, (TypeError,)
    allowed = ()
    if arr.dtype.kind != "f" and not (arr.dtype in INT_PCM and arr.dtype.isnative):
        allowed += (M.DTypeError,)
    shape_ok = arr.ndim == 1 or (arr.ndim == 3 and arr.shape[1] == 1 and arr.shape[0] >= 1)
    if not shape_ok:
        allowed += (M.ShapeError,)
    elif stream_batch is not None and (1 if arr.ndim == 1 else arr.shape[0]) != stream_batch:
        allowed += (M.ShapeError,)
    if arr.dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            if not np.isfinite(np.asarray(arr, dtype=np.float32)).all():
                allowed += (M.InvalidInputError,)
    return not allowed, allowed


@PROFILE
@given(
    data=st.data(),
    method=st.sampled_from(["encode", "encode", "encode_latents"]),
    py_object=st.sampled_from([False] * 5 + [True]),
)
def test_any_audio_given_to_encode_gives_the_codes_of_its_float32_values_or_a_typed_error(
    codec_pair, data, method, py_object
):
    count_case("codec_encode")
    codec, control = codec_pair
    if py_object:
        valid = np.random.default_rng(0).standard_normal(FRAME + 3) * 0.1
        x = data.draw(python_objects(valid), "obj")
        arr = as_ndarray_or_none(x)
    else:
        x, _ = data.draw(hostile_array(data.draw(pcm_shapes(), "shape"), scale=0.1), "x")
        arr = x
    valid, allowed = pcm_expect(arr)
    kind, r = call(getattr(codec, method), x)
    if valid:
        assert kind == "ok", f"valid pcm rejected: {type(r).__name__}: {r}"
        ref = pcm_reference(arr)
        same(r, getattr(control, method)(ref), f"{method}: layout/dtype {arr.dtype} {arr.strides}")
        if method == "encode":
            s = ref.shape[-1]
            b = 1 if ref.ndim == 1 else ref.shape[0]
            assert r.shape == (b, K, -(-s // FRAME)) and r.dtype == np.uint32
            assert (r < BINS).all()
    else:
        assert kind == "err", (
            f"invalid pcm accepted: {getattr(arr, 'dtype', type(x))} {getattr(arr, 'shape', '')}"
        )
        if py_object:
            allowed += (TypeError,)
        assert_allowed(r, allowed, f"{method}({type(x).__name__})")


@st.composite
def codes_array(draw, shape):
    dtype = draw(st.sampled_from(INT_DTYPES * 2 + ["bool", "float32", "float64", "complex64", "object"]))
    seed = draw(st.integers(0, 2**32 - 1))
    vals = np.random.default_rng(seed).integers(0, BINS, shape)
    dt = np.dtype(dtype)
    bad_value = None
    if dt.kind in "iu" and vals.size and draw(st.integers(0, 3)) == 0:
        info = np.iinfo(dt)
        cands = [
            v
            for v in (BINS, 100, 2**31, 2**63, info.max, -1, info.min)
            if info.min <= v <= info.max and (v >= BINS or v < 0)
        ]
        bad_value = draw(st.sampled_from(cands))
        flat = draw(st.integers(0, vals.size - 1))
        vals = vals.astype(object)
        vals.reshape(-1)[flat] = bad_value
    x = np.array(vals, dtype=dt) if dt.kind != "O" else vals.astype(object)
    layout = draw(st.sampled_from(LAYOUTS))
    x = lay_out(x, layout, draw(st.integers(0, 3)))
    note(f"codes shape={x.shape} dtype={x.dtype} layout={layout} bad_value={bad_value}")
    return x


@st.composite
def codes_shapes(draw):
    kind = draw(st.sampled_from(["valid"] * 4 + ["rank", "codebooks", "batch0"]))
    f = draw(st.integers(0, 3))
    if kind == "valid":
        return (draw(st.integers(1, 2)), K, f)
    if kind == "codebooks":
        return (1, draw(st.sampled_from([0, 1, K - 1, K + 1, 32])), f)
    if kind == "batch0":
        return (0, K, f)
    rank = draw(st.sampled_from([0, 1, 2, 4]))
    return tuple(draw(st.lists(st.sampled_from([0, 1, K]), min_size=rank, max_size=rank)))


def codes_expect(arr, stream_batch=None):
    allowed = ()
    if arr.dtype.kind not in "iu":
        allowed += (M.DTypeError,)
    shape_ok = arr.ndim == 3 and arr.shape[1] == K and arr.shape[0] >= 1
    if not shape_ok or (stream_batch is not None and arr.shape[0] != stream_batch):
        allowed += (M.ShapeError,)
    if arr.dtype.kind in "iu" and arr.size:
        if int(arr.min()) < 0 or int(arr.max()) >= BINS:
            allowed += (M.InvalidInputError,)
    return not allowed, allowed


@PROFILE
@given(data=st.data(), method=st.sampled_from(["decode", "decode", "decode_latents"]))
def test_any_codes_given_to_decode_give_the_audio_of_their_uint32_values_or_a_typed_error(
    codec_pair, data, method
):
    count_case("codec_decode")
    codec, control = codec_pair
    x = data.draw(codes_array(data.draw(codes_shapes(), "shape")), "codes")
    valid, allowed = codes_expect(x)
    kind, r = call(getattr(codec, method), x)
    if valid:
        assert kind == "ok", f"valid codes rejected: {type(r).__name__}: {r}"
        ref = np.array(x, dtype=np.uint32, order="C")
        same(r, getattr(control, method)(ref), f"{method}: {x.dtype} {x.strides}")
        if method == "decode":
            assert r.shape == (x.shape[0], 1, x.shape[2] * FRAME) and r.dtype == np.float32
    else:
        assert kind == "err", f"invalid codes accepted: {x.dtype} {x.shape}"
        assert_allowed(r, allowed, f"{method}({x.dtype}, {x.shape})")


@PROFILE
@given(
    data=st.data(),
    prime=st.tuples(st.integers(1, 2), st.sampled_from([0, 700, FRAME + 300])),
    py_object=st.sampled_from([False] * 6 + [True]),
    seed=st.integers(0, 2**16),
)
def test_a_refused_encode_step_leaves_the_stream_and_its_buffered_remainder_intact(
    codec_pair, data, prime, py_object, seed
):
    """A rejected encode_step leaves the encoder stream (and its buffered remainder) intact."""
    count_case("codec_encode_step")
    codec, control = codec_pair
    codec.reset_state()
    control.reset_state()
    rng = np.random.default_rng(seed)
    pb, plen = prime
    if plen:
        p = (rng.standard_normal((pb, 1, plen)) * 0.1).astype(np.float32)
        same(codec.encode_step(p), control.encode_step(p), "priming")
    stream_batch = pb if plen else None
    if py_object:
        x = data.draw(python_objects(rng.standard_normal(FRAME) * 0.1), "obj")
        arr = as_ndarray_or_none(x)
    else:
        x, _ = data.draw(hostile_array(data.draw(pcm_shapes(), "shape"), scale=0.1), "x")
        arr = x
    if x is None:  # encode_step(None) is an empty step, as documented
        assert call(codec.encode_step, x) == ("ok", None)
        return
    valid, allowed = pcm_expect(arr, stream_batch)
    kind, r = call(codec.encode_step, x)
    if valid:
        assert kind == "ok", f"valid chunk rejected: {type(r).__name__}: {r}"
        ref = pcm_reference(arr)
        same(r, control.encode_step(ref), "encode_step: layout/dtype")
        if ref.shape[-1]:
            stream_batch = 1 if ref.ndim == 1 else ref.shape[0]
    else:
        assert kind == "err", (
            f"invalid chunk accepted: {getattr(arr, 'dtype', type(x))} {getattr(arr, 'shape', '')}"
        )
        if py_object:
            allowed += (TypeError,)
        assert_allowed(r, allowed, "encode_step")
    b = stream_batch or 1
    nxt = (rng.standard_normal((b, 1, 2 * FRAME)) * 0.1).astype(np.float32)
    same(codec.encode_step(nxt), control.encode_step(nxt), "encode_step after a hostile call")


@PROFILE
@given(
    data=st.data(),
    prime=st.tuples(st.integers(1, 2), st.integers(0, 2)),
    seed=st.integers(0, 2**16),
)
def test_a_refused_decode_step_leaves_the_stream_intact(codec_pair, data, prime, seed):
    count_case("codec_decode_step")
    codec, control = codec_pair
    codec.reset_state()
    control.reset_state()
    rng = np.random.default_rng(seed)
    pb, pf = prime
    if pf:
        p = rng.integers(0, BINS, (pb, K, pf)).astype(np.uint32)
        same(codec.decode_step(p), control.decode_step(p), "priming")
    stream_batch = pb if pf else None
    if data.draw(st.integers(0, 6), "py?") == 0:
        x = data.draw(st.sampled_from([None, "x", {}, 3, [[[1, 2]] * K], 1.5]), "obj")
        if x is None:
            assert codec.decode_step(None) is None
        else:
            arr = as_ndarray_or_none(x)
            kind, r = call(codec.decode_step, x)
            if arr is not None and codes_expect(arr, stream_batch)[0]:
                assert kind == "ok", r
                same(r, control.decode_step(np.asarray(arr, np.uint32)), "decode_step(list)")
                stream_batch = arr.shape[0]
            else:
                assert kind == "err"
                assert_allowed(r, (TypeError, M.ShapeError, M.DTypeError, M.InvalidInputError), "decode_step")
    else:
        x = data.draw(codes_array(data.draw(codes_shapes(), "shape")), "codes")
        valid, allowed = codes_expect(x, stream_batch)
        kind, r = call(codec.decode_step, x)
        if valid:
            assert kind == "ok", f"valid codes rejected: {type(r).__name__}: {r}"
            same(r, control.decode_step(np.array(x, dtype=np.uint32, order="C")), "decode_step")
            if x.shape[2]:
                stream_batch = x.shape[0]
        else:
            assert kind == "err", f"invalid codes accepted: {x.dtype} {x.shape}"
            assert_allowed(r, allowed, "decode_step")
    b = stream_batch or 1
    nxt = rng.integers(0, BINS, (b, K, 2)).astype(np.uint32)
    same(codec.decode_step(nxt), control.decode_step(nxt), "decode_step after a hostile call")


def test_wrong_argument_types_for_a_codec_are_type_or_config_errors():
    for kw in (
        dict(config=[1]),
        dict(config="mimi"),
        dict(weights=3),
        dict(weights=[1]),
        dict(device=None),
        dict(dtype=1),
        dict(seed="x"),
        dict(num_codebooks="8"),
        dict(num_codebooks=0),
    ):
        kind, e = call(lambda kw=kw: make_codec(**kw))
        assert kind == "err", kw
        assert_allowed(e, (TypeError, M.ConfigError), f"MimiCodec({kw})")


def test_encode_step_of_none_returns_none_like_decode_step(codec_pair):
    """step(None) and decode_step(None) return None; encode_step(None) should do the same."""
    codec, _ = codec_pair
    assert codec.decode_step(None) is None
    kind, r = call(codec.encode_step, None)
    assert kind == "ok" and r is None


def test_empty_audio_gives_codes_and_latents_with_zero_frames(codec_pair):
    codec, _ = codec_pair
    assert codec.encode(np.zeros(0, np.float32)).shape == (1, K, 0)
    assert codec.encode_latents(np.zeros(0, np.float32)).shape[-1] == 0


def test_out_of_range_uint64_code_is_reported_as_itself(codec_pair):
    codec, _ = codec_pair
    with pytest.raises(M.InvalidInputError) as ei:
        codec.decode(np.full((1, K, 1), 2**64 - 1, np.uint64))
    assert str(2**64 - 1) in str(ei.value), str(ei.value)


def test_integer_pcm_is_scaled_as_16_and_32_bit_audio(codec_pair):
    codec, _ = codec_pair
    x = (0.3 * np.sin(np.arange(3 * FRAME + 11) * 0.05)).astype(np.float32)
    i16 = np.round(x * 32767).astype(np.int16)
    i32 = i16.astype(np.int32) << 16
    expect = codec.encode((i16 / 32768.0).astype(np.float32))
    assert_same(codec.encode(i16), expect)
    assert_same(codec.encode(i32), expect)
    assert_same(codec.encode(i16[::-1].copy()[::-1]), expect)  # strided view


def test_other_integer_pcm_is_refused_with_the_scaling_to_apply(codec_pair):
    codec, _ = codec_pair
    for dtype in ("int8", "uint8", "int64", ">i2"):
        with pytest.raises(M.DTypeError, match=r"/ 32768 for 16-bit PCM"):
            codec.encode(np.zeros(FRAME, dtype))


def test_an_unconvertible_object_names_the_real_cause(codec_pair):
    codec, _ = codec_pair
    with pytest.raises(TypeError, match="numpy.asarray failed: .*inhomogeneous"):
        codec.encode([[0.0] * 10, [0.0] * 3])


def test_a_step_with_no_frames_does_not_bind_the_stream_to_its_batch_size():
    codec, control = new_codec(), new_codec()
    k = codec.num_codebooks
    assert codec.decode_step(np.zeros((2, k, 0), np.uint32)) is None
    assert codec.encode_step(np.zeros((2, 1, 0), np.float32)) is None
    codes = np.random.default_rng(0).integers(0, codec.cardinality, (1, k, 2)).astype(np.uint32)
    same(codec.decode_step(codes), control.decode_step(codes), "decode_step after an empty batch-2 step")
    pcm = np.random.default_rng(1).standard_normal((1, 1, 2 * codec.frame_size)).astype(np.float32)
    same(codec.encode_step(pcm), control.encode_step(pcm), "encode_step after an empty batch-2 step")
