"""Where a batched streaming frame goes, layer by layer: the core's `mimi_step_profile` binary
(real-size seeded weights, native engine, no Python) for each precision, milliseconds per frame
of each layer for all its rows. Run where the binary is built (it is not in tiny mode)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import common

PEERS = ()
BINARY = Path(os.environ.get("MIMI_STEP_PROFILE", common.REPO / "target" / "release" / "mimi_step_profile"))
SIZES = {"tiny": {"batches": [1, 2], "frames": 2}, "full": {"batches": [1, 4, 8, 16], "frames": 20}}
COLUMNS = "precision | B=batch | frame ms=frame_median_ms | costliest layers (ms)=top"


def jobs(ctx, sizes):
    if not BINARY.exists():
        return [], {"mimi_py": f"{BINARY} not built (cargo build --release --bin mimi_step_profile)"}
    tasks = [dict(sizes, kind="layers", precision=p) for p in ctx.precisions]
    return [
        {"engine": "mimi_py", "label": "mimi_step_profile", "threads": ctx.main_threads, "tasks": tasks}
    ], {}


def measure(w, task) -> dict:
    cmd = [str(BINARY), ",".join(map(str, task["batches"])), str(task["frames"]), task["precision"]]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = []
    for b in (json.loads(x) for x in out.splitlines() if x.startswith("{")):
        top = sorted(b.get("layers", []), key=lambda x: -x.get("ms", 0))[:5]
        rows.append(dict(b, top=", ".join(f"{x['layer']} {x.get('ms', 0):.1f}" for x in top)))
    return {"rows": rows}
