"""The report of benches/gpu.py: the targets of the GPU work, computed from a run's rows, and
the tables of gpu_results.md.

Each run (one worker process) is labelled `engine [variant] #round` (`label`); where a variant
ran in several rounds, a figure is the mean of its rounds' figures.
"""

from __future__ import annotations

# (what, where in a row, comparison, goal, unit): mimi_py's figure over moshi's, except where
# the figure is each engine's own ratio ("own").
TARGETS = [
    ("streaming B = 1, frame median, full rings", ("steady", 1, "unmasked", "median_us"), "<=", 0.8, "us"),
    ("full rings B = 64, frame median", ("steady", 64, "unmasked", "median_us"), "<=", 1.0, "us"),
    ("full rings B = 64, frame p99", ("steady", 64, "unmasked", "p99_us"), "<=", 1.0, "us"),
    (
        "masked ÷ unmasked frame (each its own), full rings B = 64",
        ("steady", 64, "own", None),
        "<=",
        1.1,
        "x",
    ),
    ("streams held (frame p99 ≤ 80 ms, full rings)", ("held", None, None, None), ">=", 1.5, "n"),
    ("offline B = 16, encode", ("offline", 16, "encode_s", None), "<=", 1.0, "s"),
    ("offline B = 16, decode", ("offline", 16, "decode_s", None), "<=", 1.0, "s"),
]


def _figure(row: dict, where) -> float | None:
    kind, _, part, key = where
    if kind == "held":
        return row.get("streams_held")
    if kind == "offline":
        return row.get(part)
    if part == "own":
        return row.get("masked_over_unmasked")
    return (row.get(part) or {}).get("frame_total", {}).get(key)


def figure(runs: list, engine: str, dtype: str, variant, where) -> float | None:
    """The mean over rounds of one figure of (engine, dtype, variant), None where no round has it."""
    vals = []
    for r in runs:
        if (r["engine"], r["dtype"], r.get("variant")) != (engine, dtype, variant):
            continue
        for x in r["rows"]:
            if x["kind"] == where[0] and x["batch"] == where[1] and x.get("ok"):
                v = _figure(x, where)
                if v is not None:
                    vals.append(float(v))
    return sum(vals) / len(vals) if vals else None


def targets(res: dict) -> list[dict]:
    """Every target for each dtype and mimi_py variant: both engines' figures, the ratio, met."""
    runs, out = res["runs"], []
    variants = list(dict.fromkeys(r.get("variant") for r in runs if r["engine"] == "mimi_py"))
    for dt in res["args"]["dtypes"]:
        for v in variants:
            for what, where, cmp, goal, unit in TARGETS:
                ours = figure(runs, "mimi_py", dt, v, where)
                theirs = figure(runs, "moshi", dt, None, where)
                if where[2] == "own":
                    ratio = ours
                else:
                    ratio = None if ours is None or not theirs else ours / theirs
                met = None if ratio is None else (ratio <= goal if cmp == "<=" else ratio >= goal)
                out.append(
                    {
                        "target": what,
                        "dtype": dt,
                        "variant": v,
                        "mimi_py": ours,
                        "moshi": theirs,
                        "ratio": None if ratio is None else round(ratio, 3),
                        "goal": f"{cmp} {goal:g}",
                        "met": met,
                        "unit": unit,
                    }
                )
    return out


# ---------------------------------------------------------------------------------------------
# markdown


def _ms(us) -> str:
    return "—" if us is None else f"{us / 1000:.2f} ms"


def _cell_err(e) -> str:
    return "error: " + (e or "failed").strip().splitlines()[-1][:160].replace("|", "\\|")


def _pct(d, key="equal_fraction") -> str:
    return "—" if not d else f"{100 * d[key]:.1f}%"


def _rows(res, kind):
    for r in res["runs"]:
        for x in r["rows"]:
            if x["kind"] == kind:
                yield r, x


def _who(r) -> str:
    return f"{r.get('label') or r['engine']} | {r['dtype']}"


def _table(head: list[str]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]


def _failed(r, x, cols: int) -> str:
    return f"| {_who(r)} | {x['batch']} | {_cell_err(x.get('error'))} |" + " |" * (cols - 4)


def render_offline(res) -> list[str]:
    a = res["args"]
    L = ["", f"## Offline: encode {a['seconds']:g} s per row, then decode its codes"]
    L += [
        "",
        f"Median of {a['repeats']} after a warm-up. RTF = audio seconds of all B rows ÷ wall seconds.",
        "",
    ]
    L += _table(["engine", "dtype", "B", "encode", "encode RTF", "decode", "decode RTF"])
    for r, x in _rows(res, "offline"):
        if not x.get("ok"):
            L.append(_failed(r, x, 7))
            continue
        L.append(
            f"| {_who(r)} | {x['batch']} | {x['encode_s'] * 1e3:.1f} ms | {x['encode_rtf']:.1f} | "
            f"{x['decode_s'] * 1e3:.1f} ms | {x['decode_rtf']:.1f} |"
        )
    return L


