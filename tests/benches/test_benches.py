"""Smoke test of the benchmark suite (benches/run.py): every suite runs at tiny sizes, so the
scripts never rot. No timings are asserted; only that the run completes and its JSON is whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

RUN = REPO / "benches" / "run.py"
GPU = REPO / "benches" / "gpu.py"


def run_script(script: Path, args: list[str], tmp_path: Path, timeout: int) -> None:
    """Runs a bench script from the repository root, its weights cached under ``tmp_path``."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env={**os.environ, "MIMI_BENCH_CACHE": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, f"{script.name} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


SUITES = [
    "transformer",
    "codec",
    "aggregate",
    "streaming",
    "rss",
    "corpus",
    "serving",
    "server",
    "efficiency",
]


def check_server_suite(server: dict) -> None:
    """The server suite's tiny runs: real clients through `mimi-py serve` (the serve extra)."""
    assert [(r["weights_dtype"], r["slots"]) for r in server["runs"]] == [
        ("float32", 1),
        ("float32", 2),
        ("bfloat16", 1),
        ("bfloat16", 2),
    ]
    assert all(
        r["complete"] and r["frames"] == r["slots"] * r["frames_per_client"] for r in server["runs"]
    ), server
    assert set(server["streams_held"]) == {"float32", "bfloat16"}
    assert set(server["streams_held"].values()) <= {0, 1, 2}
    assert set(server["auto"]) == {"float32", "bfloat16"} and server["machine"], server
    for wd, auto in server["auto"].items():  # --slots auto: as many clients as it measured, then 2 more
        assert auto["calibrated_slots"] == auto["clients"] == auto["calibration"]["slots"] >= 1, (wd, auto)
        assert auto["complete"] and auto["frames"] == auto["clients"] * auto["frames_per_client"], (wd, auto)
        assert auto["extra_close_codes"] == [1013, 1013] and auto["extra_turned_away"], (wd, auto)


def check_layers_suite(layers: dict) -> None:
    """The layers suite's tiny run. Its binary, like the native bench, is not built in tiny
    mode; its output is tested in Rust (crates/mimi-core/src/bin/mimi_step_profile.rs)."""
    if "skipped" in layers:
        assert "not built" in layers["skipped"], layers
        return
    assert [r["weights_dtype"] for r in layers["runs"]] == ["float32", "bfloat16"]
    for r in layers["runs"]:
        assert r["ok"], r
        assert [b["batch"] for b in r["batches"]] == layers["batches"]
        timed = {x["layer"] for x in r["batches"][0]["layers"]}
        assert {"enc.init", "enc.transformer", "dec.transformer", "dec.last"} <= timed


def check_efficiency_suite(eff: dict, threads: int) -> None:
    """The efficiency suite's tiny runs: both weight types, every batch size, the figures derived
    from them, and the plan overhead reported as not measured rather than made up."""
    assert [(r["weights_dtype"], r["threads"]) for r in eff["runs"]] == [
        ("float32", threads),
        ("bfloat16", threads),
    ]
    for r in eff["runs"]:
        assert r["ok"], r
        assert r["threads_env"]["RAYON_NUM_THREADS"] == str(threads) == str(r["bandwidth"]["threads"])
        assert [b["batch"] for b in r["batches"]] == eff["batches"]
        for b in r["batches"]:
            assert b["n"] == eff["frames"] and 0 < b["median_us"] <= b["p99_us"]
            assert b["ms_per_stream_frame"] == round(b["median_us"] / 1e3 / b["batch"], 3)
            assert b["over_offline"] > 0 and b["cpu_per_wall"] > 0
            assert b["real_time"] == (b["p99_us"] <= eff["real_time_us"])
        assert r["offline"]["frames"] >= 1 and r["offline"]["ms_per_frame"] > 0
        assert r["bandwidth"]["array_bytes"] == eff["bandwidth_bytes"] and r["bandwidth"]["gb_per_s"] > 0
        assert r["weights_nbytes"] > 0 and r["memory_floor_ms"] > 0 and r["b1_over_floor"] > 0
        assert r["streams_held"] == max([b["batch"] for b in r["batches"] if b["real_time"]] + [0])
        assert r["plan_overhead_ms"] is None and r["not_measured"]["plan_overhead_ms"]
    f32, bf16 = eff["runs"]
    assert bf16["weights_nbytes"] < f32["weights_nbytes"]  # the matrices stored in half the bytes


def test_efficiency_figures(monkeypatch):
    """The efficiency suite's derived figures on made-up raw times (no process, no timing)."""
    monkeypatch.syspath_prepend(str(REPO / "benches"))
    from runner.efficiency import efficiency_figures

    def frame(batch, median_ms, p99_ms):
        return {
            "batch": batch,
            "median_us": median_ms * 1e3,
            "p99_us": p99_ms * 1e3,
            "cpu_s": 1.5,
            "wall_s": 1.0,
        }

    raw = {
        "batches": [frame(1, 20, 30), frame(4, 40, 79), frame(8, 60, 81), frame(16, 70, 80)],
        "offline": {"ms_per_frame": 5.0},
        "weights_nbytes": 300_000_000,
        "bandwidth": {"gb_per_s": 20.0},
    }
    fig = efficiency_figures(raw, {"ok": False, "error": "not run"})
    assert [b["ms_per_stream_frame"] for b in fig["batches"]] == [20.0, 10.0, 7.5, 4.375]
    assert [b["over_offline"] for b in fig["batches"]] == [4.0, 2.0, 1.5, 0.875]
    assert fig["streams_held"] == 16  # B=8 misses (81 ms), the largest B within 80 ms counts
    assert fig["memory_floor_ms"] == 15.0 and fig["b1_over_floor"] == round(20 / 15, 3)
    assert fig["b1_over_floor_plus_offline"] == 1.0  # 20 ms against 15 + 5
    assert fig["cpu_per_wall"] == 1.5
    assert fig["plan_overhead_ms"] is None and fig["not_measured"] == {"plan_overhead_ms": "not run"}
    measured = efficiency_figures(raw, {"ok": True, "no_products_median_ms": 2.5, "ratio": 0.125})
    assert measured["plan_overhead_ms"] == 2.5 and measured["plan_overhead_share"] == 0.125
    assert measured["not_measured"] == {}
    slow = efficiency_figures(dict(raw, weights_nbytes=None, batches=[frame(2, 90, 95)]), {"ok": False})
    assert slow["streams_held"] == 0 and slow["memory_floor_ms"] is None and slow["b1_over_floor"] is None
    assert slow["b1_over_floor_plus_offline"] is None
    assert set(slow["not_measured"]) == {"plan_overhead_ms", "memory_floor_ms"}


