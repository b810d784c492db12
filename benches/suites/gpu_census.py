"""The GPU suites' kernel census: what one streaming frame launches on the device.

torch.profiler records through CUPTI every kernel the process runs, candle's as well as
torch's. Over `census_frames` frames (unmasked, then masked) on full rings at each of
`census_batches`, the worker exports a Chrome trace and `census_from_trace` counts, per frame:
kernels (and the 5 costliest), the host's launch calls (a graph replay launches many kernels in
one), copies by direction and memsets, GPU busy time (the union of their intervals) and wall
time with and without the profiler. On the CPU the profile has CPU activities only (candle's are
invisible to it); without torch the frames still run and the row says the profiler was missing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from suites import gpu_steady as steady

PEERS = ("moshi",)
SIZES = {
    "tiny": {"census_batches": [1, 2], "census_frames": 2, "steady_warmup": 130, "warmup": 1},
    "full": {"census_batches": [1, 64], "census_frames": 5, "steady_warmup": 130, "warmup": 5},
}
COLUMNS = (
    "engine=label | dtype | variant | B=batch | kernels / frame=kernels | "
    "launch calls / frame=launches | copies / frame=copies | GPU busy ÷ wall=busy_over_wall | "
    "wall ms / frame=wall_ms"
)


def jobs(ctx, sizes):
    from suites.gpu_rows import gpu_jobs

    return gpu_jobs(ctx, sizes, {"census": "census_batches"})


def measure(w, task) -> dict:
    return census_row(w.engine(), dict(task, device=w.job["device"]), task["batch"])


def summary(ctx, rows) -> dict:
    """The unmasked census of each row, flat (the masked one stays in the rows)."""
    table = []
    for r in rows:
        c = r.get("unmasked") or {}
        cells = {k: r.get(k) for k in ("ok", "error", "label", "dtype", "variant", "batch")}
        cells.update(kernels=c.get("kernels_per_frame"), launches=c.get("launch_calls_per_frame"))
        cells.update(copies=c.get("copies_per_frame"), busy_over_wall=c.get("busy_over_wall"))
        cells["wall_ms"] = c.get("wall_us_per_frame") and round(c["wall_us_per_frame"] / 1e3, 2)
        table.append(cells)
    return {"table": table}


LAUNCHES = set("cudaLaunchKernel cudaLaunchKernelExC cudaLaunchCooperativeKernel".split())
LAUNCHES |= {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"}
GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch"}
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_API = {"cuda_runtime", "cuda_driver"}


def union_us(intervals) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _direction(name: str) -> str:
    for d in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP"):
        if d in name:
            return d
    return "other"


def census_from_trace(trace: dict, frames: int) -> dict:
    """Counts of a Chrome trace of `frames` frames (see the module's docstring), per frame."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    by_cat: dict[str, list] = {}
    for e in events:
        by_cat.setdefault(str(e.get("cat", "")).lower(), []).append(e)
    kernels = by_cat.get("kernel", [])
    copies: dict[str, int] = {}
    for e in by_cat.get("gpu_memcpy", []):
        d = _direction(e.get("name", ""))
        copies[d] = copies.get(d, 0) + 1
    api = [e for c in HOST_API for e in by_cat.get(c, [])]
    gpu = [e for c in GPU_CATEGORIES for e in by_cat.get(c, [])]
    busy = union_us((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu)
    kernel_sum = sum(float(e.get("dur", 0)) for e in kernels)
    per = max(frames, 1)
    top: dict[str, list] = {}
    for e in kernels:
        t = top.setdefault(e.get("name", "?"), [0, 0.0])
        t[0] += 1
        t[1] += float(e.get("dur", 0))
    return {
        "kernels": len(kernels),
        "kernels_per_frame": round(len(kernels) / per, 1),
        "launch_calls_per_frame": round(sum(e.get("name") in LAUNCHES for e in api) / per, 1),
        "graph_launches_per_frame": round(sum(e.get("name") in GRAPH_LAUNCHES for e in api) / per, 1),
        "api_calls_per_frame": round(len(api) / per, 1),
        "copies_per_frame": {d: round(n / per, 1) for d, n in sorted(copies.items())},
        "memsets_per_frame": round(len(by_cat.get("gpu_memset", [])) / per, 1),
        "gpu_busy_us_per_frame": round(busy / per, 1),
        "kernel_us_per_frame": round(kernel_sum / per, 1),
        "cpu_ops_per_frame": round(len(by_cat.get("cpu_op", [])) / per, 1),
        "top_kernels": [
            {"name": n[:120], "count": c, "us": round(t, 1)}
            for n, (c, t) in sorted(top.items(), key=lambda kv: -kv[1][1])[:5]
        ],
    }


def _profiler(device: str):
    """(a torch.profiler context or None, what records): CUDA activities on a CUDA device."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        return None, f"none: torch not installed ({e.name})", None
    acts = [ProfilerActivity.CPU]
    cuda = str(device).startswith("cuda") and torch.cuda.is_available()
    if cuda:
        acts.append(ProfilerActivity.CUDA)
    label = f"torch.profiler {torch.__version__} ({', '.join(a.name for a in acts)})"
    return profile(activities=acts), label, (torch if cuda else None)


def profile_frames(run, device: str, frames: int) -> dict:
    """`run()` (the frames) under torch.profiler, its trace counted; without torch, timed
    only and an empty trace counted."""
    prof, label, torch_cuda = _profiler(device)
    trace = {"traceEvents": []}
    if prof is None:
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
    else:
        with prof:
            t0 = time.perf_counter()
            run()
            if torch_cuda is not None:
                torch_cuda.cuda.synchronize()
            wall = time.perf_counter() - t0
        fd, path = tempfile.mkstemp(suffix=".json", prefix="mimi-census-")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
    out = {"profiler": label, "frames": frames, "profiled_wall_us_per_frame": round(1e6 * wall / frames, 1)}
    out.update(census_from_trace(trace, frames))
    out["busy_over_wall"] = round(out["gpu_busy_us_per_frame"] / out["profiled_wall_us_per_frame"], 3)
    return out


def _census(eng, audio, at: int, spec: dict, masked: bool) -> tuple[dict, int]:
    """`census_frames` frames timed, then as many again profiled, from audio's frame `at`."""
    batch, n = len(audio.rows), spec["census_frames"]
    masks = [steady.mask(batch, i) if masked else None for i in range(2 * n)]
    t0 = time.perf_counter()
    for i in range(n):
        steady.step_frame(eng, audio.chunk(at + i), masks[i])
    wall = (time.perf_counter() - t0) / n

    def run():
        for i in range(n, 2 * n):
            steady.step_frame(eng, audio.chunk(at + i), masks[i])

    try:
        out = profile_frames(run, spec["device"], n)
    finally:
        if masked:
            steady.unmask(eng)
    out["wall_us_per_frame"] = round(1e6 * wall, 1)
    return out, at + 2 * n


def census_row(eng, spec: dict, batch: int) -> dict:
    """Full rings at B, `warmup` frames, then the census of unmasked and of masked frames."""
    n = spec["census_frames"]
    audio = steady.Audio(batch, spec["steady_warmup"] + spec["warmup"] + 4 * n + 1, seed=31)
    row = {"warmup": steady.warm_to_full(eng, audio, spec["steady_warmup"])}
    at = spec["steady_warmup"]
    for i in range(spec["warmup"]):
        steady.step_frame(eng, audio.chunk(at + i))
    at += spec["warmup"]
    row["unmasked"], at = _census(eng, audio, at, spec, masked=False)
    try:
        row["masked"], at = _census(eng, audio, at, spec, masked=True)
    except Exception as e:
        row["masked"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    return row
