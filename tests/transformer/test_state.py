"""The streaming state: chunk invariance, exact copy_state, reset == fresh, unbounded streams;
copy_state between generated pairs of transformers either continues exactly or changes neither."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mimi_py
from support.hostile import PROFILE, assert_allowed, call, count_case, same
from support.ondevice import make_transformer
from support.reference import assert_close, assert_same, load_case

CASES = ["small_rope", "small_sin_rms_gated", "mimi"]
_cache: dict = {}


def case(name):
    if name not in _cache:
        meta, cfg, weights, arrays = load_case(name)
        _cache[name] = (meta, mimi_py.TransformerConfig(**cfg), weights, arrays)
    return _cache[name]


def model(name):
    meta, cfg, weights, arrays = case(name)
    return make_transformer(cfg, weights)


def run_chunks(t, x, sizes, use_step=False):
    out, s = [], 0
    for n in sizes:
        f = t.step if use_step else t.forward
        out.append(f(x[:, s : s + n]))
        s += n
    assert s == x.shape[1]
    return np.concatenate(out, axis=1)


def chunkings(length):
    """Random splits of `length` into positive chunk sizes (some longer than the context)."""
    return st.lists(st.integers(1, length), min_size=1, max_size=12).map(
        lambda cuts: np.diff(sorted({0, length, *[c % length for c in cuts]})).tolist()
    )


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_chunking_gives_y_full(name, data):
    meta, cfg, weights, arrays = case(name)
    x, tol = arrays["x"], meta["tolerance"]
    sizes = data.draw(chunkings(x.shape[1]), label="chunks")
    use_step = data.draw(st.booleans(), label="use_step")
    t = model(name)
    y = run_chunks(t, x, sizes, use_step)
    assert_close(y, arrays["y_full"], tol["atol"], tol["rtol"], f"{name} chunks={sizes}")
    assert t.position == x.shape[1]


def test_chunks_longer_than_context():
    meta, cfg, weights, arrays = case("small_rope")
    x, tol = arrays["x"], meta["tolerance"]
    c = cfg.context
    for sizes in (
        [c + 1, x.shape[1] - c - 1],
        [2 * c + 5, x.shape[1] - 2 * c - 5],
        [5, c, c, x.shape[1] - 5 - 2 * c],
    ):
        y = run_chunks(model("small_rope"), x, sizes)
        assert_close(y, arrays["y_full"], tol["atol"], tol["rtol"], f"chunks={sizes}")


def branch_reference(name, prefix, a):
    """Independent replay: a fresh model over prefix+a, tail only."""
    t = model(name)
    t.forward(prefix)
    return t.forward(a)


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_copy_state_branches_are_independent(name, data):
    meta, cfg, weights, arrays = case(name)
    x = arrays["x"]
    T = x.shape[1]
    p = data.draw(st.integers(1, T - 2), label="branch point")
    rng = np.random.default_rng(p)
    prefix = x[:, :p]
    a = x[:, p:]
    b = rng.standard_normal(a.shape).astype(np.float32)
    pre_chunks = data.draw(chunkings(p), label="prefix chunks")

    src = model(name)
    y_prefix = run_chunks(src, prefix, pre_chunks)
    dst = model(name)
    dst.forward(rng.standard_normal((x.shape[0], 3, cfg.d_model)).astype(np.float32))  # junk state
    dst.copy_state(src)
    assert dst.position == src.position == p
    # Interleave the two continuations step by step: a shared buffer would show up here.
    ya, yb = [], []
    for i in range(a.shape[1]):
        ya.append(src.step(a[:, i : i + 1]))
        yb.append(dst.step(b[:, i : i + 1]))
    ya, yb = np.concatenate(ya, 1), np.concatenate(yb, 1)
    tol = meta["tolerance"]
    assert_close(y_prefix, arrays["y_full"][:, :p], tol["atol"], tol["rtol"], "prefix")
    assert_close(ya, arrays["y_full"][:, p:], tol["atol"], tol["rtol"], "branch a (original)")
    assert_close(yb, branch_reference(name, prefix, b), 1e-5, 1e-5, "branch b (copy)")


def test_clone_and_deepcopy_fork_the_stream():
    meta, cfg, weights, arrays = case("small_rope")
    x = arrays["x"]
    t = model("small_rope")
    t.forward(x[:, :20])
    for fork in (t.clone(), copy.deepcopy(t), copy.copy(t)):
        assert fork.position == 20
        y_fork = fork.forward(x[:, 20:])
        assert_close(y_fork, arrays["y_full"][:, 20:], what="fork")
    # the original was not advanced by its forks
    assert t.position == 20
    assert_close(t.forward(x[:, 20:]), arrays["y_full"][:, 20:], what="original")


def test_copy_state_from_fresh_resets_position():
    meta, cfg, weights, arrays = case("small_rope")
    x = arrays["x"]
    a, b = model("small_rope"), model("small_rope")
    a.forward(x[:, :30])
    a.copy_state(b)
    assert a.position == 0 and a.batch_size is None
    assert_close(a.forward(x), arrays["y_full"], what="after copying a fresh state")


def test_copy_state_with_itself_is_a_no_op():
    meta, cfg, weights, arrays = case("small_rope")
    x = arrays["x"]
    t = model("small_rope")
    t.forward(x[:, :10])
    t.copy_state(t)
    assert_close(t.forward(x[:, 10:]), arrays["y_full"][:, 10:], what="self copy")


def small_long_config():
    return mimi_py.TransformerConfig(
        d_model=16, num_heads=2, num_layers=2, dim_feedforward=32, context=4, max_seq_len=8
    )


def test_reset_is_fresh_after_many_steps_past_max_seq_len():
    cfg = small_long_config()
    rng = np.random.default_rng(0)
    probe = rng.standard_normal((1, 12, cfg.d_model)).astype(np.float32)
    fresh = make_transformer(cfg, seed=3).forward(probe)
    t = make_transformer(cfg, seed=3)
    for k in range(40):  # 40 streams of up to 12 steps: far past max_seq_len=8 in total
        t.forward(rng.standard_normal((2, 1 + k % 12, cfg.d_model)).astype(np.float32))
        t.reset_state()
        assert t.position == 0 and t.state_nbytes == 0 and t.batch_size is None
    assert_same(t.forward(probe), fresh)


def test_long_stream_has_bounded_state_and_keeps_counting():
    cfg = small_long_config()
    t = make_transformer(cfg, seed=1)
    rng = np.random.default_rng(1)
    sizes = []
    for i in range(3000):  # 375x max_seq_len
        y = t.step(rng.standard_normal((1, 1, cfg.d_model)).astype(np.float32))
        assert np.isfinite(y).all()
        if i % 500 == 0:
            sizes.append(t.state_nbytes)
    assert t.position == 3000
    # ring buffers of `context` keys and values per layer, nothing more
    expected = 2 * cfg.num_layers * 1 * cfg.context * cfg.d_model * 4
    assert set(sizes) == {expected}


def test_long_stream_matches_a_stream_started_late():
    """Rope/sin angles come from the absolute position: far into a stream, the output still
    depends only on the last `context` inputs (checked against a replay of the window).
    With rope, attention is relative, so the replay from position 0 must agree."""
    cfg = small_long_config()
    rng = np.random.default_rng(2)
    xs = rng.standard_normal((1, 20_000 + 10, cfg.d_model)).astype(np.float32)
    t = make_transformer(cfg, seed=4)
    t.forward(xs[:, :20_000])
    tail = t.forward(xs[:, 20_000:])
    # the last output depends on the last `context` positions of every layer: all of the
    # influence is within num_layers * (context - 1) steps back
    window = cfg.num_layers * (cfg.context - 1) + 1
    r = make_transformer(cfg, seed=4)
    replay = r.forward(xs[:, 20_010 - window - 5 :])[:, -10:]
    assert_close(tail[:, -1], replay[:, -1], 1e-4, 1e-4, "late output vs windowed replay")


def test_batch_size_is_part_of_the_stream():
    meta, cfg, weights, arrays = case("small_rope")
    x = arrays["x"]  # batch 2
    t = model("small_rope")
    t.forward(x[:, :5])
    assert t.batch_size == 2
    with pytest.raises(mimi_py.ShapeError, match="reset_state"):
        t.forward(x[:1, 5:6])
    assert t.position == 5  # the rejected call changed nothing
    assert_close(t.forward(x[:, 5:]), arrays["y_full"][:, 5:], what="after rejected call")
    t.reset_state()
    y1 = t.forward(x[:1])
    assert_close(y1, arrays["y_full"][:1], what="batch 1 after reset")


# ---------------------------------------------------------------- copy_state, generated pairs


@st.composite
def copy_state_cfg(draw):
    return {
        "d_model": draw(st.sampled_from([16, 32])),
        "num_heads": draw(st.sampled_from([2, 4])),
        "num_layers": draw(st.integers(1, 2)),
        "context": draw(st.sampled_from([4, 8])),
        "dim_feedforward": 32,
    }


@PROFILE
@given(
    a_kw=copy_state_cfg(),
    b_kw=copy_state_cfg(),
    a_dtype=st.sampled_from(["float32", "float32", "bfloat16"]),
    b_dtype=st.sampled_from(["float32", "float32", "bfloat16"]),
    same_seed=st.booleans(),
    a_hist=st.tuples(st.integers(1, 2), st.sampled_from([0, 3, 11])),
    b_hist=st.tuples(st.integers(1, 2), st.sampled_from([0, 3, 11])),
    seed=st.integers(0, 2**16),
)
def test_copy_state_either_continues_as_the_source_or_changes_neither_object(
    a_kw, b_kw, a_dtype, b_dtype, same_seed, a_hist, b_hist, seed
):
    """dst.copy_state(src): either dst continues exactly as src, or both are unchanged."""
    count_case("copy_state")
    if same_seed and np.random.default_rng(seed).random() < 0.5:
        b_kw, b_dtype = a_kw, a_dtype  # often compatible
    ca, cb = mimi_py.TransformerConfig(**a_kw), mimi_py.TransformerConfig(**b_kw)
    sa, sb = 5, (5 if same_seed else 6)
    dst, dst_ctl = (
        make_transformer(ca, seed=sa, dtype=a_dtype),
        make_transformer(ca, seed=sa, dtype=a_dtype),
    )
    src, src_ctl = (
        make_transformer(cb, seed=sb, dtype=b_dtype),
        make_transformer(cb, seed=sb, dtype=b_dtype),
    )
    rng = np.random.default_rng(seed)
    for t, ctl, (bb, n) in ((dst, dst_ctl, a_hist), (src, src_ctl, b_hist)):
        if n:
            h = rng.standard_normal((bb, n, t.d_model)).astype(np.float32)
            same(t.forward(h), ctl.forward(h), "history")
    kind, r = call(dst.copy_state, src)
    compatible = (
        a_kw["num_layers"] == b_kw["num_layers"]
        and a_kw["d_model"] == b_kw["d_model"]
        and a_kw["num_heads"] == b_kw["num_heads"]
        and a_kw["context"] == b_kw["context"]
        and a_dtype == b_dtype
    )
    if kind == "err":
        assert not compatible, f"compatible copy_state refused: {r}"
        allowed = (
            (mimi_py.DepthMismatchError,)
            if a_kw["num_layers"] != b_kw["num_layers"]
            else (mimi_py.IncompatibleStateError,)
        )
        assert_allowed(r, allowed, "copy_state")
        if a_kw["num_layers"] == b_kw["num_layers"]:
            assert not isinstance(r, mimi_py.DepthMismatchError), r
        for t, ctl in ((dst, dst_ctl), (src, src_ctl)):
            assert t.position == ctl.position
            b = t.batch_size or 1
            x = rng.standard_normal((b, 2, t.d_model)).astype(np.float32)
            same(t.forward(x), ctl.forward(x), "state after a refused copy_state")
        return
    assert compatible, "incompatible copy_state accepted"
    assert dst.position == src.position and dst.batch_size == src.batch_size
    assert dst.state_nbytes == src.state_nbytes
    b = src.batch_size or 1
    x = rng.standard_normal((b, 2, src.d_model)).astype(np.float32)
    ys = src.forward(x)
    yd = dst.forward(x)
    if a_kw == b_kw and a_dtype == b_dtype and sa == sb:
        same(yd, ys, "dst continues exactly as src")
    for wrong in (None, 1, "x", mimi_py.TransformerConfig(**a_kw)):
        kind, e = call(dst.copy_state, wrong)
        assert kind == "err"
        assert_allowed(e, (TypeError,), "copy_state(wrong type)")
