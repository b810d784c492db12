"""The CUDA graph plan (MIMI_PY_CUDA_GRAPHS=1) on the CPU, where it runs without capture:
scripts/gpu_graph_check.py's dry run. The same frames streamed through a bfloat16 codec and
transformer (the candle path, which takes the plan) in two processes, graphs off and on, give
outputs equal in every bit, and the graphs process really replayed (its counters)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_graph_check.py"


def test_graph_replays_equal_eager_steps_in_every_bit_on_the_cpu(tmp_path: Path):
    out = tmp_path / "graphs.json"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--dtypes", "bfloat16"]
    cmd += ["--frames", "6", "--tokens", "24", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())["results"]["bfloat16"]
    assert result["outputs"] == 6 * 2 + 24
    assert result["differ"] == []
    assert result["eager_counts"].get("replayed") == 0
    assert result["graph_counts"]["replayed"] > 0
    assert result["graph_counts"]["failed"] == 0
