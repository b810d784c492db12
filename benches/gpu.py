#!/usr/bin/env python3
"""mimi_py against moshi's PyTorch Mimi on one accelerator: same random weights,
same device, float32 and bfloat16.

    python benches/gpu.py [--device cuda] [--dtypes float32,bfloat16] [--engines mimi_py,moshi]
                          [--sections offline,streaming,masked,transformer,steady,held,census]
                          [--seconds 10] [--batches 1,16] [--stream-batches 1,8,64]
                          [--frames 50] [--warmup 5] [--repeats 3]
                          [--steady-batches 1,8,64,256] [--steady-warmup 130] [--steady-frames 30]
                          [--held-max 4096] [--held-frames 20] [--held-budget 30]
                          [--census-batches 1,64] [--census-frames 5]
                          [--variant NAME:ENV=VAL,...]... [--rounds N]
                          [--tiny] [--codec real|small] [--timeout S] [--out DIR]

For each (engine, dtype) one fresh process (`gpu.py --worker`, gpu_rows.py) loads the codec
from the moshi-layout file that common.py writes (random weights of the real architecture, 8
codebooks), then measures, each section of `--sections` in this order:

* offline: `encode` of `--seconds` of audio at each batch size of `--batches` (B rows), then
  `decode` of those codes: one warm-up call at that size, then the median of `--repeats`;
* streaming: per 80 ms frame, `encode_step` of (B, 1, 1920) then `decode_step` of its codes, at
  each of `--stream-batches`: `--warmup` frames, then `--frames` timed frames; the median and
  p99 per frame, and per stream (÷ B). These streams are young: their rings never fill;
* masked: the same frames with a mask on both calls, three rows in four stepping (row r sits out
  frame i when (r + i) % 4 == 0; at B = 1 the mask is [True]): mimi_py's `active=`, moshi's
  `set_exec_mask`; per active stream = the frames' total time ÷ their active rows;
* transformer (mimi_py): Mimi's transformer alone, steps of 2 tokens, in turns, of one model
  stepped unmasked and one masked, on young rings and on full ones;
* steady (gpu_steady.py): full rings at each of `--steady-batches`: `--steady-warmup` frames
  streamed first (in calls of several frames), the rings checked full, then `--warmup` +
  `--steady-frames` frames unmasked, then the same masked;
* held (gpu_steady.py): streams held per device, the largest B whose full-ring frame p99 stays
  within 80 ms: from the steady rows, probes of `--held-frames` frames at B predicted by a
  line, then bisection, up to `--held-max`, within `--held-budget` seconds;
* census (gpu_census.py): torch.profiler (CUDA activities through CUPTI: candle's kernels too)
  over `--census-frames` frames unmasked and masked at each of `--census-batches` on full
  rings: kernels, launch calls, copies, GPU busy time and wall time per frame.

Variants (`--variant NAME:ENV=VAL,ENV2=VAL`, repeated; `NAME:` changes nothing) run mimi_py's
workers with those environment variables (a PYTHONPATH is put before the current one, so a
variant can also be another build), in `--rounds` rounds whose order alternates (A B, then
B A): the before and after of a switch in one run. moshi runs once, in the first round.

torch on CUDA is synchronized before each timer stops; mimi_py returns numpy arrays, so its calls
are synchronous. Every row that fails (out of memory, a dtype or device the build does not support,
an engine that is not installed, a worker past `--timeout`) is recorded with its error; the script
itself does not fail. Code agreement: the fraction of equal codes between mimi_py and moshi (same
dtype), between each engine's half-precision codes and its float32 codes, and between each
variant's codes and the first variant's (offline, streaming and steady, at the smallest batch).

Writes DIR/gpu_results.json and DIR/gpu_results.md (DIR defaults to benches/).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import gpu_report  # noqa: E402
from gpu_rows import INFO_MARK, ROW_MARK, SECTIONS, wanted_rows  # noqa: E402

import common  # noqa: E402

ENGINES = ["mimi_py", "moshi"]
DTYPES = ["float32", "bfloat16", "float16"]
NEEDS = {"mimi_py": ["mimi_py"], "moshi": ["torch", "moshi"]}
WRITE_RESERVE_S = 10.0  # of --budget, kept for the agreement and the results' files
MIN_WORKER_S = 15.0  # a worker given less is not started
# (option, default, tiny default): the sizes handed to each worker and recorded in the results
SIZES = [
    ("seconds", 10.0, 0.5),
    ("batches", "1,16", "1,2"),
    ("stream_batches", "1,8,64", "1,2"),
    ("frames", 50, 3),
    ("warmup", 5, 1),
    ("repeats", 3, 1),
    ("steady_batches", "1,8,64,256", "1,2"),
    ("steady_warmup", 130, 130),
    ("steady_frames", 30, 3),
    ("held_max", 4096, 4),
    ("held_frames", 20, 3),
    ("held_budget", 30.0, 10.0),
    ("census_batches", "1,64", "1,2"),
    ("census_frames", 5, 2),
]
HELP = {
    "seconds": "offline audio per row",
    "batches": "offline batch sizes",
    "stream_batches": "streaming batch sizes (young rings)",
    "frames": "timed streaming frames",
    "warmup": "untimed frames before the timed ones",
    "repeats": "timed offline repeats",
    "steady_batches": "batch sizes on full rings",
    "steady_warmup": "frames streamed before the full-ring rows (130: 260 tokens > the 250 context)",
    "steady_frames": "timed frames of each full-ring row, unmasked and masked",
    "held_max": "the largest B the streams-held search tries",
    "held_frames": "timed frames of each streams-held probe",
    "held_budget": "seconds the streams-held search may take (a worker's own probes)",
    "census_batches": "batch sizes of the kernel census",
    "census_frames": "profiled frames per census (as many run unprofiled just before)",
}


def log(msg: str) -> None:
    print(f"[gpu bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def parse_variant(text: str) -> dict:
    """`NAME:ENV=VAL,ENV2=VAL` (or `NAME`, `NAME:`) -> {"name", "env"}."""
    name, _, rest = text.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"variant name {name!r}: letters, digits, '_', '.', '-' only")
    env = {}
    for item in (x for x in rest.split(",") if x.strip()):
        key, eq, val = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise ValueError(f"variant {name}: {item!r} is not ENV=VALUE")
        env[key.strip()] = val
    return {"name": name, "env": env}


def _size_args(p) -> None:
    for key, default, tiny in SIZES:
        kind = float if isinstance(default, float) else (int if isinstance(default, int) else str)
        p.add_argument(
            "--" + key.replace("_", "-"),
            type=kind,
            default=None,
            help=f"{HELP[key]} (default {default}; tiny {tiny})",
        )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="device of both engines: cuda (default), cuda:N, cpu")
    p.add_argument("--dtypes", default="float32,bfloat16", help="of: " + ",".join(DTYPES))
    p.add_argument("--engines", default=",".join(ENGINES), help="of: " + ",".join(ENGINES))
    p.add_argument("--sections", default=",".join(SECTIONS), help="of: " + ",".join(SECTIONS))
    _size_args(p)
    p.add_argument(
        "--held-start", type=int, default=None, help="first streams-held probe without steady rows"
    )
    p.add_argument("--variant", action="append", default=[], help="NAME:ENV=VAL,... (mimi_py's workers)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of mimi_py's variants, order alternating")
    p.add_argument("--tiny", action="store_true", help="dry-run sizes (each option's tiny default)")
    p.add_argument(
        "--codec",
        choices=["real", "small"],
        default="real",
        help="real: random weights of the real Mimi (default); small: the fixtures' small codec "
        "(4 codebooks; mimi_py only, moshi builds only the real architecture)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of each process (RAYON/OMP_NUM_THREADS; default: the available cores; tiny 1)",
    )
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per worker process (default 240)")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole bench: each worker gets at most its fair share of what is left",
    )
    p.add_argument("--out", default=None, help="folder for gpu_results.json and .md (default benches/)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is None:
        _finish_args(p, a)
    return a


def _finish_args(p, a) -> None:
    """Lists from their strings, the tiny or full defaults, and the checks."""
    a.engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    a.sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = [x for x in a.engines if x not in ENGINES] + [d for d in a.dtypes if d not in DTYPES]
    bad += [s for s in a.sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown engine(s), dtype(s) or section(s) {bad}")
    for key, default, tiny in SIZES:
        if getattr(a, key) is None:
            setattr(a, key, tiny if a.tiny else default)
        if isinstance(default, str):
            setattr(a, key, _ints(getattr(a, key)))
    a.held_start = a.held_start or max(a.steady_batches)
    a.threads = a.threads or (1 if a.tiny else common.cpu_count_available())
    sizes = a.batches + a.stream_batches + a.steady_batches + a.census_batches
    sizes += [a.frames, a.repeats, a.steady_frames, a.held_frames, a.census_frames, a.held_max, a.rounds]
    if min(sizes) < 1 or a.warmup < 0 or a.steady_warmup < 0:
        p.error("sizes must be positive")
    try:
        a.variants = [parse_variant(v) for v in a.variant] or [{"name": None, "env": {}}]
    except ValueError as e:
        p.error(str(e))
    if len({v["name"] for v in a.variants}) != len(a.variants):
        p.error("variant names must differ")
    a.out = Path(a.out).resolve() if a.out else BENCH_DIR


def sizes_of(args) -> dict:
    """The sizes handed to each worker and recorded in the results."""
    out = {key: getattr(args, key) for key, _, _ in SIZES}
    return dict(out, held_start=args.held_start, sections=args.sections)


# ---------------------------------------------------------------------------------------------
# the parent


def worker_env(threads: int, extra: dict) -> dict:
    """The environment of a worker: its thread counts, then the variant's variables (a
    PYTHONPATH put before the current one)."""
    env = os.environ.copy()
    t = str(threads)
    env.update(RAYON_NUM_THREADS=t, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t)
    for key, val in extra.items():
        if key == "PYTHONPATH" and env.get("PYTHONPATH"):
            val = val + os.pathsep + env["PYTHONPATH"]
        env[key] = val
    return env


def _spawn(spec: dict, env: dict, timeout: float):
    """(stdout, stderr, why it died or None) of one worker process."""
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(common.REPO),
        )
        return (
            proc.stdout,
            proc.stderr,
            None if proc.returncode == 0 else f"worker exited with status {proc.returncode}",
        )
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return stdout, stderr, f"timed out after {timeout:g} s"


def run_worker(spec: dict, threads: int, timeout: float, env_extra: dict | None = None) -> dict:
    """One worker: its info and rows, every wanted row it did not report recorded as failed."""
    t0 = time.perf_counter()
    stdout, stderr, died = _spawn(spec, worker_env(threads, env_extra or {}), timeout)
    info, rows = None, []
    for line in stdout.splitlines():
        if line.startswith(INFO_MARK):
            info = json.loads(line[len(INFO_MARK) :])
        elif line.startswith(ROW_MARK):
            rows.append(json.loads(line[len(ROW_MARK) :]))
    tail = stderr.strip()[-1500:]  # the protocol lines on stdout say nothing about a crash
    if info is None:
        info = {"ok": False, "error": f"{died or 'no result'}" + (f": {tail}" if tail else "")}
    done = {(r["kind"], r["batch"]) for r in rows}
    for kind, b in wanted_rows(spec):  # rows never reported: the load failed, or the process died
        if (kind, b) not in done:
            why = (
                info.get("error")
                if not info.get("ok")
                else (died or "not reported") + (f": {tail}" if tail else "")
            )
            rows.append({"kind": kind, "batch": b, "ok": False, "error": why})
    return dict(
        info,
        engine=spec["engine"],
        dtype=spec["dtype"],
        rows=rows,
        process_wall_s=round(time.perf_counter() - t0, 2),
    )


def run_plan(args) -> list[tuple[str, str, dict, int]]:
    """(engine, dtype, variant, round) of every worker, in the order they run: per round, each
    engine's dtypes, mimi_py's variants in order in odd rounds and reversed in even ones."""
    plan = []
    for rnd in range(args.rounds):
        for eng in args.engines:
            if eng != "mimi_py" and rnd > 0:
                continue
            vs = args.variants if eng == "mimi_py" else [{"name": None, "env": {}}]
            for dt in args.dtypes:
                for v in vs if rnd % 2 == 0 else vs[::-1]:
                    plan.append((eng, dt, v, rnd + 1))
    return plan


def codes_name(eng: str, dt: str, variant, first_variant) -> str:
    return f"{eng}-{dt}" + (f"-{variant}" if variant is not None and variant != first_variant else "")


def failed_run(spec: dict, why: str, **extra) -> dict:
    """The failed rows of a worker that did not run (its engine cannot be imported, or the
    bench's budget was spent)."""
    rows = [{"kind": k, "batch": b, "ok": False, "error": why} for k, b in wanted_rows(spec)]
    return dict(engine=spec["engine"], dtype=spec["dtype"], ok=False, error=why, rows=rows, **extra)


def worker_timeout(args, workers: int, left_workers: int) -> float:
    """`--timeout`, and with `--budget` what is left of it once half an even share (or of
    `--timeout`, if less) is kept for each later worker: a worker that ends early leaves its
    time to the next ones, and the results are written in time. A worker knows its deadline:
    its streams-held search stops in time for its census."""
    if args.budget is None:
        return args.timeout
    left = args.started + args.budget - WRITE_RESERVE_S - time.perf_counter()
    floor = min(args.timeout, args.budget / workers) / 2
    return min(args.timeout, left - (left_workers - 1) * floor)


def _label(eng: str, v: dict, rnd: int, args) -> str:
    label = eng + (f" [{v['name']}]" if v["name"] is not None and len(args.variants) > 1 else "")
    return label + (f" #{rnd}" if args.rounds > 1 and eng == "mimi_py" else "")


def run_engines(args, weights: dict, sizes: dict, codes_dir: Path) -> list:
    """One worker per (engine, dtype, variant, round); the first round's save their codes under
    codes_dir for `agreement`."""
    import importlib.util

    runs, first, plan = [], args.variants[0]["name"], run_plan(args)
    for i, (eng, dt, v, rnd) in enumerate(plan):
        spec = {"task": "gpu", "engine": eng, "dtype": dt, "device": args.device, "weights": weights["path"]}
        spec.update(hf_config=weights["hf_config"], num_codebooks=weights["num_codebooks"], **sizes)
        spec["save_dir"] = None
        if rnd == 1:
            save = codes_dir / codes_name(eng, dt, v["name"], first)
            save.mkdir()
            spec["save_dir"] = str(save)
        missing = [m for m in NEEDS[eng] if importlib.util.find_spec(m) is None]
        label = _label(eng, v, rnd, args)
        timeout = worker_timeout(args, len(plan), len(plan) - i)
        spec["deadline_unix"] = time.time() + timeout - 5.0
        if missing:
            r = failed_run(spec, "not installed (" + ", ".join(missing) + ")", not_installed=True)
        elif timeout < MIN_WORKER_S:
            r = failed_run(spec, f"not run: the bench's --budget of {args.budget:g} s was spent")
        else:
            log(
                f"{label} {dt} on {args.device}, {timeout:.0f} s at most"
                + (f" ({v['env']})" if v["env"] else "")
            )
            r = run_worker(spec, args.threads, timeout, v["env"] if eng == "mimi_py" else {})
            bad = [f"{x['kind']} B={x['batch']}" for x in r["rows"] if not x.get("ok")]
            log(f"{label} {dt}: {r['process_wall_s']:.1f} s" + (f"; failed: {', '.join(bad)}" if bad else ""))
        variant = v["name"] if eng == "mimi_py" else None
        runs.append(dict(r, label=label, variant=variant, variant_env=v["env"] if variant else {}, round=rnd))
    return runs


# ---------------------------------------------------------------------------------------------
# codes, machine


def _load(path: Path):
    import numpy as np

    return np.load(path) if path.exists() else None


def _agree(a, b) -> dict | None:
    if a is None or b is None or a.shape[:2] != b.shape[:2]:
        return None
    f = min(a.shape[-1], b.shape[-1])
    a, b = a[..., :f].astype("int64"), b[..., :f].astype("int64")
    return {
        "equal_fraction": round(float((a == b).mean()), 4),
        "first_codebook_equal_fraction": round(float((a[:, 0] == b[:, 0]).mean()), 4),
        "frames": int(f),
    }


def _pairs(args) -> list[tuple[tuple, tuple]]:
    """(engine, dtype, variant) pairs: mimi_py vs moshi at each dtype, each engine's dtypes vs
    its float32, each later variant vs the first."""
    v0 = args.variants[0]["name"]
    pairs = [(("mimi_py", dt, v0), ("moshi", dt, None)) for dt in args.dtypes]
    for eng in args.engines:
        v = v0 if eng == "mimi_py" else None
        for dt in args.dtypes:
            if dt != "float32" and "float32" in args.dtypes:
                pairs.append(((eng, dt, v), (eng, "float32", v)))
    for dt in args.dtypes:
        pairs += [(("mimi_py", dt, v["name"]), ("mimi_py", dt, v0)) for v in args.variants[1:]]
    return [(a, b) for a, b in pairs if a[0] in args.engines and b[0] in args.engines]


def agreement(args, codes_dir: Path) -> list:
    """Fraction of equal codes of each pair of `_pairs`: offline at the smallest batch,
    streaming and steady at the smallest of theirs."""
    b0, s0, f0 = min(args.batches), min(args.stream_batches), min(args.steady_batches)
    v0, out = args.variants[0]["name"], []
    for a, b in _pairs(args):
        da = codes_dir / codes_name(a[0], a[1], a[2], v0)
        db = codes_dir / codes_name(b[0], b[1], b[2], v0)
        g = {
            "a": dict(zip(("engine", "dtype", "variant"), a)),
            "b": dict(zip(("engine", "dtype", "variant"), b)),
        }
        for key, name, batch in (
            ("offline", "offline", b0),
            ("streaming", "stream", s0),
            ("steady", "steady", f0),
        ):
            g[f"{name}_batch"] = batch
            g[key] = _agree(_load(da / f"{name}-b{batch}.npy"), _load(db / f"{name}-b{batch}.npy"))
        out.append(g)
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _commit() -> str | None:
    """The checkout's commit (+ "-dirty" with changes), else $MIMI_BENCH_COMMIT (a copy of the
    tree without .git, as on the device machine)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(common.REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(common.REPO), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return head.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:
        pass
    return os.environ.get("MIMI_BENCH_COMMIT") or None


def device_facts(device: str) -> dict:
    out = {"device": device, "cpu_model": common.cpu_model(), "cpu_cores": common.cpu_count()}
    out.update(
        commit=_commit(), torch=_version("torch"), moshi=_version("moshi"), mimi_py=_version("mimi_py")
    )
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            out["nvidia_smi"] = q.splitlines()
        except Exception as e:
            out["nvidia_smi_error"] = f"{type(e).__name__}: {e}"
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        from gpu_rows import worker_main

        return worker_main(json.loads(args.worker))
    t_start = args.started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    log(
        f"device {args.device}, engines {args.engines}, dtypes {args.dtypes}, {args.codec} codec, out {args.out}"
    )
    if args.codec != "small":
        log("random weights in the moshi checkpoint layout (cached in benches/.cache or $MIMI_BENCH_CACHE)")
    weights = common.bench_weights(small=args.codec == "small")
    sizes = sizes_of(args)
    with tempfile.TemporaryDirectory(prefix="mimi-gpu-bench-") as tmp:
        runs = run_engines(args, weights, sizes, Path(tmp))
        agree = agreement(args, Path(tmp))
    res = {
        "schema": 2,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python benches/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": dict(
            device=args.device,
            engines=args.engines,
            dtypes=args.dtypes,
            **sizes,
            variants=args.variants if args.variant else [],
            rounds=args.rounds,
            tiny=args.tiny,
            codec=args.codec,
            threads=args.threads,
            timeout=args.timeout,
            budget=args.budget,
        ),
        "machine": dict(
            device_facts(args.device), platform=platform.platform(), python=platform.python_version()
        ),
        "weights": weights,
        "runs": runs,
        "agreement": agree,
    }
    res["targets"] = gpu_report.targets(res)
    res["variants"] = gpu_report.variant_rows(res) if len(args.variants) > 1 or args.rounds > 1 else []
    res["duration_s"] = round(time.perf_counter() - t_start, 1)
    (args.out / "gpu_results.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "gpu_results.md").write_text(gpu_report.render(res))
    log(
        f"wrote {args.out / 'gpu_results.json'} and {args.out / 'gpu_results.md'} ({res['duration_s']:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
