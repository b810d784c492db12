#!/usr/bin/env python3
"""mimi_py benchmark suite: one entry point, every engine side by side, in one run.

    python benches/run.py [--suites transformer,codec,aggregate,streaming,rss,corpus,serving]
                          [--repeats N]
                          [--threads 1,2] [--engines mimi_py,rustymimi,moshi,transformers]
                          [--tiny] [--out DIR]

Writes DIR/results.json and the markdown tables into DIR/README.md between the markers
`<!-- results:start -->` / `<!-- results:end -->` (DIR defaults to benches/). Every
(engine, threads) measurement runs in a fresh process, with RAYON_NUM_THREADS / OMP_NUM_THREADS
set before it starts. See benches/README.md for what each suite measures.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
from worker import RESULT_MARK  # noqa: E402

import common  # noqa: E402

REPO = common.REPO
WORKER = BENCH_DIR / "worker.py"
# MIMI_NATIVE_BENCH overrides where the native bench binary is looked for.
NATIVE_BIN = Path(os.environ.get("MIMI_NATIVE_BENCH", REPO / "target" / "release" / "mimi_native_bench"))
MARK_START = "<!-- results:start -->"
MARK_END = "<!-- results:end -->"
ALL_SUITES = ["transformer", "codec", "aggregate", "streaming", "rss", "corpus", "serving"]
ALL_ENGINES = ["mimi_py", "rustymimi", "moshi", "transformers"]
STREAMING_ENGINES = {"mimi_py", "rustymimi", "moshi"}  # transformers: offline only

# Targets of issue 5. kind "max": measured <= bound; "min": measured >= bound.
TARGETS = {
    "step_median_us": ("transformer step median, mimi_py, B=1", "max", 7000.0, "µs"),
    "binding_overhead": ("binding overhead: mimi_py ÷ native step median", "max", 1.05, "×"),
    "encode_rtf": ("offline encode RTF, mimi_py", "min", 25.0, ""),
    "decode_rtf": ("offline decode RTF, mimi_py", "min", 20.0, ""),
    "stream_median_us": ("streaming encode+decode per 80 ms frame, median", "max", 30000.0, "µs"),
    "stream_p99_us": ("streaming encode+decode per 80 ms frame, p99", "max", 45000.0, "µs"),
    "peak_rss_bytes": ("peak RSS, offline encode+decode of the bench audio", "max", 0.7e9, "B"),
}

# glibc malloc told to keep freed memory (fewer page faults on big fresh buffers).
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024),
    "MALLOC_TRIM_THRESHOLD_": str(4 * 1024 * 1024 * 1024),
    "MALLOC_TOP_PAD_": str(256 * 1024 * 1024),
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# arguments


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--suites",
        default=",".join(ALL_SUITES),
        help="comma-separated subset of: " + ",".join(ALL_SUITES) + " (codec = offline codec)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed repeats of each offline encode/decode, and alternating Python/native "
        "transformer runs (default 3; tiny 1)",
    )
    p.add_argument(
        "--threads",
        default=None,
        help="thread counts, comma-separated (default 1,2; tiny 1). Streaming, RSS and "
        "the targets use 2 if listed, else the largest",
    )
    p.add_argument(
        "--engines", default=",".join(ALL_ENGINES), help="codec engines to run, of: " + ",".join(ALL_ENGINES)
    )
    p.add_argument(
        "--tiny",
        action="store_true",
        help="smoke-test sizes: small transformer, the fixtures' small codec, 0.2 s of "
        "audio, few steps; peers and a missing native binary are skipped",
    )
    p.add_argument(
        "--out", default=None, help="output folder for results.json and README.md (default: benches/)"
    )
    p.add_argument("--steps", type=int, default=None, help="timed transformer steps (default 300; tiny 30)")
    p.add_argument("--frames", type=int, default=None, help="timed streaming frames (default 200; tiny 10)")
    p.add_argument("--seconds", type=float, default=None, help="offline audio length (default 10; tiny 0.2)")
    p.add_argument(
        "--aggregate-procs",
        type=int,
        default=2,
        help="aggregate suite: concurrent processes of 1 thread each (default 2)",
    )
    p.add_argument(
        "--aggregate-clips",
        type=int,
        default=None,
        help="aggregate suite: clips of --seconds each process encodes back to back (default 6; tiny 2)",
    )
    p.add_argument(
        "--malloc-variants",
        action="store_true",
        help="also run every offline/streaming engine with glibc malloc told to keep freed "
        "memory (engine name suffix +malloc)",
    )
    p.add_argument(
        "--rebuild-native",
        action="store_true",
        help="run cargo build for the native bench binary even if it exists",
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds per child process (default 1800; tiny 120)"
    )
    a = p.parse_args(argv)
    a.suites = [s.strip() for s in a.suites.split(",") if s.strip()]
    bad = [s for s in a.suites if s not in ALL_SUITES]
    if bad:
        p.error(f"unknown suite(s) {bad}; choose from {ALL_SUITES}")
    a.engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [e for e in a.engines if e not in ALL_ENGINES]
    if bad:
        p.error(f"unknown engine(s) {bad}; choose from {ALL_ENGINES}")
    tiny = a.tiny
    a.repeats = a.repeats if a.repeats is not None else (1 if tiny else 3)
    a.threads = [int(t) for t in (a.threads or ("1" if tiny else "1,2")).split(",") if t.strip()]
    if not a.threads or min(a.threads) < 1:
        p.error("--threads needs positive integers")
    a.steps = a.steps if a.steps is not None else (30 if tiny else 300)
    a.frames = a.frames if a.frames is not None else (10 if tiny else 200)
    a.seconds = a.seconds if a.seconds is not None else (0.2 if tiny else 10.0)
    a.timeout = a.timeout if a.timeout is not None else (120.0 if tiny else 1800.0)
    a.aggregate_clips = a.aggregate_clips if a.aggregate_clips is not None else (2 if tiny else 6)
    if a.aggregate_procs < 1 or a.aggregate_clips < 1:
        p.error("--aggregate-procs and --aggregate-clips need positive integers")
    a.out = Path(a.out).resolve() if a.out else BENCH_DIR
    a.main_threads = 2 if 2 in a.threads else max(a.threads)
    return a


# ---------------------------------------------------------------------------------------------
# child processes


def thread_env(threads: int) -> dict:
    t = str(threads)
    return {
        "RAYON_NUM_THREADS": t,
        "OMP_NUM_THREADS": t,
        "MKL_NUM_THREADS": t,
        "OPENBLAS_NUM_THREADS": t,
        "VECLIB_MAXIMUM_THREADS": t,
    }


def worker_result(stdout: str, stderr: str, returncode: int) -> dict:
    """The `@@RESULT {json}` line of a worker's output, or a failure saying why there is none."""
    res = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_MARK):
            res = json.loads(line[len(RESULT_MARK) :])
    if res is None:
        tail = (stderr or stdout)[-2000:]
        return {"ok": False, "error": f"worker exited with status {returncode} and no result: {tail}"}
    if returncode != 0:
        res["ok"] = False
        res.setdefault("error", f"worker exited with status {returncode}")
    return res


def run_child(spec: dict, threads: int, timeout: float, extra_env: dict | None = None) -> dict:
    env = os.environ.copy()
    env.update(thread_env(threads))
    if extra_env:
        env.update(extra_env)
    spec = dict(spec, threads=threads)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(WORKER), json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(REPO),
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s", "threads": threads}
    wall = time.perf_counter() - t0
    res = worker_result(proc.stdout, proc.stderr, proc.returncode)
    res["threads"] = threads
    res["process_wall_s"] = round(wall, 2)
    if extra_env:
        res["extra_env"] = extra_env
    return res


