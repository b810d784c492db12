#!/usr/bin/env python3
"""The agreement of each precision with ``"highest"``, per layer group (docs/precision.md).

    python benches/precision.py [--seconds 20] [--out benches/precision.json]

For each codec (the fixture codec of tests/data/codec, and the real-size codec of seeded
weights with 32 codebooks) and input (speech-like: a gliding, pulsing tone with a little
noise; and white noise), it encodes at ``"highest"`` and at the precision under test, and
decodes ``"highest"``'s codes at both. Reported: the fraction of codebook 0's codes and of
all codes equal to ``"highest"``'s, and the SNR of the decoded audio against ``"highest"``'s
decoding of the same codes. ``"medium"`` is measured with its default groups, with every group
in bf16, and one group at a time (``MIMI_PY_MEDIUM_LAYERS``, read once per process: each
configuration runs in its own process). Prints a markdown table and writes the rows as JSON, with the machine's
``kernel_isa``. Speed is ``benches/paired.py``'s (``--worker medium=:medium``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODEC_DIR = REPO / "tests" / "data" / "codec"
DEFAULT_LAYERS = "frame_rate,transformers,decoder_convs"  # MIMI_PY_MEDIUM_LAYERS' default
CONFIGS = [
    ("high", "all"),
    ("medium", DEFAULT_LAYERS),
    ("medium", "all"),
    ("medium", "encoder_convs"),
    ("medium", "frame_rate"),
    ("medium", "transformers"),
    ("medium", "decoder_convs"),
]


def inputs(seconds: float, sr: int = 24000):
    import numpy as np

    t = np.arange(int(seconds * sr)) / sr
    rng = np.random.default_rng(1)
    tone = np.sin(2 * np.pi * (200 + 150 * np.sin(2 * np.pi * 0.3 * t)) * t) * (
        0.5 + 0.5 * np.sin(4 * np.pi * t)
    )
    speech = (0.3 * tone + 0.05 * rng.standard_normal(t.size)).astype(np.float32)[None, None]
    noise = (0.1 * rng.standard_normal(t.size)).astype(np.float32)[None, None]
    return {"speech-like": speech, "noise": noise}


def snr_db(ref, x) -> float:
    import numpy as np

    ref = ref.astype(np.float64)
    err = float(((ref - x) ** 2).sum())
    return float("inf") if err == 0 else float(10 * np.log10(float((ref**2).sum()) / err))


def codecs(precision: str):
    """(name, highest codec, codec at ``precision``) for the fixture and real-size codecs."""
    import mimi_py

    cfg = mimi_py.CodecConfig(**json.loads((CODEC_DIR / "mimi_small_candle_config.json").read_text()))
    f = CODEC_DIR / "mimi_small.safetensors"
    yield "fixture codec", *(mimi_py.MimiCodec(f, config=cfg, precision=p) for p in ("highest", precision))
    yield (
        "real-size, seeded, 32 codebooks",
        *(mimi_py.MimiCodec(seed=0, num_codebooks=32, precision=p) for p in ("highest", precision)),
    )


def worker(precision: str, groups: str, seconds: float) -> None:
    for name, ref, ours in codecs(precision):
        for what, pcm in inputs(seconds).items():
            codes, mine = ref.encode(pcm), ours.encode(pcm)
            equal = codes == mine
            audio, decoded = ref.decode(codes), ours.decode(codes)
            row = {
                "precision": precision,
                "layers": groups,
                "codec": name,
                "input": what,
                "frames": int(codes.shape[-1]),
                "codebook0_equal": float(equal[:, 0].mean()),
                "all_equal": float(equal.mean()),
                "decoded_snr_db": snr_db(audio, decoded),
                "finite": bool(all(map(lambda a: __import__("numpy").isfinite(a).all(), (mine, decoded)))),
                "kernel_isa": ours.kernel_isa,
            }
            print(json.dumps(row), flush=True)


def run_all(seconds: float) -> list[dict]:
    rows = []
    for precision, groups in CONFIGS:
        env = dict(os.environ, MIMI_PY_MEDIUM_LAYERS=groups)
        cmd = [sys.executable, __file__, "--worker", f"{precision}:{groups}", "--seconds", str(seconds)]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        rows += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows


def table(rows: list[dict]) -> str:
    head = "| precision | layers in bf16 | codec | input | codebook 0 equal | all codes equal | decoded SNR |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['precision']} | {'default' if r['layers'] == DEFAULT_LAYERS else r['layers']} | "
            f"{r['codec']} | {r['input']} | "
            f"{r['codebook0_equal']:.1%} | {r['all_equal']:.1%} | {r['decoded_snr_db']:.1f} dB |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="length of each input")
    p.add_argument("--out", type=Path, default=None, help="write the rows here as JSON")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        precision, groups = a.worker.split(":")
        return worker(precision, groups, a.seconds)
    rows = run_all(a.seconds)
    print(table(rows))
    if a.out:
        machine = {"cpu": platform.processor() or platform.machine(), "kernel_isa": rows[-1]["kernel_isa"]}
        a.out.write_text(
            json.dumps({"machine": machine, "seconds": a.seconds, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
