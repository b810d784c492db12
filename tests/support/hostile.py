"""The machinery of the hostile-input tests: their hypothesis budget, their statistics, the
checks of each call's outcome, and the strategies that draw arrays and Python objects.

The hostile-input tests (inputs/test_input_arrays, transformer/test_transformer_inputs,
codec/test_codec_inputs, the generated cases of transformer/test_config, transformer/test_state
and weights/test_weights, inputs/test_memory_limits) feed every public entry point random shapes
(rank 0-4, zero-length axes, wrong last dim), dtypes (int, bool, complex, object, datetime,
strings, float16/32/64, longdouble, big-endian), memory layouts (Fortran order, negative
strides, strided slices, transposes, zero strides, read-only, unaligned), NaN/Inf and wrong
Python types. Every call must end in one of two ways:

* the correct result: the same values as the same input passed C-contiguous float32 (uint32
  for codes), compared exactly; or
* a ``MimiError`` subclass (or a ``TypeError`` for a wrong Python type), never a
  ``PanicException``, a bare ``ValueError``/``RuntimeError``/``OverflowError``, or a crash,
  with the object's streaming state unchanged: the next call gives exactly what a control
  object that never saw the rejected call gives.

Budget: the hypothesis profile of tests/conftest.py: ``ci`` (the default) runs a fixed,
derandomized budget of 50 examples per property test; ``HYPOTHESIS_PROFILE=dev`` runs 1000
per test, randomized, for local hunting (a few minutes)::

    HYPOTHESIS_PROFILE=dev python -m pytest -q tests/transformer/test_transformer_inputs.py \
        tests/codec/test_codec_inputs.py tests/transformer/test_config.py tests/transformer/test_state.py

At the end of the session the number of generated cases and the distinct exception classes
they hit are printed in the terminal summary and written to
``<pytest basetemp>/hostile_stats.json`` (and to ``$MIMI_HOSTILE_STATS`` if set); the session
fixture and the hooks that do it are in tests/conftest.py.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st

import mimi_py
from support.models import D, tf_pair
from support.reference import assert_same

# ---------------------------------------------------------------- hypothesis budget

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# The profile tests/conftest.py registered and loaded (ci or dev) gives the budget and the seed;
# this module is imported once test modules are collected, after --hypothesis-profile is read.
PROFILE_NAME = settings.get_current_profile_name()
if PROFILE_NAME not in ("ci", "dev"):  # imported before tests/conftest.py loaded its profile
    raise RuntimeError(f"support.hostile imported under hypothesis profile {PROFILE_NAME!r}, not ci or dev")
PROFILE = settings(suppress_health_check=_SUPPRESS)

# ---------------------------------------------------------------- statistics

STATS: dict = {
    "cases": Counter(),
    "errors": Counter(),
    "generated_errors": Counter(),
    "ok": 0,
    "in_generated_test": False,
}


def count_case(test: str) -> None:
    """Called at the start of each generated case: counts it, and marks its errors as generated."""
    STATS["cases"][test] += 1
    STATS["in_generated_test"] = True


def start_test() -> None:
    """Called before each test: its errors are not generated ones until it counts a case."""
    STATS["in_generated_test"] = False


def summary(basetemp: Path) -> str | None:
    """At the end of the session, if any hostile call was made: the statistics, written as json
    to ``basetemp/hostile_stats.json`` (and ``$MIMI_HOSTILE_STATS``), and a line that says so."""
    if not STATS["cases"] and not STATS["errors"]:
        return None
    n = sum(STATS["cases"].values())
    classes = sorted(STATS["generated_errors"])
    stats = {
        "profile": PROFILE_NAME,
        "generated_cases": n,
        "cases_per_test": dict(sorted(STATS["cases"].items())),
        "successful_calls": STATS["ok"],
        "distinct_error_classes": len(classes),
        "error_classes": {c: STATS["generated_errors"][c] for c in classes},
        "error_classes_all_tests": dict(sorted(STATS["errors"].items())),
    }
    path = basetemp / "hostile_stats.json"
    text = json.dumps(stats, indent=2)
    path.write_text(text)
    if os.environ.get("MIMI_HOSTILE_STATS"):
        Path(os.environ["MIMI_HOSTILE_STATS"]).write_text(text)
    return (
        f"hostile inputs [{PROFILE_NAME}]: {n} generated cases, {len(classes)} distinct error "
        f"classes ({', '.join(classes)}); all tests of the session: "
        f"{len(STATS['errors'])} error classes; {path}"
    )


# ---------------------------------------------------------------- outcome checking


def call(fn, *args):
    """Runs fn(*args): ("ok", result) or ("err", exception); records the outcome."""
    try:
        r = fn(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException
        STATS["errors"][type(e).__name__] += 1
        if STATS["in_generated_test"]:
            STATS["generated_errors"][type(e).__name__] += 1
        assert type(e).__name__ != "PanicException", f"PanicException escaped: {e}"
        assert isinstance(e, Exception), f"{type(e).__name__} is not an Exception: {e}"
        return "err", e
    STATS["ok"] += 1
    return "ok", r


def assert_allowed(e: BaseException, allowed: tuple, what: str = "") -> None:
    """e is one of the allowed classes, and is a MimiError or a plain TypeError."""
    assert isinstance(e, allowed), (
        f"{what}: raised {type(e).__module__}.{type(e).__name__}: {e}; expected one of "
        f"{[a.__name__ for a in allowed]}"
    )
    assert isinstance(e, mimi_py.MimiError) or type(e) is TypeError, (
        f"{what}: {type(e).__name__} is neither a MimiError nor a TypeError: {e}"
    )
    assert str(e), f"{what}: empty message"


# ---------------------------------------------------------------- array strategies

FLOAT_DTYPES = ["float16", "float32", "float64", "longdouble", ">f4", ">f8"]
BAD_DTYPES = [
    "int8",
    "int32",
    "int64",
    "uint8",
    "uint64",
    "bool",
    "complex64",
    "complex128",
    "object",
    "datetime64[s]",
    "U3",
]
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", ">i4"]
LAYOUTS = ["C", "F", "neg", "slice", "transpose", "broadcast", "readonly", "unaligned"]


def lay_out(x: np.ndarray, layout: str, axis: int) -> np.ndarray:
    """The same logical values as x in another memory layout (broadcast: a zero-stride
    view of x's first slice along axis, so the values change but the reference is computed
    from the returned array itself)."""
    if x.ndim == 0 or x.dtype.kind in "OUM" or layout == "C":
        return x
    axis %= x.ndim
    if layout == "F":
        return np.asfortranarray(x)
    if layout == "neg":
        return np.flip(np.flip(x, axis).copy(), axis)
    if layout == "slice":
        big_shape = list(x.shape)
        big_shape[axis] *= 2
        big = np.zeros(big_shape, x.dtype)
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(None, None, 2)
        big[tuple(idx)] = x
        return big[tuple(idx)]
    if layout == "transpose":
        return np.ascontiguousarray(x.T).T
    if layout == "broadcast":
        if x.shape[axis] == 0:
            return x
        return np.broadcast_to(x.take([0], axis=axis), x.shape)
    if layout == "readonly":
        y = x.copy()
        y.setflags(write=False)
        return y
    if layout == "unaligned":
        if x.dtype.itemsize < 2:
            return x
        buf = np.zeros(x.nbytes + 1, np.uint8)[1:]
        y = buf.view(x.dtype).reshape(x.shape)
        y[...] = x
        return y
    raise AssertionError(layout)


@st.composite
def float_values(draw, shape, scale=1.0, allow_special=True):
    """float64 values of `shape`, possibly with one NaN/Inf."""
    seed = draw(st.integers(0, 2**32 - 1))
    x = np.array(np.random.default_rng(seed).standard_normal(shape) * scale, dtype=np.float64)
    special = draw(st.sampled_from([None] * 4 + (["nan", "inf", "-inf"] if allow_special else [])))
    if special and x.size:
        flat = draw(st.integers(0, x.size - 1))
        x.reshape(-1)[flat] = float(special)
    return x


@st.composite
def hostile_array(draw, shape, scale=1.0, float_only=False):
    """(array, dtype_ok) for a pcm/activation input of `shape`."""
    vals = draw(float_values(shape, scale))
    dtype = draw(st.sampled_from(FLOAT_DTYPES * 3 + ([] if float_only else BAD_DTYPES)))
    if dtype == "object":
        x = vals.astype(object)
    elif dtype == "U3":
        x = np.full(shape, "1.5", dtype="U3")
    elif dtype.startswith("datetime"):
        x = np.zeros(shape, dtype=dtype)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            x = vals.astype(dtype)
    layout = draw(st.sampled_from(LAYOUTS))
    axis = draw(st.integers(0, 3))
    x = lay_out(x, layout, axis)
    note(f"array shape={x.shape} dtype={x.dtype} layout={layout} axis={axis} strides={x.strides}")
    return x, np.dtype(x.dtype).kind == "f"


class ArrayLike:
    """Not an ndarray, but convertible with numpy.asarray."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.a, dtype=dtype)


