"""Smoke test of the benchmark suite (benches/run.py): every suite runs at tiny sizes, so the
scripts never rot. No timings are asserted; only that the run completes and its JSON is whole."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from support.paths import REPO

RUN = REPO / "benches" / "run.py"
GPU = REPO / "benches" / "gpu.py"


def run_script(script: Path, args: list[str], tmp_path: Path, timeout: int, env: dict | None = None) -> None:
    """Runs a bench script from the repository root, its weights cached under ``tmp_path``."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env={**os.environ, "MIMI_BENCH_CACHE": str(tmp_path / "cache"), **(env or {})},
    )
    assert proc.returncode == 0, f"{script.name} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


# The suites whose Rust binary tiny mode does not build: reported skipped, as their checks
# below require. Every other suite of run.py's list (declared there once, ALL_SUITES) must run.
UNBUILT_IN_TINY = {"layers"}


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
    assert set(suites) == set(res["args"]["suites"]) and "efficiency" in suites  # all of ALL_SUITES
    for name in set(suites) - UNBUILT_IN_TINY:
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
    """benches/gpu.py on the CPU at tiny sizes with the small codec, its young-ring sections
    (offline, streaming, masked, transformer): mimi_py's float32 rows run; moshi (not installed,
    or unable to build the small codec) and any dtype the build refuses are recorded as failed
    rows, not a crash."""
    args = ["--device", "cpu", "--tiny", "--codec", "small", "--engines", "mimi_py,moshi"]
    args += ["--sections", "offline,streaming,masked,transformer", "--dtypes", "float32,bfloat16"]
    run_script(GPU, [*args, "--out", str(tmp_path)], tmp_path, timeout=120)
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


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def check_steady_row(x: dict, args: dict) -> None:
    """A full-ring row: the rings really full, both frame kinds timed, the figures consistent."""
    w, u, m = x["warmup"], x["unmasked"], x["masked"]
    assert w["frames"] == args["steady_warmup"] and w["rings_full"], w
    assert w["ring_tokens"] >= w["context"] > 0 and w["calls"] * w["frames_per_call"] >= w["frames"], w
    assert x["ring_tokens_after"] > w["ring_tokens"]  # the timed frames went on from there
    for part in (u, m):
        t = part["frame_total"]
        assert (
            t["n"] == args["steady_frames"]
            and 0 < t["min_us"] <= t["median_us"] <= t["p99_us"] <= t["max_us"]
        )
        assert part["real_time"] == (t["p99_us"] <= 80_000)
    assert u["per_stream_median_us"] == round(u["frame_total"]["median_us"] / x["batch"], 1)
    assert (m["mean_active_rows"] < x["batch"]) if x["batch"] > 1 else m["mean_active_rows"] == 1
    ratio = m["frame_total"]["median_us"] / u["frame_total"]["median_us"]
    assert _finite(x["masked_over_unmasked"]) and abs(x["masked_over_unmasked"] - ratio) < 1e-3


def check_held_row(x: dict, args: dict) -> None:
    """The streams-held search: the answer is its largest passing probe, within its bounds."""
    probes = x["probes"]
    assert [p["batch"] for p in probes] == sorted({p["batch"] for p in probes}), probes
    assert set(args["steady_batches"]) <= {p["batch"] for p in probes if p.get("from") == "steady"}
    assert all(_finite(p["p99_us"]) and p["ok"] == (p["p99_us"] <= x["limit_us"]) for p in probes)
    assert x["streams_held"] == max([p["batch"] for p in probes if p["ok"]] + [0])
    assert x["first_failing"] is None or x["first_failing"] > x["streams_held"]
    assert x["streams_held"] <= args["held_max"]
    assert x["stopped"] in ("largest batch tried", "resolution", "time budget", "B = 1 misses"), x
    assert 0 <= x["search_s"] <= args["held_budget"] + 30


def check_census_row(x: dict, args: dict) -> None:
    """A census on the CPU: no kernels, no GPU time, the frames timed with and without it."""
    assert x["warmup"]["rings_full"]
    for part in (x["unmasked"], x["masked"]):
        assert part["frames"] == args["census_frames"], part
        assert part["profiler"].startswith(("torch.profiler", "none: torch not installed")), part
        assert part["kernels"] == 0 and part["launch_calls_per_frame"] == 0 and part["copies_per_frame"] == {}
        assert part["gpu_busy_us_per_frame"] == 0 == part["busy_over_wall"]
        assert _finite(part["wall_us_per_frame"], part["profiled_wall_us_per_frame"])
        assert part["wall_us_per_frame"] > 0 and part["profiled_wall_us_per_frame"] > 0


