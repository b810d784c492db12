"""Typed errors: one hierarchy, builtins preserved, state untouched by rejected calls, objects
usable after a caught panic."""

from __future__ import annotations

import numpy as np
import pytest

import mimi_py
from support.hostile import assert_allowed, call, same, tf_follow_up, tf_primed
from support.models import FRAME, small_codec_config
from support.ondevice import make_codec, make_transformer
from support.paths import REPO
from support.reference import assert_close, assert_same, case_json, load_case


def test_hierarchy():
    M = mimi_py
    expect = {
        M.ConfigError: (M.MimiError, ValueError),
        M.UnsupportedKvRepeatError: (M.ConfigError, M.MimiError, ValueError),
        M.IncompatibleStateError: (M.MimiError, ValueError),
        M.DepthMismatchError: (M.IncompatibleStateError, M.MimiError, ValueError),
        M.ShapeError: (M.MimiError, ValueError),
        M.DTypeError: (M.MimiError, TypeError),
        M.WeightsError: (M.MimiError, ValueError),
        M.InvalidInputError: (M.MimiError, ValueError),
        M.ResourceError: (M.MimiError, MemoryError),
        M.DeviceError: (M.MimiError, RuntimeError),
        M.ComputeError: (M.MimiError, RuntimeError),
        M.InternalError: (M.MimiError, RuntimeError),
    }
    assert issubclass(M.MimiError, Exception)
    for cls, bases in expect.items():
        for b in bases:
            assert issubclass(cls, b), (cls, b)
        assert cls.__module__ == "mimi_py"
        assert cls.__doc__


def depth_model(n):
    cfg = case_json(f"depth{n}")["config"]
    return make_transformer(mimi_py.TransformerConfig(**cfg), seed=n)


def test_copy_state_depth_mismatch_leaves_both_states_intact():
    a, b = depth_model(2), depth_model(3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 12, a.d_model)).astype(np.float32)
    a.forward(x[:, :5])
    b.forward(x[:, :7])
    # controls replaying the same history
    ca, cb = depth_model(2), depth_model(3)
    ca.forward(x[:, :5])
    cb.forward(x[:, :7])
    for dst, src in ((a, b), (b, a)):
        with pytest.raises(mimi_py.DepthMismatchError) as ei:
            dst.copy_state(src)
        msg = str(ei.value)
        assert str(dst.num_layers) in msg and str(src.num_layers) in msg
        assert "same config" in msg
        assert isinstance(ei.value, ValueError)
    assert (a.position, b.position) == (5, 7)
    assert_same(a.forward(x[:, 5:]), ca.forward(x[:, 5:]))
    assert_same(b.forward(x[:, 7:]), cb.forward(x[:, 7:]))


def test_copy_state_other_incompatibilities():
    a = make_transformer(
        mimi_py.TransformerConfig(d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, context=8)
    )
    b = make_transformer(a.config.replace(context=9))
    c = make_transformer(a.config, dtype="bfloat16")
    for other in (b, c):
        with pytest.raises(mimi_py.IncompatibleStateError):
            a.copy_state(other)
    with pytest.raises(TypeError):
        a.copy_state("not a transformer")


def test_kv_repeat_refused_at_construction():
    cfg = mimi_py.TransformerConfig(d_model=32, num_heads=4, num_layers=1, kv_repeat=2, dim_feedforward=64)
    with pytest.raises(mimi_py.UnsupportedKvRepeatError, match="set kv_repeat=1") as ei:
        make_transformer(cfg)
    assert isinstance(ei.value, mimi_py.ConfigError) and isinstance(ei.value, ValueError)


@pytest.mark.parametrize(
    "field,value",
    [("use_conv_block", True), ("cross_attention", True), ("norm_first", False), ("causal", False)],
)
def test_unsupported_layouts_refused_at_construction(field, value):
    cfg = mimi_py.TransformerConfig(
        d_model=32, num_heads=4, num_layers=1, dim_feedforward=64, **{field: value}
    )
    with pytest.raises(mimi_py.ConfigError, match=field):
        make_transformer(cfg)


@pytest.fixture(scope="module")
def small():
    meta, cfg, weights, arrays = load_case("small_rope")
    return mimi_py.TransformerConfig(**cfg), weights, arrays


@pytest.mark.parametrize(
    "shape",
    [(48, 64), (2, 48, 63), (2, 48, 64, 1), (0, 4, 64), (64,), ()],
)
def test_wrong_shapes_are_shape_errors_and_change_nothing(small, shape):
    cfg, weights, arrays = small
    t = make_transformer(cfg, weights)
    t.forward(arrays["x"][:, :3])
    with pytest.raises(mimi_py.ShapeError) as ei:
        t.forward(np.zeros(shape, np.float32))
    msg = str(ei.value)
    assert "d_model=64" in msg and str(list(shape)) in msg
    assert t.position == 3
    assert_close(t.forward(arrays["x"][:, 3:]), arrays["y_full"][:, 3:], what="after rejection")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex64, object])
def test_non_float_dtypes_are_dtype_errors(small, dtype):
    cfg, weights, arrays = small
    t = make_transformer(cfg, weights)
    with pytest.raises(mimi_py.DTypeError, match="float"):
        t.forward(np.zeros((1, 2, 64), dtype=dtype))
    assert t.position == 0


