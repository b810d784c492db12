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
# mimi_py's precisions (run.py's --precisions default: all of mimi_py.options.PRECISIONS).
PRECISIONS = ["highest", "high", "medium"]
# moshi's rows: float32, and torch's own bf16 mode since "medium" is among the precisions.
MOSHI_LABELS = ["moshi", "moshi (torch bf16)"]


def check_server_suite(server: dict) -> None:
    """The server suite's tiny runs: real clients through `mimi-py serve` (the serve extra),
    one set per precision (`--precision`)."""
    assert [(r["precision"], r["slots"]) for r in server["runs"]] == [
        (p, n) for p in PRECISIONS for n in (1, 2)
    ]
    assert all(
        r["complete"] and r["frames"] == r["slots"] * r["frames_per_client"] for r in server["runs"]
    ), server
    assert list(server["streams_held"]) == PRECISIONS
    assert set(server["streams_held"].values()) <= {0, 1, 2}
    assert list(server["auto"]) == PRECISIONS and server["machine"], server
    for p, auto in server["auto"].items():  # --slots auto: as many clients as it measured, then 2 more
        assert auto["calibrated_slots"] == auto["clients"] == auto["calibration"]["slots"] >= 1, (p, auto)
        assert auto["complete"] and auto["frames"] == auto["clients"] * auto["frames_per_client"], (p, auto)
        assert auto["extra_close_codes"] == [1013, 1013] and auto["extra_turned_away"], (p, auto)


def check_layers_suite(layers: dict) -> None:
    """The layers suite's tiny run. Its binary, like the native bench, is not built in tiny
    mode; its output is tested in Rust (crates/mimi-core/src/bin/mimi_step_profile.rs)."""
    if "skipped" in layers:
        assert "not built" in layers["skipped"], layers
        return
    assert [r["precision"] for r in layers["runs"]] == PRECISIONS
    for r in layers["runs"]:
        assert r["ok"], r
        assert [b["batch"] for b in r["batches"]] == layers["batches"]
        timed = {x["layer"] for x in r["batches"][0]["layers"]}
        assert {"enc.init", "enc.transformer", "dec.transformer", "dec.last"} <= timed


