"""How a batched streaming frame compares with what the machine and the offline path allow, per
precision: the read bandwidth of the threads (numpy sums over one array too big for a cache,
before the codec exists), then per B the frame's time per stream against the offline time per
frame, and the B = 1 frame against the memory floor (the weights one frame reads, as stored,
over that bandwidth)."""

from __future__ import annotations

import threading
import time

import numpy as np

import common
from suites import REAL_TIME_US, engine_jobs
from suites.offline import clip
from suites.streaming import frames

PEERS = ()
SIZES = {
    "tiny": dict(batches=[1, 2], frames=3, warmup=1, seconds=0.2, bandwidth_mb=64),
    "full": dict(batches=[1, 2, 4, 8, 16, 32], frames=60, warmup=5, seconds=10.0, bandwidth_mb=1024),
}
COLUMNS = (
    "engine=label | threads | GB/s read=gb_per_s | memory floor ms=memory_floor_ms | "
    "B=1 ms ÷ floor=b1_over_floor | offline ms/frame=offline_ms_per_frame | "
    "ms per stream-frame at B=per_stream_by_batch | streams held=streams_held"
)


def jobs(ctx, sizes):
    return engine_jobs(ctx, PEERS, [dict(sizes, kind="efficiency")], threads=ctx.threads)


def read_bandwidth(nbytes: int, threads: int, passes: int = 3) -> float:
    """GB/s of the best of `passes` reads of a float32 array, split between `threads` threads."""
    parts = np.array_split(np.ones(nbytes // 4, np.float32), threads)
    best = float("inf")
    for _ in range(passes):
        ws = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for x in ws:
            x.start()
        for x in ws:
            x.join()
        best = min(best, time.perf_counter() - t0)
    return round(nbytes / best / 1e9, 2)


def measure(w, task) -> dict:
    gbs = read_bandwidth(task["bandwidth_mb"] << 20, w.job["threads"])
    eng = w.engine()
    per, p99 = {}, {}
    for b in task["batches"]:
        f = frames(eng, b, task["frames"], task["warmup"])
        per[str(b)], p99[str(b)] = round(f["median_ms"] / b, 3), f["p99_ms"]
    pcm = clip(task["seconds"])
    eng.decode(eng.encode(pcm[..., : common.SAMPLE_RATE]))
    t0 = time.perf_counter()
    codes = eng.encode(pcm)
    eng.decode(codes)
    off = (time.perf_counter() - t0) * 1e3 / np.shape(codes)[-1]
    nbytes = eng.codec.weights_nbytes
    floor = round(nbytes / (gbs * 1e9) * 1e3, 3)
    return {
        "gb_per_s": gbs,
        "weights_nbytes": nbytes,
        "memory_floor_ms": floor,
        "b1_over_floor": round(per["1"] / floor, 3) if "1" in per else None,
        "offline_ms_per_frame": round(off, 3),
        "per_stream_by_batch": per,
        "p99_by_batch": p99,
        "streams_held": max([int(b) for b, ms in p99.items() if ms * 1e3 <= REAL_TIME_US], default=0),
    }
