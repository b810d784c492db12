"""The benchmarks' runner (`python -m benches`): every suite runs at the tiny size, the GPU
suites run on the CPU, the variants alternate, and the report renders its tables and charts
from a results file. No time is asserted: only that the runs complete, their rows are whole,
and the figures derived from made-up times are right."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO

BENCHES = REPO / "benches"
PRECISIONS = ["highest", "high", "medium"]


@pytest.fixture
def benches(monkeypatch):
    """benches/ on the path, as `python -m benches` puts it."""
    monkeypatch.syspath_prepend(str(BENCHES))


def run_benches(args: list[str], tmp_path, timeout: int = 600) -> dict:
    """`python -m benches ARGS --out TMP` from the repository root; its one results file."""
    out = tmp_path / "results"
    env = {**os.environ, "MIMI_BENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "benches", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        env=env,
    )
    assert proc.returncode == 0, (
        f"python -m benches {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr[-6000:]}"
    )
    (path,) = out.glob("*.json")
    return json.loads(path.read_text())


def rows(res: dict, suite: str) -> list[dict]:
    """A suite's table rows: its summary's table, else its rows (a row's sub-rows each)."""
    s = res["suites"][suite]
    return s.get("table") or [dict(r, **x) for r in s["rows"] for x in r.get("rows") or [{}]]


def check_codec_suites(res: dict) -> None:
    """Offline, streaming, serving and efficiency: one mimi_py row per precision, each
    computing at the precision asked; the peers skipped at the tiny size, and said why."""
    for suite in ("offline", "streaming", "serving", "efficiency"):
        mine = [r for r in res["suites"][suite]["rows"] if r["engine"] == "mimi_py"]
        assert [(r["label"], r["precision"]) for r in mine] == [(f"mimi_py {p}", p) for p in PRECISIONS]
        assert all(r["ok"] and r["kernel_isa"] for r in mine), mine
    off = res["suites"]["offline"]
    assert all(r["encode_rtf"] > 0 and r["codes_shape"][:2] == [1, 4] for r in off["rows"])
    assert off["skipped"]["moshi"] == "skipped (tiny sizes)"
    assert [a["label"] for a in off["agreement"]] == ["mimi_py high", "mimi_py medium"]
    assert all(a["against"] == "mimi_py highest" and 0 <= a["equal"] <= 1 for a in off["agreement"])
    for r in res["suites"]["serving"]["rows"]:
        assert list(r["p99_by_batch"]) == ["1", "2"] and r["streams_held"] in (0, 1, 2)
    for r in res["suites"]["efficiency"]["rows"]:
        assert r["memory_floor_ms"] > 0 and r["gb_per_s"] > 0 and list(r["per_stream_by_batch"]) == ["1", "2"]
    highest, high, medium = (r["weights_nbytes"] for r in res["suites"]["efficiency"]["rows"])
    assert high < highest and medium < highest  # the matrices stored in half the bytes


def check_other_suites(res: dict) -> None:
    """The suites that are not one row per engine: each row whole."""
    assert all(r["ok"] and r["step_median_us"] > 0 for r in rows(res, "transformer"))
    (agg,) = rows(res, "aggregate")
    assert agg["ok"] and agg["processes"] == 2 and agg["encode_rtf"] > 0 and len(agg["each_rtf"]) == 2
    assert all(r["ok"] and r["peak_rss_mb"] >= r["load_rss_mb"] > 0 for r in rows(res, "rss"))
    corpus = {r["label"]: r for r in rows(res, "corpus")}
    assert corpus["plain loop"]["files"] == corpus["tokenize, 1 worker(s)"]["files"] == 3
    assert corpus["tokenize, 1 worker(s)"]["codes_equal"] is True
    server = rows(res, "server")
    assert [(r["precision"], r["slots"]) for r in server] == [
        (p, n) for p in PRECISIONS for n in ("1", "2", "auto")
    ]
    assert all(r["complete"] for r in server), server
    assert all(r["extra_turned_away"] for r in server if r["slots"] == "auto")
    assert res["suites"]["layers"]["rows"] == [] or all(r["ok"] for r in rows(res, "layers"))
    agree = rows(res, "precision")
    assert [(r["precision"], r["codec"]) for r in agree] == [
        ("high", "fixture codec"),
        ("medium", "fixture codec"),
    ]
    for r in agree:
        assert list(r["all_equal"]) == ["speech-like", "noise"] and r["finite"], r
        assert all(0 <= r["all_equal"][i] <= 1 and 0 <= r["codebook0_equal"][i] <= 1 for i in r["all_equal"])
    (threads,) = rows(res, "threads")
    assert threads["same"] is True and threads["speedup"] > 0
    soak = {r["phase"]: r for r in rows(res, "soak")}
    assert soak["transformer"]["steps"] == 300 and soak["codec"]["steps"] == 50
    assert soak["transformer"]["state_nbytes_peak"] == soak["transformer"]["state_nbytes_end"]


@pytest.mark.extra("serve", "data")  # the server and corpus suites
def test_every_suite_runs_at_the_tiny_size(tmp_path, benches):
    from suites import CPU_SUITES

    res = run_benches(["--tiny"], tmp_path)
    assert list(res["suites"]) == CPU_SUITES and res["tiny"]
    assert res["machine"]["cpu"] and res["machine"]["versions"]["mimi_py"]
    check_codec_suites(res)
    check_other_suites(res)
    md = tmp_path / "README.md"
    import report

    report.main(
        [str(next((tmp_path / "results").glob("*.json"))), "--readme", str(md), "--charts", str(tmp_path)]
    )
    text = md.read_text()
    for suite in CPU_SUITES:
        assert f"#### {suite}: " in text, suite


def test_gpu_suites_run_on_the_cpu_with_variants_in_alternating_rounds(tmp_path):
    """The GPU suites' dry run, as scripts/gpu_check.sh's switches: two variants in two rounds
    (A B, then B A), each variant's codes against the first's."""
    args = ["--tiny", "--device", "cpu", "--dtypes", "float32", "--engines", "mimi_py", "--rounds", "2"]
    args += ["--sections", "offline,streaming,masked,steady,held,census", "--size", "stream_batches=1,2"]
    res = run_benches([*args, "--variant", "a:", "--variant", "b:MIMI_PY_UNUSED=1"], tmp_path)
    assert list(res["suites"]) == ["gpu_rows", "gpu_steady", "gpu_census"]
    got = res["suites"]["gpu_rows"]["rows"]
    order = list(dict.fromkeys((r["variant"], r["round"]) for r in got))
    assert order == [("a", 1), ("b", 1), ("b", 2), ("a", 2)]
    assert {(r["kind"], r["batch"]) for r in got} == {
        (k, b) for k in ("offline", "streaming", "masked") for b in (1, 2)
    }
    assert all(r["ok"] for s in res["suites"].values() for r in s["rows"]), res
    steady = {(r["kind"], r["batch"]): r for r in res["suites"]["gpu_steady"]["rows"] if r["round"] == 1}
    assert steady[("steady", 1)]["warmup"]["rings_full"] and 1 <= steady[("held", None)]["streams_held"] <= 4
    agree = res["suites"]["gpu_rows"]["agreement"]
    assert {(a["kind"], a["variant"], a["equal"]) for a in agree} == {
        ("offline", "b", 1.0),
        ("streaming", "b", 1.0),
    }
    switches = res["suites"]["gpu_rows"]["switches"]
    assert {s["variant"] for s in switches} == {"a", "b"} and all(len(s["rounds_ms"]) == 2 for s in switches)
    census = res["suites"]["gpu_census"]["table"]
    assert [c["batch"] for c in census if c["variant"] == "a"] == [1, 2, 1, 2]


def test_variants_parse_and_plan(benches):
    """--variant NAME:ENV=VAL,... and the order of the jobs: A B, then B A; a peer's once."""
    import run

    assert run.parse_variant("graphs:MIMI_PY_X=1,MIMI_PY_Y=a=b") == {
        "name": "graphs",
        "env": {"MIMI_PY_X": "1", "MIMI_PY_Y": "a=b"},
    }
    assert run.parse_variant("base") == run.parse_variant("base:") == {"name": "base", "env": {}}
    for bad in ("", "a b:X=1", "v:X", "v:1X=2"):
        with pytest.raises(ValueError):
            run.parse_variant(bad)
    args = run.parse_args(["--variant", "a:", "--variant", "b:X=1", "--rounds", "3"])
    jobs = [{"engine": "mimi_py", "env": {"Y": "2"}}, {"engine": "moshi"}]
    plan = [(j["engine"], j.get("variant"), j["round"], j.get("env")) for j in run.plan(args, jobs)]
    assert plan == [
        ("mimi_py", "a", 1, {"Y": "2"}),
        ("mimi_py", "b", 1, {"Y": "2", "X": "1"}),
        ("moshi", None, 1, None),
        ("mimi_py", "b", 2, {"Y": "2", "X": "1"}),
        ("mimi_py", "a", 2, {"Y": "2"}),
        ("mimi_py", "a", 3, {"Y": "2"}),
        ("mimi_py", "b", 3, {"Y": "2", "X": "1"}),
    ]
    import worker

    env = worker.environment(2, {"PYTHONPATH": "/old/build", "X": "1"})
    assert env["X"] == "1" and env["RAYON_NUM_THREADS"] == "2"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == "/old/build"


def test_sizes_take_overrides_and_jobs_share_a_worker(benches):
    import run
    from suites import gpu_steady

    sizes = ["steady_batches=1,64", "held_budget=15", "nope=1", "gpu_steady.warmup=4", "gpu_rows.frames=9"]
    args = run.parse_args(["--tiny"] + [x for s in sizes for x in ("--size", s)])
    got = run.Context(args, None, None).sizes(gpu_steady)
    assert got["steady_batches"] == [1, 64] and got["held_budget"] == 15.0 and got["warmup"] == 4
    assert "nope" not in got and got["steady_frames"] == 3 and "frames" not in got
    a = {"engine": "mimi_py", "label": "x", "dtype": "f", "share": "gpu", "tasks": [1]}
    merged = run.merged(
        [a, dict(a, tasks=[2]), dict(a, dtype="g", tasks=[3]), dict(a, share=None, tasks=[4])]
    )
    assert [j["tasks"] for j in merged] == [[1, 2], [3], [4]] and a["tasks"] == [1]


def test_budget_shrinks_the_timeouts(benches, monkeypatch):
    import run

    args = run.parse_args(["--budget", "100", "--timeout", "80"])
    monkeypatch.setattr(run.time, "perf_counter", lambda: 0.0)
    assert run.job_timeout(args, 0.0, 4, 4) == 90 - 3 * 12.5  # half of an even share kept for each later job
    assert run.job_timeout(args, 0.0, 4, 1) == 80  # the last: --timeout
    assert run.job_timeout(run.parse_args([]), 0.0, 4, 4) == 1800


def test_worker_reports_the_tasks_it_did_not_run(benches):
    import worker

    job = {"tasks": [{"suite": "s", "kind": "a"}, {"suite": "s", "kind": "b", "batches": [1]}]}
    done = worker.ROW_MARK + json.dumps({"suite": "s", "kind": "a", "ok": True})
    got = worker.rows_of(job, f"noise\n{done}\n", "Traceback: boom", "timed out after 9 s")
    assert got[0] == {"suite": "s", "kind": "a", "ok": True}
    assert got[1] == {"suite": "s", "kind": "b", "ok": False, "error": "timed out after 9 s: Traceback: boom"}


def _results(tmp_path) -> dict:
    """A made-up results file of one machine: offline, serving and the streams-held search."""
    row = {"ok": True, "threads": 2, "round": 1}
    offline = [
        dict(row, label=x, engine=x.split()[0], encode_rtf=v)
        for x, v in [("mimi_py highest", 60.0), ("moshi", 20.0)]
    ]
    offline.append(dict(row, label="rustymimi", engine="rustymimi", ok=False, error="boom"))
    serving = [
        dict(row, label=x, engine=x.split()[0], streams_held=v)
        for x, v in [("mimi_py highest", 12), ("moshi", 1)]
    ]
    held = [
        dict(
            row, label="mimi_py", engine="mimi_py", dtype="float32", kind="held", batch=None, streams_held=700
        )
    ]
    ratio = {"mimi_py": "mimi_py highest", "peer": "moshi", "threads": 2, "ratio": 3.0}
    suite = {"date": "2026-12-06T23:00", "commit": "abc1234", "sizes": {"seconds": 10.0}, "skipped": {}}
    return {
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "cpu_flags": ["avx2"],
            "gpu": None,
            "platform": "Linux",
            "python": "3.11",
        }
        | {"versions": {"mimi_py": "0.1.0", "torch": None}},
        "weights": {"architecture": "real Mimi", "num_codebooks": 8},
        "suites": {
            "offline": dict(suite, rows=offline, encode_ratios=[ratio]),
            "serving": dict(suite, rows=serving),
            "gpu_steady": dict(suite, rows=held, table=[dict(held[0], median_ms=40.0)]),
        },
    }