def test_bench_suites_run_tiny(tmp_path):
    run_script(RUN, ["--tiny", "--threads", "1", "--out", str(tmp_path)], tmp_path, timeout=240)

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

    (agg,) = mimi_runs("aggregate")  # 2 processes x 1 thread, started together
    assert agg["ok"], agg
    assert agg["processes"] == res["args"]["aggregate_procs"] == len(agg["each"]) == 2
    assert all(r["ok"] and r["threads_env"]["RAYON_NUM_THREADS"] == "1" for r in agg["each"])
    clips = res["args"]["aggregate_clips"]
    assert agg["audio_s"] == 2 * clips * agg["clip_seconds"] and agg["encode_rtf"] > 0
    assert agg["wall_s"] >= max(r["wall_s"] for r in agg["each"]) - 0.01
    assert agg["single_clip"]["encode_rtf"] == off["encode_rtf"]  # the offline figure beside it

    (st,) = mimi_runs("streaming")
    assert st["ok"], st
    assert st["frames_without_codes"] == 0
    assert st["frame_total"]["n"] == res["args"]["frames"]

    rss = mimi_runs("rss")
    assert rss and all(r["ok"] and r["peak_rss_bytes"] > 0 for r in rss), rss

    serving = suites["serving"]["runs"]  # float32 then bfloat16 weights
    assert [r["weights_dtype"] for r in serving] == ["float32", "bfloat16"]
    for serve in serving:
        assert serve["ok"], serve
        assert [b["batch"] for b in serve["batches"]] == suites["serving"]["batches"]
        assert serve["streams_held"] in suites["serving"]["batches"] + [0]
        assert serve["masked"]["active"] * 2 == serve["masked"]["batch"]

    check_server_suite(suites["server"])
    check_layers_suite(suites["layers"])
    check_efficiency_suite(suites["efficiency"], threads=1)

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
        "### Codec aggregate",
        "### Codec streaming",
        "### Peak RSS",
        "### Corpus",
        "### Server",
        "### Efficiency",
    ):
        assert heading in readme


def test_gpu_bench_dry_run_cpu(tmp_path):
    """benches/gpu.py on the CPU at tiny sizes with the small codec: mimi_py's float32 rows run;
    moshi (not installed, or unable to build the small codec) and any dtype the build refuses are
    recorded as failed rows, not a crash."""
    args = ["--device", "cpu", "--tiny", "--codec", "small", "--engines", "mimi_py,moshi"]
    run_script(GPU, [*args, "--dtypes", "float32,bfloat16", "--out", str(tmp_path)], tmp_path, timeout=120)
    res = json.loads((tmp_path / "gpu_results.json").read_text())
    runs = {(r["engine"], r["dtype"]): r for r in res["runs"]}
    assert set(runs) == {(e, d) for e in ("mimi_py", "moshi") for d in ("float32", "bfloat16")}
    want = [("offline", b) for b in res["args"]["batches"]] + [
        (kind, b) for kind in ("streaming", "masked", "transformer") for b in res["args"]["stream_batches"]
    ]
    for r in runs.values():
        assert sorted((x["kind"], x["batch"]) for x in r["rows"]) == sorted(want), r
        assert all(x["ok"] or x["error"] for x in r["rows"]), r
    f32 = runs["mimi_py", "float32"]
    assert f32["ok"] and all(x["ok"] for x in f32["rows"]), f32
    for x in f32["rows"]:
        if x["kind"] == "offline":
            assert x["encode_rtf"] > 0 and x["codes_shape"][:2] == [x["batch"], 4]
        elif x["kind"] == "streaming":
            assert x["frame_total"]["n"] == res["args"]["frames"] and x["per_stream_median_us"] > 0
        elif x["kind"] == "transformer":
            for rings in ("young", "full"):
                n = {x[f"{rings}_{kind}"]["n"] for kind in ("unmasked", "masked")}
                assert n == {res["args"]["frames"]} and x[f"{rings}_masked_over_unmasked"] > 0, x
        else:
            assert (
                x["frame_total"]["n"] == res["args"]["frames"] and 0 < x["mean_active_rows"] < x["batch"] + 1
            )
    assert all(not x["ok"] for d in ("float32", "bfloat16") for x in runs["moshi", d]["rows"])
    pairs = {
        (g["a"]["engine"], g["a"]["dtype"], g["b"]["engine"], g["b"]["dtype"]): g for g in res["agreement"]
    }
    assert pairs["mimi_py", "float32", "moshi", "float32"]["offline"] is None  # moshi has no codes
    md = (tmp_path / "gpu_results.md").read_text()
    assert "## Offline" in md and "## Streaming" in md and "## Streaming with masks" in md
    assert "## The transformer alone" in md
    assert "## Code agreement" in md
