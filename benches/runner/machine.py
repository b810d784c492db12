"""Machine facts and versions for benches/run.py's results."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import common

REPO = common.REPO
# The CPU features behind the precisions' kernels (mimi_py's and oneDNN's), from /proc/cpuinfo.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def pkg_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def machine_info(args) -> dict:
    import numpy

    import mimi_py

    git = {}
    try:
        git["commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
        st = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        git["modified_files"] = len([line for line in st.splitlines() if line.strip()])
    except Exception:
        pass
    core = getattr(mimi_py, "_core", None)
    core_file = getattr(core, "__file__", None)
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_model": common.cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_cores": common.cpu_count(),
        "cpu_cores_available": common.cpu_count_available(),
        "memory_total_bytes": common.memory_total_bytes(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "threads": args.threads,
        "main_threads": args.main_threads,
        "versions": {
            "mimi_py": mimi_py.__version__,
            "candle": mimi_py.candle_version,
            "mimi_py_features": sorted(mimi_py.features),
            "numpy": numpy.__version__,
            "rustymimi": pkg_version("rustymimi"),
            "torch": pkg_version("torch"),
            "moshi": pkg_version("moshi"),
            "transformers": pkg_version("transformers"),
        },
        "mimi_py_core": core_file,
        "mimi_py_core_built": _dt.datetime.fromtimestamp(Path(core_file).stat().st_mtime).isoformat(
            timespec="seconds"
        )
        if core_file
        else None,
        "git": git,
    }


def cpu_flags() -> dict:
    """Which of CPU_FLAGS the CPU has ({} where /proc/cpuinfo cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    have = set(line.split(":", 1)[-1].split())
    return {f: f in have for f in CPU_FLAGS}


def machine_name(m: dict) -> str:
    """The machine in words, from machine_info's facts: CPU model, cores, memory."""
    mem = m.get("memory_total_bytes")
    ram = f", {mem / 1e9:.0f} GB RAM" if mem else ""
    return f"{m['cpu_model']}, {m['cpu_cores']} cores ({m['cpu_cores_available']} available){ram}"