def test_report_writes_the_tables_between_the_markers(benches, tmp_path):
    import report

    path = tmp_path / "test-cpu.json"
    path.write_text(json.dumps(_results(tmp_path)))
    md = tmp_path / "README.md"
    md.write_text(f"# Title\n\nbefore\n\n{report.START}\nold tables\n{report.END}\n\nafter\n")
    report.write_readme(md, report.render(report.load([str(path)])))
    text = md.read_text()
    assert (
        text.startswith("# Title\n\nbefore\n") and text.endswith("\n\nafter\n") and "old tables" not in text
    )
    assert "### Test CPU (2 cores available; CPU flags: avx2)" in text
    assert "| mimi_py highest | 2 | 60 |" in text and "| rustymimi | failed: boom |" in text
    assert "- encode speed, mimi_py over each peer, like for like: mimi_py highest ÷ moshi 3×" in text
    assert "#### gpu_steady: " in text and "| mimi_py | float32 | — | held | — | 40 |" in text


def test_report_charts_offline_speed_and_streams_held_per_machine(benches, tmp_path):
    import report

    res = _results(tmp_path)
    assert report.bars([res], "offline") == {"Test CPU, 2 cores": {"mimi_py highest": 60.0, "moshi": 20.0}}
    held = report.bars([res], "held")
    assert held == {"Test CPU, 2 cores": {"mimi_py highest": 12, "moshi": 1, "mimi_py float32": 700}}
    pytest.importorskip("matplotlib", reason="the charts are drawn in the bench environment (matplotlib)")
    drawn = report.draw([res], tmp_path)
    assert [p.name for p in drawn] == ["offline_rtf.svg", "streams_held.svg"]
    svg = drawn[1].read_text()
    assert svg.startswith("<?xml") and "Streams held" in svg and "<dc:date>" not in svg


