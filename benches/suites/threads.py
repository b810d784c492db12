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
    job = {"engine": "mimi_py", "label": "2 objects, 2 threads", "threads": 1}
    return [dict(job, tasks=[dict(sizes, kind="threads")])], {}


def measure(w, task) -> dict:
    import mimi_py

    cfg, steps = mimi_py.TransformerConfig.mimi(), task["steps"]
    models = [mimi_py.StreamingTransformer(cfg, seed=i) for i in range(2)]
    xs = [
        np.random.default_rng(i).standard_normal((1, steps, cfg.d_model)).astype(np.float32) for i in range(2)
    ]
    out: list = [None, None]

    def work(i):
        models[i].reset_state()
        out[i] = np.concatenate([models[i].forward(xs[i][:, j : j + 1]) for j in range(steps)], axis=1)

    def both_at_once():
        ths = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()

    for m in models:
        m.forward(xs[0][:, :8])  # warm-up
    serial, threads, same = [], [], True
    for _ in range(task["repeats"]):
        t0 = time.perf_counter()
        work(0), work(1)
        ref, t1 = list(out), time.perf_counter()
        both_at_once()
        serial.append(t1 - t0)
        threads.append(time.perf_counter() - t1)
        same &= all(np.array_equal(a, b) for a, b in zip(out, ref))
    s, t = min(serial), min(threads)
    return {"serial_s": round(s, 3), "threads_s": round(t, 3), "speedup": round(s / t, 2), "same": same}