def check_efficiency_suite(eff: dict, threads: int) -> None:
    """The efficiency suite's tiny runs: every precision, every batch size, the figures derived
    from them, and the plan overhead reported as not measured rather than made up."""
    assert [(r["precision"], r["label"], r["threads"]) for r in eff["runs"]] == [
        (p, f"mimi_py {p}", threads) for p in PRECISIONS
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
    highest, high, medium = eff["runs"]
    assert high["weights_nbytes"] < highest["weights_nbytes"]  # the matrices stored in half the bytes
    assert medium["weights_nbytes"] < highest["weights_nbytes"]


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


def check_codec_suites(res: dict) -> None:
    """The offline, aggregate and streaming suites: one mimi_py row per precision, labelled,
    each computing at the precision asked; moshi's two modes planned (skipped in tiny mode)."""
    suites = res["suites"]
    codec = suites["codec"]
    labels = [f"mimi_py {p}" for p in PRECISIONS]
    offline = [r for r in codec["runs"] if r["engine"] == "mimi_py"]
    assert [(r["label"], r["precision"]) for r in offline] == list(zip(labels, PRECISIONS))
    for off in offline:
        assert off["ok"] and off["kernel_isa"], off
        assert off["encode_rtf"] > 0 and off["decode_rtf"] > 0
        assert off["codes_shape"][:2] == [1, 4] and off["audio_shape"][:2] == [1, 1]
    assert [q["label"] for q in codec["parity"]] == labels[1:]  # each against highest, on the same weights
    assert all(q["reference"] == labels[0] and 0 <= q["codes_equal_fraction"] <= 1 for q in codec["parity"])
    for suite in ("codec", "streaming"):
        assert [k for k in suites[suite]["skipped"] if k.startswith("moshi")] == MOSHI_LABELS

    (agg,) = [r for r in suites["aggregate"]["runs"] if r["engine"] == "mimi_py"]  # 2 processes x 1 thread
    assert agg["ok"], agg
    assert agg["processes"] == res["args"]["aggregate_procs"] == len(agg["each"]) == 2
    assert all(r["ok"] and r["threads_env"]["RAYON_NUM_THREADS"] == "1" for r in agg["each"])
    clips = res["args"]["aggregate_clips"]
    assert agg["audio_s"] == 2 * clips * agg["clip_seconds"] and agg["encode_rtf"] > 0
    assert agg["wall_s"] >= max(r["wall_s"] for r in agg["each"]) - 0.01
    assert agg["single_clip"]["encode_rtf"] == offline[0]["encode_rtf"]  # highest's figure beside it

    streaming = [r for r in suites["streaming"]["runs"] if r["engine"] == "mimi_py"]
    assert [(r["label"], r["precision"]) for r in streaming] == list(zip(labels, PRECISIONS))
    for st in streaming:
        assert st["ok"], st
        assert st["frames_without_codes"] == 0
        assert st["frame_total"]["n"] == res["args"]["frames"]


def check_serving_suite(serving: dict) -> None:
    """The serving suite: one batched run per precision, moshi's two single streams planned."""
    assert [(r["precision"], r["label"]) for r in serving["runs"]] == [
        (p, f"mimi_py {p}") for p in PRECISIONS
    ]
    for serve in serving["runs"]:
        assert serve["ok"], serve
        assert [b["batch"] for b in serve["batches"]] == serving["batches"]
        assert serve["streams_held"] in serving["batches"] + [0]
        assert serve["masked"]["active"] * 2 == serve["masked"]["batch"]
    assert [k for k in serving["skipped"] if k.startswith("moshi")] == MOSHI_LABELS


def check_readme(readme: str) -> None:
    """The tables: every section, and the rows named by precision."""
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
    for p in PRECISIONS:
        assert f"| mimi_py {p} | 1 |" in readme  # offline
        assert f"| 1 | {p} | 1 |" in readme  # efficiency
    assert "| moshi (torch bf16) | — | skipped (tiny mode) |" in readme
    assert "- precisions: mimi_py highest, high, medium" in readme


def test_bench_suites_run_tiny(tmp_path):
    run_script(RUN, ["--tiny", "--threads", "1", "--out", str(tmp_path)], tmp_path, timeout=240)

    res = json.loads((tmp_path / "results.json").read_text())
    assert res["args"]["tiny"] is True
    assert res["args"]["precisions"] == PRECISIONS and res["args"]["torch_modes"] == ["float32", "bf16"]
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

    check_codec_suites(res)
    rss = [r for r in suites["rss"]["runs"] if r["engine"] == "mimi_py"]
    assert rss and all(r["ok"] and r["peak_rss_bytes"] > 0 for r in rss), rss
    check_serving_suite(suites["serving"])
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
    check_readme((tmp_path / "README.md").read_text())


def test_medium_targets_are_verdicts_only_where_vdpbf16ps_runs(monkeypatch):
    """Issue 49's "medium" targets from a run's rows (no process, no timing): each ratio within
    the run, met or not by its bound, and a verdict only where "medium" ran `vdpbf16ps`."""
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(REPO / "benches"))
    from runner.targets import evaluate_targets

    def suites(isa):
        def row(p, **kw):
            return dict(ok=True, engine="mimi_py", precision=p, threads=2, kernel_isa=isa, **kw)

        ratios = [
            dict(peer=peer, threads=2, precision="medium", encode_speed_ratio=e, decode_speed_ratio=d)
            for peer, e, d in [("moshi", 2.1, 1.9), ("moshi (torch bf16)", 1.4, 1.2)]
        ]
        batches = [dict(batch=b, over_offline=o) for b, o in [(4, 1.5), (8, 1.14), (16, 1.16)]]
        return {
            "codec": {
                "runs": [
                    row("highest", encode_rtf=20.0, decode_rtf=30.0),
                    row("medium", encode_rtf=34.0, decode_rtf=45.0),
                ],
                "speed_ratios": ratios,
            },
            "serving": {"runs": [row("highest", streams_held=8), row("medium", streams_held=12)]},
            "efficiency": {"runs": [row("medium", batches=batches)]},
        }

    args = SimpleNamespace(main_threads=2, tiny=False)
    got = {t["key"]: t for t in evaluate_targets(args, suites("avx512bf16"))}
    want = {
        "medium_encode_speedup": (1.7, True),
        "medium_decode_speedup": (1.5, False),
        "medium_encode_over_moshi": (2.1, True),
        "medium_decode_over_moshi": (1.9, False),
        "medium_encode_over_moshi_bf16": (1.4, True),
        "medium_decode_over_moshi_bf16": (1.2, False),
        "medium_streams_held": (1.5, True),
        "medium_batched_over_offline": (1.16, False),  # the worst B >= 8, B = 4 left out
    }
    assert {k: (got[k]["measured"], got[k]["met"]) for k in want} == want
    assert all(got[k]["meaningful"] and got[k]["not_a_verdict"] is None for k in want)
    emulated = [t for t in evaluate_targets(args, suites("avx512")) if t["key"] in want]
    assert len(emulated) == len(want) and not any(t["meaningful"] for t in emulated)
    assert {t["not_a_verdict"] for t in emulated} == {"medium ran avx512, not avx512bf16"}
    no_medium = evaluate_targets(args, {"codec": {"runs": [], "speed_ratios": []}})
    assert not any(t["key"] in want for t in no_medium)