def run_children_together(specs: list[dict], threads: int, timeout: float, extra_env: dict | None = None):
    """Start one worker per spec at once (same thread environment as run_child), let each load
    and warm up, then release them together: each worker touches `ready-<index>` in a barrier
    folder and waits for `go`, which is created once every worker is ready (or has exited).
    Returns the workers' results in spec order."""
    env = os.environ.copy()
    env.update(thread_env(threads))
    if extra_env:
        env.update(extra_env)
    with tempfile.TemporaryDirectory(prefix="mimi-bench-barrier-") as tmp:
        barrier = Path(tmp)
        procs, logs = [], []
        t0 = time.perf_counter()
        for i, spec in enumerate(specs):
            spec = dict(spec, threads=threads, index=i, barrier_dir=str(barrier), barrier_timeout=timeout)
            out, err = open(barrier / f"out-{i}", "w+"), open(barrier / f"err-{i}", "w+")
            logs.append((out, err))
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), json.dumps(spec)],
                    stdout=out,
                    stderr=err,
                    text=True,
                    env=env,
                    cwd=str(REPO),
                )
            )
        deadline = t0 + timeout
        while time.perf_counter() < deadline:
            if all((barrier / f"ready-{i}").exists() or p.poll() is not None for i, p in enumerate(procs)):
                break
            time.sleep(0.01)
        (barrier / "go").touch()
        results = []
        for p, (out, err) in zip(procs, logs):
            try:
                p.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                results.append({"ok": False, "error": f"timed out after {timeout:.0f} s", "threads": threads})
                continue
            out.seek(0)
            err.seek(0)
            res = worker_result(out.read(), err.read(), p.returncode)
            res["threads"] = threads
            results.append(res)
        for out, err in logs:
            out.close()
            err.close()
    return results


def engine_available(engine: str, tiny: bool) -> str | None:
    """None if the engine can run, else why not."""
    base = engine.split("+")[0]
    if base == "mimi_py":
        return None
    if tiny:
        return "skipped (tiny mode)"
    needs = {
        "rustymimi": ["rustymimi"],
        "moshi": ["torch", "moshi"],
        "transformers": ["torch", "transformers"],
    }[base]
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        return "not installed (" + ", ".join(missing) + ")"
    return None


# ---------------------------------------------------------------------------------------------
# native bench binary


