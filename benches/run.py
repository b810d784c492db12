#!/usr/bin/env python3
"""The benchmarks' one runner: `python -m benches [options]` (or `python benches/run.py`), and
`python -m benches report [RESULTS.json ...]`, which rewrites benches/README.md's tables and charts.

A suite (benches/suites/) declares its name, the peers it compares, its sizes (tiny, full) and
the jobs it wants run; the runner starts each job in a fresh worker (benches/worker.py), with
its thread counts, within the budget, and interleaves mimi_py's variants (`--variant`, another
build or a switch) in `--rounds` whose order alternates (A B, then B A), so that a noisy
neighbour hits each alike. The rows land in one results file per machine kind
(benches/results/<machine>.json: the machine, versions, commit, every raw repeat), and the
report (benches/report.py) writes the tables and charts from it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.util
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
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
import common  # noqa: E402
import worker  # noqa: E402
from engines import NEEDS  # noqa: E402
from suites import CPU_SUITES, GPU_SUITES, SECTIONS  # noqa: E402

RESULTS = BENCH_DIR / "results"
ENGINES = list(NEEDS)
PRECISIONS = ["highest", "high", "medium"]
WRITE_RESERVE_S, MIN_WORKER_S = 10.0, 15.0  # of --budget: kept for writing; a worker given less is not run


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _list(text: str) -> list[str]:
    return [x.strip() for x in str(text).split(",") if x.strip()]


def parse_variant(text: str) -> dict:
    """`NAME:ENV=VAL,ENV2=VAL` (or `NAME`, `NAME:`) -> {"name", "env"}."""
    name, _, rest = text.partition(":")
    env = dict(item.partition("=")[::2] for item in _list(rest))
    bad = [k for k in env if not re.fullmatch(r"[A-Za-z_]\w*", k)] + [i for i in _list(rest) if "=" not in i]
    if not re.fullmatch(r"[\w.-]+", name) or bad:
        raise ValueError(f"--variant {text!r}: NAME:ENV=VALUE,... (a name, then variables)")
    return {"name": name, "env": env}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add(
        "--suites", help="comma-separated (default: the CPU suites), of: " + ",".join(CPU_SUITES + GPU_SUITES)
    )
    add("--engines", default=",".join(ENGINES), help="mimi_py and the peers: " + ",".join(ENGINES))
    add("--precisions", default=",".join(PRECISIONS), help="mimi_py's precisions (one row each)")
    add("--threads", help="thread counts (default 1,2; tiny 1); one-count suites take 2, else the largest")
    add("--tiny", action="store_true", help="smoke-test sizes: small codec, few frames, peers skipped")
    add("--size", action="append", default=[], help="KEY=VALUE: a size of the suites (repeated)")
    add("--device", default="cuda", help="the GPU suites' device")
    add("--dtypes", default="float32,bfloat16", help="the GPU suites' dtypes")
    add(
        "--sections",
        help="the GPU suites' rows: " + ",".join(sum(SECTIONS.values(), [])) + " (they choose the suites)",
    )
    add("--codec", choices=["real", "small"], help="the codec's size (default: small when tiny)")
    add("--variant", action="append", default=[], help="NAME:ENV=VAL,...: mimi_py with those variables")
    add("--rounds", type=int, default=1, help="rounds of the variants, alternating their order")
    add("--budget", type=float, help="seconds the whole run may take (workers' timeouts shrink)")
    add("--timeout", type=float, help="seconds per worker (default 1800; tiny 300)")
    add("--out", help="where the results file goes (default benches/results/)")
    add("--no-report", action="store_true", help="do not rewrite benches/README.md's tables and charts")
    return p


def parse_args(argv=None):
    p = parser()
    a = p.parse_args(argv)
    if a.sections:
        a.sections = _list(a.sections)
        a.suites = a.suites or ",".join(s for s in GPU_SUITES if set(SECTIONS[s]) & set(a.sections))
    else:
        a.sections = [k for s in GPU_SUITES for k in SECTIONS[s]]
    a.suites = _list(a.suites or ",".join(CPU_SUITES))
    a.engines, a.precisions, a.dtypes = _list(a.engines), _list(a.precisions), _list(a.dtypes)
    known = [CPU_SUITES + GPU_SUITES, ENGINES, PRECISIONS, sum(SECTIONS.values(), [])]
    bad = [
        x
        for got, ok in zip([a.suites, a.engines, a.precisions, a.sections], known)
        for x in got
        if x not in ok
    ]
    if bad:
        p.error(f"unknown suite(s), engine(s), precision(s) or section(s): {bad}")
    a.threads = [int(t) for t in _list(a.threads or ("1" if a.tiny else "1,2"))]
    a.main_threads = 2 if 2 in a.threads else max(a.threads)
    a.timeout = a.timeout or (300.0 if a.tiny else 1800.0)
    a.codec = a.codec or ("small" if a.tiny else "real")
    try:
        a.variants = [parse_variant(v) for v in a.variant] or [{"name": None, "env": {}}]
        a.overrides = dict(x.split("=", 1) for x in a.size)
    except ValueError as e:
        p.error(str(e))
    if len({v["name"] for v in a.variants}) != len(a.variants) or a.rounds < 1 or min(a.threads) < 1:
        p.error("variant names must differ; --rounds and --threads must be positive")
    return a


class Context:
    """What a suite's `jobs` sees: the arguments, its sizes, the weights, a scratch folder,
    and which engines can run."""

    def __init__(self, args, weights: dict | None, tmp: Path):
        self.args, self.weights, self.tmp = args, weights, tmp
        self.tiny, self.threads, self.main_threads = args.tiny, args.threads, args.main_threads
        self.precisions, self.engines = args.precisions, args.engines

    def sizes(self, suite) -> dict:
        """The suite's sizes for this run, `--size KEY=VALUE` applied to the keys it has
        (`--size SUITE.KEY=VALUE` to that suite's only)."""
        out, name = dict(suite.SIZES["tiny" if self.tiny else "full"]), suite.__name__.split(".")[-1]
        for key, val in self.args.overrides.items():
            key = key.removeprefix(name + ".")
            if key in out:
                d = out[key]
                out[key] = [type(d[0])(x) for x in _list(val)] if isinstance(d, list) else type(d)(val)
        return out

    def skip(self, engine: str) -> str | None:
        """Why `engine` cannot run here, or None."""
        if engine not in self.engines:
            return "not selected (--engines)"
        if engine != "mimi_py" and self.tiny:
            return "skipped (tiny sizes)"
        missing = [m for m in NEEDS[engine] if importlib.util.find_spec(m) is None]
        return "not installed (" + ", ".join(missing) + ")" if missing else None

    def runnable(self, engines) -> tuple[list[str], dict]:
        """The engines that can run here, and why each other one cannot."""
        why = {e: self.skip(e) for e in engines}
        return [e for e in engines if not why[e]], {e: w for e, w in why.items() if w}

    def codec(self) -> dict:
        """The engine arguments of the bench's codec file (every engine loads the same one)."""
        w = self.weights
        return {"weights": w["path"], "hf_config": w["hf_config"], "num_codebooks": w["num_codebooks"]}


def plan(args, jobs: list[dict]) -> list[dict]:
    """Every job once per round: mimi_py's for each variant, in order in odd rounds and
    reversed in even ones; a peer's, or a job marked `once`, in the first round only."""
    out = []
    for rnd in range(1, args.rounds + 1):
        for job in jobs:
            if job["engine"] != "mimi_py" or job.get("once"):
                out += [dict(job, round=rnd)] if rnd == 1 else []
                continue
            vs = args.variants if rnd % 2 else args.variants[::-1]
            out += [
                dict(job, round=rnd, variant=v["name"], env={**job.get("env", {}), **v["env"]}) for v in vs
            ]
    return out


def job_timeout(args, started: float, n: int, left: int) -> float:
    """`--timeout`, and with `--budget` what is left of it once half an even share is kept for
    each later job: a job that ends early leaves its time to the next ones."""
    if args.budget is None:
        return args.timeout
    rest = started + args.budget - WRITE_RESERVE_S - time.perf_counter()
    return min(args.timeout, rest - (left - 1) * min(args.timeout, args.budget / n) / 2)


def run_job(args, job: dict, timeout: float) -> list[dict]:
    """A job's rows, each with the job's labels."""
    keep = ("engine", "label", "precision", "torch_mode", "dtype", "device", "variant", "round")
    tags = {k: job[k] for k in keep if job.get(k) is not None}
    threads = job.get("threads", args.main_threads)
    job = dict(job, threads=threads, deadline_unix=time.time() + timeout - 5.0)  # a search stops in time
    if timeout < MIN_WORKER_S:
        rows = worker.rows_of(job, "", "", f"not run: the --budget of {args.budget:g} s was spent")
    elif job.get("together"):
        rows = sum(worker.spawn_together([job] * job["together"], threads, timeout, job.get("env")), [])
    else:
        rows = worker.spawn(job, threads, timeout, job.get("env"))
    return [dict(r, **tags, threads=threads) for r in rows]


def merged(jobs: list[dict]) -> list[dict]:
    """Jobs marked `share` with the same engine and labels run as one worker (the GPU suites:
    one load of the codec for all their rows)."""
    out, seen = [], {}
    for job in jobs:
        key = job.get("share") and (job["engine"], job.get("label"), job.get("dtype"))
        if key and key in seen:
            seen[key]["tasks"] += job["tasks"]
            continue
        job = dict(job, tasks=list(job["tasks"]))
        out.append(job)
        if key:
            seen[key] = job
    return out


def run_suites(args, ctx: Context) -> dict:
    """Every selected suite's jobs, planned and run; then each suite's summary of its rows."""
    mods = {name: importlib.import_module(f"suites.{name}") for name in args.suites}
    jobs, skipped = [], {}
    for name, mod in mods.items():
        js, why = mod.jobs(ctx, ctx.sizes(mod))
        jobs += [dict(j, suite=name, tasks=[dict(t, suite=name) for t in j["tasks"]]) for j in js]
        skipped[name] = why
    todo, started, rows = plan(args, merged(jobs)), time.perf_counter(), []
    for i, job in enumerate(todo):
        timeout = job_timeout(args, started, len(todo), len(todo) - i)
        name = job.get("label", job["engine"]) + (f" [{job['variant']}]" if job.get("variant") else "")
        suites = ", ".join(sorted({t["suite"] for t in job["tasks"]}))
        where = (
            f"{job['dtype']} on {job['device']}"
            if job.get("dtype")
            else f"{job.get('threads', args.main_threads)} thread(s)"
        )
        log(f"{name} ({suites}), {where}, round {job['round']}, {timeout:.0f} s at most")
        rows += run_job(args, job, timeout)
    out = {}
    for name, mod in mods.items():
        mine = [dict(r, suite=name) for r in rows if r.get("suite") == name]
        summary = mod.summary(ctx, mine) if hasattr(mod, "summary") else {}
        out[name] = {"sizes": ctx.sizes(mod), "rows": mine, "skipped": skipped[name], **summary}
    return out


def commit() -> str | None:
    """The checkout's commit (+ "-dirty" with changes to tracked files), else $MIMI_BENCH_COMMIT
    (a copy of the tree without .git, as on the device machine)."""
    git = ["git", "-C", str(common.REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return os.environ.get("MIMI_BENCH_COMMIT")
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine(args) -> dict:
    """The machine in words and its slug (the results file's name), with the versions."""
    from engines import version_of

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    have = set(next((x for x in info.splitlines() if x.startswith("flags")), "").split())
    m = {"cpu": common.cpu_model(), "cores": common.cpu_count_available(), "gpu": None}
    m["cpu_flags"] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in have]
    if set(args.suites) & set(GPU_SUITES):
        q = "nvidia-smi --query-gpu=name --format=csv,noheader"
        smi = (
            subprocess.run(q.split(), capture_output=True, text=True) if shutil.which("nvidia-smi") else None
        )
        m["gpu"] = smi.stdout.splitlines()[0].strip() if smi and smi.stdout.strip() else args.device
    name = m["gpu"] or f"{m['cpu']} {m['cores']} cores"
    m["slug"] = "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())
    m.update(platform=platform.platform(), python=platform.python_version())
    m["versions"] = {
        d: version_of(d) for d in ("mimi_py", "numpy", "rustymimi", "torch", "moshi", "transformers")
    }
    return m


def write_results(args, res: dict) -> Path:
    """The machine's results file: this run's suites replace the same suites of an earlier run
    of the same sizes (the others stay, with their own date and commit)."""
    out = Path(args.out).resolve() if args.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{res['machine']['slug']}{'-tiny' if args.tiny else ''}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    for name, suite in old.get("suites", {}).items():
        if name not in res["suites"]:
            res["suites"][name] = suite
    path.write_text(dumps(res) + "\n")
    return path


def dumps(x, depth: int = 0) -> str:
    """JSON with one row (a list's dict) a line: diffs of a results file read row by row."""
    pad = "\n" + " " * (depth + 1)
    if isinstance(x, dict) and depth < 3:
        items = (f"{json.dumps(k)}: {dumps(v, depth + 1)}" for k, v in x.items())
        return "{" + pad + ("," + pad).join(items) + "\n" + " " * depth + "}" if x else "{}"
    if isinstance(x, list) and x and isinstance(x[0], dict):
        return "[" + pad + ("," + pad).join(json.dumps(r) for r in x) + "\n" + " " * depth + "]"
    return json.dumps(x)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        import report

        return report.main(argv[1:])
    args = parse_args(argv)
    t0 = time.perf_counter()
    log(f"suites {args.suites}, engines {args.engines}, {'tiny' if args.tiny else 'full'} sizes")
    weights = common.bench_weights(small=args.codec == "small")
    with tempfile.TemporaryDirectory(prefix="mimi-bench-") as tmp:
        suites = run_suites(args, Context(args, weights, Path(tmp)))
    stamp = {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "commit": commit()}
    stamp.update(command="python -m benches " + " ".join(argv), wall_s=round(time.perf_counter() - t0, 1))
    for s in suites.values():
        s.update(stamp)
    res = {"schema": 3, "machine": machine(args), "weights": weights, "tiny": args.tiny, "suites": suites}
    path = write_results(args, res)
    log(f"wrote {path} ({stamp['wall_s']:.0f} s)")
    if not args.no_report and not args.tiny and not args.out:
        import report

        report.main([])
    # A CPU suite's failed mimi_py row fails the run; a GPU row that fails (out of memory at a
    # large batch, a dtype the build lacks) is a result, recorded with its error.
    rows = [
        r for n, s in suites.items() if n in CPU_SUITES for r in s["rows"] if r.get("engine") == "mimi_py"
    ]
    failed = [r for r in rows if not r["ok"] and not r.get("not_installed")]
    for r in failed:
        log(f"mimi_py failed: {r.get('label')} {r.get('kind', '')} {r.get('error', '')[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
