"""Batched streaming: per-row masks (`active=`), per-row resets (`reset_state(rows=)`),
`positions`. Every row must behave exactly like an independent single-row object fed only its
own active inputs, with its own resets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mimi_py
from support.models import CODEC_FILE, small_codec_config
from support.ondevice import ON_CPU, assert_row, make_codec, make_transformer
from support.reference import assert_close, assert_same

# Derandomized (or not) by the profile in tests/conftest.py.
SETTINGS = settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
    batched = make_transformer(cfg, seed=1)
    alone = [make_transformer(cfg, seed=1) for _ in range(batch)]
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
                want = alone[r].step(x[r : r + 1])
                if "gated" in name and ON_CPU:  # the candle path: rows batched in its products
                    assert_close(y[r : r + 1], want, **TOL, what=f"row {r}")
                else:  # float32 on the CPU without gating takes the planned step: the same bits
                    assert_row(y[r : r + 1], want, what=f"row {r}")
            else:
                assert not y[r].any(), "an inactive row's output must be zeros"
        assert list(batched.positions) == [a.position for a in alone]
    assert batched.position == max(a.position for a in alone)


def small_transformer(**kw):
    cfg = mimi_py.TransformerConfig(d_model=16, num_heads=2, num_layers=1, dim_feedforward=32, context=4)
    return make_transformer(cfg, seed=2, **kw)


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
    assert_same(t.step(x), control.step(x))
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


# ---------------------------------------------------------------- codec


def small_codec():
    return make_codec(CODEC_FILE, config=small_codec_config())


@pytest.fixture(scope="module")
def codecs():
    return [small_codec() for _ in range(6)]


def codec_ops(batch, frame):
    mask = st.lists(st.booleans(), min_size=batch, max_size=batch)
    frames = st.integers(0, 2).map(lambda n: n * frame)
    step = st.tuples(st.just("step"), mask, frames)
    reset = st.tuples(st.just("reset"), mask, st.just(0))
    return st.lists(st.one_of(step, step, step, reset), min_size=1, max_size=6)


@SETTINGS
@given(data=st.data(), batch=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_each_codec_row_is_an_independent_stream(codecs, data, batch, seed):
    batched, alone = codecs[0], codecs[1 : 1 + batch]
    for c in codecs:
        c.reset_state()
    rng = np.random.default_rng(seed)
    f, k = batched.frame_size, batched.num_codebooks
    for kind, mask, n in data.draw(codec_ops(batch, f), "ops"):
        active = np.array(mask, dtype=bool)
        if kind == "reset":
            batched.reset_state(rows=np.flatnonzero(active))
            for r in np.flatnonzero(active):
                alone[r].reset_state()
            continue
        pcm = (rng.standard_normal((batch, 1, n)) * 0.1).astype(np.float32)
        pcm[~active] = np.nan  # inactive rows may hold anything
        codes = batched.encode_step(pcm, active=active)
        bad = rng.integers(-5, 10**6, size=(batch, k, n // f))
        fed = np.where(active[:, None, None], codes if codes is not None else bad, bad)
        audio = batched.decode_step(fed, active=active)
        assert (codes is None) == (audio is None) == (n == 0)
        for r in range(batch):
            if not active[r]:
                assert codes is None or not codes[r].any()
                assert audio is None or not audio[r].any()
                continue
            ref = alone[r].encode_step(pcm[r : r + 1])
            if codes is None:
                assert ref is None
                continue
            assert_row(codes[r : r + 1], ref, what=f"codes of row {r}")
            # The row's own codes, decoded alone (equal to ref on the CPU; off it a flipped
            # code would move the audio far more than rounding does).
            assert_row(audio[r : r + 1], alone[r].decode_step(codes[r : r + 1]), what=f"audio of row {r}")
    frames = [a.positions[0] if a.positions.size else 0 for a in alone]
    assert list(batched.positions) == frames or batched.positions.size == 0


def test_masked_codec_steps_take_whole_frames_and_rejected_calls_change_nothing():
    c, control = small_codec(), small_codec()
    f = c.frame_size
    pcm = (np.random.default_rng(3).standard_normal((2, 1, 2 * f)) * 0.1).astype(np.float32)
    c.encode_step(pcm)
    control.encode_step(pcm)
    with pytest.raises(mimi_py.ShapeError, match="whole number of frames"):
        c.encode_step(pcm[:, :, :100], active=np.array([True, False]))
    with pytest.raises(mimi_py.ShapeError, match="active"):
        c.encode_step(pcm, active=np.array([True]))
    bad = np.full((2, c.num_codebooks, 1), 7)
    bad[0, 0, 0] = 10**9
    with pytest.raises(mimi_py.InvalidInputError):
        c.decode_step(bad, active=np.array([True, True]))
    assert_same(c.encode_step(pcm), control.encode_step(pcm))


def test_after_a_row_reset_uneven_partial_frames_need_whole_frame_chunks():
    c = small_codec()
    f = c.frame_size
    pcm = (np.random.default_rng(4).standard_normal((2, 1, f + 100)) * 0.1).astype(np.float32)
    c.encode_step(pcm)
    c.reset_state(rows=[1])
    with pytest.raises(mimi_py.ShapeError, match="partial frames"):
        c.encode_step(pcm)
    assert list(c.positions) == [1, 0]
    c.encode_step(pcm[:, :, :f])
    assert list(c.positions) == [2, 1]


# ---------------------------------------------------------------- codec forks


def test_a_codec_fork_continues_exactly_and_independently():
    c = small_codec()
    rng = np.random.default_rng(5)
    f = c.frame_size
    first = (rng.standard_normal((2, 1, f + 700)) * 0.1).astype(np.float32)
    c.encode_step(first)
    c.decode_step(c.encode(first))
    fork = c.clone()
    other = small_codec()
    other.copy_state(c)
    more = (rng.standard_normal((2, 1, 3 * f)) * 0.1).astype(np.float32)
    codes = rng.integers(0, c.cardinality, size=(2, c.num_codebooks, 2))
    expect = (c.encode_step(more), c.decode_step(codes))
    for copy in (fork, other):
        got = (copy.encode_step(more), copy.decode_step(codes))
        assert_row(got[0], expect[0], what="forked codes")
        assert_row(got[1], expect[1], what="forked audio")
    # independent: stepping the original again does not move the fork
    c.encode_step(more)
    assert list(fork.positions) == list(c.positions - 3)


def test_copying_a_codec_state_checks_config_and_batch():
    c = small_codec()
    seeded = make_codec(config=c.config, seed=1)
    other = make_codec(config=c.config.replace(quantizer_n_q=2), seed=1)
    with pytest.raises(mimi_py.IncompatibleStateError, match="config"):
        seeded.copy_state(other)
    with pytest.raises(mimi_py.IncompatibleStateError, match="layout"):
        seeded.copy_state(c)
    a, b = small_codec(), small_codec()
    f = a.frame_size
    a.encode_step(np.zeros((2, 1, f), np.float32))
    b.encode_step(np.zeros((3, 1, f), np.float32))
    with pytest.raises(mimi_py.IncompatibleStateError, match="batch"):
        a.copy_state(b)
    assert list(a.positions) == [1, 1]


def test_a_rejected_first_masked_step_does_not_fix_the_batch_size():
    c = small_codec()
    with pytest.raises(mimi_py.ShapeError, match="whole number of frames"):
        c.encode_step(np.zeros((2, 1, 100), np.float32), active=np.array([True, False]))
    assert c.positions.size == 0
    assert c.encode_step(np.zeros((3, 1, c.frame_size), np.float32)).shape[0] == 3