def test_gpu_bench_steady_held_census_variants_dry_run_cpu(tmp_path):
    """The full-ring rows, the streams-held search and the kernel census, each run for two
    variants of mimi_py's environment in two rounds (A B, B A); moshi's rows fail as not run."""
    args = ["--device", "cpu", "--tiny", "--codec", "small", "--engines", "mimi_py,moshi"]
    args += ["--sections", "steady,held,census", "--dtypes", "float32", "--rounds", "2"]
    args += ["--variant", "base:", "--variant", "parked:MIMI_PY_SPIN=0,MIMI_PY_HEAP_KEEP_MB=0"]
    # The commit: git's where the tree is a checkout, else $MIMI_BENCH_COMMIT (CI's copy and the
    # device's have no .git).
    commit = {"MIMI_BENCH_COMMIT": "0123abc-test"}
    run_script(GPU, [*args, "--budget", "200", "--out", str(tmp_path)], tmp_path, timeout=120, env=commit)
    res = json.loads((tmp_path / "gpu_results.json").read_text())
    a = res["args"]
    assert [(r["engine"], r["variant"], r["round"]) for r in res["runs"]] == [
        ("mimi_py", "base", 1),
        ("mimi_py", "parked", 1),
        ("moshi", None, 1),
        ("mimi_py", "parked", 2),
        ("mimi_py", "base", 2),
    ]
    want = [("steady", b) for b in a["steady_batches"]] + [("held", None)]
    want += [("census", b) for b in a["census_batches"]]
    for r in res["runs"]:
        assert [(x["kind"], x["batch"]) for x in r["rows"]] == want, r
        if r["engine"] == "moshi":
            assert not any(x["ok"] for x in r["rows"]) and r["variant_env"] == {}
            continue
        assert all(x["ok"] for x in r["rows"]), r
        spin = "0" if r["variant"] == "parked" else "1"
        assert r["settings"]["MIMI_PY_SPIN"] == spin and r["label"].startswith(f"mimi_py [{r['variant']}] #")
        for x in r["rows"]:
            {"steady": check_steady_row, "held": check_held_row, "census": check_census_row}[x["kind"]](x, a)
    # Same build, switches that change no result: each variant's codes equal the first's.
    (g,) = [g for g in res["agreement"] if g["a"].get("variant") == "parked"]
    assert g["b"]["variant"] == "base" and g["steady"]["equal_fraction"] == 1.0, g
    assert {v["variant"] for v in res["variants"]} == {"base", "parked"}
    for v in res["variants"]:
        assert len(v["rounds_median_us"]) == 2 and _finite(v["mean_median_us"], v["over_first"])
    b1 = [t for t in res["targets"] if t["target"].startswith("streaming B = 1")]
    assert [t["variant"] for t in b1] == ["base", "parked"] and all(t["mimi_py"] > 0 for t in b1)
    assert all(t["moshi"] is None and t["met"] is None for t in res["targets"])  # moshi did not run
    in_git = (
        subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode == 0
    )
    assert in_git or res["machine"]["commit"] == "0123abc-test", res["machine"]["commit"]
    assert res["machine"]["commit"] and res["duration_s"] <= 200
    md = (tmp_path / "gpu_results.md").read_text()
    for heading in ("## Targets", "## Steady state", "## Streams held", "## Kernel census", "## Variants"):
        assert heading in md, heading


def _event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_gpu_census_counts_a_trace(monkeypatch):
    """The census of a made-up Chrome trace of 2 frames: kernels and copies counted by kind,
    launch calls by API, GPU busy as the union of overlapping device intervals."""
    monkeypatch.syspath_prepend(str(REPO / "benches"))
    from gpu_census import census_from_trace, union_us

    assert union_us([]) == 0 and union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    trace = {
        "traceEvents": [
            _event("kernel", "gemm", 0, 10),
            _event("kernel", "gemm", 5, 10),  # overlaps the first: busy 15, kernel time 20
            _event("Kernel", "softmax", 30, 2),
            _event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 40, 4),
            _event("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 50, 1),
            _event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 60, 1),
            _event("gpu_memset", "Memset (Device)", 70, 1),
            _event("cuda_driver", "cuLaunchKernel", 0, 1),
            _event("cuda_runtime", "cudaLaunchKernel", 2, 1),
            _event("cuda_runtime", "cudaGraphLaunch", 3, 1),
            _event("cuda_runtime", "cudaStreamSynchronize", 4, 1),
            _event("cpu_op", "aten::mm", 0, 3),
            _event("gpu_user_annotation", "frame", 0, 100),  # not device work
            {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 0},  # not a complete event
        ]
    }
    c = census_from_trace(trace, frames=2)
    assert c["kernels"] == 3 and c["kernels_per_frame"] == 1.5
    assert c["kernel_us_per_frame"] == 11.0  # (10 + 10 + 2) / 2
    assert c["gpu_busy_us_per_frame"] == 12.0  # (15 + 2 + 4 + 1 + 1 + 1) / 2: overlaps once, not 14.5
    assert c["launch_calls_per_frame"] == 1.0 and c["graph_launches_per_frame"] == 0.5
    assert c["api_calls_per_frame"] == 2.0 and c["cpu_ops_per_frame"] == 0.5
    assert c["copies_per_frame"] == {"DtoH": 0.5, "HtoD": 1.0} and c["memsets_per_frame"] == 0.5
    assert [(k["name"], k["count"], k["us"]) for k in c["top_kernels"]] == [
        ("gemm", 2, 20.0),
        ("softmax", 1, 2.0),
    ]
    empty = census_from_trace({"traceEvents": []}, frames=5)
    assert empty["kernels"] == 0 and empty["gpu_busy_us_per_frame"] == 0 and empty["top_kernels"] == []