def test_wrong_python_type_is_type_error(small):
    cfg, weights, arrays = small
    t = make_transformer(cfg, weights)
    with pytest.raises(TypeError):
        t.forward("hello")
    with pytest.raises(TypeError):
        t.forward(None)


def test_empty_time_axis_is_a_no_op(small):
    cfg, weights, arrays = small
    t = make_transformer(cfg, weights)
    y = t.forward(np.zeros((2, 0, 64), np.float32))
    assert y.shape == (2, 0, 64) and y.dtype == np.float32
    assert t.position == 0


def test_step_none_returns_none(small):
    cfg, weights, arrays = small
    t = make_transformer(cfg, weights)
    assert t.step(None) is None
    assert t.position == 0


def test_unknown_device_and_missing_backend():
    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32)
    with pytest.raises(mimi_py.DeviceError, match="unknown device"):
        make_transformer(cfg, device="tpu")
    for dev, feat in (("cuda", "cuda"), ("cuda:1", "cuda"), ("metal", "metal")):
        if feat in mimi_py.features:
            continue
        with pytest.raises(mimi_py.DeviceError, match=f"--features {feat}") as ei:
            make_transformer(cfg, device=dev)
        assert isinstance(ei.value, RuntimeError)


def test_bad_dtype_and_qk_layout_are_config_errors():
    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32)
    with pytest.raises(mimi_py.ConfigError, match="dtype"):
        make_transformer(cfg, dtype="int8")
    with pytest.raises(mimi_py.ConfigError, match="qk_layout"):
        make_transformer(cfg, qk_layout="rotated")


def test_panics_arrive_as_internal_error_not_panic_exception():
    with pytest.raises(mimi_py.InternalError, match="forced panic") as ei:
        mimi_py._core._panic_for_tests()
    assert isinstance(ei.value, Exception)  # PanicException is a BaseException


def test_pickling_a_transformer_is_refused():
    import pickle

    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32)
    with pytest.raises(TypeError, match="state_dict"):
        pickle.dumps(make_transformer(cfg))


# ---------------------------------------------------------------- one declaration, one policy


def test_exception_classes_are_declared_once_and_every_list_agrees():
    """errors.py declares the classes, all under MimiError; the Rust mapping, the package's
    __all__ (its one list of them) and the README follow, and the stub does not redeclare them."""
    import re
    from pathlib import Path

    from mimi_py import errors

    declared = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    assert declared == {c.__name__ for c in errors._family(errors.MimiError)}
    assert set(mimi_py._core._error_class_names()) == declared - {"MimiError"}
    for name in declared:
        assert name in mimi_py.__all__
        assert getattr(mimi_py, name) is getattr(errors, name)
    stub = (Path(mimi_py.__file__).parent / "_core.pyi").read_text()
    assert not re.findall(r"^class \w+Error\b", stub, re.M), "the stub must not redeclare them"
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+Error)` \| `(\w+)` \|", readme, re.M))
    assert set(rows) == declared
    for name, base in rows.items():
        assert base in [b.__name__ for b in getattr(errors, name).__mro__[1:]], (name, base)


def _poisoned_transformer():
    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32, context=4)
    x = np.random.default_rng(0).standard_normal((1, 3, 16)).astype(np.float32)
    return make_transformer(cfg, seed=1), make_transformer(cfg, seed=1), x, "step"


def _poisoned_codec():
    cfg = small_codec_config()
    pcm = (np.random.default_rng(1).standard_normal((1, 1, 3000)) * 0.1).astype(np.float32)
    return make_codec(config=cfg, seed=2), make_codec(config=cfg, seed=2), pcm, "encode_step"


@pytest.mark.parametrize("make", [_poisoned_transformer, _poisoned_codec], ids=["transformer", "codec"])
def test_a_panic_under_the_stream_lock_resets_the_stream_and_raises_internal_error(make):
    obj, fresh, x, method = make()
    getattr(obj, method)(x)  # some state to lose
    with pytest.raises(mimi_py.InternalError, match="forced panic"):
        mimi_py._core._poison_for_tests(obj)
    with pytest.raises(mimi_py.InternalError, match="reset to its fresh state"):
        getattr(obj, method)(x)
    # the stream restarted from scratch: it now continues exactly as a fresh object does
    for _ in range(2):
        a, b = getattr(obj, method)(x), getattr(fresh, method)(x)
        assert (a is None and b is None) or np.array_equal(a, b)


# ---------------------------------------------------------------- after a caught panic


def test_objects_stay_usable_after_a_caught_panic(codec_pair):
    codec, control = codec_pair
    t, c = tf_primed(1, 5, 0)
    codec.reset_state()
    control.reset_state()
    pcm = (np.random.default_rng(1).standard_normal((1, 1, FRAME + 100)) * 0.1).astype(np.float32)
    same(codec.encode_step(pcm), control.encode_step(pcm), "before")
    for _ in range(3):
        kind, e = call(mimi_py._core._panic_for_tests)
        assert kind == "err"
        assert_allowed(e, (mimi_py.InternalError,), "_panic_for_tests")
        assert "forced panic" in str(e)
    tf_follow_up(t, c, 1, 0)
    same(codec.encode_step(pcm), control.encode_step(pcm), "encode_step after panics")
    same(codec.encode(pcm), control.encode(pcm), "encode after panics")
