"""The `serving` suite's measurement (run in a child process by benches/run.py through
worker.py): how many real-time streams one batched codec holds.

One frame of serving is one `encode_step` then one `decode_step` of B rows (80 ms of audio per
row). B streams are held in real time when the p99 of that frame time stays under 80 ms. The
masked case steps B rows of which only half are active: skipped rows must cost (almost)
nothing, so it is compared with B/2 rows all active.
"""

from __future__ import annotations

import time

import numpy as np

import common

REAL_TIME_US = 80_000.0


def _frames(codec, batch, active, frames, warmup, rng):
    """Per-frame seconds of `frames` masked encode+decode steps of `batch` rows."""
    f = codec.frame_size
    codec.reset_state()
    times = []
    for i in range(warmup + frames):
        pcm = (rng.standard_normal((batch, 1, f)) * 0.1).astype(np.float32)
        t0 = time.perf_counter()
        codes = codec.encode_step(pcm, active=active)
        codec.decode_step(codes, active=active)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def task_serving(spec, make_engine):
    """Frame times for each batch size in spec["batches"], all rows active, and the masked
    case (half of the largest batch active) next to half the batch all active."""
    eng, load_s = make_engine(dict(spec, engine="mimi_py"))
    codec = eng.codec
    rng = np.random.default_rng(0)
    frames, warmup = spec["frames"], spec["warmup"]
    rows = []
    for b in spec["batches"]:
        t = _frames(codec, b, np.ones(b, bool), frames, warmup, rng)
        s = common.summary_us(t)
        rows.append({"batch": b, **s, "real_time": s["p99_us"] <= REAL_TIME_US})
    held = max((r["batch"] for r in rows if r["real_time"]), default=0)
    big = max(spec["batches"])
    half = np.zeros(big, bool)
    half[::2] = True
    masked = common.summary_us(_frames(codec, big, half, frames, warmup, rng))
    dense = common.summary_us(
        _frames(codec, int(half.sum()), np.ones(int(half.sum()), bool), frames, warmup, rng)
    )
    return {
        "engine": "mimi_py",
        "version": eng.version(),
        **eng.describe(),
        "load_s": round(load_s, 3),
        "frames": frames,
        "warmup": warmup,
        "batches": rows,
        "streams_held": held,
        "masked": {
            "batch": big,
            "active": int(half.sum()),
            "masked": masked,
            "dense_active_only": dense,
            "overhead_ratio": round(masked["median_us"] / dense["median_us"], 3),
        },
    }