def render_streaming(res) -> list[str]:
    a = res["args"]
    L = ["", "## Streaming, young rings: `encode_step` + `decode_step` per 80 ms frame"]
    L += ["", f"{a['frames']} frames after {a['warmup']} warm-up from fresh streams (the rings never fill). "]
    L[-1] += "Per stream = the frame time ÷ B. Real time: p99 of the frame ≤ 80 ms."
    L += [""] + _table(
        ["engine", "dtype", "B", "frame median", "frame p99", "per stream median", "per stream p99"]
        + ["encode_step median", "decode_step median", "real time"]
    )
    for r, x in _rows(res, "streaming"):
        if not x.get("ok"):
            L.append(_failed(r, x, 10))
            continue
        t = x["frame_total"]
        L.append(
            f"| {_who(r)} | {x['batch']} | {_ms(t['median_us'])} | {_ms(t['p99_us'])} | "
            f"{_ms(x['per_stream_median_us'])} | {_ms(x['per_stream_p99_us'])} | "
            f"{_ms(x['encode_step']['median_us'])} | {_ms(x['decode_step']['median_us'])} | "
            f"{'✅' if x['real_time'] else '❌'} |"
        )
    return L


def render_masked(res) -> list[str]:
    a = res["args"]
    L = ["", f"## Streaming with masks, young rings ({a['frames']} frames after {a['warmup']} warm-up)"]
    L += ["", "Three rows in four step each frame (B = 1: a mask of [True]); mimi_py: `active=`, moshi: "]
    L[-1] += "`set_exec_mask`. Per active stream = total time ÷ active row-frames."
    L += [""] + _table(
        ["engine", "dtype", "B", "active rows", "frame median", "frame p99", "per active stream"]
        + ["encode_step median", "decode_step median", "real time"]
    )
    for r, x in _rows(res, "masked"):
        if not x.get("ok"):
            L.append(_failed(r, x, 10))
            continue
        t = x["frame_total"]
        L.append(
            f"| {_who(r)} | {x['batch']} | {x['mean_active_rows']:g} | "
            f"{_ms(t['median_us'])} | {_ms(t['p99_us'])} | {_ms(x['per_active_stream_mean_us'])} | "
            f"{_ms(x['encode_step']['median_us'])} | {_ms(x['decode_step']['median_us'])} | "
            f"{'✅' if x['real_time'] else '❌'} |"
        )
    return L


def render_transformer(res) -> list[str]:
    L = ["", "## The transformer alone: 2-token steps of an unmasked and a masked model, in turns", ""]
    L += _table(["engine", "dtype", "B", "rings", "unmasked median", "masked median", "masked ÷ unmasked"])
    for r, x in _rows(res, "transformer"):
        if not x.get("ok"):
            L.append(_failed(r, x, 7))
            continue
        for rings in ("young", "full"):
            L.append(
                f"| {_who(r)} | {x['batch']} | {rings} | "
                f"{_ms(x[rings + '_unmasked']['median_us'])} | {_ms(x[rings + '_masked']['median_us'])} | "
                f"{x[rings + '_masked_over_unmasked']:.2f} |"
            )
    return L


def render_steady(res) -> list[str]:
    a = res["args"]
    L = ["", "## Steady state: full rings, unmasked then masked frames"]
    L += ["", f"{a['steady_warmup']} frames streamed first (in calls of several frames; rings: the fewest "]
    L[-1] += (
        f"tokens a row's rings took, of the context), then {a['warmup']} untimed and {a['steady_frames']} timed "
    )
    L[-1] += "frames unmasked, then the same masked (three rows in four)."
    L += [""] + _table(
        ["engine", "dtype", "B", "rings", "unmasked median", "unmasked p99", "per stream"]
        + ["masked median", "masked p99", "masked ÷ unmasked", "real time"]
    )
    for r, x in _rows(res, "steady"):
        if not x.get("ok"):
            L.append(_failed(r, x, 11))
            continue
        w, u, m = x["warmup"], x["unmasked"], x.get("masked", {})
        mt = m.get("frame_total", {})
        ratio = x.get("masked_over_unmasked")
        L.append(
            f"| {_who(r)} | {x['batch']} | {w['ring_tokens']}/{w['context']} | "
            f"{_ms(u['frame_total']['median_us'])} | {_ms(u['frame_total']['p99_us'])} | "
            f"{_ms(u['per_stream_median_us'])} | "
            + (
                f"{_ms(mt.get('median_us'))} | {_ms(mt.get('p99_us'))} | {ratio:.2f} | "
                if "error" not in m
                else f"{_cell_err(m['error'])} | | | "
            )
            + f"{'✅' if u['real_time'] else '❌'} |"
        )
    return L


