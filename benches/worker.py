"""The one worker protocol: `python benches/worker.py '<json job>'`, a fresh process started
by the runner with its thread counts and a variant's variables already in its environment
(candle's, rustymimi's and torch's pools read them once). A job names an engine (loaded once,
shared by its tasks) and its tasks, each `{"suite": NAME, ...}`: the worker calls
`suites.NAME.measure(worker, task)` and prints each row at once (`@@ROW {json}`), so a crash or
a timeout loses only the rows after it. The parent's half (`spawn`, `spawn_together`) reads the
rows back and records each task a worker did not report as failed, with the reason.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

ROW_MARK = "@@ROW "
THREAD_VARS = ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class Worker:
    """What a task's `measure` gets: the job, its engine (loaded on first use), and a dict the
    tasks of one job share (the full-ring rows leave the streams-held search its start)."""

    def __init__(self, job: dict):
        self.job, self.shared, self._eng = job, {}, None
        self.info: dict = {}

    def engine(self):
        if self._eng is None:
            from engines import make_engine

            self._eng, load_s = make_engine(self.job)
            self.info = {"version": self._eng.version(), "load_s": round(load_s, 3), **self._eng.describe()}
        return self._eng


def labels(task: dict) -> dict:
    """A task's plain fields, which its row repeats (its sizes' lists stay in the suite's)."""
    return {k: v for k, v in task.items() if not isinstance(v, (list, dict))}


def run_task(w: Worker, task: dict) -> dict:
    """One task's row: what it measured, or why it failed."""
    row = labels(task)
    t0 = time.perf_counter()
    try:
        row.update(importlib.import_module(f"suites.{task['suite']}").measure(w, task))
        row["ok"] = True
    except ImportError as e:
        row.update(ok=False, not_installed=True, error=f"{type(e).__name__}: {e}")
    except Exception as e:
        row.update(
            ok=False, error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-3000:]
        )
        getattr(w._eng, "free", lambda: None)()
    row.update(w.info, row_wall_s=round(time.perf_counter() - t0, 3))
    return row


def main(argv: list[str]) -> int:
    w = Worker(json.loads(argv[1]))
    for task in w.job["tasks"]:
        row = run_task(w, task)
        row["threads_env"] = os.environ.get("RAYON_NUM_THREADS")
        sys.stdout.write(ROW_MARK + json.dumps(row) + "\n")
        sys.stdout.flush()
    return 0


def environment(threads: int, extra: dict) -> dict:
    """A worker's environment: its thread counts, then a variant's variables (a PYTHONPATH is
    put before the current one, so a variant can be another build)."""
    env = dict(os.environ, **{k: str(threads) for k in THREAD_VARS})
    for key, val in extra.items():
        if key == "PYTHONPATH" and env.get("PYTHONPATH"):
            val = val + os.pathsep + env["PYTHONPATH"]
        env[key] = val
    return env


def rows_of(job: dict, stdout: str, stderr: str, died: str | None) -> list[dict]:
    """The rows a worker printed, then one failed row for each task it did not report."""
    rows = [json.loads(x[len(ROW_MARK) :]) for x in stdout.splitlines() if x.startswith(ROW_MARK)]
    tail = stderr.strip()[-1500:]
    why = (died or "not reported") + (f": {tail}" if tail else "")
    for task in job["tasks"][len(rows) :]:
        rows.append(dict(labels(task), ok=False, error=why))
    return rows


def _text(x) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")


def spawn(job: dict, threads: int, timeout: float, env: dict | None = None) -> list[dict]:
    """One worker for `job`, at most `timeout` seconds: its rows."""
    cmd = [sys.executable, str(BENCH_DIR / "worker.py"), json.dumps(job)]
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=environment(threads, env or {})
        )
        died = None if p.returncode == 0 else f"worker exited with status {p.returncode}"
        return rows_of(job, p.stdout, p.stderr, died)
    except subprocess.TimeoutExpired as e:
        return rows_of(job, _text(e.stdout), _text(e.stderr), f"timed out after {timeout:.0f} s")


def spawn_together(jobs: list[dict], threads: int, timeout: float, env: dict | None = None) -> list[list]:
    """One worker per job, started at once; each loads and warms up, touches `ready-<i>` in a
    barrier folder and waits for `go` (`wait_for_go`), created once all are ready, so that
    they measure at the same time. Their rows, in job order."""
    with tempfile.TemporaryDirectory(prefix="mimi-bench-") as tmp:
        procs, t0 = [], time.perf_counter()
        for i, job in enumerate(jobs):
            job = dict(job, tasks=[dict(t, index=i, barrier=tmp) for t in job["tasks"]])
            out = open(Path(tmp) / f"out-{i}", "w+")
            cmd = [sys.executable, str(BENCH_DIR / "worker.py"), json.dumps(job)]
            p = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=environment(threads, env or {})
            )
            procs.append((job, p, out))
        while time.perf_counter() - t0 < timeout:
            if all(
                (Path(tmp) / f"ready-{i}").exists() or p.poll() is not None
                for i, (_, p, _) in enumerate(procs)
            ):
                break
            time.sleep(0.01)
        (Path(tmp) / "go").touch()
        results = []
        for job, p, out in procs:
            try:
                p.wait(timeout=max(1.0, t0 + timeout - time.perf_counter()))
                died = None if p.returncode == 0 else f"worker exited with status {p.returncode}"
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                died = f"timed out after {timeout:.0f} s"
            out.seek(0)
            text = out.read()
            out.close()
            results.append(rows_of(job, text, "" if died is None else text, died))
    return results


def wait_for_go(task: dict) -> None:
    """In a worker of `spawn_together`: say it is ready, then wait for the others."""
    barrier = Path(task["barrier"])
    (barrier / f"ready-{task['index']}").touch()
    deadline = time.monotonic() + 600
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the other processes never got ready")
        time.sleep(0.002)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
