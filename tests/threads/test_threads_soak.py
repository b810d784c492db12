"""Threads, long runs and interrupts.

* Threads: 8 Python threads hammering ONE StreamingTransformer (or one MimiCodec) with mixed
  calls, and 8 threads each with its own object. No crash, no deadlock (every join has a
  timeout and every thread must have finished), and the results are exactly those of a
  serial run wherever they are determined: independent objects; identical steps on a shared
  object (whatever the interleaving, the k-th call sees the same history, so the multiset of
  outputs equals the serial run's); offline codec calls.
* Long runs: a shortened in-process version of the soak suite (benches/suites/soak.py) with a small config; the
  streaming state's size (``state_nbytes``) must stop growing after ``context`` steps and
  the RSS must stay flat. Memory is measured, not wall time.
* Interrupts: Ctrl-C during a long offline ``MimiCodec.encode`` (real-size seeded model, 60 s
  of audio) in a subprocess, sent once the call is known to be computing.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import numpy as np
import pytest

import mimi_py as M
from support.paths import CODEC_DIR, REPO

JOIN_TIMEOUT = 120.0
CFG = M.TransformerConfig(d_model=32, num_heads=2, num_layers=2, dim_feedforward=64, context=8)
D = CFG.d_model
STATE_BOUND = 2 * CFG.num_layers * 1 * CFG.context * D * 4  # 2 * layers * batch * context * d, f32


def run_threads(targets, timeout=JOIN_TIMEOUT):
    """Starts one thread per callable, waits for all with a deadline; returns their results.

    Fails if any thread raised or is still running at the deadline (a deadlock or a hang)."""
    results = [None] * len(targets)
    errors = []
    barrier = threading.Barrier(len(targets))

    def wrap(i, fn):
        try:
            barrier.wait(timeout=30)
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001 - PanicException is a BaseException
            errors.append((i, e))

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(targets)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout
    for th in threads:
        th.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [i for i, th in enumerate(threads) if th.is_alive()]
    assert not alive, f"threads {alive} still running after {timeout} s: deadlock or hang"
    assert not errors, f"threads raised: {[(i, type(e).__name__, str(e)) for i, e in errors]}"
    return results


def as_key(a) -> bytes:
    return b"None" if a is None else a.tobytes() + str(a.shape).encode()


# ---------------------------------------------------------------- one transformer, 8 threads


def test_identical_steps_from_8_threads_on_one_transformer_are_atomic():
    """Every step sees the history of the steps before it, whatever the interleaving: with
    the same input each time, the outputs are exactly the serial run's, in some order."""
    n_threads, n_steps = 8, 30
    x = np.random.default_rng(0).standard_normal((1, 1, D)).astype(np.float32)
    shared = M.StreamingTransformer(CFG, seed=1)
    serial_model = M.StreamingTransformer(CFG, seed=1)
    serial = [serial_model.step(x) for _ in range(n_threads * n_steps)]

    def work():
        return [shared.step(x) for _ in range(n_steps)]

    outs = [y for ys in run_threads([work] * n_threads) for y in ys]
    assert shared.position == n_threads * n_steps
    assert Counter(map(as_key, outs)) == Counter(map(as_key, serial))
    np.testing.assert_array_equal(shared.step(x), serial_model.step(x))


def test_8_threads_hammer_one_transformer_with_mixed_calls():
    t = M.StreamingTransformer(CFG, seed=2)
    other = M.StreamingTransformer(CFG, seed=2)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((16, 1, 5, D)).astype(np.float32)
    ops = Counter()
    lock = threading.Lock()
    fed = [0]  # tokens given to `t` or `other` so far, counted before each call that steps them

    def feed(tokens):
        with lock:
            fed[0] += tokens

    def work(seed):
        r = random.Random(seed)
        for _ in range(40):
            op = r.choice(
                [
                    "step",
                    "step",
                    "forward",
                    "reset",
                    "copy_from_other",
                    "copy_into_other",
                    "clone",
                    "deepcopy",
                    "position",
                    "state_dict",
                    "nbytes",
                    "batch",
                    "other_step",
                    "step_none",
                ]
            )
            x = xs[r.randrange(16)]
            if op == "step":
                feed(1)
                y = t.step(x[:, :1])
                assert y.shape == (1, 1, D)
            elif op == "forward":
                feed(5)
                y = t.forward(x)
                assert y.shape == (1, 5, D)
            elif op == "reset":
                t.reset_state()
            elif op == "copy_from_other":
                t.copy_state(other)
            elif op == "copy_into_other":
                other.copy_state(t)
            elif op == "clone":
                c = t.clone()
                c.step(x[:, :1])
            elif op == "deepcopy":
                copy.deepcopy(t).forward(x[:, :2])
            elif op == "position":
                # a whole count, read while other threads step, copy and reset: never more than
                # the tokens stepped into either object (copy_state moves positions between them)
                position = t.position
                with lock:
                    assert type(position) is int and position <= fed[0], (position, fed[0])
            elif op == "state_dict":
                assert "layers.0.mlp.fc1.weight" in t.state_dict()
            elif op == "nbytes":
                assert 0 <= t.state_nbytes <= STATE_BOUND
            elif op == "batch":
                assert t.batch_size in (None, 1)
            elif op == "other_step":
                feed(1)
                other.step(x[:, :1])
            elif op == "step_none":
                assert t.step(None) is None
            with lock:
                ops[op] += 1

    run_threads([lambda s=s: work(s) for s in range(8)])
    assert sum(ops.values()) == 8 * 40
    assert t.state_nbytes <= STATE_BOUND and other.state_nbytes <= STATE_BOUND
    # still usable, and a reset is indistinguishable from a fresh object
    t.reset_state()
    fresh = M.StreamingTransformer(CFG, seed=2)
    np.testing.assert_array_equal(t.forward(xs[0]), fresh.forward(xs[0]))
    other.copy_state(t)
    np.testing.assert_array_equal(other.forward(xs[1]), fresh.forward(xs[1]))