def test_census_counts_a_trace(benches):
    """The census of a made-up Chrome trace of 2 frames: kernels and copies counted by kind,
    launch calls by API, GPU busy as the union of overlapping device intervals."""
    from suites.gpu_census import census_from_trace, union_us

    def ev(cat, name, ts, dur):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    assert union_us([]) == 0 and union_us([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20
    trace = {
        "traceEvents": [
            ev("kernel", "gemm", 0, 10),
            ev("kernel", "gemm", 5, 10),  # overlaps the first: busy 15, kernel time 20
            ev("Kernel", "softmax", 30, 2),
            ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 40, 4),
            ev("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", 50, 1),
            ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 60, 1),
            ev("gpu_memset", "Memset (Device)", 70, 1),
            ev("cuda_driver", "cuLaunchKernel", 0, 1),
            ev("cuda_runtime", "cudaLaunchKernel", 2, 1),
            ev("cuda_runtime", "cudaGraphLaunch", 3, 1),
            ev("cuda_runtime", "cudaStreamSynchronize", 4, 1),
            ev("cpu_op", "aten::mm", 0, 3),
            ev("gpu_user_annotation", "frame", 0, 100),  # not device work
            {"ph": "f", "cat": "ac2g", "name": "flow", "ts": 0},  # not a complete event
        ]
    }
    c = census_from_trace(trace, frames=2)
    assert c["kernels"] == 3 and c["kernels_per_frame"] == 1.5 and c["kernel_us_per_frame"] == 11.0
    assert c["gpu_busy_us_per_frame"] == 12.0  # (15 + 2 + 4 + 1 + 1 + 1) / 2: overlaps once
    assert c["launch_calls_per_frame"] == 1.0 and c["graph_launches_per_frame"] == 0.5
    assert c["copies_per_frame"] == {"DtoH": 0.5, "HtoD": 1.0} and c["memsets_per_frame"] == 0.5
    assert [(k["name"], k["count"], k["us"]) for k in c["top_kernels"]] == [
        ("gemm", 2, 20.0),
        ("softmax", 1, 2.0),
    ]