def test_gpu_streams_held_search(monkeypatch):
    """The streams-held search on made-up frame times (p99 = 5 ms + 0.1 ms per row: 750 rows
    within 80 ms), from the steady rows' results, on a made-up clock."""
    monkeypatch.syspath_prepend(str(REPO / "benches"))
    from gpu_steady import search_held

    now = [0.0]
    tried = []

    def probe(b, cost_per_row=0.01):
        tried.append(b)
        now[0] += cost_per_row * b  # a probe's seconds grow with B
        p99 = 5000 + 100 * b
        return {"batch": b, "ok": p99 <= 80_000, "p99_us": p99, "s": cost_per_row * b}

    def known(*batches):
        return {b: dict(probe(b), **{"from": "steady"}) for b in batches}

    spec = {"held_start": 256, "held_max": 4096, "held_budget": 1000}
    steady = known(64, 256)
    tried.clear()
    r = search_held(probe, steady, spec, clock=lambda: now[0])
    assert r["streams_held"] <= 750 < r["first_failing"] and r["stopped"] == "resolution", r
    assert r["first_failing"] - r["streams_held"] <= r["streams_held"] // 8
    assert tried[0] == 750  # the line through 64 and 256 rows, straight to the limit
    assert 64 not in tried and 256 not in tried  # the steady rows are not measured again
    # A short budget stops before a probe that would pass it, keeping what it had.
    r = search_held(probe, known(64, 256), dict(spec, held_budget=1.0), clock=lambda: now[0])
    assert r["stopped"] == "time budget" and r["streams_held"] == 256 and r["first_failing"] is None
    # Nothing known: it starts at held_start and halves while B misses.
    slow = lambda b: dict(probe(b), ok=False)  # noqa: E731
    r = search_held(slow, {}, dict(spec, held_start=4), clock=lambda: now[0])
    assert [p["batch"] for p in r["probes"]] == [1, 2, 4] and r["streams_held"] == 0
    assert r["stopped"] == "B = 1 misses" and r["first_failing"] == 1
    # Everything passes: it stops at held_max.
    r = search_held(probe, {}, dict(spec, held_start=1, held_max=8), clock=lambda: now[0])
    assert r["streams_held"] == 8 and r["stopped"] == "largest batch tried"


def test_gpu_variants_parse_and_alternate(monkeypatch):
    """--variant NAME:ENV=VAL,... and the order of the workers: A B, then B A; moshi once."""
    monkeypatch.syspath_prepend(str(REPO / "benches"))
    import gpu

    assert gpu.parse_variant("graphs:MIMI_PY_X=1,MIMI_PY_Y=a=b") == {
        "name": "graphs",
        "env": {"MIMI_PY_X": "1", "MIMI_PY_Y": "a=b"},
    }
    assert gpu.parse_variant("base") == gpu.parse_variant("base:") == {"name": "base", "env": {}}
    for bad in ("", "a b:X=1", "v:X", "v:1X=2"):
        try:
            gpu.parse_variant(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
    args = gpu.parse_args(["--variant", "a:", "--variant", "b:X=1", "--rounds", "3", "--dtypes", "float32"])
    plan = [(e, v["name"], r) for e, _, v, r in gpu.run_plan(args)]
    assert plan == [
        ("mimi_py", "a", 1),
        ("mimi_py", "b", 1),
        ("moshi", None, 1),
        ("mimi_py", "b", 2),
        ("mimi_py", "a", 2),
        ("mimi_py", "a", 3),
        ("mimi_py", "b", 3),
    ]
    env = gpu.worker_env(2, {"PYTHONPATH": "/old/build", "X": "1"})
    assert env["X"] == "1" and env["RAYON_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == "/old/build"
