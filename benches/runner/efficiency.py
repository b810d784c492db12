"""The `efficiency` suite of benches/run.py (issue 32, item 6): how far a batched streaming frame
is from the offline path and from the memory floor, per batch size and precision. Each
(threads, precision) runs in a fresh child (benches/efficiency.py through worker.py); the
figures are derived here from its raw times (report.py renders them)."""

from __future__ import annotations

from serving import REAL_TIME_US

from . import log, ratio
from .children import run_child
from .native import PROFILE_BIN, ensure_native, run_overhead
from .suites import codec_spec

EFFICIENCY_BATCHES = [1, 2, 4, 8, 16, 32]
TINY_BATCHES = [1, 2]
# The read-bandwidth array: at least 1 GiB, so no cache holds it (tiny: a quick 64 MiB).
BANDWIDTH_BYTES, TINY_BANDWIDTH_BYTES = 1 << 30, 64 << 20
OVERHEAD_FRAMES = 40
NO_WEIGHTS_NBYTES = "this build of mimi_py has no MimiCodec.weights_nbytes"


def _spec(args, weights) -> dict:
    """A child's measurement but the precision: the small codec's file (tiny) or real-size
    seeded weights."""
    tiny = args.tiny
    return dict(
        codec_spec(args, weights) if tiny else {},
        task="efficiency",
        batches=args.efficiency_batches,
        frames=3 if tiny else 60,
        warmup=1 if tiny else 5,
        seconds=args.seconds,
        warmup_seconds=0.08 if tiny else 1.0,
        repeats=args.repeats,
        bandwidth_bytes=TINY_BANDWIDTH_BYTES if tiny else BANDWIDTH_BYTES,
        bandwidth_passes=2 if tiny else 5,
    )


def plan_overhead(args, threads: int, precision: str) -> dict:
    """The plan's overhead: a B = 1 frame with the products skipped (mimi_step_profile's
    `overhead` mode, real-size seeded weights), its median and its share of a whole frame."""
    if args.tiny:
        return {"ok": False, "error": "tiny mode does not measure it (the profile binary runs the real size)"}
    binary = ensure_native(args, PROFILE_BIN)
    if "path" not in binary:
        return {"ok": False, "error": binary["skipped"]}
    log(f"efficiency: plan overhead, {precision}, {threads} thread(s)")
    return run_overhead(OVERHEAD_FRAMES, precision, threads, args.timeout)


def suite_efficiency(args, weights) -> dict:
    """One child per thread count and precision, each running every batch size, and the
    plan's overhead from the profile binary."""
    spec = _spec(args, weights)
    runs = []
    for th in args.threads:
        for p in args.precisions:
            log(f"efficiency: mimi_py {p}, batches {args.efficiency_batches}, {th} thread(s)")
            res = run_child(dict(spec, precision=p), th, args.timeout)
            res.setdefault("engine", "mimi_py")
            if res.get("precision", p) != p:  # the codec's own, as against what was asked
                res["precision_ran"] = res["precision"]
            res.update(precision=p, label=f"mimi_py {p}")
            if res.get("ok"):
                res.update(efficiency_figures(res, plan_overhead(args, th, p)))
            runs.append(res)
    return {
        "batches": args.efficiency_batches,
        "frames": spec["frames"],
        "warmup": spec["warmup"],
        "offline_seconds": args.seconds,
        "bandwidth_bytes": spec["bandwidth_bytes"],
        "real_time_us": REAL_TIME_US,
        "runs": runs,
    }


def efficiency_figures(res: dict, overhead: dict) -> dict:
    """The figures derived from one child's raw result: per batch size, ms per stream-frame and
    its ratio to the offline ms per frame; the B = 1 memory floor, and the B = 1 frame against
    that floor plus the offline ms per frame (a model of a step that reads its weights, then
    computes, without overlapping the two); CPU ÷ wall over all the
    streaming frames; the streams held in real time; the plan's overhead (`overhead`, from
    [plan_overhead]); what this build or run cannot measure."""
    off_ms = res["offline"]["ms_per_frame"]
    rows = []
    for r in res["batches"]:
        per = r["median_us"] / 1e3 / r["batch"]
        rows.append(
            dict(
                r,
                ms_per_stream_frame=round(per, 3),
                over_offline=ratio(per, off_ms),
                real_time=r["p99_us"] <= REAL_TIME_US,
            )
        )
    not_measured = {}
    if not overhead.get("ok"):
        not_measured["plan_overhead_ms"] = overhead.get("error", "not run")
    floor_ms = None
    if res.get("weights_nbytes") is None:
        not_measured["memory_floor_ms"] = NO_WEIGHTS_NBYTES
    else:
        floor_ms = round(res["weights_nbytes"] / (res["bandwidth"]["gb_per_s"] * 1e9) * 1e3, 3)
    b1 = next((r for r in rows if r["batch"] == 1), None)
    cpu = sum(r["cpu_s"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    return {
        "batches": rows,
        "memory_floor_ms": floor_ms,
        "b1_over_floor": ratio(b1["median_us"] / 1e3, floor_ms) if b1 else None,
        "b1_over_floor_plus_offline": (
            ratio(b1["median_us"] / 1e3, floor_ms + off_ms)
            if b1 and floor_ms and off_ms is not None
            else None
        ),
        "cpu_per_wall": round(cpu / wall, 2) if wall else None,
        "streams_held": max((r["batch"] for r in rows if r["real_time"]), default=0),
        "plan_overhead_ms": overhead.get("no_products_median_ms"),
        "plan_overhead_share": overhead.get("ratio"),
        "not_measured": not_measured,
    }
