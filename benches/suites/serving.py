"""Streams held in real time: mimi_py steps B streams at once (`encode_step` + `decode_step`
of B rows per 80 ms frame); B streams are held when the frame's p99 stays within 80 ms. The
peers have no batched streams: each holds one stream or none, by its single stream's p99."""

from __future__ import annotations

from suites import REAL_TIME_US, engine_jobs
from suites.streaming import frames

PEERS = ("rustymimi", "moshi")
SIZES = {
    "tiny": {"batches": [1, 2], "frames": 3, "warmup": 1},
    "full": {"batches": [1, 2, 4, 8, 12, 16, 32], "frames": 30, "warmup": 3},
}
COLUMNS = (
    "engine=label | threads | streams held=streams_held | p99 ms at B=p99_by_batch | "
    "ms per stream at B=per_stream_by_batch"
)


def jobs(ctx, sizes):
    out, skipped = engine_jobs(ctx, PEERS, [dict(sizes, kind="serving")], threads=ctx.threads)
    return [j for j in out if j["engine"] == "mimi_py" or j["threads"] == ctx.main_threads], skipped


def measure(w, task) -> dict:
    eng = w.engine()
    batches = task["batches"] if w.job["engine"] == "mimi_py" else [1]
    p99, per = {}, {}
    for b in batches:
        f = frames(eng, b, task["frames"], task["warmup"])
        p99[str(b)], per[str(b)] = f["p99_ms"], round(f["median_ms"] / b, 2)
        if f["p99_ms"] * 1e3 > 2 * REAL_TIME_US:
            break  # larger batches miss too
    held = max([int(b) for b, ms in p99.items() if ms * 1e3 <= REAL_TIME_US], default=0)
    return {"streams_held": held, "p99_by_batch": p99, "per_stream_by_batch": per}
