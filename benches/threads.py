#!/usr/bin/env python
"""Two threads on two StreamingTransformer objects vs the same work serially.

mimi_py releases the GIL during every computation, so two Python threads driving two
different objects compute in parallel. This benchmark streams the Mimi-shape transformer
(``TransformerConfig.mimi()``: d_model 512, 8 layers, context 250, seeded weights) one time
step per call (``--chunk 1``, the streaming case) on two objects, first one after the other,
then from two threads at once, and prints the speed-up (target: >= 1.6x on 2 cores).

RAYON_NUM_THREADS=1 is set in the environment *before mimi_py is imported* (candle reads it
when it first sizes its CPU thread pool), so each object computes on one core and the
speed-up measures the GIL release rather than candle's own multithreading. Pass
``--rayon-threads N`` (or set RAYON_NUM_THREADS yourself) to change it.

    python benches/threads.py [--steps 150] [--chunk 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150, help="time steps per object (default 150)")
    ap.add_argument("--chunk", type=int, default=1, help="time steps per call (default 1)")
    ap.add_argument("--repeats", type=int, default=3, help="best of N (default 3)")
    ap.add_argument(
        "--rayon-threads",
        default=None,
        help="RAYON_NUM_THREADS for candle (default: $RAYON_NUM_THREADS or 1)",
    )
    ap.add_argument("--target", type=float, default=1.6)
    ap.add_argument("--check", action="store_true", help="exit with status 1 below --target")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    # Must happen before the first import of mimi_py (and so of candle).
    if args.rayon_threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.rayon_threads)
    else:
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
    if "mimi_py" in sys.modules:
        print("warning: mimi_py was imported before RAYON_NUM_THREADS was set", file=sys.stderr)

    import numpy as np

    import mimi_py

    cfg = mimi_py.TransformerConfig.mimi()
    models = [mimi_py.StreamingTransformer(cfg, seed=i) for i in range(2)]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, args.steps, cfg.d_model)).astype(np.float32) for _ in range(2)]

    def work(i):
        t = models[i]
        t.reset_state()
        out = [t.forward(xs[i][:, j : j + args.chunk]) for j in range(0, args.steps, args.chunk)]
        return np.concatenate(out, axis=1)

    for i in range(2):  # warm-up: allocations, thread pool
        models[i].forward(xs[i][:, :8])

    def serial():
        return [work(0), work(1)]

    def threaded():
        res = [None, None]

        def run(i):
            res[i] = work(i)

        ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        return res

    t_serial, t_threads = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ref = serial()
        t_serial.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = threaded()
        t_threads.append(time.perf_counter() - t0)
        for a, b in zip(got, ref):
            if not np.array_equal(a, b):
                print("error: threaded results differ from serial results", file=sys.stderr)
                return 2
    s, p = min(t_serial), min(t_threads)
    speedup = s / p
    per_step = s / (2 * args.steps) * 1e3
    print(
        f"mimi_py {mimi_py.__version__}, candle {mimi_py.candle_version}, {os.cpu_count()} CPUs, "
        f"RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}"
    )
    print(
        f"Mimi-shape transformer (d_model {cfg.d_model}, {cfg.num_layers} layers, context "
        f"{cfg.context}), 2 objects x {args.steps} steps, {args.chunk} step(s) per call, "
        f"best of {args.repeats}"
    )
    print(f"  serial      {s:7.3f} s   ({per_step:.2f} ms per step)")
    print(f"  2 threads   {p:7.3f} s")
    verdict = "meets" if speedup >= args.target else "BELOW"
    print(f"  speed-up    {speedup:7.2f}x   ({verdict} the {args.target}x target; results identical)")
    return 1 if args.check and speedup < args.target else 0


if __name__ == "__main__":
    sys.exit(main())
