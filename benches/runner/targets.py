"""The targets of benches/run.py: bounds on mimi_py's figures, checked against a run (the codec
targets at precision "highest", the float32 work they were set for), and issue 49's for
precision "medium", all ratios within the run ([PRECISION_TARGETS])."""

from __future__ import annotations

from precisions import precision_of

from . import ratio

# kind "max": measured <= bound; "min": measured >= bound.
TARGETS = {
    "step_median_us": ("transformer step median, mimi_py, B=1", "max", 7000.0, "µs"),
    "binding_overhead": ("binding overhead: mimi_py ÷ native step median", "max", 1.05, "×"),
    "encode_rtf": ("offline encode RTF, mimi_py highest", "min", 25.0, ""),
    "decode_rtf": ("offline decode RTF, mimi_py highest", "min", 20.0, ""),
    "stream_median_us": (
        "streaming encode+decode per 80 ms frame, mimi_py highest, median",
        "max",
        30000.0,
        "µs",
    ),
    "stream_p99_us": ("streaming encode+decode per 80 ms frame, mimi_py highest, p99", "max", 45000.0, "µs"),
    "peak_rss_bytes": ("peak RSS, offline encode+decode of the bench audio", "max", 0.7e9, "B"),
}


# Issue 49's, for "medium": ratios within one run. They were set for the CPUs where `vdpbf16ps`
# runs at twice the float32 rate (AMD Zen 4 and 5); elsewhere "medium" runs the exact emulation
# at the float32 rate by design, so a row is a measurement there, not a verdict.
PRECISION_TARGETS = {
    "medium_encode_speedup": ("offline encode, medium ÷ highest time", "min", 1.6, "×"),
    "medium_decode_speedup": ("offline decode, medium ÷ highest time", "min", 1.6, "×"),
    "medium_encode_over_moshi": ("offline encode, medium over moshi float32", "min", 2.0, "×"),
    "medium_decode_over_moshi": ("offline decode, medium over moshi float32", "min", 2.0, "×"),
    "medium_encode_over_moshi_bf16": ("offline encode, medium over moshi torch bf16", "min", 1.3, "×"),
    "medium_decode_over_moshi_bf16": ("offline decode, medium over moshi torch bf16", "min", 1.3, "×"),
    "medium_streams_held": ("streams held (frame p99 ≤ 80 ms), medium ÷ highest", "min", 1.5, "×"),
    "medium_batched_over_offline": (
        "per stream-frame at B ≥ 8 ÷ offline per frame, medium, worst B",
        "max",
        1.15,
        "×",
    ),
}

# The kernel ISA the "medium" targets were set for (`codec.kernel_isa`).
NATIVE_BF16 = "avx512bf16"


def _ok_rows(suites, suite: str) -> list:
    return [r for r in suites.get(suite, {}).get("runs", []) if r.get("ok") and r.get("engine") == "mimi_py"]


def _precision_measured(suites, th) -> dict:
    """PRECISION_TARGETS' figures from a run, where it has them."""
    m = {}
    codec = {precision_of(r): r for r in _ok_rows(suites, "codec") if r["threads"] == th}
    if "medium" in codec and "highest" in codec:
        for d in ("encode", "decode"):
            m[f"medium_{d}_speedup"] = ratio(codec["medium"][f"{d}_rtf"], codec["highest"][f"{d}_rtf"])
    for sr in suites.get("codec", {}).get("speed_ratios", []):
        if sr.get("precision") == "medium" and sr.get("threads") == th:
            peer = {"moshi": "over_moshi", "moshi (torch bf16)": "over_moshi_bf16"}.get(sr["peer"])
            for d in ("encode", "decode") if peer else ():
                m[f"medium_{d}_{peer}"] = sr[f"{d}_speed_ratio"]
    held = {precision_of(r): r["streams_held"] for r in _ok_rows(suites, "serving")}
    if held.get("highest") and "medium" in held:
        m["medium_streams_held"] = ratio(held["medium"], held["highest"])
    for r in _ok_rows(suites, "efficiency"):
        big = [b["over_offline"] for b in r["batches"] if b["batch"] >= 8 and b["over_offline"] is not None]
        if precision_of(r) == "medium" and r["threads"] == th and big:
            m["medium_batched_over_offline"] = max(big)
    return m


def _medium_isa(suites) -> str | None:
    """The kernel ISA the run's "medium" rows ran on."""
    for suite in ("codec", "streaming", "serving", "efficiency"):
        for r in _ok_rows(suites, suite):
            if precision_of(r) == "medium" and r.get("kernel_isa"):
                return r["kernel_isa"]
    return None


def evaluate_targets(args, suites) -> list:
    th = args.main_threads
    out = _evaluate(TARGETS, _highest_measured(suites, th), th, None, tiny=args.tiny)
    isa = _medium_isa(suites)
    if isa is None:
        return out
    off_target = None if isa == NATIVE_BF16 else f"medium ran {isa}, not {NATIVE_BF16}"
    measured = _precision_measured(suites, th)
    return out + _evaluate(PRECISION_TARGETS, measured, th, off_target, tiny=args.tiny)


def _highest_measured(suites, th) -> dict:
    """TARGETS' figures from a run."""
    measured = {}
    tr = suites.get("transformer", {})
    for run in tr.get("runs", []):
        if run["threads"] == th and run["mimi_py"].get("ok"):
            measured["step_median_us"] = run["mimi_py"]["step_median_us"]
            measured["binding_overhead"] = (run.get("ratios") or {}).get("binding_overhead_step_median")
    for r in suites.get("codec", {}).get("runs", []):
        if r.get("ok") and r["engine"] == "mimi_py" and r["threads"] == th and precision_of(r) == "highest":
            measured["encode_rtf"] = r["encode_rtf"]
            measured["decode_rtf"] = r["decode_rtf"]
    for r in suites.get("streaming", {}).get("runs", []):
        if r.get("ok") and r["engine"] == "mimi_py" and precision_of(r) == "highest":
            measured["stream_median_us"] = r["frame_total"]["median_us"]
            measured["stream_p99_us"] = r["frame_total"]["p99_us"]
    for r in suites.get("rss", {}).get("runs", []):
        if r.get("ok") and r.get("label") == "mimi_py":
            measured["peak_rss_bytes"] = r["peak_rss_bytes"]
    return measured


def _evaluate(targets: dict, measured: dict, th: int, off_target: str | None, tiny: bool = False) -> list:
    """One row per target; `off_target`: why the run is no verdict on these (a machine they
    were not set for), besides tiny sizes."""
    out = []
    for key, (what, kind, bound, unit) in targets.items():
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
                "meaningful": not tiny and off_target is None,
                "not_a_verdict": "tiny sizes" if tiny else off_target,
            }
        )
    return out