def test_precision_variants_and_ratios(monkeypatch):
    """The rows --precisions plans (moshi's torch bf16 mode only with medium), their labels, the
    like-for-like pairs of the ratios and the ratio table (no process, no timing)."""
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(REPO / "benches"))
    from runner.report import ratio_table
    from runner.suites import engine_variants, offline_ratios

    args = SimpleNamespace(engines=["mimi_py", "moshi", "rustymimi"], malloc_variants=True)
    args.precisions = ["highest", "medium"]
    assert [v["label"] for _, v in engine_variants(args, True)] == [
        "mimi_py highest",
        "mimi_py medium",
        "mimi_py+malloc highest",
        "mimi_py+malloc medium",
        "moshi",
        "moshi (torch bf16)",
        "moshi+malloc",
        "moshi+malloc (torch bf16)",
        "rustymimi",
        "rustymimi+malloc",
    ]
    args.precisions, args.malloc_variants = ["highest", "high"], False
    assert [v for _, v in engine_variants(args, False, {"moshi"})] == [
        {"label": "moshi", "torch_mode": "float32"}
    ]

    def row(label, engine, rtf, **kw):
        return dict(label=label, engine=engine, ok=True, threads=2, encode_rtf=rtf, decode_rtf=rtf, **kw)

    runs = [
        row("mimi_py highest", "mimi_py", 30.0, precision="highest"),
        row("mimi_py medium", "mimi_py", 40.0, precision="medium"),
        row("moshi", "moshi", 20.0, torch_mode="float32"),
        row("moshi (torch bf16)", "moshi", 25.0, torch_mode="bf16"),
        row("mimi_py+malloc medium", "mimi_py+malloc", 50.0, precision="medium"),  # against medium only
    ]
    got = {
        (q["peer"], q["precision"]): (q["encode_speed_ratio"], q["like_for_like"])
        for q in offline_ratios(runs)
    }
    assert got == {
        ("moshi", "highest"): (1.5, True),
        ("moshi", "medium"): (2.0, False),
        ("moshi (torch bf16)", "highest"): (1.2, False),
        ("moshi (torch bf16)", "medium"): (1.6, True),
        ("mimi_py+malloc medium", "medium"): (0.8, True),
    }
    lines: list = []
    ratio_table(lines, offline_ratios(runs), {"encode_speed_ratio": "encode"}, by_threads=True)
    assert lines[0] == "| mimi_py vs | threads | encode, highest | encode, medium |"
    assert lines[2:4] == [
        "| moshi | 2 | **1.50×** | 2.00× |",
        "| moshi (torch bf16) | 2 | 1.20× | **1.60×** |",
    ]


