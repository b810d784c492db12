"""The transformer alone, Mimi's shape (d 512, 8 layers, context 250), one stream, one token a
step: mimi_py's `StreamingTransformer.step` from Python, then the same model in the core's
native bench binary (no Python) and candle's own ops, alternating per thread count; the
binding's overhead is Python's step over the native one."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np

import common

PEERS = ()
NATIVE = Path(os.environ.get("MIMI_NATIVE_BENCH", common.REPO / "target" / "release" / "mimi_native_bench"))
SIZES = {
    "tiny": {"steps": 30, "warmup": 5, "repeats": 1, "small": True},
    "full": {"steps": 300, "warmup": 20, "repeats": 3, "small": False},
}
COLUMNS = (
    "run=label | threads | step median µs=step_median_us | each repeat=each_us | step p99 µs=step_p99_us | "
    "candle's µs=candle_us"
)


def jobs(ctx, sizes):
    """Python's steps and the native binary's, alternating, `repeats` times per thread count."""
    kinds = [("mimi_py (Python)", "python")] + [("native (Rust)", "native")] * (
        NATIVE.exists() and not ctx.tiny
    )
    out = [
        {"engine": "mimi_py", "label": label, "threads": th, "tasks": [dict(sizes, kind=kind)]}
        for th in ctx.threads
        for _ in range(sizes["repeats"])
        for label, kind in kinds
    ]
    return out, {} if NATIVE.exists() else {
        "native": f"{NATIVE} not built (cargo build --release --bin {NATIVE.name})"
    }


def measure(w, task) -> dict:
    if task["kind"] == "native":
        out = subprocess.run(
            [str(NATIVE), str(task["steps"]), "1"], capture_output=True, text=True, check=True
        )
        got = {
            d.get("engine"): d for d in map(json.loads, (x for x in out.stdout.splitlines() if x[:1] == "{"))
        }
        mine = got["mimi_py-native"]
        return {
            "step_median_us": mine["step_median_us"],
            "step_p99_us": mine.get("step_p99_us"),
            "candle_us": got.get("candle", {}).get("step_median_us"),
        }
    import mimi_py

    small = mimi_py.TransformerConfig(d_model=64, num_heads=4, num_layers=2, context=16)
    cfg = small if task["small"] else mimi_py.TransformerConfig.mimi()
    t = mimi_py.StreamingTransformer(cfg, seed=0)
    xs = (
        np.random.default_rng(1)
        .uniform(-1, 1, (1, task["steps"] + task["warmup"], cfg.d_model))
        .astype(np.float32)
    )
    times = []
    for i in range(xs.shape[1]):
        t0 = time.perf_counter()
        t.step(xs[:, i : i + 1])
        times.append(time.perf_counter() - t0)
    s = common.summary_us(times[task["warmup"] :])
    return {"step_median_us": s["median_us"], "step_p99_us": s["p99_us"], "d_model": cfg.d_model}


def summary(ctx, rows) -> dict:
    """One table row per (run, thread count): the median over the repeats and each repeat's;
    the binding's overhead: Python's median step over the native one's."""
    table, medians = [], {}
    for label, th in dict.fromkeys((r["label"], r["threads"]) for r in rows):
        mine = [r for r in rows if (r["label"], r["threads"]) == (label, th)]
        ok = [r for r in mine if r["ok"]]
        row = {"label": label, "threads": th, "ok": len(ok) == len(mine)}
        row["error"] = next((r.get("error") for r in mine if not r["ok"]), None)
        for key in ("step_median_us", "step_p99_us", "candle_us"):
            vals = [r[key] for r in ok if r.get(key)]
            row[key] = common.median(vals) if vals else None
        row["each_us"] = [r["step_median_us"] for r in ok]
        medians[(mine[0]["kind"], th)] = row["step_median_us"]
        table.append(row)
    over = {
        str(th): round(medians[("python", th)] / medians[("native", th)], 3)
        for _, th in medians
        if medians.get(("native", th))
    }
    return {"table": table, "binding_overhead": over}
