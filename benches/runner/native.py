"""The native bench binary (target/release/mimi_native_bench): built on demand, run per thread count."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
from pathlib import Path

import common

from . import log
from .children import thread_env

REPO = common.REPO
# MIMI_NATIVE_BENCH overrides where the native bench binary is looked for.
NATIVE_BIN = Path(os.environ.get("MIMI_NATIVE_BENCH", REPO / "target" / "release" / "mimi_native_bench"))
# MIMI_STEP_PROFILE overrides where the per-layer profile binary (the layers suite) is looked for.
PROFILE_BIN = Path(os.environ.get("MIMI_STEP_PROFILE", REPO / "target" / "release" / "mimi_step_profile"))


def newest_source_mtime() -> float:
    paths = list((REPO / "crates" / "mimi-core").rglob("*.rs")) + [REPO / "Cargo.toml", REPO / "Cargo.lock"]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def ensure_native(args, binary: Path = NATIVE_BIN) -> dict:
    """{"path": ..., "stale": bool} or {"skipped": why}, for one of the core's bench binaries."""
    if args.tiny and not binary.exists():
        return {"skipped": f"{_rel(binary)} not built (tiny mode does not build it)"}
    if args.rebuild_native or not binary.exists():
        if shutil.which("cargo") is None:
            return {"skipped": f"cargo not found, cannot build {binary.name}"}
        cmd = ["cargo", "build", "--release", "-p", "mimi-core", "--bin", binary.name]
        log("building a native bench binary: " + " ".join(cmd))
        proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True)
        if proc.returncode != 0 or not binary.exists():
            return {"skipped": "cargo build failed: " + proc.stderr[-2000:]}
    stale = binary.stat().st_mtime < newest_source_mtime()
    return {
        "path": _rel(binary),
        "stale": stale,
        "built": _dt.datetime.fromtimestamp(binary.stat().st_mtime).isoformat(timespec="seconds"),
    }


def run_native(binary: Path, steps: int, threads: int, timeout: float) -> dict:
    env = os.environ.copy()
    env.update(thread_env(threads))
    try:
        proc = subprocess.run(
            [str(binary), str(steps), "1"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(REPO),
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    out = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[d.get("engine", "?")] = d
    if proc.returncode != 0 or not out:
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return {"ok": True, "engines": out}


# ---------------------------------------------------------------------------------------------


def run_overhead(frames: int, precision: str, threads: int, timeout: float) -> dict:
    """The profile binary's `overhead` mode: B = 1 frames with every matrix product skipped
    against whole frames, alternating in one process (`{"ok", "frame_median_ms",
    "no_products_median_ms", "ratio"}`). The binary takes a precision name (or the older
    float32 / bfloat16)."""
    env = os.environ.copy()
    env.update(thread_env(threads))
    cmd = [str(PROFILE_BIN), "1", str(frames), precision, "overhead"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"overhead"')]
    if proc.returncode != 0 or not lines:
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return dict(lines[-1]["overhead"], ok=True)


def run_profile(batches: list, frames: int, precision: str, threads: int, timeout: float) -> dict:
    """The per-layer profile binary's lines (one per batch size): frame median and layer ms."""
    env = os.environ.copy()
    env.update(thread_env(threads))
    cmd = [str(PROFILE_BIN), ",".join(map(str, batches)), str(frames), precision]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or len(rows) != len(batches):
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return {"ok": True, "batches": rows}
