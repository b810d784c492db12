"""Smoke test of the benchmark suite (benches/run.py): every suite runs at tiny sizes, so the
scripts never rot. No timings are asserted; only that the run completes and its JSON is whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "benches" / "run.py"
SUITES = ["transformer", "codec", "streaming", "rss", "corpus", "serving"]


def test_bench_suites_run_tiny(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(RUN), "--tiny", "--threads", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(REPO),
        env={**os.environ, "MIMI_BENCH_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, f"benches/run.py --tiny failed:\n{proc.stdout}\n{proc.stderr}"

    res = json.loads((tmp_path / "results.json").read_text())
    assert res["args"]["tiny"] is True
    assert res["mimi_py_failures"] == []
    m = res["machine"]
    assert m["cpu_cores"] >= 1 and m["versions"]["mimi_py"] and m["versions"]["candle"]

    suites = res["suites"]
    assert set(SUITES) <= set(suites)
    for name in SUITES:
        assert "skipped" not in suites[name] or not isinstance(suites[name]["skipped"], str), name

    (tr,) = suites["transformer"]["runs"]
    assert tr["mimi_py"]["ok"], tr["mimi_py"]
    assert tr["mimi_py"]["reps"][0]["step_stats"]["n"] == res["args"]["steps"]
    assert tr["mimi_py"]["step_median_us"] > 0 and tr["mimi_py"]["chunk_us"] > 0
    native = tr["native"]
    assert native.get("ok") or native.get("skipped"), native  # binary optional in tiny mode

    def mimi_runs(suite):
        return [r for r in suites[suite]["runs"] if r["engine"] == "mimi_py"]

    (off,) = mimi_runs("codec")
    assert off["ok"], off
    assert off["encode_rtf"] > 0 and off["decode_rtf"] > 0
    assert off["codes_shape"][:2] == [1, 4] and off["audio_shape"][:2] == [1, 1]

    (st,) = mimi_runs("streaming")
    assert st["ok"], st
    assert st["frames_without_codes"] == 0
    assert st["frame_total"]["n"] == res["args"]["frames"]

    rss = mimi_runs("rss")
    assert rss and all(r["ok"] and r["peak_rss_bytes"] > 0 for r in rss), rss

    (serve,) = suites["serving"]["runs"]
    assert serve["ok"], serve
    assert [b["batch"] for b in serve["batches"]] == suites["serving"]["batches"]
    assert serve["streams_held"] in suites["serving"]["batches"] + [0]
    assert serve["masked"]["active"] * 2 == serve["masked"]["batch"]

    corpus = suites["corpus"]  # needs the data extra (part of the test extra)
    runs = {r["label"]: r for r in corpus["runs"]}
    assert all(r["ok"] for r in corpus["runs"]), corpus["runs"]
    assert runs["tokenize, 1 worker x 1 thread"]["codes_equal"] is True
    assert runs["plain loop, 1 process"]["audio_s"] == corpus["audio_s"] > 0
    assert all(g["meaningful"] is False for g in corpus["goals"])

    keys = {t["key"] for t in res["targets"]}
    assert {"step_median_us", "encode_rtf", "decode_rtf", "stream_median_us", "peak_rss_bytes"} <= keys
    assert all(t["meaningful"] is False for t in res["targets"])  # tiny numbers are not verdicts

    readme = (tmp_path / "README.md").read_text()
    assert "<!-- results:start -->" in readme and "<!-- results:end -->" in readme
    for heading in (
        "### Targets",
        "### Transformer",
        "### Codec offline",
        "### Codec streaming",
        "### Peak RSS",
        "### Corpus",
    ):
        assert heading in readme
