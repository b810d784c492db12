"""Corpus throughput: several processes of one thread each, started together (a barrier),
each encoding clips back to back; the aggregate real-time factor is all their audio over the
span from the first start to the last end."""

from __future__ import annotations

import time

from suites import engine_jobs, ratios
from suites.offline import clip

PEERS = ("rustymimi", "moshi", "transformers")
SIZES = {
    "tiny": {"processes": 2, "clips": 2, "seconds": 0.2},
    "full": {"processes": 2, "clips": 6, "seconds": 10.0},
}
COLUMNS = "engine=label | processes | aggregate encode RTF=encode_rtf | each=each_rtf"


def jobs(ctx, sizes):
    out, skipped = engine_jobs(ctx, PEERS, [dict(sizes, kind="aggregate")], threads=[1], per_precision=False)
    return [dict(j, together=sizes["processes"]) for j in out], skipped


def measure(w, task) -> dict:
    from worker import wait_for_go

    eng = w.engine()
    pcm = clip(task["seconds"])
    eng.encode(clip(min(task["seconds"], 1.0), seed=1))  # warm-up
    wait_for_go(task)
    start = time.monotonic()
    for _ in range(task["clips"]):
        eng.encode(pcm)
    end = time.monotonic()
    return {"start": start, "end": end, "audio_s": task["clips"] * task["seconds"]}


def summary(ctx, rows) -> dict:
    """One row per engine from its processes' rows: all the audio over the whole span."""
    out = []
    for name in dict.fromkeys(r["label"] for r in rows):
        each = [r for r in rows if r["label"] == name]
        ok = all(r["ok"] for r in each)
        row = {k: each[0].get(k) for k in ("label", "engine", "precision", "torch_mode")}
        row.update(threads=1, processes=len(each), ok=ok)
        if ok:
            span = max(r["end"] for r in each) - min(r["start"] for r in each)
            row["encode_rtf"] = round(sum(r["audio_s"] for r in each) / span, 3)
            row["each_rtf"] = [round(r["audio_s"] / (r["end"] - r["start"]), 3) for r in each]
        else:
            row["error"] = next(r.get("error") for r in each if not r["ok"])
        out.append(row)
    return {"table": out, "encode_ratios": ratios(out, "encode_rtf")}