def test_precision_labels_of_older_results(monkeypatch):
    """A results file from before --precisions labels mimi_py's rows by weights_dtype: the report
    names them by precision (float32 is highest, bfloat16 high), and renders the committed file."""
    monkeypatch.syspath_prepend(str(REPO / "benches"))
    from precisions import precision_of, row_label
    from runner.report import render_markdown

    assert precision_of({"weights_dtype": "bfloat16"}) == "high" and precision_of({}) == "highest"
    assert precision_of({"precision": "medium", "weights_dtype": "bfloat16"}) == "medium"
    assert row_label({"engine": "mimi_py+malloc"}) == "mimi_py+malloc highest"
    assert row_label({"engine": "moshi", "torch_mode": "bf16"}) == "moshi (torch bf16)"
    assert row_label({"engine": "rustymimi"}) == "rustymimi"
    md = render_markdown(json.loads((REPO / "benches" / "results.json").read_text()))
    rows = [line.split(" | ") for line in md.splitlines() if line.startswith("| 2 | ")]
    assert rows and all(cells[1] in PRECISIONS for cells in rows if len(cells) > 8), rows


class _Knob:
    fp32_precision = "none"


def _fake_torch(new_api: bool):
    """A stand-in for torch's precision switches (new_api: torch >= 2.9's per-backend knobs)."""
    from types import SimpleNamespace

    calls = []
    mkldnn = SimpleNamespace(matmul=_Knob(), conv=_Knob()) if new_api else SimpleNamespace()
    torch = SimpleNamespace(
        backends=SimpleNamespace(mkldnn=mkldnn, cpu=SimpleNamespace(get_cpu_capability=lambda: "AVX512")),
        set_float32_matmul_precision=calls.append,
        get_float32_matmul_precision=lambda: calls[-1] if calls else "highest",
        _C=SimpleNamespace(),  # no _cpu queries: unknown
        ops=SimpleNamespace(),
    )
    return torch, calls


def test_torch_bf16_switch(monkeypatch):
    """moshi's torch bf16 mode: the per-backend oneDNN switch where torch has it, else
    set_float32_matmul_precision("medium"); float32 leaves torch's defaults; what was set and
    what torch says of the CPU are recorded (a fake torch here; a real one below, where installed)."""
    monkeypatch.syspath_prepend(str(REPO / "benches"))
    import precisions

    monkeypatch.setattr(precisions, "takes_effect", lambda torch: {"matmul": True})
    torch, calls = _fake_torch(new_api=True)
    got = precisions.torch_switch(torch, "bf16")
    assert torch.backends.mkldnn.matmul.fp32_precision == torch.backends.mkldnn.conv.fp32_precision == "bf16"
    assert got["switch"] == precisions.BF16_SWITCH and calls == [] and got["takes_effect"] == {"matmul": True}
    assert got["settings"]["mkldnn.conv.fp32_precision"] == "bf16"
    assert got["cpu"]["cpu_capability"] == "AVX512" and got["cpu"]["amx_tile"] is None
    torch, calls = _fake_torch(new_api=False)
    got = precisions.torch_switch(torch, "bf16")
    assert got["switch"] == precisions.BF16_FALLBACK and calls == ["medium"]
    assert got["settings"]["float32_matmul_precision"] == "medium"
    assert got["settings"]["mkldnn.matmul.fp32_precision"] is None
    torch, calls = _fake_torch(new_api=True)
    got = precisions.torch_switch(torch, "float32")
    assert got["switch"] is None and calls == [] and "takes_effect" not in got
    assert torch.backends.mkldnn.matmul.fp32_precision == "none"


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
