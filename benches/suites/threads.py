"""Two Python threads on two transformers against the same work one after the other: mimi_py
releases the GIL while it computes, so two threads driving two objects run in parallel. Each
object streams one token a call at one thread (RAYON_NUM_THREADS=1), so the speed-up measures
the GIL's release, not candle's own threads; the threads' outputs must equal the serial ones."""

from __future__ import annotations

import threading
import time

import numpy as np

PEERS = ()
SIZES = {"tiny": {"steps": 20, "repeats": 1}, "full": {"steps": 150, "repeats": 3}}
COLUMNS = "run=label | serial s=serial_s | 2 threads s=threads_s | speed-up=speedup | same outputs=same"


def jobs(ctx, sizes):
    return [
        {
            "engine": "mimi_py",
            "label": "2 objects, 2 threads",
            "threads": 1,
            "tasks": [dict(sizes, kind="threads")],
        }
    ], {}


def measure(w, task) -> dict:
    import mimi_py

    cfg = mimi_py.TransformerConfig.mimi()
    models = [mimi_py.StreamingTransformer(cfg, seed=i) for i in range(2)]
    xs = [
        np.random.default_rng(i).standard_normal((1, task["steps"], cfg.d_model)).astype(np.float32)
        for i in range(2)
    ]
    out: list = [None, None]

    def work(i):
        models[i].reset_state()
        out[i] = np.concatenate(
            [models[i].forward(xs[i][:, j : j + 1]) for j in range(task["steps"])], axis=1
        )

    for m in models:
        m.forward(xs[0][:, :8])  # warm-up
    serial, threads, same = [], [], True
    for _ in range(task["repeats"]):
        t0 = time.perf_counter()
        work(0), work(1)
        serial.append(time.perf_counter() - t0)
        ref = list(out)
        ths = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        t0 = time.perf_counter()
        [(t.start(), t) for t in ths] and [t.join() for t in ths]
        threads.append(time.perf_counter() - t0)
        same &= all(np.array_equal(a, b) for a, b in zip(out, ref))
    return {
        "serial_s": round(min(serial), 3),
        "threads_s": round(min(threads), 3),
        "speedup": round(min(serial) / min(threads), 2),
        "same": same,
    }
