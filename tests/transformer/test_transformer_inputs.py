"""StreamingTransformer fed hostile inputs: forward and step with generated arrays (any rank,
dtype, layout, NaN/Inf, wrong batch) and wrong Python types, generated configs, devices, dtypes
and q/k layouts at construction, and wrong argument types. Each call gives the result of the
same values passed C-contiguous float32, or a typed error that leaves the stream unchanged
(the contract is stated in tests/support/hostile.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import mimi_py as M
from support.hostile import (
    PROFILE,
    as_ndarray_or_none,
    assert_allowed,
    call,
    count_case,
    hostile_array,
    python_objects,
    reference_input,
    same,
    tf_follow_up,
    tf_primed,
)
from support.models import TF_CFG, D
from support.ondevice import make_transformer
from support.reference import assert_close


@st.composite
def tf_shapes(draw):
    kind = draw(st.sampled_from(["valid"] * 4 + ["rank", "lastdim", "batch0"]))
    b, t = draw(st.integers(1, 2)), draw(st.integers(0, 4))
    if kind == "valid":
        return (b, t, D)
    if kind == "lastdim":
        return (b, t, draw(st.sampled_from([0, 1, D - 1, D + 1, 2 * D])))
    if kind == "batch0":
        return (0, t, D)
    rank = draw(st.sampled_from([0, 1, 2, 4]))
    dims = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
    if rank and draw(st.booleans()):
        dims[-1] = D
    return tuple(dims)


def check_tf_call(t, c, method, x, stream_batch, py_object=False):
    """Hostile call on t; on success c gets the C-contiguous float32 equivalent."""
    pos0 = t.position
    if method == "step" and x is None:
        kind, r = call(t.step, None)
        assert kind == "ok" and r is None
        assert t.position == pos0
        return
    arr = as_ndarray_or_none(x) if py_object else x
    kind, r = call(getattr(t, method), x)
    if arr is None:
        assert kind == "err", f"{type(x).__name__} accepted"
        assert_allowed(r, (TypeError,), f"{method}({type(x).__name__})")
    else:
        dtype_ok = arr.dtype.kind == "f"
        shape_ok = arr.ndim == 3 and arr.shape[2] == D and arr.shape[0] >= 1
        batch_ok = shape_ok and (stream_batch is None or arr.shape[0] == stream_batch)
        finite_ok = not dtype_ok or bool(np.isfinite(np.asarray(arr, dtype=np.float32)).all())
        if dtype_ok and batch_ok and finite_ok:
            assert kind == "ok", f"valid input rejected: {type(r).__name__}: {r}"
            expect = c.forward(reference_input(arr))
            same(r, expect, f"{method}: layout/dtype {arr.dtype} {arr.strides}")
            assert t.position == c.position == pos0 + arr.shape[1]
            return
        assert kind == "err", f"invalid input accepted: dtype={arr.dtype} shape={arr.shape}"
        allowed = ()
        if not dtype_ok:
            allowed += (M.DTypeError,)
        if not batch_ok:
            allowed += (M.ShapeError,)
        if not finite_ok:
            allowed += (M.InvalidInputError,)
        if py_object:
            allowed += (TypeError,)
        assert_allowed(r, allowed, f"{method}(dtype={arr.dtype}, shape={arr.shape})")
    assert t.position == pos0, "a rejected call moved the stream"


@PROFILE
@given(
    data=st.data(),
    method=st.sampled_from(["forward", "step"]),
    prime_batch=st.integers(1, 2),
    prime_len=st.sampled_from([0, 0, 3, 9]),
    seed=st.integers(0, 2**16),
)
def test_any_array_given_to_forward_or_step_gives_the_result_of_its_float32_values_or_a_typed_error(
    data, method, prime_batch, prime_len, seed
):
    count_case("transformer_arrays")
    t, c = tf_primed(prime_batch, prime_len, seed)
    stream_batch = prime_batch if prime_len else None
    shape = data.draw(tf_shapes(), "shape")
    x, _ = data.draw(hostile_array(shape), "x")
    check_tf_call(t, c, method, x, stream_batch)
    if t.batch_size is not None:
        stream_batch = t.batch_size
    tf_follow_up(t, c, stream_batch, seed)


@PROFILE
@given(
    data=st.data(),
    method=st.sampled_from(["forward", "step"]),
    prime_len=st.sampled_from([0, 2]),
    seed=st.integers(0, 2**16),
)
def test_python_objects_given_to_forward_or_step_are_converted_or_refused_with_a_type_error(
    data, method, prime_len, seed
):
    count_case("transformer_python_types")
    t, c = tf_primed(1, prime_len, seed)
    valid = np.random.default_rng(seed).standard_normal((1, 2, D)).astype(np.float32)
    obj = data.draw(python_objects(valid), "obj")
    check_tf_call(t, c, method, obj, 1 if prime_len else None, py_object=True)
    tf_follow_up(t, c, t.batch_size, seed)


SMALL_CFG = st.fixed_dictionaries(
    {
        "d_model": st.sampled_from([8, 12, 16, 24]),
        "num_heads": st.sampled_from([1, 2, 3, 4]),
        "num_layers": st.integers(1, 2),
        "dim_feedforward": st.integers(1, 40),
        "context": st.integers(1, 6),
        "positional_embedding": st.sampled_from(["rope", "sin", "none"]),
        "norm": st.sampled_from(["layer_norm", "rms_norm"]),
        "gating": st.sampled_from([None, "silu", "gelu", "relu"]),
        "bias_attn": st.booleans(),
        "bias_ff": st.booleans(),
        "layer_scale": st.sampled_from([None, 0.01, 1.0]),
        "kv_repeat": st.sampled_from([1, 1, 1, 2]),
        "causal": st.sampled_from([True] * 6 + [False]),
        "use_conv_block": st.sampled_from([False] * 6 + [True]),
    }
)


@PROFILE
@given(
    kw=SMALL_CFG,
    device=st.sampled_from(["cpu"] * 6 + ["cuda:7", "tpu", "", "CPU"]),
    dtype=st.sampled_from(["float32"] * 4 + ["bfloat16", "float16", "float64", "int8", ""]),
    qk_layout=st.sampled_from(["interleaved", "hf", "bogus"]),
    seed=st.integers(0, 2**64 - 1),
    t_len=st.integers(1, 9),
)
def test_any_transformer_that_builds_runs_and_streams_like_one_call(
    kw, device, dtype, qk_layout, seed, t_len
):
    count_case("transformer_construction")
    kind, cfg = call(lambda: M.TransformerConfig(**kw))
    if kind == "err":
        assert_allowed(cfg, (M.ConfigError,), f"TransformerConfig({kw})")
        return
    kind, t = call(lambda: make_transformer(cfg, seed=seed, device=device, dtype=dtype, qk_layout=qk_layout))
    if kind == "err":
        assert_allowed(t, (M.ConfigError, M.DeviceError), f"StreamingTransformer({kw}, {device}, {dtype})")
        return
    assert t.device == "cpu" and t.dtype in ("float32", "bfloat16", "float16"), (device, dtype)
    x = np.random.default_rng(seed % 2**32).standard_normal((1, t_len, cfg.d_model)).astype(np.float32)
    y = t.forward(x)
    assert y.shape == x.shape and y.dtype == np.float32 and np.isfinite(y).all()
    if dtype == "float32":
        u = make_transformer(cfg, seed=seed, qk_layout=qk_layout)
        cut = t_len // 2
        y2 = np.concatenate([u.forward(x[:, :cut]), u.step(x[:, cut:])], axis=1)
        assert_close(y2, y, atol=1e-4, rtol=1e-4)


def test_wrong_argument_types_for_a_transformer_are_type_or_config_errors():
    """Wrong argument types are TypeError or ConfigError; negative/huge ints are not OverflowError."""
    bad = [
        dict(config=[1]),
        dict(config="mimi"),
        dict(weights=42),
        dict(weights=[1, 2]),
        dict(device=None),
        dict(dtype=3),
        dict(prefix=None),
        dict(qk_layout=1.5),
        dict(seed=1.5),
        dict(seed="0"),  # (seed=None means the default seed)
    ]
    for kw in bad:
        kw.setdefault("config", TF_CFG)
        kind, e = call(lambda kw=kw: make_transformer(**kw))
        assert kind == "err", kw
        assert_allowed(e, (TypeError, M.ConfigError), f"StreamingTransformer({kw})")
