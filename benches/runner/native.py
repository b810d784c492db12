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


def newest_source_mtime() -> float:
    paths = list((REPO / "crates" / "mimi-core").rglob("*.rs")) + [REPO / "Cargo.toml", REPO / "Cargo.lock"]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def ensure_native(args) -> dict:
    """{"path": ..., "stale": bool} or {"skipped": why}."""
    if args.tiny and not NATIVE_BIN.exists():
        return {"skipped": f"{_rel(NATIVE_BIN)} not built (tiny mode does not build it)"}
    if args.rebuild_native or not NATIVE_BIN.exists():
        if shutil.which("cargo") is None:
            return {"skipped": "cargo not found, cannot build the native bench"}
        log("building the native bench: cargo build --release -p mimi-core --bin mimi_native_bench")
        proc = subprocess.run(
            ["cargo", "build", "--release", "-p", "mimi-core", "--bin", "mimi_native_bench"],
            cwd=str(REPO),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not NATIVE_BIN.exists():
            return {"skipped": "cargo build failed: " + proc.stderr[-2000:]}
    stale = NATIVE_BIN.stat().st_mtime < newest_source_mtime()
    return {
        "path": _rel(NATIVE_BIN),
        "stale": stale,
        "built": _dt.datetime.fromtimestamp(NATIVE_BIN.stat().st_mtime).isoformat(timespec="seconds"),
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
