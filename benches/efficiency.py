"""The `efficiency` suite's measurement (run in a child process by benches/run.py through
worker.py; runner/efficiency.py derives the figures, runner/report.py renders them): how a batched
streaming frame compares with what the machine and the offline path allow.

In one process, at the thread count the environment sets, for one precision: first the read
bandwidth of that many threads (numpy sums over one float32 array split between Python threads;
numpy releases the GIL in reductions), before the codec exists so no codec thread competes; then
for each B the streaming frames (one `encode_step` of B rows of 1920 samples, no mask, then one
`decode_step` of its codes), with the process's CPU time over them; then an offline `encode` +
`decode` of the same codec; and `codec.weights_nbytes`, the bytes of weights one frame reads.
"""

from __future__ import annotations

import threading
import time

import numpy as np

import common


def read_bandwidth(nbytes: int, threads: int, passes: int) -> dict:
    """Best of `passes` reads of a float32 array of `nbytes`, split between `threads` threads."""
    a = np.ones(nbytes // 4, np.float32)  # written, so every page is real memory
    parts = np.array_split(a, threads)
    times = []
    for _ in range(passes):
        workers = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {
        "array_bytes": a.nbytes,
        "threads": threads,
        "passes": passes,
        "best_s": round(best, 5),
        "all_s": [round(t, 5) for t in times],
        "gb_per_s": round(a.nbytes / best / 1e9, 2),
    }


def stream_frames(codec, batch: int, frames: int, warmup: int, rng) -> dict:
    """Frame times of `frames` encode_step + decode_step of `batch` rows after `warmup` frames,
    and the process's CPU time ÷ wall time over the timed frames."""
    f = codec.frame_size
    pcm = (rng.standard_normal((warmup + frames, batch, 1, f)) * 0.1).astype(np.float32)
    codec.reset_state()
    times = []
    cpu0 = wall0 = 0.0
    for i in range(warmup + frames):
        if i == warmup:
            cpu0, wall0 = time.process_time(), time.perf_counter()
        t0 = time.perf_counter()
        codec.decode_step(codec.encode_step(pcm[i]))
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "batch": batch,
        **common.summary_us(times),
        "cpu_s": round(cpu, 4),
        "wall_s": round(wall, 4),
        "cpu_per_wall": round(cpu / wall, 2),
    }


def offline(codec, seconds: float, warmup_seconds: float, repeats: int) -> dict:
    """Median wall time of `repeats` offline encode then decode of `seconds` of audio, and its
    time per code frame."""
    sr = common.SAMPLE_RATE
    pcm = common.smooth_noise(int(round(seconds * sr)), seed=0)[None, None]
    warm = common.smooth_noise(int(round(warmup_seconds * sr)), seed=1)[None, None]
    codec.decode(codec.encode(warm))
    times, codes = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        codes = codec.encode(pcm)
        codec.decode(codes)
        times.append(time.perf_counter() - t0)
    med = common.median(times)
    n = int(np.shape(codes)[-1])
    return {
        "audio_seconds": pcm.shape[-1] / sr,
        "frames": n,
        "repeats": repeats,
        "encode_decode_s": round(med, 4),
        "all_s": [round(t, 4) for t in times],
        "ms_per_frame": round(med * 1e3 / n, 3),
    }


def _codec(spec, make_engine):
    """The small codec of the other suites (spec["weights"], tiny), else real-size seeded weights."""
    if spec.get("weights"):
        eng, load_s = make_engine(dict(spec, engine="mimi_py"))
        return eng.codec, load_s
    import mimi_py

    t0 = time.perf_counter()
    codec = mimi_py.MimiCodec(seed=0, precision=spec["precision"])
    return codec, time.perf_counter() - t0


def task_efficiency(spec, make_engine):
    bandwidth = read_bandwidth(spec["bandwidth_bytes"], spec["threads"], spec["bandwidth_passes"])
    codec, load_s = _codec(spec, make_engine)
    rng = np.random.default_rng(0)
    rows = [stream_frames(codec, b, spec["frames"], spec["warmup"], rng) for b in spec["batches"]]
    off = offline(codec, spec["seconds"], spec["warmup_seconds"], spec["repeats"])
    return {
        "engine": "mimi_py",
        "weights": "seeded (seed 0)" if not spec.get("weights") else spec["weights"],
        "precision": codec.precision,
        "kernel_isa": getattr(codec, "kernel_isa", None),
        "weights_dtype": codec.weights_dtype,  # as stored: "high" and "medium" keep bfloat16
        "num_codebooks": codec.num_codebooks,
        "load_s": round(load_s, 3),
        "weights_nbytes": getattr(codec, "weights_nbytes", None),  # None: a build without it
        "bandwidth": bandwidth,
        "frames": spec["frames"],
        "warmup": spec["warmup"],
        "batches": rows,
        "offline": off,
    }
