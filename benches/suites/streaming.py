"""Streaming speed: per 80 ms frame, `encode_step` of 1920 samples then `decode_step` of its
codes, one stream; the median and p99 frame time after a warm-up (transformers' MimiModel has
no streaming API, so it is not here)."""

from __future__ import annotations

import time

import numpy as np

import common
from suites import engine_jobs, ratios

PEERS = ("rustymimi", "moshi")
SIZES = {"tiny": {"frames": 10, "warmup": 2}, "full": {"frames": 200, "warmup": 10}}
COLUMNS = (
    "engine=label | threads | frame median ms=median_ms | frame p99 ms=p99_ms | "
    "encode_step median ms=encode_median_ms | decode_step median ms=decode_median_ms"
)


def jobs(ctx, sizes):
    return engine_jobs(ctx, PEERS, [dict(sizes, kind="streaming")])


def frames(eng, batch: int, n: int, warmup: int, seed: int = 2) -> dict:
    """`warmup` then `n` timed frames of `batch` fresh streams: each a summary in ms."""
    fs = common.FRAME_SIZE
    pcm = np.stack([common.smooth_noise((warmup + n) * fs, seed=seed + r) for r in range(batch)])[:, None]
    eng.reset(batch)
    enc, dec = [], []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        codes = eng.encode_step(pcm[:, :, i * fs : (i + 1) * fs])
        t1 = time.perf_counter()
        if codes is not None and np.shape(codes)[-1] > 0:
            eng.decode_step(codes)
        if i >= warmup:
            enc.append(t1 - t0)
            dec.append(time.perf_counter() - t1)
    tot = [a + b for a, b in zip(enc, dec)]
    return {
        "median_ms": round(common.median(tot) * 1e3, 2),
        "p99_ms": round(common.percentile(tot, 0.99) * 1e3, 2),
        "encode_median_ms": round(common.median(enc) * 1e3, 2),
        "decode_median_ms": round(common.median(dec) * 1e3, 2),
        "frame_all_ms": [round(x * 1e3, 2) for x in tot],
    }


def measure(w, task) -> dict:
    return frames(w.engine(), 1, task["frames"], task["warmup"])


def summary(ctx, rows) -> dict:
    return {"frame_ratios": ratios(rows, "median_ms", higher_is_faster=False)}