PY_OBJECTS = {
    "None": lambda v: None,
    "str": lambda v: "hello",
    "bytes": lambda v: b"bytes",
    "dict": lambda v: {"a": 1},
    "empty dict": lambda v: {},
    "int": lambda v: 3,
    "float": lambda v: 2.5,
    "bool": lambda v: True,
    "object": lambda v: object(),
    "tuple": lambda v: (1.0, 2.0),
    "ragged list": lambda v: [[1.0], [1.0, 2.0]],
    "list of str": lambda v: ["a", "b"],
    "complex": lambda v: 1j,
    "set": lambda v: set(),
    "slice": lambda v: slice(1),
    "nested list": lambda v: v.tolist(),
    "flat tuple": lambda v: tuple(v.ravel().tolist()),
    "__array__": lambda v: ArrayLike(v),
    "memoryview": lambda v: memoryview(np.ascontiguousarray(v)),
    "np.float32": lambda v: np.float32(1.0),
    "np.int64": lambda v: np.int64(3),
}


@st.composite
def python_objects(draw, valid_float):
    """Wrong Python types and array-likes; valid_float: a valid float input as an ndarray."""
    name = draw(st.sampled_from(sorted(PY_OBJECTS)))
    note(f"python object: {name}")
    return PY_OBJECTS[name](valid_float)


