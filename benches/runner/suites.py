"""The suites of benches/run.py but the corpus one (corpus.py): each runs its measurements in
fresh processes and returns its part of results.json."""

from __future__ import annotations

import os
from pathlib import Path

import common
from precisions import like_for_like, precision_of, variants
from worker import saved_stem

from . import log, ratio
from .children import MALLOC_ENV, engine_available, run_child, run_children_together
from .native import NATIVE_BIN, PROFILE_BIN, ensure_native, run_native, run_profile

STREAMING_ENGINES = {"mimi_py", "rustymimi", "moshi"}  # transformers: offline only


def _agg_median(values):
    """The median over repeats (the mean of the middle two for an even count)."""
    import statistics

    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 1) if vals else None


def _transformer_repeats(args, th: int, native: dict) -> tuple[list, list]:
    """Python and native runs at `th` threads, alternating `--repeats` times."""
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
    return py_reps, nat_reps


def _python_medians(py_reps: list) -> dict:
    """The Python runs' figures: medians over the repeats that succeeded."""
    ok_py = [r for r in py_reps if r.get("ok")]
    if not ok_py:
        return dict(py_reps[0], reps=py_reps)
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
    return py


def _native_medians(nat_reps: list) -> dict:
    """The native runs' figures per engine: medians over the repeats that succeeded."""
    ok_nat = [r for r in nat_reps if r.get("ok")]
    if not ok_nat:
        return dict(nat_reps[0], reps=nat_reps)
    engines = {}
    for name in ok_nat[0]["engines"]:
        rows = [r["engines"][name] for r in ok_nat if name in r["engines"]]
        engines[name] = {
            "engine": name,
            "step_median_us": _agg_median(d.get("step_median_us") for d in rows),
            "step_p99_us": _agg_median(d.get("step_p99_us") for d in rows),
            "chunk250_us": _agg_median(d.get("chunk250_us") for d in rows),
        }
    return {"ok": True, "repeats": len(nat_reps), "engines": engines, "reps": nat_reps}


def _transformer_ratios(args, py: dict, nat: dict, py_reps: list, nat_reps: list) -> dict:
    """Binding overhead (Python ÷ the same model in native Rust) and mimi_py ÷ candle."""
    eng = nat.get("engines", {})
    mine, cand = eng.get("mimi_py-native", {}), eng.get("candle", {})
    comparable = not args.tiny and py.get("ok") and nat.get("ok")
    paired = []
    if comparable:
        for a, b in zip(py_reps, nat_reps):
            if a.get("ok") and b.get("ok") and "mimi_py-native" in b["engines"]:
                paired.append(ratio(a["step_median_us"], b["engines"]["mimi_py-native"]["step_median_us"]))
    return {
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
        "vs_candle_chunk250": ratio(py.get("chunk_us"), cand.get("chunk250_us")) if comparable else None,
        "note": None if comparable else "tiny mode: the native binary always runs the Mimi shape; no ratio",
    }


def suite_transformer(args) -> dict:
    """Python and native runs alternate `--repeats` times at each thread count, so a noisy
    neighbour hits both alike; the reported figures are medians over the repeats, and the
    binding overhead is also given as the median of the paired per-repeat ratios."""
    native = ensure_native(args)
    runs = []
    for th in args.threads:
        py_reps, nat_reps = _transformer_repeats(args, th, native)
        py = _python_medians(py_reps)
        run = {"threads": th, "mimi_py": py}
        if "path" in native:
            nat = _native_medians(nat_reps)
            run["native"] = nat
            run["ratios"] = _transformer_ratios(args, py, nat, py_reps, nat_reps)
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


def engine_variants(args, with_malloc: bool, allowed=None) -> list[tuple[str, dict]]:
    """(engine, variant) for each row of a suite: mimi_py once per --precisions, moshi once per
    torch mode (benches/precisions.py), the other engines once; `+malloc` ones after each."""
    return [(e, v) for e in engine_list(args, with_malloc, allowed) for v in variants(e, args.precisions)]


def run_variant(spec: dict, eng: str, variant: dict, threads: int, timeout: float) -> dict:
    """One child for one row: the variant's precision or torch mode in its spec and its result."""
    res = run_child(
        dict(spec, engine=eng, **variant), threads, timeout, MALLOC_ENV if eng.endswith("+malloc") else None
    )
    res.setdefault("engine", eng)
    ran = res.get("precision")  # the codec's own (describe()), as against what was asked
    res.update(variant)
    if ran and ran != res.get("precision"):
        res["precision_ran"] = ran
    return res