def script(seed):
    """A deterministic mix of calls on one private object; returns every output."""
    t = M.StreamingTransformer(CFG, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 40, D)).astype(np.float32)
    outs = [t.forward(x[:, :7])]
    outs += [t.step(x[:, i : i + 1]) for i in range(7, 15)]
    fork = t.clone()
    outs.append(fork.forward(x[:, 15:30]))
    outs.append(t.forward(x[:, 15:25]))
    t.copy_state(fork)
    outs.append(t.forward(x[:, 30:40]))
    t.reset_state()
    outs.append(t.forward(x[:, :12]))
    outs.append(np.array([t.position, t.state_nbytes], dtype=np.float32))
    return outs


def test_8_threads_with_their_own_transformers_equal_the_serial_run():
    serial = [script(s) for s in range(8)]
    threaded = run_threads([lambda s=s: script(s) for s in range(8)])
    for s in range(8):
        assert len(threaded[s]) == len(serial[s])
        for a, b in zip(threaded[s], serial[s]):
            np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- one codec, 8 threads

CODEC = CODEC_DIR
FRAME = 1920


def small_codec():
    cfg = M.CodecConfig(**json.loads((CODEC / "mimi_small_candle_config.json").read_text()))
    return M.MimiCodec(CODEC / "mimi_small.safetensors", config=cfg)


def test_one_codec_shared_by_8_threads_offline_and_streaming():
    """Concurrent encode + encode_step + decode_step + decode on one codec: offline calls equal
    the serial ones; identical streaming calls give the serial stream's outputs in some
    order; nothing crashes or hangs."""
    codec, ref = small_codec(), small_codec()
    rng = np.random.default_rng(3)
    clips = [(rng.standard_normal((1, 1, 3 * FRAME + 200 * i)) * 0.1).astype(np.float32) for i in range(3)]
    chunk = (rng.standard_normal((1, 1, FRAME)) * 0.1).astype(np.float32)
    codes = rng.integers(0, 64, (1, 4, 1)).astype(np.uint32)
    n_stream = 6
    serial_enc = [ref.encode(c) for c in clips]
    serial_dec = ref.decode(serial_enc[0])
    serial_enc_stream = [ref.encode_step(chunk) for _ in range(2 * n_stream)]
    serial_dec_stream = [ref.decode_step(codes) for _ in range(2 * n_stream)]

    def offline(i):
        return lambda: [codec.encode(clips[i]) for _ in range(2)]

    def enc_stream():
        return [codec.encode_step(chunk) for _ in range(n_stream)]

    def dec_stream():
        return [codec.decode_step(codes) for _ in range(n_stream)]

    def dec_offline():
        return [codec.decode(serial_enc[0]) for _ in range(2)]

    res = run_threads(
        [offline(0), offline(1), offline(2), enc_stream, enc_stream, dec_stream, dec_stream, dec_offline]
    )
    for i in range(3):
        for r in res[i]:
            np.testing.assert_array_equal(r, serial_enc[i])
    assert Counter(map(as_key, res[3] + res[4])) == Counter(map(as_key, serial_enc_stream))
    assert Counter(map(as_key, res[5] + res[6])) == Counter(map(as_key, serial_dec_stream))
    for r in res[7]:
        np.testing.assert_array_equal(r, serial_dec)