def as_ndarray_or_none(obj):
    """What numpy makes of obj (None if it cannot), to predict the outcome."""
    if obj is None:
        return None
    try:
        a = np.asarray(obj)
    except Exception:  # noqa: BLE001
        return None
    if a.dtype.kind in "USOV":
        return None
    return a


def same(a, b, what):
    """Exactly the same result (None, or arrays equal with NaNs in the same places)."""
    if a is None or b is None:
        assert a is None and b is None, f"{what}: {a!r} vs {b!r}"
        return
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert_same(a, b, what=what)


def reference_input(arr: np.ndarray) -> np.ndarray:
    """The C-contiguous float32 input a call with `arr` must be equivalent to."""
    return np.array(arr, dtype=np.float32, order="C")


# ---------------------------------------------------------------- a transformer and its control


def tf_primed(prime_batch, prime_len, seed):
    """A transformer and its control, both fed the same history."""
    t, c = tf_pair()
    hist = np.random.default_rng(seed).standard_normal((prime_batch, prime_len, D)).astype(np.float32)
    if prime_len:
        same(t.forward(hist), c.forward(hist), "priming")
    return t, c


def tf_follow_up(t, c, batch, seed):
    """The next valid step gives exactly what the control gives."""
    b = batch or 1
    x = np.random.default_rng(seed + 1).standard_normal((b, 2, D)).astype(np.float32)
    same(t.forward(x), c.forward(x), "follow-up after a hostile call")
    assert t.position == c.position