def test_streams_held_search(benches):
    """The streams-held search on made-up frame times (p99 = 5 ms + 0.1 ms per row: 750 rows
    within 80 ms), from the full-ring rows' results, on a made-up clock."""
    from suites.gpu_steady import search_held

    now, tried = [0.0], []

    def probe(b, cost_per_row=0.01):
        tried.append(b)
        now[0] += cost_per_row * b
        p99 = 5000 + 100 * b
        return {"batch": b, "ok": p99 <= 80_000, "p99_us": p99, "s": cost_per_row * b}

    def known(*batches):
        return {b: dict(probe(b), **{"from": "steady"}) for b in batches}

    spec = {"held_start": 256, "held_max": 4096, "held_budget": 1000}
    steady = known(64, 256)
    tried.clear()
    r = search_held(probe, steady, spec, clock=lambda: now[0])
    assert r["streams_held"] <= 750 < r["first_failing"] and r["stopped"] == "resolution", r
    assert tried[0] == 750 and 64 not in tried  # the line through 64 and 256 rows, straight to the limit
    r = search_held(probe, known(64, 256), dict(spec, held_budget=1.0), clock=lambda: now[0])
    assert r["stopped"] == "time budget" and r["streams_held"] == 256 and r["first_failing"] is None
    slow = lambda b: dict(probe(b), ok=False)  # noqa: E731
    r = search_held(slow, {}, dict(spec, held_start=4), clock=lambda: now[0])
    assert [p["batch"] for p in r["probes"]] == [1, 2, 4] and r["stopped"] == "B = 1 misses"
