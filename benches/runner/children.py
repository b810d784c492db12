"""Child processes of benches/run.py: one measurement per fresh process (benches/worker.py),
its thread environment set before it starts, and its one-line JSON result."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from worker import RESULT_MARK

REPO = common.REPO
WORKER = Path(__file__).resolve().parents[1] / "worker.py"

# glibc malloc told to keep freed memory (fewer page faults on big fresh buffers).
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(4 * 1024 * 1024 * 1024),
    "MALLOC_TOP_PAD_": str(256 * 1024 * 1024),
}


def thread_env(threads: int) -> dict:
    t = str(threads)
    return {
        "RAYON_NUM_THREADS": t,
        "OMP_NUM_THREADS": t,
        "MKL_NUM_THREADS": t,
        "OPENBLAS_NUM_THREADS": t,
        "VECLIB_MAXIMUM_THREADS": t,
    }


def worker_result(stdout: str, stderr: str, returncode: int) -> dict:
    """The `@@RESULT {json}` line of a worker's output, or a failure saying why there is none."""
    res = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARK):
            res = json.loads(line[len(RESULT_MARK) :])
    if res is None:
        tail = (stderr or stdout)[-2000:]
        return {"ok": False, "error": f"worker exited with status {returncode} and no result: {tail}"}
    if returncode != 0:
        res["ok"] = False
        res.setdefault("error", f"worker exited with status {returncode}")
    return res


def run_child(spec: dict, threads: int, timeout: float, extra_env: dict | None = None) -> dict:
    env = os.environ.copy()
    env.update(thread_env(threads))
    if extra_env:
        env.update(extra_env)
    spec = dict(spec, threads=threads)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(WORKER), json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(REPO),
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s", "threads": threads}
    wall = time.perf_counter() - t0
    res = worker_result(proc.stdout, proc.stderr, proc.returncode)
    res["threads"] = threads
    res["process_wall_s"] = round(wall, 2)
    if extra_env:
        res["extra_env"] = extra_env
    return res


def run_children_together(specs: list[dict], threads: int, timeout: float, extra_env: dict | None = None):
    """Start one worker per spec at once (same thread environment as run_child), let each load
    and warm up, then release them together: each worker touches `ready-<index>` in a barrier
    folder and waits for `go`, which is created once every worker is ready (or has exited).
    Returns the workers' results in spec order."""
    env = os.environ.copy()
    env.update(thread_env(threads))
    if extra_env:
        env.update(extra_env)
    with tempfile.TemporaryDirectory(prefix="mimi-bench-barrier-") as tmp:
        barrier = Path(tmp)
        procs, logs = [], []
        t0 = time.perf_counter()
        for i, spec in enumerate(specs):
            spec = dict(spec, threads=threads, index=i, barrier_dir=str(barrier), barrier_timeout=timeout)
            out, err = open(barrier / f"out-{i}", "w+"), open(barrier / f"err-{i}", "w+")
            logs.append((out, err))
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), json.dumps(spec)],
                    stdout=out,
                    stderr=err,
                    text=True,
                    env=env,
                    cwd=str(REPO),
                )
            )
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            if all((barrier / f"ready-{i}").exists() or p.poll() is not None for i, p in enumerate(procs)):
                break
            time.sleep(0.01)
        (barrier / "go").touch()
        results = []
        for p, (out, err) in zip(procs, logs):
            try:
                p.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                results.append({"ok": False, "error": f"timed out after {timeout:.0f} s", "threads": threads})
                continue
            out.seek(0)
            err.seek(0)
            res = worker_result(out.read(), err.read(), p.returncode)
            res["threads"] = threads
            results.append(res)
        for out, err in logs:
            out.close()
            err.close()
    return results


def engine_available(engine: str, tiny: bool) -> str | None:
    """None if the engine can run, else why not."""
    base = engine.split("+")[0]
    if base == "mimi_py":
        return None
    if tiny:
        return "skipped (tiny mode)"
    needs = {
        "rustymimi": ["rustymimi"],
        "moshi": ["torch", "moshi"],
        "transformers": ["torch", "transformers"],
    }[base]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        return "not installed (" + ", ".join(missing) + ")"
    return None