def render_held(res) -> list[str]:
    L = ["", "## Streams held per device: the largest B whose frame p99 ≤ 80 ms, full rings", ""]
    L += ["Probes: B (frame p99); ✗: over 80 ms or failed. The search stops at a gap under 1/8, "]
    L[-1] += "the largest B tried, or its time budget."
    L += [""] + _table(["engine", "dtype", "streams held", "first B over", "stopped", "probes"])
    for r, x in _rows(res, "held"):
        if not x.get("ok"):
            L.append(f"| {_who(r)} | {_cell_err(x.get('error'))} | | | |")
            continue
        probes = ", ".join(
            f"{p['batch']} ({_ms(p.get('p99_us'))}{'' if p['ok'] else ' ✗'})" for p in x["probes"]
        )
        L.append(
            f"| {_who(r)} | {x['streams_held']} | {x['first_failing'] or '—'} | {x['stopped']} | {probes} |"
        )
    return L


def _census_cells(c: dict) -> str:
    if "error" in c:
        return f"{_cell_err(c['error'])} | | | | | |"
    copies = ", ".join(f"{d} {n:g}" for d, n in c["copies_per_frame"].items()) or "0"
    return (
        f"{c['kernels_per_frame']:g} | {c['launch_calls_per_frame']:g} + {c['graph_launches_per_frame']:g} | "
        f"{copies} | {_ms(c['gpu_busy_us_per_frame'])} | {_ms(c['profiled_wall_us_per_frame'])} "
        f"({_ms(c['wall_us_per_frame'])}) | {c['busy_over_wall']:.2f} |"
    )


def render_census(res) -> list[str]:
    a = res["args"]
    L = ["", f"## Kernel census: torch.profiler over {a['census_frames']} frames, full rings"]
    L += ["", "Per frame: kernels on the device; launch calls (+ graph launches) on the host; copies by "]
    L[-1] += "direction; GPU busy (the union of kernels and copies); wall under the profiler (without it)."
    L += [""] + _table(
        [
            "engine",
            "dtype",
            "B",
            "rows stepping",
            "kernels",
            "launch calls",
            "copies",
            "GPU busy",
            "wall",
            "busy ÷ wall",
        ]
    )
    for r, x in _rows(res, "census"):
        if not x.get("ok"):
            L.append(_failed(r, x, 10))
            continue
        for part, stepping in (("unmasked", "all"), ("masked", "3 in 4")):
            cells = _census_cells(x.get(part, {"error": "absent"}))
            L.append(f"| {_who(r)} | {x['batch']} | {stepping} | {cells}")
    profilers = sorted({x["unmasked"]["profiler"] for _, x in _rows(res, "census") if x.get("ok")})
    if profilers:
        L += ["", "Recorded by: " + "; ".join(profilers) + "."]
    return L


def _num(v, unit: str) -> str:
    if v is None:
        return "—"
    return {"us": _ms, "s": lambda s: f"{s * 1e3:.1f} ms", "x": lambda x: f"{x:.2f}"}.get(
        unit, lambda n: f"{n:g}"
    )(v)


def render_targets(res) -> list[str]:
    L = ["", "## Targets: mimi_py against moshi, same run", ""]
    L += ["Ratio = mimi_py's figure ÷ moshi's (masked ÷ unmasked: each engine's own ratio). ", ""]
    L += _table(["target", "dtype", "variant", "mimi_py", "moshi", "ratio", "goal", "met"])
    for t in res.get("targets", []):
        ours, theirs = _num(t["mimi_py"], t["unit"]), _num(t["moshi"], t["unit"])
        met = "—" if t["met"] is None else ("✅" if t["met"] else "❌")
        ratio = "—" if t["ratio"] is None else f"{t['ratio']:.2f}"
        L.append(
            f"| {t['target']} | {t['dtype']} | {t['variant'] or '—'} | {ours} | {theirs} | {ratio} | "
            f"{t['goal']} | {met} |"
        )
    return L


