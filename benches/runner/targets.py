"""The targets of benches/run.py: bounds on mimi_py's figures, checked against a run (the codec
targets at precision "highest", the float32 work they were set for)."""

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


def evaluate_targets(args, suites) -> list:
    th = args.main_threads
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