def suite_codec(args, weights, save_dir: Path) -> dict:
    runs, skipped = [], {}
    for eng, variant in engine_variants(args, True):
        why = engine_available(eng, args.tiny)
        if why:
            skipped[variant["label"]] = why
            continue
        for th in args.threads:
            log(f"codec offline: {variant['label']}, {th} thread(s)")
            spec = dict(
                codec_spec(args, weights),
                task="codec_offline",
                seconds=args.seconds,
                warmup_seconds=0.08 if args.tiny else 1.0,
                repeats=args.repeats,
                save_dir=str(save_dir),
            )
            runs.append(run_variant(spec, eng, variant, th, args.timeout))
    parity = codec_parity(runs, save_dir)
    return {
        "audio_seconds": args.seconds,
        "runs": runs,
        "skipped": skipped,
        "parity": parity,
        "speed_ratios": offline_ratios(runs),
    }


def _saved(save_dir: Path, r: dict):
    """An offline row's saved codes and audio (worker.saved_stem names them), or None."""
    import numpy as np

    stem = save_dir / saved_stem(r)
    c, a = Path(f"{stem}-codes.npy"), Path(f"{stem}-audio.npy")
    return (np.load(c), np.load(a)) if c.exists() and a.exists() else None


def codec_parity(runs, save_dir: Path) -> list:
    """Do the rows compute the same thing on the same weights? Codes equal, audio diff, each
    row (mimi_py's other precisions, the peers in each mode; transformers has its own
    weights) against mimi_py's highest (else its first) row."""
    import numpy as np

    out = []
    mine = [r for r in runs if r.get("ok") and r["engine"] == "mimi_py"]
    ref = next((r for r in mine if precision_of(r) == "highest"), mine[0] if mine else None)
    saved = _saved(save_dir, ref) if ref else None
    if saved is None:
        return out
    c0, a0 = saved
    seen = {ref["label"]}
    for r in runs:
        if not r.get("ok") or r["label"] in seen or r["engine"].split("+")[0] == "transformers":
            continue
        seen.add(r["label"])
        other = _saved(save_dir, r)
        if other is None:
            continue
        c1, a1 = other
        f = min(c0.shape[-1], c1.shape[-1])
        n = min(a0.shape[-1], a1.shape[-1])
        same_q = c0.shape[:2] == c1.shape[:2]
        out.append(
            {
                "engine": r["engine"],
                "label": r["label"],
                "reference": ref["label"],
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


def precision_pairs(runs: list[dict]):
    """(mimi_py's row, peer's row) at the same thread count: every plain mimi_py precision
    against every other row (each torch mode, +malloc included); mimi_py+malloc's rows only
    against their own precision."""
    mine = [r for r in runs if r.get("ok") and r["engine"] == "mimi_py"]
    for p in runs:
        if not p.get("ok") or p["engine"] == "mimi_py":
            continue
        for m in mine:
            own = p["engine"].split("+")[0] != "mimi_py" or precision_of(p) == precision_of(m)
            if own and m["threads"] == p["threads"]:
                yield m, p


def offline_ratios(runs) -> list:
    """mimi_py RTF ÷ peer RTF per precision at each thread count (> 1: mimi_py faster);
    like_for_like marks the pairs that compute alike (highest and float32, medium and bf16)."""
    return [
        {
            "peer": p["label"],
            "threads": p["threads"],
            "precision": precision_of(m),
            "like_for_like": like_for_like(precision_of(m), p),
            "encode_speed_ratio": ratio(m["encode_rtf"], p["encode_rtf"]),
            "decode_speed_ratio": ratio(m["decode_rtf"], p["decode_rtf"]),
        }
        for m, p in precision_pairs(runs)
    ]


def _aggregate_run(eng: str, procs: int, each: list, busy, ref: dict | None) -> dict:
    """One engine's aggregate figures from its processes' results (`ref`: its single-clip run)."""
    run = {"engine": eng, "processes": procs, "threads_per_process": 1, "threads": 1, "each": each}
    bad = [r for r in each if not r.get("ok")]
    if bad:
        run["ok"] = False
        run["error"] = bad[0].get("error")
        run["not_installed"] = bool(bad[0].get("not_installed"))
        return run
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
    if ref:
        run["single_clip"] = {
            "threads": ref["threads"],
            "encode_rtf": ref["encode_rtf"],
            "encode_cpu_per_wall": ref["encode_cpu_per_wall"],
        }
        run["aggregate_over_single"] = ratio(run["encode_rtf"], ref["encode_rtf"])
    return run


def suite_aggregate(args, weights, codec: dict | None) -> dict:
    """Corpus throughput: --aggregate-procs processes of 1 thread each, started together, each
    encoding --aggregate-clips clips of --seconds back to back. Aggregate encode RTF = all the
    audio ÷ the span from the first process's start to the last one's end. The offline suite's
    single-clip encode RTF at 2 threads (or the largest thread count) is put beside it."""
    procs = args.aggregate_procs
    runs, skipped = [], {}
    single = {}
    for r in (codec or {}).get("runs", []):  # mimi_py at highest, the peers in float32: as here
        if r.get("ok") and r["threads"] == args.main_threads and r.get("torch_mode", "float32") == "float32":
            if r["engine"].split("+")[0] != "mimi_py" or precision_of(r) == "highest":
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
        runs.append(_aggregate_run(eng, procs, each, busy, single.get(eng)))
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


def streaming_ratios(runs) -> list:
    """Peer ÷ mimi_py frame time per precision (> 1: mimi_py faster), median and p99."""
    return [
        {
            "peer": p["label"],
            "precision": precision_of(m),
            "like_for_like": like_for_like(precision_of(m), p),
            "median_speed_ratio": ratio(p["frame_total"]["median_us"], m["frame_total"]["median_us"]),
            "p99_speed_ratio": ratio(p["frame_total"]["p99_us"], m["frame_total"]["p99_us"]),
        }
        for m, p in precision_pairs(runs)
    ]


def suite_streaming(args, weights) -> dict:
    runs, skipped = [], {}
    th = args.main_threads
    for eng, variant in engine_variants(args, True, STREAMING_ENGINES):
        why = engine_available(eng, args.tiny)
        if why:
            skipped[variant["label"]] = why
            continue
        log(f"codec streaming: {variant['label']}, {th} thread(s)")
        spec = dict(
            codec_spec(args, weights),
            task="codec_streaming",
            frames=args.frames,
            warmup=2 if args.tiny else 10,
        )  # keep in step with "warmup" below
        runs.append(run_variant(spec, eng, variant, th, args.timeout))
    for e in args.engines:
        if e not in STREAMING_ENGINES:
            skipped[e] = "not measured (no streaming API wired up in this bench)"
    ratios = streaming_ratios(runs)
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
def busy_core_seconds(t0: dict | None, t1: dict | None) -> float | None:
    """CPU seconds all processes of the machine spent busy between two /proc/stat readings."""
    if not t0 or not t1:
        return None
    busy = sum(t1[k] - t0[k] for k in t0 if k not in ("idle", "iowait"))
    return round(busy / os.sysconf("SC_CLK_TCK"), 2)


SERVING_BATCHES = [1, 2, 4, 8, 12, 16, 32]


def suite_serving(args, weights) -> dict:
    """Streams held in real time: batched encode_step + decode_step of B rows per 80 ms frame
    (mimi_py, at each thread count and precision), the masked case, and the peers' single
    stream (each torch mode of moshi) from the streaming suite's task (they have no batched
    streaming)."""
    batches = [1, 2] if args.tiny else SERVING_BATCHES
    frames, warmup = (3, 1) if args.tiny else (30, 3)
    runs = []
    for th in args.threads:
        for p in args.precisions:
            log(f"serving: mimi_py {p}, batches {batches}, {th} thread(s)")
            spec = dict(
                codec_spec(args, weights), task="serving", batches=batches, frames=frames, warmup=warmup
            )
            runs.append(run_variant(spec, "mimi_py", variants("mimi_py", [p])[0], th, args.timeout))
    peers, skipped = [], {}
    for eng, variant in engine_variants(args, True, STREAMING_ENGINES):
        if eng.split("+")[0] == "mimi_py":
            continue
        why = engine_available(eng, args.tiny)
        if why:
            skipped[variant["label"]] = why
            continue
        log(f"serving: {variant['label']}, one stream, {args.main_threads} thread(s)")
        spec = dict(codec_spec(args, weights), task="codec_streaming", frames=frames, warmup=warmup)
        res = run_variant(spec, eng, variant, args.main_threads, args.timeout)
        if res.get("ok"):
            res["streams_held"] = int(res["frame_total"]["p99_us"] <= 80_000)
        peers.append(res)
    return {"batches": batches, "frames": frames, "runs": runs, "peers": peers, "skipped": skipped}


LAYER_BATCHES = [1, 4, 8, 16]


def suite_layers(args) -> dict:
    """Where a batched streaming frame goes, layer by layer: the core's mimi_step_profile
    binary (real-size seeded weights, native engine, no Python) at the main thread count, for
    each precision (the binary takes the names); milliseconds per frame of each layer for all
    its rows."""
    binary = ensure_native(args, PROFILE_BIN)
    if "path" not in binary:
        return {"skipped": binary["skipped"]}
    batches = [1, 2] if args.tiny else LAYER_BATCHES
    frames = 2 if args.tiny else 20
    runs = []
    for p in args.precisions:
        log(f"layers: {p}, batches {batches}, {args.main_threads} thread(s)")
        res = run_profile(batches, frames, p, args.main_threads, args.timeout)
        runs.append(dict(res, precision=p, threads=args.main_threads))
    return {"binary": binary, "batches": batches, "frames": frames, "runs": runs}
