"""Numerical parity with the PyTorch reference fixtures (tests/data/transformer)."""

from __future__ import annotations

import numpy as np
import pytest

import mimi_py
from support.ondevice import make_transformer, tolerance
from support.reference import NUMERIC_CASES, assert_close, chunk_slices, load_case


def build(cfg, weights, **kw):
    return make_transformer(mimi_py.TransformerConfig(**cfg), weights, **kw)


@pytest.fixture(scope="module", params=NUMERIC_CASES)
def case(request):
    return (request.param, *load_case(request.param))


def test_step_by_step_matches_y_steps(case):
    name, meta, cfg, weights, arrays = case
    x, tol = arrays["x"], meta["tolerance"]
    t = build(cfg, weights)
    ys = [t.step(x[:, i : i + 1]) for i in range(x.shape[1])]
    assert t.position == x.shape[1]
    assert_close(np.concatenate(ys, axis=1), arrays["y_steps"], *tolerance(tol), name)


def test_chunk_pattern_matches_y_full_not_candles_y_chunks(case):
    """Streaming in the fixture's chunk pattern gives the model's definition (y_full), not
    candle's chunk-dependent ring-buffer result (y_chunks)."""
    name, meta, cfg, weights, arrays = case
    x, tol = arrays["x"], meta["tolerance"]
    t = build(cfg, weights)
    y = np.concatenate([t.forward(x[:, s]) for s in chunk_slices(meta["chunks"])], axis=1)
    assert_close(y, arrays["y_full"], *tolerance(tol), name)
    if x.shape[1] > cfg["context"]:
        assert np.abs(y - arrays["y_chunks"]).max() > 1e-2


def test_one_call_matches_y_full(case):
    name, meta, cfg, weights, arrays = case
    x, tol = arrays["x"], meta["tolerance"]
    t = build(cfg, weights)
    y = t.forward(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert_close(y, arrays["y_full"], *tolerance(tol), name)
    if "y_full_window_plus1" in arrays:  # candle's answer for one long call
        assert np.abs(y - arrays["y_full_window_plus1"]).max() > 1e-3


# Half precision: bfloat16 keeps 8 significant bits (relative step 2^-8 = 3.9e-3) and float16
# 11 bits (4.9e-4). Weights, activations and every intermediate are rounded to that, through
# num_layers residual blocks, so we bound the error relative to the output's scale:
# max |y - y_ref| <= k * eps * max|y_ref| with k = 8 (measured: see docs/correctness.md).
@pytest.mark.parametrize("dtype,eps", [("bfloat16", 2.0**-8), ("float16", 2.0**-11)])
def test_half_precision(case, dtype, eps):
    name, meta, cfg, weights, arrays = case
    x = arrays["x"]
    t = build(cfg, weights, dtype=dtype)
    assert t.dtype == dtype
    # Every step of the case: past the context (mimi: 300 steps, ring of 250), so the ring
    # wraps and its oldest slots are overwritten in half precision too.
    ys = [t.step(x[:, i : i + 1]) for i in range(x.shape[1])]
    y = np.concatenate(ys, axis=1)
    ref = arrays["y_steps"]
    assert np.isfinite(y).all(), f"{name} {dtype}: non-finite outputs"
    err = np.abs(y - ref).max()
    bound = 8 * eps * np.abs(ref).max()
    assert y.dtype == np.float32
    assert err <= bound, f"{name} {dtype}: max abs err {err:.3g} > {bound:.3g}"


def test_gqa_fixture_is_refused():
    meta, cfg, weights, arrays = load_case("gqa")
    config = mimi_py.TransformerConfig(**cfg)  # the config itself is valid
    with pytest.raises(mimi_py.UnsupportedKvRepeatError, match="kv_repeat=1"):
        mimi_py.StreamingTransformer(config, weights)
