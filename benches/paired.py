#!/usr/bin/env python3
"""Serving frames of several builds or weight types, interleaved in one run.

    python benches/paired.py --worker new32=:float32 --worker new16=:bfloat16 --worker med=:medium \
        [--worker old=/path/to/old/python/dir:float32] [--batches 1,4,8,12,16] [--rounds 5]

Each worker is a long-lived process (``RAYON_NUM_THREADS=--threads``) holding one real-size
seeded codec (``MimiCodec(seed=0, weights_dtype=...)``, or ``precision=...`` for the names
``highest``, ``high`` and ``medium``), imported from the given directory
(``PYTHONPATH``; empty: the installed ``mimi_py``). The parent asks the workers in turn, round
after round, for ``--frames`` serving frames (one ``encode_step`` then ``decode_step`` of B
rows, after one warm-up frame; B = 0: an offline encode then decode of 10 s), so every worker
sees the same background load: on a shared
machine, only such same-run ratios mean anything. Prints one JSON line per (worker, B) with
the median and p99 frame time over all rounds, and the ratio of each median to the first
worker's.

Each worker runs in ``--copies`` processes (default 2), started in mirrored order (A B B A): on
the 2-core Xeon, a build's process started first ran 9-18% slower than its process started
last, in 9 of 10 comparisons (benches/README.md, "Planned step, sixth pass"), so one process
per build measured the start order as much as the build. A worker's figures pool the
frames of its copies; ``copy_medians_ms`` shows each copy's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import json, sys, time
import numpy as np
import mimi_py
wd = sys.argv[1]
kw = {"precision": wd} if wd in ("highest", "high", "medium") else {"weights_dtype": wd}
codec = mimi_py.MimiCodec(seed=0, **kw)
rng = np.random.default_rng(0)
print(json.dumps({"ready": True}), flush=True)
pcm10 = (rng.standard_normal((1, 1, 240000)) * 0.1).astype(np.float32)
for line in sys.stdin:
    b, frames = json.loads(line)
    codec.reset_state()
    times = []
    if b == 0:  # offline: encode then decode 10 s, frames times
        for i in range(frames):
            t0 = time.perf_counter()
            codec.decode(codec.encode(pcm10))
            times.append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)
        continue
    for i in range(frames + 1):
        pcm = (rng.standard_normal((b, 1, codec.frame_size)) * 0.1).astype(np.float32)
        t0 = time.perf_counter()
        codec.decode_step(codec.encode_step(pcm))
        if i:
            times.append(time.perf_counter() - t0)
    print(json.dumps(times), flush=True)
"""


def start(spec: str, threads: int) -> tuple[str, subprocess.Popen]:
    name, rest = spec.split("=", 1)
    path, wd = rest.rsplit(":", 1)
    print(f"starting {name} ({wd}, {path or 'installed'})", file=sys.stderr, flush=True)
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    if path:
        env["PYTHONPATH"] = path
    p = subprocess.Popen(
        [sys.executable, "-c", WORKER, wd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert json.loads(p.stdout.readline())["ready"]
    return name, p


def median(t: list[float]) -> float:
    return sorted(t)[len(t) // 2]


def report(names: list[str], batches: list[int], times: dict[tuple[str, int], list[float]]) -> None:
    """One JSON line per (worker, B): its copies' frames pooled, against the first worker's."""
    for b in batches:
        pooled = {
            n: sorted(x for (c, bb), t in times.items() if bb == b and c.split("#")[0] == n for x in t)
            for n in names
        }
        base = median(pooled[names[0]])
        for name in names:
            t = pooled[name]
            med, p99 = median(t), t[min(len(t) - 1, int(0.99 * len(t)))]
            copies = sorted(c for (c, bb) in times if bb == b and c.split("#")[0] == name)
            row = {
                "worker": name,
                "batch": b,
                "median_ms": round(med * 1e3, 1),
                "p99_ms": round(p99 * 1e3, 1),
                "copy_medians_ms": [round(median(times[(c, b)]) * 1e3, 1) for c in copies],
            }
            row["median_over_" + names[0]] = round(med / base, 3)
            print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="append", required=True, help="NAME=PYTHONPATH:WEIGHTS_DTYPE")
    ap.add_argument("--batches", default="1,4,8,12,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copies", type=int, default=2, help="processes per worker, started A B B A")
    args = ap.parse_args()
    names = [w.split("=", 1)[0] for w in args.worker]
    specs = [(w, c) for c in range(args.copies) for w in (args.worker if c % 2 == 0 else args.worker[::-1])]
    workers = [(f"{name}#{c + 1}", p) for (w, c) in specs for name, p in [start(w, args.threads)]]
    batches = [int(b) for b in args.batches.split(",")]
    times: dict[tuple[str, int], list[float]] = {(c, b): [] for c, _ in workers for b in batches}
    for r in range(args.rounds):
        for b in batches:
            order = workers[r % len(workers) :] + workers[: r % len(workers)]
            for copy, p in order:
                p.stdin.write(json.dumps([b, args.frames]) + "\n")
                p.stdin.flush()
                times[(copy, b)] += json.loads(p.stdout.readline())
    report(names, batches, times)
    for _, p in workers:
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    main()