SPIN_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    sys.path[:0] = ["tests/threads", "tests"]  # this module, and the support package it imports
    import mimi_py as M
    from test_threads_soak import small_codec, FRAME
    codec = small_codec()
    pcm = (np.random.default_rng(5).standard_normal((1, 1, 7 * FRAME + 11)) * 0.1).astype(np.float32)
    codes = [codec.encode_step(pcm[..., i : i + 700]) for i in range(0, pcm.shape[-1], 700)]
    codes = np.concatenate([c for c in codes if c is not None], axis=-1)
    audio = codec.decode(codec.encode(pcm))
    print(json.dumps({"codes": codes.tolist(), "audio": audio.ravel().tolist()}))
    """
)


@pytest.mark.parametrize("spin", ["0", "1"])
def test_pool_spin_setting_changes_no_result(spin):
    """MIMI_PY_SPIN=0 (idle workers park) and the default (they spin for the length of a call)
    give the same bits as each other and as a 1-thread pool, streaming and offline."""
    out = {}
    for name, env in (
        ("threads2", {"MIMI_PY_SPIN": spin, "RAYON_NUM_THREADS": "2"}),
        ("threads1", {"RAYON_NUM_THREADS": "1"}),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", SPIN_CHILD],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, **env),
            cwd=str(REPO),
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out[name] = json.loads(proc.stdout)
    assert len(out["threads1"]["codes"][0][0]) == 7
    assert out["threads2"] == out["threads1"]


def test_one_codec_hammered_with_resets():
    codec = small_codec()
    rng = np.random.default_rng(4)
    pcm = (rng.standard_normal((8, 1, 1, 1000)) * 0.1).astype(np.float32)
    codes = rng.integers(0, 64, (8, 1, 4, 2)).astype(np.uint32)

    def work(seed):
        r = random.Random(seed)
        for _ in range(12):
            op = r.choice(
                [
                    "encode_step",
                    "encode_step",
                    "decode_step",
                    "decode_step",
                    "reset",
                    "encode",
                    "decode",
                    "props",
                ]
            )
            k = r.randrange(8)
            if op == "encode_step":
                out = codec.encode_step(pcm[k])
                assert out is None or (out.shape[:2] == (1, 4) and out.dtype == np.uint32)
            elif op == "decode_step":
                out = codec.decode_step(codes[k])
                assert out is None or out.shape[:2] == (1, 1)
            elif op == "reset":
                codec.reset_state()
            elif op == "encode":
                assert codec.encode(pcm[k]).shape == (1, 4, 1)
            elif op == "decode":
                assert codec.decode(codes[k]).shape == (1, 1, 2 * FRAME)
            else:
                assert codec.frame_size == FRAME and codec.num_codebooks == 4

    run_threads([lambda s=s: work(s) for s in range(8)])
    # usable, and a reset is a fresh stream
    codec.reset_state()
    fresh = small_codec()
    x = (rng.standard_normal((1, 1, 2 * FRAME)) * 0.1).astype(np.float32)
    np.testing.assert_array_equal(codec.encode_step(x), fresh.encode_step(x))
    np.testing.assert_array_equal(codec.decode_step(codes[0]), fresh.decode_step(codes[0]))


# ---------------------------------------------------------------- memory kept between offline calls

HEAP_CHILD = textwrap.dedent(
    """
    import json
    import numpy as np
    import mimi_py as M

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    codec = M.MimiCodec(seed=0)  # the real architecture
    pcm = (np.random.default_rng(0).standard_normal((1, 1, 10 * 24000)) * 0.1).astype(np.float32)
    before = rss()
    after = []
    for _ in range(5):
        codes = codec.encode(pcm)
        after.append(rss())
    print(json.dumps({"before": before, "after": after, "frames": codes.shape[-1]}))
    """
)


@pytest.mark.parametrize("keep_mb", ["0", "256"])
def test_offline_calls_keep_at_most_the_heap_budget(keep_mb):
    """After an offline call the allocator keeps its free memory for the next call up to
    MIMI_PY_HEAP_KEEP_MB (256 by default); 0 gives it all back. Either way, back-to-back
    calls do not grow the process."""
    env = dict(os.environ, MIMI_PY_HEAP_KEEP_MB=keep_mb, RAYON_NUM_THREADS="2")
    proc = subprocess.run(
        [sys.executable, "-c", HEAP_CHILD], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["frames"] == 125
    mb = 1 << 20
    grown = [(a - r["before"]) / mb for a in r["after"]]
    # The kept memory is reused: later calls add at most some fragmentation between the
    # pool's threads (measured: up to ~25 MB, then flat).
    assert max(grown) - grown[0] < 40, grown
    if keep_mb == "0":
        # Trimmed: only the allocator's bookkeeping, the pool threads' buffers and the
        # transformer rings stay. Measured on a 2-core AMD EPYC: 24-54 MB (43-48 MB before
        # the products were cut into fixed depth blocks: more, smaller `gemm` calls, whose
        # packing buffers the allocator keeps in its arenas).
        assert max(grown) < 64, grown
    else:
        # A 10 s encode's working memory (~90-120 MB measured) stays, below the budget.
        assert 64 <= grown[0] < 256, grown


# ---------------------------------------------------------------- long runs (shortened soak)


def load_soak():
    spec = importlib.util.spec_from_file_location("mimi_soak_bench", REPO / "benches" / "suites" / "soak.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_soak_transformer_state_is_bounded():
    soak = load_soak()
    t = M.StreamingTransformer(CFG, seed=0)
    steps, every = 3000, 50
    samples = soak.soak_transformer(t, steps, every, seed=0)
    assert samples[-1]["position"] == steps == t.position
    nbytes = [s["state_nbytes"] for s in samples]
    full = [s["state_nbytes"] for s in samples if s["position"] >= CFG.context]
    assert max(nbytes) <= STATE_BOUND, (max(nbytes), STATE_BOUND)
    assert len(set(full)) == 1, f"state_nbytes keeps changing after context steps: {sorted(set(full))}"
    rss = [s["rss_kib"] for s in samples]
    growth = rss[-1] - rss[len(rss) // 4]
    assert growth < 8 * 1024, f"RSS grew by {growth} KiB over {steps} steps after warm-up"
    summary = soak.summarize(samples)
    assert summary["state_nbytes_end"] == summary["state_nbytes_peak"] <= STATE_BOUND


def test_soak_codec_memory_is_flat():
    soak = load_soak()
    codec = small_codec()
    # 24 s: 300 frames at 12.5 Hz, 600 steps of the encoder transformer at 25 Hz, both well
    # past the transformers' context (250).
    samples = soak.soak_codec(codec, 24.0, sample_every=25, decode=True)
    assert samples[-1]["frames"] == 300
    rss = [s["rss_kib"] for s in samples]
    growth = rss[-1] - rss[len(rss) // 4]
    assert growth < 16 * 1024, f"RSS grew by {growth} KiB while streaming after warm-up"


# ---------------------------------------------------------------- interrupts

INTERRUPT_CHILD = textwrap.dedent(
    """
    import signal, threading, time
    import numpy as np, mimi_py as M
    # A process started in the background by a non-interactive shell inherits SIGINT as
    # ignored, and Python then installs no KeyboardInterrupt handler: restore it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    codec = M.MimiCodec(seed=0)
    probe = (np.random.default_rng(1).standard_normal(2 * 1920) * 0.1).astype(np.float32)
    before = codec.encode(probe)
    x = (np.random.default_rng(0).standard_normal(24000 * 60) * 0.1).astype(np.float32)
    calling = threading.Event()

    def announce_running():
        # Nothing but the encode runs in this process once `calling` is set, so CPU time
        # spent after that was spent inside the call: it is computing.
        calling.wait()
        t0 = time.process_time()
        while time.process_time() - t0 < 0.2:
            time.sleep(0.005)
        print("RUNNING", flush=True)

    threading.Thread(target=announce_running, daemon=True).start()
    try:
        calling.set()
        codec.encode(x)
        print("FINISHED", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    after = codec.encode(probe)
    print("USABLE", bool(np.array_equal(before, after)), flush=True)
    """
)
HANG_GUARD = 180.0  # seconds: only a hung child takes this long


def read_lines(stream, lines: queue.Queue) -> None:
    """Puts each line of `stream` on `lines`, then None at its end."""
    for line in stream:
        lines.put(line.strip())
    lines.put(None)


def test_ctrl_c_interrupts_a_long_offline_encode():
    """SIGINT while a 60 s encode is computing: KeyboardInterrupt comes out of the call, and
    the codec still works.

    The signal is sent on a condition, not after a delay: once the child reports that the
    call has spent 0.2 s of CPU time. With one compute thread, the 60 s encode (real-size
    model) needs seconds of CPU time on any machine, far more than the 50 ms within which the
    waiting call checks for signals, so the signal always lands while the call runs."""
    env = dict(os.environ, RUST_BACKTRACE="0", RAYON_NUM_THREADS="1")
    p = subprocess.Popen(
        [sys.executable, "-c", INTERRUPT_CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(REPO),
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(p.stdout, lines), daemon=True)
    reader.start()
    seen = []
    try:
        while not seen or seen[-1] != "RUNNING":
            line = lines.get(timeout=HANG_GUARD)
            assert line is not None and line != "FINISHED", f"no RUNNING before the end: {seen + [line]}"
            seen.append(line)
        p.send_signal(signal.SIGINT)
        while (line := lines.get(timeout=HANG_GUARD)) is not None:
            seen.append(line)
        assert p.wait(timeout=HANG_GUARD) == 0, seen[-20:]
        assert "INTERRUPTED" in seen, f"the encode was not interrupted: {seen[-20:]}"
        assert "USABLE True" in seen, f"the codec is not usable after the interrupt: {seen[-20:]}"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        reader.join(timeout=30)  # the pipe is at its end once the child is gone
        p.stdout.close()
