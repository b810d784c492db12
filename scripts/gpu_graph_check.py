#!/usr/bin/env python3
"""Graph replays against eager steps, bit for bit (a step of scripts/gpu_check.sh).

    python scripts/gpu_graph_check.py [--device cuda] [--dtypes float32,bfloat16] [--frames 24]
                                      [--tokens 40] [--out FILE]

For each dtype, two fresh processes stream the same frames through the same seeded codec and
transformer, one with MIMI_PY_CUDA_GRAPHS=0 (eager steps) and one with MIMI_PY_CUDA_GRAPHS=1
(captured once per batch size, replayed after): a codec at B = 4, frames unmasked, then masked
(three rows in four), then after one row's reset, each frame's codes decoded again; and the
transformer alone, steps of 1 token at B = 4 past a full ring (context 16). Every output of the two must be
equal in every bit, and the graphs process must have replayed graphs (its counters, from
`mimi_py._core._graph_counts`); on a CPU the plan runs without capture (the capture-free
replay), so the dry run checks the plan and the tables, not CUDA.

Writes a JSON summary to --out (default: print only). Exit status 1 when any output differs or
the graphs process replayed nothing. On a CPU only the candle path takes the plan (half
precision: `--dtypes bfloat16`); tests/streaming/test_graphs.py runs that dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CONTEXT = 16  # the transformer's context: its ring is full after 16 steps


def child(device: str, dtype: str, out: str, frames: int, tokens: int) -> None:
    """Streams the frames and saves every output to `out` (npz), with the graph counters:
    the first third unmasked, the rest masked, row 1 reset two thirds in."""
    import mimi_py

    b = 4
    rng = np.random.default_rng(0)
    codec = mimi_py.MimiCodec(seed=0, num_codebooks=8, device=device, dtype=dtype)
    pcm = (rng.standard_normal((b, 1, frames * 1920)) * 0.1).astype(np.float32)
    saved: dict[str, np.ndarray] = {}
    for i in range(frames):
        active = None if i < frames // 3 else np.array([(r + i) % 4 != 0 for r in range(b)])
        if i == 2 * frames // 3:
            codec.reset_state(rows=[1])
        codes = codec.encode_step(pcm[..., i * 1920 : (i + 1) * 1920], active=active)
        saved[f"codes{i}"] = codes
        saved[f"audio{i}"] = codec.decode_step(codes, active=active)
    cfg = mimi_py.TransformerConfig.mimi().replace(context=CONTEXT, num_layers=2)
    tr = mimi_py.StreamingTransformer(cfg, seed=0, device=device, dtype=dtype)
    x = rng.standard_normal((b, tokens, cfg.d_model)).astype(np.float32)
    for t in range(tokens):
        saved[f"transformer{t}"] = tr.step(x[:, t : t + 1])
    counts = getattr(mimi_py._core, "_graph_counts", lambda: {})()
    np.savez(out, counts=json.dumps(counts), **saved)


def compare(eager: Path, graphs: Path) -> dict:
    """Which outputs differ (names), and the graphs process's counters."""
    a, g = np.load(eager), np.load(graphs)
    names = [n for n in a.files if n != "counts"]
    differ = [n for n in names if a[n].shape != g[n].shape or a[n].tobytes() != g[n].tobytes()]
    return {
        "outputs": len(names),
        "differ": differ,
        "eager_counts": json.loads(str(a["counts"])),
        "graph_counts": json.loads(str(g["counts"])),
    }


def run(a: argparse.Namespace, dtype: str, tmp: Path) -> dict:
    paths = {}
    for graphs in ("0", "1"):
        path = tmp / f"{dtype}-{graphs}.npz"
        env = dict(os.environ, MIMI_PY_CUDA_GRAPHS=graphs)
        cmd = [sys.executable, __file__, "--child", a.device, dtype, str(path), str(a.frames), str(a.tokens)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": f"MIMI_PY_CUDA_GRAPHS={graphs}: {done.stderr.strip()[-2000:]}"}
        paths[graphs] = path
    return compare(paths["0"], paths["1"])


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        device, dtype, out, frames, tokens = sys.argv[2:7]
        child(device, dtype, out, int(frames), int(tokens))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--frames", type=int, default=24, help="codec frames streamed")
    p.add_argument("--tokens", type=int, default=40, help="transformer steps")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    results, ok = {}, True
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in a.dtypes.split(","):
            r = run(a, dtype, Path(tmp))
            results[dtype] = r
            replays = r.get("graph_counts", {}).get("replayed", 0)
            good = "error" not in r and not r["differ"] and replays > 0
            ok &= good
            print(f"{dtype}: {'equal' if good else 'FAILED'}: {json.dumps(r)}")
    if a.out:
        Path(a.out).write_text(json.dumps({"device": a.device, "results": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