def newest_source_mtime() -> float:
    paths = list((REPO / "src").rglob("*.rs")) + [REPO / "Cargo.toml", REPO / "Cargo.lock"]
    return max((p.stat().st_mtime for p in paths if p.exists()), default=0.0)


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def ensure_native(args) -> dict:
    """{"path": ..., "stale": bool} or {"skipped": why}."""
    if args.tiny and not NATIVE_BIN.exists():
        return {"skipped": f"{_rel(NATIVE_BIN)} not built (tiny mode does not build it)"}
    if args.rebuild_native or not NATIVE_BIN.exists():
        if shutil.which("cargo") is None:
            return {"skipped": "cargo not found, cannot build the native bench"}
        log("building the native bench: cargo build --release -p mimi-core --bin mimi_native_bench")
        proc = subprocess.run(
            ["cargo", "build", "--release", "-p", "mimi-core", "--bin", "mimi_native_bench"],
            cwd=str(REPO),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not NATIVE_BIN.exists():
            return {"skipped": "cargo build failed: " + proc.stderr[-2000:]}
    stale = NATIVE_BIN.stat().st_mtime < newest_source_mtime()
    return {
        "path": _rel(NATIVE_BIN),
        "stale": stale,
        "built": _dt.datetime.fromtimestamp(NATIVE_BIN.stat().st_mtime).isoformat(timespec="seconds"),
    }


def run_native(binary: Path, steps: int, threads: int, timeout: float) -> dict:
    env = os.environ.copy()
    env.update(thread_env(threads))
    try:
        proc = subprocess.run(
            [str(binary), str(steps), "1"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(REPO),
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    out = {}
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[d.get("engine", "?")] = d
    if proc.returncode != 0 or not out:
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    return {"ok": True, "engines": out}


# ---------------------------------------------------------------------------------------------
# suites


def ratio(a, b, nd=3):
    try:
        if a is None or b is None or b == 0:
            return None
        return round(a / b, nd)
    except TypeError:
        return None


def _agg_median(values):
    """The median over repeats (the mean of the middle two for an even count)."""
    import statistics

    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 1) if vals else None


def suite_transformer(args) -> dict:
    """Python and native runs alternate `--repeats` times at each thread count, so a noisy
    neighbour hits both alike; the reported figures are medians over the repeats, and the
    binding overhead is also given as the median of the paired per-repeat ratios."""
    native = ensure_native(args)
    runs = []
    for th in args.threads:
        py_reps, nat_reps = [], []
        for rep in range(args.repeats):
            log(f"transformer: mimi_py, {th} thread(s), repeat {rep + 1}/{args.repeats}")
            spec = {
                "task": "transformer",
                "tiny": args.tiny,
                "steps": args.steps,
                "warmup": 5 if args.tiny else 20,
                "chunk": 32 if args.tiny else 250,
                "chunk_repeats": 1,
            }
            py_reps.append(run_child(spec, th, args.timeout))
            if "path" in native:
                log(f"transformer: native binary, {th} thread(s), repeat {rep + 1}/{args.repeats}")
                nat_reps.append(run_native(NATIVE_BIN, 20 if args.tiny else args.steps, th, args.timeout))
        ok_py = [r for r in py_reps if r.get("ok")]
        if ok_py:
            py = {
                "ok": True,
                "repeats": len(py_reps),
                "step_median_us": _agg_median(r["step_median_us"] for r in ok_py),
                "step_p99_us": _agg_median(r["step_p99_us"] for r in ok_py),
                "chunk_us": _agg_median(r["chunk_us"] for r in ok_py),
                "config": ok_py[0]["config"],
                "steps": ok_py[0]["steps"],
                "chunk_len": ok_py[0]["chunk_len"],
                "reps": py_reps,
            }
            if len(ok_py) < len(py_reps):
                py["ok"] = False
                py["error"] = next(r.get("error") for r in py_reps if not r.get("ok"))
        else:
            py = dict(py_reps[0], reps=py_reps)
        run = {"threads": th, "mimi_py": py}
        if "path" in native:
            ok_nat = [r for r in nat_reps if r.get("ok")]
            if ok_nat:
                engines = {}
                for name in ok_nat[0]["engines"]:
                    rows = [r["engines"][name] for r in ok_nat if name in r["engines"]]
                    engines[name] = {
                        "engine": name,
                        "step_median_us": _agg_median(d.get("step_median_us") for d in rows),
                        "step_p99_us": _agg_median(d.get("step_p99_us") for d in rows),
                        "chunk250_us": _agg_median(d.get("chunk250_us") for d in rows),
                    }
                nat = {"ok": True, "repeats": len(nat_reps), "engines": engines, "reps": nat_reps}
            else:
                nat = dict(nat_reps[0], reps=nat_reps)
            run["native"] = nat
            eng = nat.get("engines", {})
            mine, cand = eng.get("mimi_py-native", {}), eng.get("candle", {})
            comparable = not args.tiny and py.get("ok") and nat.get("ok")
            paired = []
            if comparable:
                for a, b in zip(py_reps, nat_reps):
                    if a.get("ok") and b.get("ok") and "mimi_py-native" in b["engines"]:
                        paired.append(
                            ratio(a["step_median_us"], b["engines"]["mimi_py-native"]["step_median_us"])
                        )
            run["ratios"] = {
                "binding_overhead_step_median": ratio(py.get("step_median_us"), mine.get("step_median_us"))
                if comparable
                else None,
                "binding_overhead_step_median_paired": round(common.median(paired), 3) if paired else None,
                "binding_overhead_step_median_each": paired,
                "binding_overhead_step_p99": ratio(py.get("step_p99_us"), mine.get("step_p99_us"))
                if comparable
                else None,
                "binding_overhead_chunk250": ratio(py.get("chunk_us"), mine.get("chunk250_us"))
                if comparable
                else None,
                "vs_candle_step_median": ratio(py.get("step_median_us"), cand.get("step_median_us"))
                if comparable
                else None,
                "vs_candle_chunk250": ratio(py.get("chunk_us"), cand.get("chunk250_us"))
                if comparable
                else None,
                "note": None
                if comparable
                else "tiny mode: the native binary always runs the Mimi shape; no ratio",
            }
        else:
            run["native"] = {"ok": False, "skipped": native["skipped"]}
        runs.append(run)
    return {"native_binary": native, "repeats": args.repeats, "runs": runs}


def codec_spec(args, weights: dict) -> dict:
    return {
        "weights": weights["path"],
        "hf_config": weights.get("hf_config"),
        "num_codebooks": weights["num_codebooks"],
    }


def engine_list(args, with_malloc: bool, allowed=None):
    out = []
    for e in args.engines:
        if allowed is not None and e not in allowed:
            continue
        out.append(e)
        if with_malloc and args.malloc_variants:
            out.append(e + "+malloc")
    return out


def suite_codec(args, weights, save_dir: Path) -> dict:
    runs, skipped = [], {}
    for eng in engine_list(args, True):
        why = engine_available(eng, args.tiny)
        if why:
            skipped[eng] = why
            continue
        for th in args.threads:
            log(f"codec offline: {eng}, {th} thread(s)")
            spec = dict(
                codec_spec(args, weights),
                task="codec_offline",
                engine=eng,
                seconds=args.seconds,
                warmup_seconds=0.08 if args.tiny else 1.0,
                repeats=args.repeats,
                save_dir=str(save_dir),
            )
            res = run_child(spec, th, args.timeout, MALLOC_ENV if eng.endswith("+malloc") else None)
            res.setdefault("engine", eng)
            runs.append(res)
    parity = codec_parity(runs, save_dir)
    return {
        "audio_seconds": args.seconds,
        "runs": runs,
        "skipped": skipped,
        "parity": parity,
        "speed_ratios": offline_ratios(runs),
    }


def codec_parity(runs, save_dir: Path) -> list:
    """Do the engines compute the same thing on the same weights? Codes equal, audio diff."""
    import numpy as np

    out = []
    ref = next((r for r in runs if r.get("ok") and r["engine"] == "mimi_py"), None)
    if ref is None:
        return out
    rc = save_dir / f"mimi_py-t{ref['threads']}-codes.npy"
    ra = save_dir / f"mimi_py-t{ref['threads']}-audio.npy"
    if not (rc.exists() and ra.exists()):
        return out
    c0, a0 = np.load(rc), np.load(ra)
    seen = set()
    for r in runs:
        if not r.get("ok") or r["engine"] in seen or r["engine"].split("+")[0] in ("mimi_py", "transformers"):
            continue
        seen.add(r["engine"])
        cp = save_dir / f"{r['engine']}-t{r['threads']}-codes.npy"
        ap = save_dir / f"{r['engine']}-t{r['threads']}-audio.npy"
        if not (cp.exists() and ap.exists()):
            continue
        c1, a1 = np.load(cp), np.load(ap)
        f = min(c0.shape[-1], c1.shape[-1])
        n = min(a0.shape[-1], a1.shape[-1])
        same_q = c0.shape[:2] == c1.shape[:2]
        out.append(
            {
                "engine": r["engine"],
                "codes_shapes": [list(c0.shape), list(c1.shape)],
                "codes_equal_fraction": float((c0[..., :f] == c1[..., :f]).mean()) if same_q else None,
                "audio_max_abs_diff": float(np.abs(a0[..., :n] - a1[..., :n]).max())
                if a0.shape[:2] == a1.shape[:2]
                else None,
            }
        )
    return out


def peer_ratios(runs: list[dict], name: str = "engine", **fields) -> list[dict]:
    """For each measured peer (a run of another engine), ``{"peer": run[name], field:
    f(mimi_py's run, peer's run), ...}``; mimi_py's run is the one whose ``name`` is "mimi_py".
    Empty when mimi_py's run failed."""
    mine = next((r for r in runs if r.get("ok") and r[name] == "mimi_py"), None)
    if mine is None:
        return []
    peers = [r for r in runs if r.get("ok") and r["engine"] != "mimi_py"]
    return [{"peer": r[name], **{k: f(mine, r) for k, f in fields.items()}} for r in peers]


def offline_ratios(runs) -> list:
    """mimi_py RTF ÷ peer RTF at each thread count (> 1: mimi_py faster)."""
    out = []
    mine = {r["threads"]: r for r in runs if r.get("ok") and r["engine"] == "mimi_py"}
    for r in runs:
        if not r.get("ok") or r["engine"] == "mimi_py" or r["threads"] not in mine:
            continue
        m = mine[r["threads"]]
        out.append(
            {
                "peer": r["engine"],
                "threads": r["threads"],
                "encode_speed_ratio": ratio(m["encode_rtf"], r["encode_rtf"]),
                "decode_speed_ratio": ratio(m["decode_rtf"], r["decode_rtf"]),
            }
        )
    return out


def suite_aggregate(args, weights, codec: dict | None) -> dict:
    """Corpus throughput: --aggregate-procs processes of 1 thread each, started together, each
    encoding --aggregate-clips clips of --seconds back to back. Aggregate encode RTF = all the
    audio ÷ the span from the first process's start to the last one's end. The offline suite's
    single-clip encode RTF at 2 threads (or the largest thread count) is put beside it."""
    procs = args.aggregate_procs
    runs, skipped = [], {}
    single = {}
    for r in (codec or {}).get("runs", []):
        if r.get("ok") and r["threads"] == args.main_threads:
            single[r["engine"]] = r
    for eng in engine_list(args, True):
        why = engine_available(eng, args.tiny)
        if why:
            skipped[eng] = why
            continue
        log(f"aggregate: {eng}, {procs} process(es) x 1 thread, {args.aggregate_clips} clip(s) each")
        spec = dict(
            codec_spec(args, weights),
            task="codec_aggregate",
            engine=eng,
            seconds=args.seconds,
            clips=args.aggregate_clips,
            warmup_seconds=0.08 if args.tiny else 1.0,
        )
        c0 = common.cpu_times()
        each = run_children_together(
            [spec] * procs, 1, args.timeout, MALLOC_ENV if eng.endswith("+malloc") else None
        )
        busy = busy_core_seconds(c0, common.cpu_times())
        run = {"engine": eng, "processes": procs, "threads_per_process": 1, "threads": 1, "each": each}
        bad = [r for r in each if not r.get("ok")]
        if bad:
            run["ok"] = False
            run["error"] = bad[0].get("error")
            run["not_installed"] = bool(bad[0].get("not_installed"))
        else:
            span = max(r["end_monotonic"] for r in each) - min(r["start_monotonic"] for r in each)
            audio = sum(r["audio_s"] for r in each)
            cpu = sum(r["cpu_per_wall"] * r["wall_s"] for r in each)
            run.update(
                ok=True,
                version=each[0].get("version"),
                clips=sum(r["clips"] for r in each),
                clip_seconds=each[0]["clip_seconds"],
                audio_s=round(audio, 3),
                wall_s=round(span, 4),
                start_skew_s=round(
                    max(r["start_monotonic"] for r in each) - min(r["start_monotonic"] for r in each), 4
                ),
                encode_rtf=round(audio / span, 3),
                process_rtfs=[r["rtf"] for r in each],
                cpu_per_wall=round(cpu / span, 2),
                machine_busy_core_s=busy,
            )
            ref = single.get(eng)
            if ref:
                run["single_clip"] = {
                    "threads": ref["threads"],
                    "encode_rtf": ref["encode_rtf"],
                    "encode_cpu_per_wall": ref["encode_cpu_per_wall"],
                }
                run["aggregate_over_single"] = ratio(run["encode_rtf"], ref["encode_rtf"])
        runs.append(run)
    ratios = peer_ratios(runs, encode_speed_ratio=lambda m, r: ratio(m["encode_rtf"], r["encode_rtf"]))
    return {
        "processes": procs,
        "threads_per_process": 1,
        "clips_per_process": args.aggregate_clips,
        "clip_seconds": args.seconds,
        "single_clip_threads": args.main_threads,
        "runs": runs,
        "skipped": skipped,
        "speed_ratios": ratios,
    }


def suite_streaming(args, weights) -> dict:
    runs, skipped = [], {}
    th = args.main_threads
    for eng in engine_list(args, True, STREAMING_ENGINES):
        why = engine_available(eng, args.tiny)
        if why:
            skipped[eng] = why
            continue
        log(f"codec streaming: {eng}, {th} thread(s)")
        spec = dict(
            codec_spec(args, weights),
            task="codec_streaming",
            engine=eng,
            frames=args.frames,
            warmup=2 if args.tiny else 10,
        )  # keep in step with "warmup" below
        res = run_child(spec, th, args.timeout, MALLOC_ENV if eng.endswith("+malloc") else None)
        res.setdefault("engine", eng)
        runs.append(res)
    for e in args.engines:
        if e not in STREAMING_ENGINES:
            skipped[e] = "not measured (no streaming API wired up in this bench)"
    ratios = peer_ratios(
        runs,
        median_speed_ratio=lambda m, r: ratio(r["frame_total"]["median_us"], m["frame_total"]["median_us"]),
        p99_speed_ratio=lambda m, r: ratio(r["frame_total"]["p99_us"], m["frame_total"]["p99_us"]),
    )
    return {
        "threads": th,
        "frame_size": common.FRAME_SIZE,
        "warmup": 2 if args.tiny else 10,
        "runs": runs,
        "skipped": skipped,
        "speed_ratios": ratios,
    }


def suite_rss(args, weights) -> dict:
    runs, skipped = [], {}
    th = args.main_threads
    variants = []
    for eng in args.engines:
        variants.append((eng, False))
        if eng == "mimi_py":
            variants.append(("mimi_py", True))  # seeded weights: no file mapped
    for eng, seeded in variants:
        why = engine_available(eng, args.tiny)
        label = eng + (" (seeded weights)" if seeded else "")
        if why:
            skipped[label] = why
            continue
        log(f"peak RSS: {label}, {th} thread(s)")
        spec = dict(
            codec_spec(args, weights), task="codec_rss", engine=eng, seconds=args.seconds, seeded=seeded
        )
        res = run_child(spec, th, args.timeout)
        res["engine"] = eng
        res["label"] = label
        runs.append(res)
    ratios = peer_ratios(
        runs, name="label", rss_ratio=lambda m, r: ratio(m["peak_rss_bytes"], r["peak_rss_bytes"])
    )
    return {
        "threads": th,
        "audio_seconds": args.seconds,
        "runs": runs,
        "skipped": skipped,
        "rss_ratios_mimi_py_over_peer": ratios,
    }


# Lengths (s) of the corpus suite's files: 20 files, 600 s; tiny: 3 files, 1.2 s.
CORPUS_SECONDS = [12, 45, 20, 38, 27, 33, 15, 50, 24, 30, 18, 42, 36, 22, 28, 40, 16, 35, 25, 44]
CORPUS_SECONDS_TINY = [0.4, 0.3, 0.5]
CORPUS_RATES = [24000, 16000, 44100, 24000]  # cycled; every third file is stereo
# Goals of issue 14 (2 cores): Ray's overhead per core against the plain loop, and 2 workers'
# throughput over 1 worker's.
CORPUS_GOALS = {"ray_overhead_per_core": ("max", 0.10), "two_over_one_worker": ("min", 1.8)}


def make_corpus(folder: Path, tiny: bool) -> list[str]:
    """The corpus suite's audio: wav (24/16 kHz) and flac (44.1 kHz) files, mono and stereo."""
    import numpy as np
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, sec in enumerate(CORPUS_SECONDS_TINY if tiny else CORPUS_SECONDS):
        sr = CORPUS_RATES[i % len(CORPUS_RATES)]
        n = int(round(sec * sr))
        chans = [common.smooth_noise(n, seed=100 + i)]
        if i % 3 == 2:
            chans.append(common.smooth_noise(n, seed=200 + i))
        path = folder / f"{i:02d}-{sr // 1000}k-{len(chans)}ch.{'flac' if sr == 44100 else 'wav'}"
        sf.write(path, np.stack(chans, axis=1), sr, subtype="PCM_16")
        files.append(str(path))
    return files


def busy_core_seconds(t0: dict | None, t1: dict | None) -> float | None:
    """CPU seconds all processes of the machine spent busy between two /proc/stat readings."""
    if not t0 or not t1:
        return None
    busy = sum(t1[k] - t0[k] for k in t0 if k not in ("idle", "iowait"))
    return round(busy / os.sysconf("SC_CLK_TCK"), 2)


SERVING_BATCHES = [1, 2, 4, 8, 16, 32]


def suite_serving(args, weights) -> dict:
    """Streams held in real time: batched encode_step + decode_step of B rows per 80 ms frame
    (mimi_py, at each thread count), the masked case, and the peers' single stream from the
    streaming suite's task (they have no batched streaming)."""
    batches = [1, 2] if args.tiny else SERVING_BATCHES
    frames, warmup = (3, 1) if args.tiny else (30, 3)
    runs = []
    for th in args.threads:
        log(f"serving: mimi_py, batches {batches}, {th} thread(s)")
        spec = dict(codec_spec(args, weights), task="serving", batches=batches, frames=frames, warmup=warmup)
        res = run_child(spec, th, args.timeout)
        res.setdefault("engine", "mimi_py")
        runs.append(res)
    peers, skipped = [], {}
    for eng in engine_list(args, True, STREAMING_ENGINES):
        if eng.split("+")[0] == "mimi_py":
            continue
        why = engine_available(eng, args.tiny)
        if why:
            skipped[eng] = why
            continue
        log(f"serving: {eng}, one stream, {args.main_threads} thread(s)")
        spec = dict(
            codec_spec(args, weights), task="codec_streaming", engine=eng, frames=frames, warmup=warmup
        )
        res = run_child(
            spec, args.main_threads, args.timeout, MALLOC_ENV if eng.endswith("+malloc") else None
        )
        res.setdefault("engine", eng)
        if res.get("ok"):
            res["streams_held"] = int(res["frame_total"]["p99_us"] <= 80_000)
        peers.append(res)
    return {"batches": batches, "frames": frames, "runs": runs, "peers": peers, "skipped": skipped}


def render_serving(L: list, s: dict) -> None:
    """The serving suite's tables (appended to L)."""
    L.append("")
    L.append("### Serving: streams held in real time (batched `encode_step` + `decode_step` per 80 ms)")
    L.append("")
    if s.get("skipped") and not s.get("runs"):
        L.append(f"_skipped: {s['skipped']}_")
        return
    L.append(
        "One frame = one masked `encode_step` then `decode_step` of B rows, 80 ms of audio per row. "
        "B streams are held when the p99 frame time is ≤ 80 ms."
    )
    L.append("")
    L.append(
        "| threads | " + " | ".join(f"B={b} median / p99 ms" for b in s["batches"]) + " | streams held |"
    )
    L.append("| --- | " + " | ".join("---" for _ in s["batches"]) + " | --- |")
    for r in s["runs"]:
        if not r.get("ok"):
            L.append(f"| {r.get('threads')} | error: {fmt_err(r)} |")
            continue
        cells = [f"{b['median_us'] / 1e3:.1f} / {b['p99_us'] / 1e3:.1f}" for b in r["batches"]]
        L.append(f"| {r['threads']} | " + " | ".join(cells) + f" | {r['streams_held']} |")
    L.append("")
    for r in s["runs"]:
        if r.get("ok"):
            m = r["masked"]
            L.append(
                f"- masked, {r['threads']} thread(s): B={m['batch']} with {m['active']} active, median "
                f"{m['masked']['median_us'] / 1e3:.1f} ms, against {m['active']} rows all active "
                f"{m['dense_active_only']['median_us'] / 1e3:.1f} ms (ratio {m['overhead_ratio']})"
            )
    for p in s.get("peers", []):
        if p.get("ok"):
            t = p["frame_total"]
            L.append(
                f"- {p['engine']}, one stream (no batched streaming): median {t['median_us'] / 1e3:.1f} ms, "
                f"p99 {t['p99_us'] / 1e3:.1f} ms, streams held {p['streams_held']}"
            )
    for e, why in s.get("skipped", {}).items():
        L.append(f"- {e}: {why}")
    L.append("")


def suite_corpus(args, weights, tmp: Path) -> dict:
    """mimi_py.data.tokenize against a plain Python loop over MimiCodec.encode: the same files,
    the same codes (checked), 1 thread per worker. Each run is a fresh process; tokenize's runs
    start their own local Ray (timed apart: on a cluster Ray is already up)."""
    missing = [m for m in ("ray", "pyarrow", "soundfile", "soxr") if importlib.util.find_spec(m) is None]
    if missing:
        return {"skipped": f"needs the data extra (pip install '.[data]'): {', '.join(missing)} missing"}
    import numpy as np

    from mimi_py import data

    files = make_corpus(tmp / "corpus", args.tiny)
    base = dict(codec_spec(args, weights), files=files)
    cores = common.cpu_count_available()
    runs = []

    def measured(label, spec, cores_used):
        log(f"corpus: {label}")
        c0 = common.cpu_times()
        res = run_child(spec, 1, args.timeout)
        res["busy_core_s"] = busy_core_seconds(c0, common.cpu_times())
        res["label"], res["cores"] = label, cores_used
        if res.get("ok"):
            rate = res["audio_s"] / res["wall_s"]
            res["audio_h_per_wall_h"] = round(rate, 2)
            res["audio_h_per_core_h"] = round(rate / cores_used, 2)
            if res["busy_core_s"]:
                res["audio_h_per_busy_core_h"] = round(res["audio_s"] / res["busy_core_s"], 2)
        runs.append(res)
        return res

    loop_codes = tmp / "corpus-loop-codes.npz"
    loop = measured("plain loop, 1 process", dict(base, task="corpus_loop", codes_out=str(loop_codes)), 1)
    ref = dict(np.load(loop_codes)) if loop.get("ok") else None
    for workers in [1] if args.tiny else [1, 2]:
        out = tmp / f"corpus-codes-{workers}"
        spec = dict(
            base,
            task="corpus_tokenize",
            corpus=str(tmp / "corpus"),
            out=str(out),
            workers=workers,
            ray_cpus=max(cores, workers),
        )
        res = measured(f"tokenize, {workers} worker{'s' if workers > 1 else ''} x 1 thread", spec, workers)
        if res.get("ok") and ref is not None:
            t = data.read_codes(out)
            got = dict(zip(t.column("path").to_pylist(), data.codes_to_numpy(t.column("codes"))))
            res["codes_equal"] = all(
                got.get(f) is not None and np.array_equal(got[f], ref[str(i)]) for i, f in enumerate(files)
            )
    ok = {r["label"]: r for r in runs if r.get("ok")}
    one = ok.get("tokenize, 1 worker x 1 thread")
    two = ok.get("tokenize, 2 workers x 1 thread")
    measured_goals = {
        "ray_overhead_per_core": round(1 - one["audio_h_per_core_h"] / loop["audio_h_per_core_h"], 3)
        if one and loop.get("ok")
        else None,
        "two_over_one_worker": ratio(two["audio_h_per_wall_h"], one["audio_h_per_wall_h"])
        if one and two
        else None,
    }
    goals = []
    for key, (kind, bound) in CORPUS_GOALS.items():
        m = measured_goals[key]
        goals.append(
            {
                "key": key,
                "kind": kind,
                "bound": bound,
                "measured": m,
                "met": None if m is None else (m <= bound if kind == "max" else m >= bound),
                "meaningful": not args.tiny,
            }
        )
    return {
        "files": len(files),
        "audio_s": round(sum(r["audio_s"] for r in runs[:1] if r.get("ok")), 3) or None,
        "threads_per_worker": 1,
        "cpu_cores_available": cores,
        "runs": runs,
        "goals": goals,
    }


# ---------------------------------------------------------------------------------------------
# targets


def evaluate_targets(args, suites) -> list:
    th = args.main_threads
    measured = {}
    tr = suites.get("transformer", {})
    for run in tr.get("runs", []):
        if run["threads"] == th and run["mimi_py"].get("ok"):
            measured["step_median_us"] = run["mimi_py"]["step_median_us"]
            measured["binding_overhead"] = (run.get("ratios") or {}).get("binding_overhead_step_median")
    for r in suites.get("codec", {}).get("runs", []):
        if r.get("ok") and r["engine"] == "mimi_py" and r["threads"] == th:
            measured["encode_rtf"] = r["encode_rtf"]
            measured["decode_rtf"] = r["decode_rtf"]
    for r in suites.get("streaming", {}).get("runs", []):
        if r.get("ok") and r["engine"] == "mimi_py":
            measured["stream_median_us"] = r["frame_total"]["median_us"]
            measured["stream_p99_us"] = r["frame_total"]["p99_us"]
    for r in suites.get("rss", {}).get("runs", []):
        if r.get("ok") and r.get("label") == "mimi_py":
            measured["peak_rss_bytes"] = r["peak_rss_bytes"]
    out = []
    for key, (what, kind, bound, unit) in TARGETS.items():
        m = measured.get(key)
        met = None if m is None else (m <= bound if kind == "max" else m >= bound)
        out.append(
            {
                "key": key,
                "what": what,
                "kind": kind,
                "bound": bound,
                "unit": unit,
                "threads": th,
                "measured": m,
                "measured_over_bound": ratio(m, bound),
                "met": met,
                "meaningful": not args.tiny,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# machine and versions


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


# ---------------------------------------------------------------------------------------------
# markdown


def fmt_us(us) -> str:
    if us is None:
        return "—"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def fmt_x(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}×"


def fmt_num(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def fmt_bytes(b) -> str:
    return "—" if b is None else f"{b / 1e6:.0f} MB"


def fmt_err(r) -> str:
    e = r.get("error") or r.get("skipped") or "failed"
    return e.strip().splitlines()[-1][:160].replace("|", "\\|")


def torch_starved(r) -> bool:
    """A torch peer's offline or streaming run at >= 2 threads that kept < 3/4 of them busy
    (see README, Noise)."""
    if r["engine"].split("+")[0] not in ("moshi", "transformers") or r["threads"] < 2:
        return False
    busy = [r.get(k) for k in ("encode_cpu_per_wall", "decode_cpu_per_wall", "cpu_per_wall")]
    busy = [b for b in busy if b is not None]
    return bool(busy) and min(busy) < 0.75 * r["threads"]


STARVED_NOTE = (
    ": torch kept fewer than 3/4 of its threads busy. Most likely another process held a core, and "
    "torch's OpenMP threads wait for each other; do not trust these rows without a quiet rerun (README, Noise)."
)


def render_markdown(res) -> str:
    m, args = res["machine"], res["args"]
    v = m["versions"]
    L = []
    L.append(
        f"Run {m['date']}"
        + (" — **tiny smoke-test sizes, numbers are not meaningful**" if args["tiny"] else "")
        + f", {res['duration_s']:.0f} s in all."
    )
    L.append("")
    L.append(
        f"- machine: {m['cpu_model']}, {m['cpu_cores']} cores ({m['cpu_cores_available']} available), "
        f"{fmt_bytes(m['memory_total_bytes'])} RAM, {m['platform']}"
    )
    L.append(
        f"- threads: {', '.join(map(str, m['threads']))} (streaming, RSS and targets at {m['main_threads']})"
    )
    la0, la1 = m.get("loadavg_start"), m.get("loadavg_end")
    if la0 and la1:
        L.append(
            f"- load average (1/5/15 min) at start {' / '.join(map(str, la0))}, at end {' / '.join(map(str, la1))} (includes this run)"
            + (
                " — **other work was running at the start; numbers may be inflated**"
                if la0[0] > 0.5 * m["cpu_cores_available"]
                else ""
            )
        )
    peers = ", ".join(f"{k} {v[k]}" for k in ("rustymimi", "torch", "moshi", "transformers") if v.get(k))
    L.append(
        f"- versions: mimi_py {v['mimi_py']} (candle {v['candle']}, features: {', '.join(v['mimi_py_features']) or 'cpu only'}), "
        f"numpy {v['numpy']}, Python {m['python']}"
        + (f", {peers}" if peers else "")
        + "; not installed: "
        + (", ".join(k for k in ("rustymimi", "torch", "moshi", "transformers") if not v.get(k)) or "none")
    )
    sh = m.get("cpu_time_shares")
    if sh:
        L.append(
            f"- machine CPU time during the run (all processes): busy {100 * (1 - sh['idle'] - sh['iowait']):.0f}%, "
            f"idle {100 * sh['idle']:.0f}%, steal {100 * sh['steal']:.1f}%"
        )
    g = m.get("git") or {}
    L.append(
        f"- tree: commit {g.get('commit')}, {g.get('modified_files')} modified tracked file(s); "
        f"mimi_py extension built {m.get('mimi_py_core_built')}"
    )
    L.append(f"- command: `{res['command']}`")
    L.append("")

    s = res["suites"]
    # targets
    L.append("### Targets (issue 5)")
    L.append("")
    if res["targets"]:
        L.append("| target | bound | measured | measured ÷ bound | met |")
        L.append("| --- | --- | --- | --- | --- |")
        for t in res["targets"]:
            bound = t["bound"]
            meas = t["measured"]
            if t["unit"] == "µs":
                b, mm = fmt_us(bound), fmt_us(meas)
            elif t["unit"] == "B":
                b, mm = f"{bound / 1e9:.1f} GB", ("—" if meas is None else f"{meas / 1e9:.2f} GB")
            elif t["unit"] == "×":
                b, mm = f"{bound:.2f}×", fmt_x(meas, 3)
            else:
                b, mm = f"{bound:g}", fmt_num(meas)
            op = "≤" if t["kind"] == "max" else "≥"
            met = "—" if t["met"] is None else ("✅ met" if t["met"] else "❌ not met")
            if not t["meaningful"]:
                met = "— (tiny sizes)"
            L.append(
                f"| {t['what']} ({t['threads']} thread{'s' if t['threads'] != 1 else ''}) | {op} {b} | {mm} | {fmt_x(t['measured_over_bound'])} | {met} |"
            )
    L.append("")

    # transformer
    tr = s["transformer"]
    if args["tiny"]:
        L.append(
            "### Transformer, tiny shape (d 64, 2 layers, context 16; the native binary runs the Mimi shape), B=1, float32"
        )
    else:
        L.append("### Transformer, Mimi shape (d 512, 8 layers, context 250), B=1, float32")
    L.append("")
    if tr.get("skipped"):
        L.append(f"_skipped: {tr['skipped']}_")
    else:
        nb = tr["native_binary"]
        if "path" in nb:
            L.append(
                f"Native: `{nb['path']}` (built {nb['built']}"
                + (", **older than the Rust sources: rerun with --rebuild-native**" if nb["stale"] else "")
                + ")."
            )
        else:
            L.append(f"Native: {nb['skipped']}")
        L.append("")
        L.append(
            f"Python and native runs alternate, {tr.get('repeats', 1)} time(s) per thread count; each figure is the "
            "median over those repeats of the per-run median / p99 (steps) or single 250-step call."
        )
        L.append("")
        L.append("| threads | engine | step median | step p99 | 250-step `forward` |")
        L.append("| --- | --- | --- | --- | --- |")
        for run in tr["runs"]:
            py = run["mimi_py"]
            if py.get("ok"):
                L.append(
                    f"| {run['threads']} | mimi_py from Python | {fmt_us(py['step_median_us'])} | "
                    f"{fmt_us(py['step_p99_us'])} | {fmt_us(py['chunk_us'])} |"
                )
            else:
                L.append(f"| {run['threads']} | mimi_py from Python | error: {fmt_err(py)} | | |")
            nat = run.get("native", {})
            if nat.get("ok"):
                names = {
                    "mimi_py-native": "mimi_py model, native Rust",
                    "candle": "candle-transformers (native)",
                }
                for key in ("mimi_py-native", "candle"):
                    d = nat["engines"].get(key)
                    if d:
                        L.append(
                            f"| {run['threads']} | {names[key]} | {fmt_us(d['step_median_us'])} | "
                            f"{fmt_us(d['step_p99_us'])} | {fmt_us(d['chunk250_us'])} |"
                        )
            else:
                L.append(f"| {run['threads']} | native | {fmt_err(nat)} | | |")
        L.append("")
        L.append(
            "| threads | binding overhead (step median) | (paired per repeat: median [each]) | (step p99) | (250-step chunk) | mimi_py ÷ candle (step) | (chunk) |"
        )
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        for run in tr["runs"]:
            r = run.get("ratios") or {}
            each = ", ".join(
                f"{x:.2f}" for x in r.get("binding_overhead_step_median_each") or [] if x is not None
            )
            L.append(
                f"| {run['threads']} | {fmt_x(r.get('binding_overhead_step_median'), 3)} | "
                f"{fmt_x(r.get('binding_overhead_step_median_paired'), 3)}{f' [{each}]' if each else ''} | "
                f"{fmt_x(r.get('binding_overhead_step_p99'), 3)} | {fmt_x(r.get('binding_overhead_chunk250'), 3)} | "
                f"{fmt_x(r.get('vs_candle_step_median'), 3)} | {fmt_x(r.get('vs_candle_chunk250'), 3)} |"
            )
    L.append("")

    # codec offline
    c = s["codec"]
    L.append(
        f"### Codec offline: encode {args['seconds']:g} s of 24 kHz audio, then decode its codes (8 codebooks)"
    )
    L.append("")
    if c.get("skipped") and isinstance(c["skipped"], str):
        L.append(f"_skipped: {c['skipped']}_")
    else:
        L.append(
            "RTF = audio seconds ÷ wall seconds (higher is faster); median of the repeats. "
            "CPU÷wall = cores busy on average."
        )
        L.append("")
        L.append("| engine | threads | encode | encode RTF | decode | decode RTF | CPU÷wall enc/dec | load |")
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        starved = []
        for r in c["runs"]:
            if r.get("ok"):
                flag = ""
                if torch_starved(r):
                    flag = " ⚠"
                    starved.append(f"{r['engine']} at {r['threads']} threads")
                L.append(
                    f"| {r['engine']} | {r['threads']} | {r['encode_s']:.3f} s | {r['encode_rtf']:.2f} | "
                    f"{r['decode_s']:.3f} s | {r['decode_rtf']:.2f} | {r['encode_cpu_per_wall']:.2f} / "
                    f"{r['decode_cpu_per_wall']:.2f}{flag} | {r['load_s']:.2f} s |"
                )
            else:
                L.append(f"| {r['engine']} | {r['threads']} | error: {fmt_err(r)} | | | | | |")
        for eng, why in c.get("skipped", {}).items():
            L.append(f"| {eng} | — | {why} | | | | | |")
        if starved:
            L.append("")
            L.append("⚠ " + ", ".join(starved) + STARVED_NOTE)
        if c.get("speed_ratios"):
            L.append("")
            L.append("| mimi_py vs | threads | encode speed ratio | decode speed ratio |")
            L.append("| --- | --- | --- | --- |")
            for q in c["speed_ratios"]:
                L.append(
                    f"| {q['peer']} | {q['threads']} | {fmt_x(q['encode_speed_ratio'])} | {fmt_x(q['decode_speed_ratio'])} |"
                )
            L.append("")
            L.append("(> 1×: mimi_py is faster.)")
        if c.get("parity"):
            L.append("")
            for p in c["parity"]:
                L.append(
                    f"Same weights, same work: {p['engine']}'s codes equal mimi_py's for "
                    f"{100 * (p['codes_equal_fraction'] or 0):.1f}% of entries; decoded audio max abs diff "
                    f"{fmt_num(p['audio_max_abs_diff'], 7) if p['audio_max_abs_diff'] is not None else '—'}."
                )
    L.append("")

    render_aggregate(L, s.get("aggregate", {"skipped": "not selected (--suites)"}), args)

    # streaming
    st = s["streaming"]
    L.append("### Codec streaming: `encode_step` then `decode_step` per 1920-sample (80 ms) frame")
    L.append("")
    if st.get("skipped") and isinstance(st["skipped"], str):
        L.append(f"_skipped: {st['skipped']}_")
    else:
        L.append(
            f"{st['threads']} threads; times per frame over {args['frames']} frames after {st['warmup']} warm-up frames "
            "(one encoder and one decoder stream, as a real-time loop runs them)."
        )
        L.append("")
        L.append(
            "| engine | encode_step median | p99 | decode_step median | p99 | encode+decode median | p99 "
            "| context switches per frame (voluntary / involuntary) | CPU÷wall |"
        )
        L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        starved = []
        for r in st["runs"]:
            if r.get("ok"):
                e, d, t = r["encode_step"], r["decode_step"], r["frame_total"]
                flag = " ⚠" if torch_starved(r) else ""
                if flag:
                    starved.append(f"{r['engine']} (CPU÷wall {r['cpu_per_wall']:.2f})")
                cs = r.get("context_switches_per_frame")
                cs_txt = f"{cs['voluntary']:.1f} / {cs['nonvoluntary']:.1f}" if cs else "—"
                L.append(
                    f"| {r['engine']}{flag} | {fmt_us(e['median_us'])} | {fmt_us(e['p99_us'])} | {fmt_us(d['median_us'])} | "
                    f"{fmt_us(d['p99_us'])} | {fmt_us(t['median_us'])} | {fmt_us(t['p99_us'])} | {cs_txt} | "
                    f"{r.get('cpu_per_wall', float('nan')):.2f} |"
                )
            else:
                L.append(f"| {r['engine']} | error: {fmt_err(r)} | | | | | | | |")
        for eng, why in st.get("skipped", {}).items():
            L.append(f"| {eng} | {why} | | | | | |")
        if starved:
            L.append("")
            L.append("⚠ " + ", ".join(starved) + STARVED_NOTE)
        if st.get("speed_ratios"):
            L.append("")
            L.append(
                "Peer ÷ mimi_py per-frame time (> 1×: mimi_py is faster): "
                + "; ".join(
                    f"{q['peer']} median {fmt_x(q['median_speed_ratio'])}, p99 {fmt_x(q['p99_speed_ratio'])}"
                    for q in st["speed_ratios"]
                )
                + "."
            )
    L.append("")

    # rss
    rs = s["rss"]
    L.append(f"### Peak RSS: load, encode {args['seconds']:g} s, decode, one fresh process each")
    L.append("")
    if rs.get("skipped") and isinstance(rs["skipped"], str):
        L.append(f"_skipped: {rs['skipped']}_")
    else:
        L.append(
            f"{rs['threads']} threads. Peak = VmHWM of the process (includes Python, numpy and the "
            "mapped weight file's touched pages)."
        )
        L.append("")
        L.append("| engine | after import | after load | peak | minor page faults |")
        L.append("| --- | --- | --- | --- | --- |")
        for r in rs["runs"]:
            if r.get("ok"):
                L.append(
                    f"| {r['label']} | {fmt_bytes(r['rss_after_import_bytes'])} | {fmt_bytes(r['rss_after_load_bytes'])} | "
                    f"{fmt_bytes(r['peak_rss_bytes'])} | {r['minor_faults']} |"
                )
            else:
                L.append(f"| {r['label']} | error: {fmt_err(r)} | | | |")
        for eng, why in rs.get("skipped", {}).items():
            L.append(f"| {eng} | {why} | | | |")
    L.append("")
    render_corpus(L, s.get("corpus", {"skipped": "not selected (--suites)"}), args)
    render_serving(L, s.get("serving", {"skipped": "not selected (--suites)"}))
    return "\n".join(L).rstrip() + "\n"


def render_aggregate(L: list, a: dict, args: dict) -> None:
    """The aggregate suite's table (appended to L), beside the single-clip figure."""
    L.append("### Codec aggregate throughput: processes of 1 thread encoding clips back to back")
    L.append("")
    if isinstance(a.get("skipped"), str):
        L.append(f"_skipped: {a['skipped']}_")
        L.append("")
        return
    th = a["single_clip_threads"]
    L.append(
        f"{a['processes']} processes × 1 thread, started together, each encoding {a['clips_per_process']} clips "
        f"of {a['clip_seconds']:g} s back to back (the offline suite's audio and weights). Aggregate RTF = all "
        "the audio ÷ wall time from the first start to the last end; CPU÷wall = the processes' CPU time ÷ that "
        f"wall. Beside it: the offline suite's one clip at {th} thread{'s' if th != 1 else ''} (median of the repeats)."
    )
    L.append("")
    L.append(
        f"| engine | processes × threads | audio | wall | aggregate encode RTF | per-process RTF | CPU÷wall | "
        f"one clip, {th} thread{'s' if th != 1 else ''}: encode RTF | aggregate ÷ one clip |"
    )
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in a["runs"]:
        if not r.get("ok"):
            L.append(f"| {r['engine']} | {r['processes']} × 1 | error: {fmt_err(r)} | | | | | | |")
            continue
        one = r.get("single_clip")
        L.append(
            f"| {r['engine']} | {r['processes']} × 1 | {r['audio_s']:g} s | {r['wall_s']:.2f} s | "
            f"{r['encode_rtf']:.2f} | {' / '.join(f'{x:.2f}' for x in r['process_rtfs'])} | "
            f"{r['cpu_per_wall']:.2f} | {fmt_num(one['encode_rtf']) if one else '— (codec suite not run)'} | "
            f"{fmt_x(r.get('aggregate_over_single'))} |"
        )
    for eng, why in a.get("skipped", {}).items():
        L.append(f"| {eng} | — | {why} | | | | | | |")
    if a.get("speed_ratios"):
        L.append("")
        L.append(
            "mimi_py ÷ peer aggregate encode RTF (> 1×: mimi_py is faster): "
            + "; ".join(f"{q['peer']} {fmt_x(q['encode_speed_ratio'])}" for q in a["speed_ratios"])
            + "."
        )
    L.append("")


def render_corpus(L: list, c: dict, args: dict) -> None:
    """The corpus suite's table (appended to L)."""
    L.append("### Corpus: tokenize a folder of audio (mimi_py.data on Ray) against a plain loop")
    L.append("")
    if c.get("skipped"):
        L.append(f"_skipped: {c['skipped']}_")
        return
    L.append(
        f"{c['files']} files, {c['audio_s'] or 0:.0f} s of audio (wav 24/16 kHz, flac 44.1 kHz, mono and "
        "stereo), 1 thread per worker. Wall = the `tokenize` call (driver model load, actor start-up, "
        "decoding, encoding, Parquet writes; Ray's own start-up is the separate column) or the loop "
        "(model load + read, resample, `MimiCodec.encode`). Per core-hour = ÷ workers; busy = CPU "
        "time of every process on the machine during the run (Ray's included)."
    )
    L.append("")
    L.append(
        "| run | wall | audio h / wall h | audio h / core h | audio h / busy core h | first row | "
        "Ray start | codes = loop's |"
    )
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in c["runs"]:
        if not r.get("ok"):
            L.append(f"| {r['label']} | error: {fmt_err(r)} | | | | | | |")
            continue
        eq = r.get("codes_equal")
        first, start = (
            ("—" if x is None else f"{x:.1f} s") for x in (r.get("first_row_s"), r.get("ray_init_s"))
        )
        L.append(
            f"| {r['label']} | {r['wall_s']:.1f} s | {r['audio_h_per_wall_h']:.1f} | {r['audio_h_per_core_h']:.1f} | "
            f"{fmt_num(r.get('audio_h_per_busy_core_h'), 1)} | {first} | {start} | "
            f"{'—' if eq is None else ('✅' if eq else '❌')} |"
        )
    L.append("")
    L.append("| goal (issue 14) | bound | measured | met |")
    L.append("| --- | --- | --- | --- |")
    names = {
        "ray_overhead_per_core": "Ray's overhead per core: 1 − (tokenize 1×1 ÷ loop), audio h per core h",
        "two_over_one_worker": "2 workers × 1 thread ÷ 1 worker × 1 thread, audio h per wall h",
    }
    for g in c["goals"]:
        op = "≤" if g["kind"] == "max" else "≥"
        m = g["measured"]
        shown = (
            "—" if m is None else (f"{100 * m:.1f}%" if g["key"] == "ray_overhead_per_core" else f"{m:.2f}×")
        )
        bound = f"{100 * g['bound']:.0f}%" if g["key"] == "ray_overhead_per_core" else f"{g['bound']:.1f}×"
        met = "—" if g["met"] is None else ("✅ met" if g["met"] else "❌ not met")
        if not g["meaningful"]:
            met = "— (tiny sizes)"
        L.append(f"| {names[g['key']]} | {op} {bound} | {shown} | {met} |")


def write_readme(path: Path, table: str) -> None:
    block = f"{MARK_START}\n{table}\n{MARK_END}"
    if path.exists():
        text = path.read_text()
        i, j = text.find(MARK_START), text.find(MARK_END)
        if i != -1 and j > i:
            text = text[:i] + block + text[j + len(MARK_END) :]
        else:
            text = text.rstrip() + "\n\n## Latest results\n\n" + block + "\n"
    else:
        text = "# Benchmark results\n\n" + block + "\n"
    path.write_text(text)


# ---------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    log(
        f"suites {args.suites}, threads {args.threads}, engines {args.engines}, "
        f"{'tiny' if args.tiny else 'full'} sizes, out {args.out}"
    )
    machine = machine_info(args)
    cpu0 = common.cpu_times()

    weights = None
    if any(x in args.suites for x in ("codec", "aggregate", "streaming", "rss", "corpus", "serving")):
        log("random weights in the moshi checkpoint layout (cached in benches/.cache or $MIMI_BENCH_CACHE)")
        weights = common.bench_weights(small=args.tiny)

    suites = {}
    with tempfile.TemporaryDirectory(prefix="mimi-bench-") as tmp:
        for name in ALL_SUITES:
            if name not in args.suites:
                suites[name] = {"skipped": "not selected (--suites)"}
                continue
            t0 = time.perf_counter()
            if name == "transformer":
                suites[name] = suite_transformer(args)
            elif name == "codec":
                suites[name] = suite_codec(args, weights, Path(tmp))
            elif name == "aggregate":
                suites[name] = suite_aggregate(args, weights, suites.get("codec"))
            elif name == "streaming":
                suites[name] = suite_streaming(args, weights)
            elif name == "corpus":
                suites[name] = suite_corpus(args, weights, Path(tmp))
            elif name == "serving":
                suites[name] = suite_serving(args, weights)
            else:
                suites[name] = suite_rss(args, weights)
            suites[name]["suite_wall_s"] = round(time.perf_counter() - t0, 1)

    res = {
        "schema": 1,
        "command": "python benches/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {
            "suites": args.suites,
            "repeats": args.repeats,
            "threads": args.threads,
            "engines": args.engines,
            "tiny": args.tiny,
            "steps": args.steps,
            "frames": args.frames,
            "seconds": args.seconds,
            "malloc_variants": args.malloc_variants,
            "aggregate_procs": args.aggregate_procs,
            "aggregate_clips": args.aggregate_clips,
        },
        "machine": machine,
        "weights": weights,
        "suites": suites,
    }
    res["targets"] = evaluate_targets(args, suites)
    res["duration_s"] = round(time.perf_counter() - t_start, 1)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    cpu1 = common.cpu_times()
    if cpu0 and cpu1:
        d = {k: cpu1[k] - cpu0[k] for k in cpu0}
        total = sum(d.values()) or 1
        machine["cpu_time_shares"] = {k: round(v / total, 3) for k, v in d.items()}
    failures = mimi_py_failures(suites)
    res["mimi_py_failures"] = failures

    (args.out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    write_readme(args.out / "README.md", render_markdown(res))
    log(
        f"wrote {args.out / 'results.json'} and the table in {args.out / 'README.md'} "
        f"({res['duration_s']:.0f} s)"
    )
    for f in failures:
        log(f"mimi_py measurement failed: {f}")
    return 1 if failures else 0


def mimi_py_failures(suites) -> list:
    out = []
    for run in suites.get("transformer", {}).get("runs", []):
        if not run["mimi_py"].get("ok"):
            out.append(f"transformer t{run['threads']}: {run['mimi_py'].get('error')}")
    for name in ("codec", "aggregate", "streaming", "rss"):
        for r in suites.get(name, {}).get("runs", []):
            if r.get("engine", "").split("+")[0] == "mimi_py" and not r.get("ok"):
                out.append(f"{name} {r.get('label', r['engine'])} t{r['threads']}: {r.get('error')}")
    for r in suites.get("corpus", {}).get("runs", []):
        if not r.get("ok"):
            out.append(f"corpus {r.get('label')}: {r.get('error')}")
        elif r.get("codes_equal") is False:
            out.append(f"corpus {r.get('label')}: codes differ from the plain loop's")
    return out


if __name__ == "__main__":
    sys.exit(main())
