"""Batched streaming: per-row masks (`active=`), per-row resets (`reset_state(rows=)`),
`positions`. Every row must behave exactly like an independent single-row object fed only its
own active inputs, with its own resets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mimi_py

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
TOL = dict(atol=1e-5, rtol=1e-5)

TRANSFORMER_CONFIGS = {
    "rope": dict(d_model=32, num_heads=4, num_layers=2, dim_feedforward=64, context=5),
    "sin-rms-gated": dict(
        d_model=32,
        num_heads=2,
        num_layers=2,
        dim_feedforward=48,
        context=3,
        positional_embedding="sin",
        norm="rms_norm",
        gating="silu",
        layer_scale=None,
    ),
}


def transformer_ops(batch):
    """A schedule of calls: steps with a mask, resets of some rows, unmasked forwards."""
    mask = st.lists(st.booleans(), min_size=batch, max_size=batch)
    step = st.tuples(st.just("step"), mask, st.integers(1, 3))
    reset = st.tuples(st.just("reset"), mask, st.just(0))
    forward = st.tuples(st.just("forward"), st.just([True] * batch), st.integers(1, 4))
    return st.lists(st.one_of(step, step, reset, forward), min_size=1, max_size=10)


@pytest.mark.parametrize("name", sorted(TRANSFORMER_CONFIGS))
@SETTINGS
@given(data=st.data(), batch=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_each_transformer_row_is_an_independent_stream(name, data, batch, seed):
    cfg = mimi_py.TransformerConfig(**TRANSFORMER_CONFIGS[name])
    batched = mimi_py.StreamingTransformer(cfg, seed=1)
    alone = [mimi_py.StreamingTransformer(cfg, seed=1) for _ in range(batch)]
    rng = np.random.default_rng(seed)
    for kind, mask, t in data.draw(transformer_ops(batch), "ops"):
        if kind == "reset":
            batched.reset_state(rows=np.array(mask, dtype=bool))
            for r in np.flatnonzero(mask):
                alone[r].reset_state()
            continue
        x = rng.standard_normal((batch, t, cfg.d_model)).astype(np.float32)
        active = np.array(mask, dtype=bool)
        x[~active] = np.nan  # inactive rows may hold anything
        if kind == "forward":
            y = batched.forward(x)
        else:
            y = batched.step(x, active=active)
        for r in range(batch):
            if active[r]:
                np.testing.assert_allclose(y[r : r + 1], alone[r].step(x[r : r + 1]), **TOL)
            else:
                assert not y[r].any(), "an inactive row's output must be zeros"
        assert list(batched.positions) == [a.position for a in alone]
    assert batched.position == max(a.position for a in alone)


def small_transformer(**kw):
    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32, context=4)
    return mimi_py.StreamingTransformer(cfg, seed=2, **kw)


def test_rejected_masked_steps_change_no_row():
    t, control = small_transformer(), small_transformer()
    x = np.random.default_rng(0).standard_normal((3, 2, 16)).astype(np.float32)
    t.step(x)
    control.step(x)
    bad_x = x.copy()
    bad_x[1, 0, 0] = np.nan
    with pytest.raises(mimi_py.InvalidInputError):
        t.step(bad_x, active=np.array([True, True, False]))
    with pytest.raises(mimi_py.ShapeError, match="active"):
        t.step(x, active=np.array([True, False]))
    with pytest.raises(mimi_py.DTypeError, match="active"):
        t.step(x, active=np.array([1, 0, 1]))
    with pytest.raises(mimi_py.ShapeError, match="out of range"):
        t.reset_state(rows=[3])
    with pytest.raises(mimi_py.ShapeError, match="mask"):
        t.reset_state(rows=np.array([True, False]))
    np.testing.assert_array_equal(t.step(x), control.step(x))
    assert list(t.positions) == [4, 4, 4]


def test_positions_start_empty_and_count_each_rows_steps():
    t = small_transformer()
    assert t.positions.shape == (0,) and t.positions.dtype == np.int64
    x = np.zeros((3, 1, 16), np.float32)
    t.step(x, active=np.array([True, False, True]))
    t.step(x)
    t.reset_state(rows=[2])
    t.step(x, active=np.array([False, False, True]))
    assert list(t.positions) == [2, 1, 1]
    assert t.position == 2
    t.reset_state()
    assert t.positions.shape == (0,) and t.batch_size is None
