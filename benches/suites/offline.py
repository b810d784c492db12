"""Offline speed: `encode` of a clip, then `decode` of its codes, in real-time factors (seconds
of audio per second), the median of the repeats after a warm-up call. Every engine loads the
same random weights; the codes of each row are compared with mimi_py's first precision's."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np

import common
from suites import agreement, engine_jobs, ratios

PEERS = ("rustymimi", "moshi", "transformers")
SIZES = {"tiny": {"seconds": 0.2, "repeats": 1}, "full": {"seconds": 10.0, "repeats": 3}}
COLUMNS = (
    "engine=label | threads | encode RTF=encode_rtf | decode RTF=decode_rtf | "
    "encode s (each repeat)=encode_all_s | decode s (each repeat)=decode_all_s | "
    "cores busy=encode_cpu_per_wall"
)


def jobs(ctx, sizes):
    save = str(ctx.tmp / "offline")
    Path(save).mkdir(exist_ok=True)
    return engine_jobs(ctx, PEERS, [dict(sizes, kind="offline", save=save)], threads=ctx.threads)


def clip(seconds: float, seed: int = 0) -> np.ndarray:
    return common.smooth_noise(int(round(seconds * common.SAMPLE_RATE)), seed=seed)[None, None]


def timed(eng, pcm, warm, repeats: int) -> dict:
    """A warm-up call on `warm`, then `repeats` of `encode` of `pcm` and `decode` of its codes,
    each waited for: real-time factors of the medians, every repeat's seconds, and the codes."""
    eng.decode(eng.encode(warm))  # thread pools, allocator, kernels, lazy init
    eng.sync()
    enc, dec, cpu = [], [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        codes = eng.encode(pcm)
        eng.sync()
        t1, c1 = time.perf_counter(), time.process_time()
        audio = eng.decode(codes)
        eng.sync()
        dec.append(time.perf_counter() - t1)
        enc.append(t1 - t0)
        cpu.append((c1 - c0) / (t1 - t0))
    seconds = pcm.shape[0] * pcm.shape[-1] / common.SAMPLE_RATE
    out = {
        "encode_rtf": round(seconds / common.median(enc), 3),
        "decode_rtf": round(seconds / common.median(dec), 3),
    }
    out.update(encode_all_s=[round(x, 4) for x in enc], decode_all_s=[round(x, 4) for x in dec])
    out.update(encode_cpu_per_wall=round(common.median(cpu), 2), codes_shape=list(np.shape(codes)))
    return dict(out, audio_shape=list(np.shape(audio)), codes=codes)


def measure(w, task) -> dict:
    out = timed(w.engine(), clip(task["seconds"]), clip(min(task["seconds"], 1.0), seed=1), task["repeats"])
    name = re.sub(r"[^\w.-]+", "_", f"{w.job['label']}-t{w.job['threads']}-{w.job.get('variant')}")
    codes_file = Path(task["save"]) / f"{name}.npy"
    np.save(codes_file, np.asarray(out.pop("codes")))
    return dict(out, codes_file=str(codes_file) if w.job["engine"] != "transformers" else None)


def summary(ctx, rows) -> dict:
    """Encode and decode speed ratios against each peer, and each row's codes against the first."""
    return {
        "encode_ratios": ratios(rows, "encode_rtf"),
        "decode_ratios": ratios(rows, "decode_rtf"),
        "agreement": agreement([r for r in rows if r["threads"] == rows[0]["threads"]]),
    }
