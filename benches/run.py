#!/usr/bin/env python3
"""mimi_py benchmark suite: one entry point, every engine side by side, in one run.

    python benches/run.py [--suites transformer,codec,aggregate,streaming,rss,corpus,serving,server,
                                   layers,efficiency]
                          [--repeats N] [--efficiency-batches 1,2,4]
                          [--threads 1,2] [--engines mimi_py,rustymimi,moshi,transformers]
                          [--precisions highest,high,medium] [--tiny] [--out DIR]

Writes DIR/results.json and the markdown tables into DIR/README.md between the markers
`<!-- results:start -->` / `<!-- results:end -->` (DIR defaults to benches/). Every
(engine, threads) measurement runs in a fresh process, with RAYON_NUM_THREADS / OMP_NUM_THREADS
set before it starts. The offline, streaming, serving, server, layers and efficiency suites run
mimi_py once per precision of --precisions, and moshi in float32 and (when --precisions has
medium) in torch's own bf16 mode (benches/precisions.py). See benches/README.md for what each
suite measures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import common  # noqa: E402
from mimi_py import options as _options  # noqa: E402
from precisions import torch_modes  # noqa: E402
from runner import log  # noqa: E402
from runner.corpus import suite_corpus  # noqa: E402
from runner.efficiency import EFFICIENCY_BATCHES, TINY_BATCHES, suite_efficiency  # noqa: E402
from runner.machine import machine_info  # noqa: E402
from runner.report import render_markdown, write_readme  # noqa: E402
from runner.server import suite_server  # noqa: E402
from runner.suites import (  # noqa: E402
    suite_aggregate,
    suite_codec,
    suite_layers,
    suite_rss,
    suite_serving,
    suite_streaming,
    suite_transformer,
)
from runner.targets import evaluate_targets  # noqa: E402

ALL_SUITES = [
    "transformer",
    "codec",
    "aggregate",
    "streaming",
    "rss",
    "corpus",
    "serving",
    "server",
    "layers",
    "efficiency",
]
ALL_ENGINES = ["mimi_py", "rustymimi", "moshi", "transformers"]
# mimi_py's precisions, named once in the package (MimiCodec(precision=...)).
PRECISIONS = list(_options.PRECISIONS)


# ---------------------------------------------------------------------------------------------
# arguments


def _parser() -> argparse.ArgumentParser:
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
        "--precisions",
        default=",".join(PRECISIONS),
        help="mimi_py's precisions (MimiCodec(precision=...)), one row each in the offline, streaming, "
        "serving, server, layers and efficiency suites, of: " + ",".join(PRECISIONS) + " (default: all). "
        "moshi runs in float32, and in torch's bf16 mode too when medium is listed",
    )
    _size_options(p)
    return p


def _size_options(p: argparse.ArgumentParser) -> None:
    """Sizes, outputs and the native binaries."""
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
        "--efficiency-batches",
        help=f"efficiency suite: batch sizes, comma-separated (default {EFFICIENCY_BATCHES}; tiny {TINY_BATCHES})",
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


def parse_args(argv=None):
    p = _parser()
    a = p.parse_args(argv)
    a.suites = [s.strip() for s in a.suites.split(",") if s.strip()]
    bad = [s for s in a.suites if s not in ALL_SUITES]
    if bad:
        p.error(f"unknown suite(s) {bad}; choose from {ALL_SUITES}")
    a.engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [e for e in a.engines if e not in ALL_ENGINES]
    if bad:
        p.error(f"unknown engine(s) {bad}; choose from {ALL_ENGINES}")
    a.precisions = list(dict.fromkeys(x.strip() for x in a.precisions.split(",") if x.strip()))
    bad = [x for x in a.precisions if x not in PRECISIONS]
    if bad or not a.precisions:
        p.error(f"--precisions {bad or 'empty'}; choose from {list(PRECISIONS)}")
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
    eb = a.efficiency_batches or ",".join(map(str, TINY_BATCHES if tiny else EFFICIENCY_BATCHES))
    a.efficiency_batches = [int(b) for b in eb.split(",") if b.strip()]
    if not a.efficiency_batches or min(a.efficiency_batches) < 1:
        p.error("--efficiency-batches needs positive integers")
    if a.aggregate_procs < 1 or a.aggregate_clips < 1:
        p.error("--aggregate-procs and --aggregate-clips need positive integers")
    a.out = Path(a.out).resolve() if a.out else BENCH_DIR
    a.main_threads = 2 if 2 in a.threads else max(a.threads)
    return a


# ---------------------------------------------------------------------------------------------
# child processes


# ---------------------------------------------------------------------------------------------


SUITES = {
    "transformer": lambda args, weights, tmp, suites: suite_transformer(args),
    "codec": lambda args, weights, tmp, suites: suite_codec(args, weights, tmp),
    "aggregate": lambda args, weights, tmp, suites: suite_aggregate(args, weights, suites.get("codec")),
    "streaming": lambda args, weights, tmp, suites: suite_streaming(args, weights),
    "rss": lambda args, weights, tmp, suites: suite_rss(args, weights),
    "corpus": lambda args, weights, tmp, suites: suite_corpus(args, weights, tmp),
    "serving": lambda args, weights, tmp, suites: suite_serving(args, weights),
    "server": lambda args, weights, tmp, suites: suite_server(args),
    "layers": lambda args, weights, tmp, suites: suite_layers(args),
    "efficiency": lambda args, weights, tmp, suites: suite_efficiency(args, weights),
}


def run_suites(args, weights) -> dict:
    """Every suite in ALL_SUITES order: its results, or why it was skipped."""
    suites: dict = {}
    with tempfile.TemporaryDirectory(prefix="mimi-bench-") as tmp:
        for name in ALL_SUITES:
            if name not in args.suites:
                suites[name] = {"skipped": "not selected (--suites)"}
                continue
            t0 = time.perf_counter()
            suites[name] = SUITES[name](args, weights, Path(tmp), suites)
            suites[name]["suite_wall_s"] = round(time.perf_counter() - t0, 1)
    return suites


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    log(
        f"suites {args.suites}, threads {args.threads}, engines {args.engines}, precisions "
        f"{args.precisions}, {'tiny' if args.tiny else 'full'} sizes, out {args.out}"
    )
    machine = machine_info(args)
    cpu0 = common.cpu_times()

    weights = None
    needs_file = ("codec", "aggregate", "streaming", "rss", "corpus", "serving")
    if any(x in args.suites for x in needs_file) or (args.tiny and "efficiency" in args.suites):
        log("random weights in the moshi checkpoint layout (cached in benches/.cache or $MIMI_BENCH_CACHE)")
        weights = common.bench_weights(small=args.tiny)

    suites = run_suites(args, weights)
    res = {
        "schema": 1,
        "command": "python benches/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {
            "suites": args.suites,
            "repeats": args.repeats,
            "threads": args.threads,
            "engines": args.engines,
            "precisions": args.precisions,
            "torch_modes": torch_modes(args.precisions),
            "tiny": args.tiny,
            "steps": args.steps,
            "frames": args.frames,
            "seconds": args.seconds,
            "malloc_variants": args.malloc_variants,
            "aggregate_procs": args.aggregate_procs,
            "aggregate_clips": args.aggregate_clips,
            "efficiency_batches": args.efficiency_batches,
        },
        "machine": machine,
        "weights": weights,
        "suites": suites,
    }
    res["targets"] = evaluate_targets(args, suites)
    res["duration_s"] = round(time.perf_counter() - t_start, 1)
    finish_machine_info(machine, cpu0)
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


def finish_machine_info(machine: dict, cpu0: dict | None) -> None:
    """The load average at the end, and the shares of the machine's CPU time during the run."""
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    cpu1 = common.cpu_times()
    if cpu0 and cpu1:
        d = {k: cpu1[k] - cpu0[k] for k in cpu0}
        total = sum(d.values()) or 1
        machine["cpu_time_shares"] = {k: round(v / total, 3) for k, v in d.items()}


def mimi_py_failures(suites) -> list:
    out = []
    for run in suites.get("transformer", {}).get("runs", []):
        if not run["mimi_py"].get("ok"):
            out.append(f"transformer t{run['threads']}: {run['mimi_py'].get('error')}")
    for name in ("codec", "aggregate", "streaming", "rss", "efficiency"):
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