def variant_rows(res) -> list[dict]:
    """Per (dtype, figure) of the steady and streaming rows: each mimi_py variant's rounds and
    their mean, and the mean over the first variant's."""
    runs = [r for r in res["runs"] if r["engine"] == "mimi_py"]
    variants = list(dict.fromkeys(r.get("variant") for r in runs))
    keys = []
    for r in runs:
        for x in r["rows"]:
            if x.get("ok") and x["kind"] in ("steady", "streaming"):
                for part in ("unmasked", "masked") if x["kind"] == "steady" else (None,):
                    keys.append((r["dtype"], x["kind"], x["batch"], part))
    out = []
    for dt, kind, b, part in dict.fromkeys(keys):
        base = None
        for v in variants:
            where = (kind, b, part or "frame", "median_us")
            vals = [
                (x.get(part) if part else x).get("frame_total", {}).get("median_us")
                for r in runs
                if (r["dtype"], r.get("variant")) == (dt, v)
                for x in r["rows"]
                if x.get("ok") and (x["kind"], x["batch"]) == (kind, b)
            ]
            vals = [u for u in vals if u is not None]
            mean = sum(vals) / len(vals) if vals else None
            base = mean if base is None else base
            out.append(
                {
                    "dtype": dt,
                    "row": f"{kind} B = {b}" + (f", {part}" if part else ""),
                    "variant": v,
                    "rounds_median_us": vals,
                    "mean_median_us": mean,
                    "over_first": None if mean is None or not base else round(mean / base, 3),
                    "where": list(where),
                }
            )
    return out


def render_variants(res) -> list[str]:
    vs = res["args"].get("variants") or []
    if len(vs) < 2 and res["args"].get("rounds", 1) < 2:
        return []
    L = ["", "## Variants: mimi_py's frame medians by variant, rounds alternated (A B, then B A)", ""]
    L += ["Variants: " + "; ".join(f"`{v['name']}`: {v['env'] or 'no change'}" for v in vs), ""]
    L += _table(["dtype", "row", "variant", "each round", "mean", "÷ first variant"])
    for v in res.get("variants", []):
        rounds = ", ".join(_ms(u) for u in v["rounds_median_us"]) or "—"
        first = "—" if v["over_first"] is None else f"{v['over_first']:.3f}"
        L.append(
            f"| {v['dtype']} | {v['row']} | {v['variant']} | {rounds} | {_ms(v['mean_median_us'])} | {first} |"
        )
    return L


def _side(s: dict) -> str:
    return f"{s['engine']} {s['dtype']}" + (f" [{s['variant']}]" if s.get("variant") else "")


def render_agreement(res) -> list[str]:
    L = ["", "## Code agreement (fraction of equal codes)", ""]
    if not res["agreement"]:
        return L + ["_no pair of engines/dtypes to compare_"]
    L += _table(
        ["codes", "against", "offline (B)", "offline, first codebook", "streaming (B)"]
        + ["streaming, first codebook", "steady (B)"]
    )
    for g in res["agreement"]:
        L.append(
            f"| {_side(g['a'])} | {_side(g['b'])} | "
            f"{_pct(g['offline'])} ({g['offline_batch']}) | {_pct(g['offline'], 'first_codebook_equal_fraction')} | "
            f"{_pct(g['streaming'])} ({g['stream_batch']}) | {_pct(g['streaming'], 'first_codebook_equal_fraction')} | "
            f"{_pct(g.get('steady'))} ({g.get('steady_batch')}) |"
        )
    return L + ["", "— : one side has no codes (it failed or was not run)."]


def render_header(res) -> list[str]:
    a, m = res["args"], res["machine"]
    L = [f"# mimi_py vs moshi on {a['device']}", ""]
    if a["tiny"] or a["device"] == "cpu":
        L += ["**Dry-run sizes or CPU: the numbers are not meaningful.**", ""]
    L.append(f"- run {res['date']}, {res['duration_s']:.0f} s in all; command: `{res['command']}`")
    L.append(
        f"- commit: {m.get('commit') or 'unknown'}; torch {m.get('torch') or '—'}, moshi {m.get('moshi') or '—'}"
    )
    L.append(f"- device: {a['device']}" + (f" ({'; '.join(m['nvidia_smi'])})" if m.get("nvidia_smi") else ""))
    L.append(f"- host: {m['cpu_model']}, {m['cpu_cores']} cores, {a['threads']} CPU thread(s) per process")
    L.append(
        f"- weights: {res['weights']['architecture']}, {res['weights']['num_codebooks']} codebooks, random"
    )
    for r in res["runs"]:
        state = f"loaded in {r['load_s']:.2f} s" if r.get("ok") else _cell_err(r.get("error"))
        if r.get("torch_tf32"):
            state += f", torch TF32 allowed: {', '.join(k for k, v in r['torch_tf32'].items() if v) or 'no'}"
        state += f", {r['process_wall_s']:.0f} s" if "process_wall_s" in r else ""
        L.append(
            f"- {r.get('label') or r['engine']} {r['dtype']}: {r.get('version') or ''} {state}".replace(
                "  ", " "
            )
        )
    return L


def render(res) -> str:
    L = render_header(res)
    for part in (
        render_targets,
        render_offline,
        render_streaming,
        render_masked,
        render_transformer,
        render_steady,
        render_held,
        render_census,
        render_variants,
        render_agreement,
    ):
        L += part(res)
    return "\n".join(L).rstrip() + "\n"
