"""The markdown report of benches/run.py: the tables written into README.md between the
results markers."""

from __future__ import annotations

from pathlib import Path

from precisions import precision_of, row_label

from .machine import machine_name
from .server import render_server

MARK_START = "<!-- results:start -->"
MARK_END = "<!-- results:end -->"


def fmt_us(us) -> str:
    if us is None:
        return "—"
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def fmt_x(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}×"


def fmt_num(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def fmt_bytes(b, nd=0) -> str:
    return "—" if b is None else f"{b / 1e6:.{nd}f} MB"


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
    s, args = res["suites"], res["args"]
    L: list = []
    _render_header(L, res)
    _render_targets(L, res)
    _render_transformer(L, s["transformer"], args)
    _render_codec(L, s["codec"], args)
    render_aggregate(L, s.get("aggregate", {"skipped": "not selected (--suites)"}), args)
    _render_streaming(L, s["streaming"], args)
    _render_rss(L, s["rss"], args)
    render_corpus(L, s.get("corpus", {"skipped": "not selected (--suites)"}), args)
    render_serving(L, s.get("serving", {"skipped": "not selected (--suites)"}))
    render_server(L, s.get("server", {"skipped": "not selected (--suites)"}), s.get("serving"))
    render_layers(L, s.get("layers", {"skipped": "not selected (--suites)"}))
    render_efficiency(L, s.get("efficiency", {"skipped": "not selected (--suites)"}), res["machine"])
    return "\n".join(L).rstrip() + "\n"


def _render_header(L: list, res) -> None:
    """When, on what machine and tree, with which versions and command."""
    m, args = res["machine"], res["args"]
    v = m["versions"]
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
    _render_precisions(L, res)
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


def _yes(v) -> str:
    return "?" if v is None else ("yes" if v else "no")


def _render_precisions(L: list, res) -> None:
    """The precisions run (a file from before --precisions has none) and the CPU's features."""
    args, flags = res["args"], res["machine"].get("cpu_flags")
    if args.get("precisions"):
        modes = " and ".join(args.get("torch_modes", ["float32"]))
        L.append(
            f"- precisions: mimi_py {', '.join(args['precisions'])} (targets, aggregate, RSS and transformer "
            "at highest)" + (f"; moshi {modes} (torch's own switch)" if "moshi" in args["engines"] else "")
        )
    if flags:
        L.append("- CPU features: " + ", ".join(f"{k} {_yes(v)}" for k, v in flags.items()))


def precision_notes(runs: list) -> list[str]:
    """What each precision ran on: mimi_py's kernels, and what torch's bf16 mode set."""
    out = []
    isa = {precision_of(r): r["kernel_isa"] for r in runs if r.get("ok") and r.get("kernel_isa")}
    if isa:
        out.append("mimi_py's kernels by precision: " + ", ".join(f"{k} {v}" for k, v in isa.items()) + ".")
    r = next(
        (r for r in runs if r.get("ok") and (r.get("torch_precision") or {}).get("mode") == "bf16"), None
    )
    if r is not None:
        t = r["torch_precision"]
        cpu, seen = t.get("cpu") or {}, t.get("takes_effect") or {}
        out.append(
            f"{row_label(r)}: `{t['switch']}` ({r.get('version')}); oneDNN bfloat16 on this CPU: "
            f"{_yes(cpu.get('mkldnn_bf16_supported'))} (torch's CPU capability {cpu.get('cpu_capability')}, "
            f"AVX-512 BF16 {_yes(cpu.get('avx512_bf16'))}, AMX {_yes(cpu.get('amx_tile'))}); bfloat16 "
            "rounding seen on a test call: " + ", ".join(f"{k} {_yes(v)}" for k, v in seen.items()) + "."
        )
    return out


def ratio_table(L: list, ratios: list, fields: dict, by_threads: bool) -> None:
    """One row per peer (and thread count), one column per (figure, mimi_py precision); the
    like-for-like cells (highest and float32, medium and torch bf16) in bold."""
    precs = list(dict.fromkeys(precision_of(q) for q in ratios))
    keys = list(dict.fromkeys((q["peer"], q.get("threads")) for q in ratios))
    at = {(q["peer"], q.get("threads"), precision_of(q)): q for q in ratios}
    head = ["mimi_py vs"] + (["threads"] if by_threads else [])
    head += [f"{name}, {p}" for name in fields.values() for p in precs]
    L += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for peer, th in keys:
        cells = [peer] + ([str(th)] if by_threads else [])
        for f in fields:
            for p in precs:
                q = at.get((peer, th, p))
                v = fmt_x(q[f]) if q else "—"
                cells.append(f"**{v}**" if q and q.get("like_for_like") else v)
        L.append("| " + " | ".join(cells) + " |")
    L += ["", "(> 1×: mimi_py is faster; bold: the pair computes alike.)"]


def _render_targets(L: list, res) -> None:
    L.append("### Targets")
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
                met = f"— ({t.get('not_a_verdict') or 'tiny sizes'})"
            L.append(
                f"| {t['what']} ({t['threads']} thread{'s' if t['threads'] != 1 else ''}) | {op} {b} | {mm} | {fmt_x(t['measured_over_bound'])} | {met} |"
            )
    L.append("")


def _render_transformer(L: list, tr: dict, args: dict) -> None:
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
        _transformer_tables(L, tr)
    L.append("")


def _transformer_tables(L: list, tr: dict) -> None:
    """Step and chunk times per engine, then the binding overhead and the ratios to candle."""
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


def _render_codec(L: list, c: dict, args: dict) -> None:
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
        starved = _codec_rows(L, c)
        if starved:
            L.append("")
            L.append("⚠ " + ", ".join(starved) + STARVED_NOTE)
        if c.get("speed_ratios"):
            L.append("")
            fields = {"encode_speed_ratio": "encode", "decode_speed_ratio": "decode"}
            ratio_table(L, c["speed_ratios"], fields, by_threads=True)
        notes = precision_notes(c["runs"])
        if notes:
            L += [""] + notes
        if c.get("parity"):
            L.append("")
            for p in c["parity"]:
                L.append(
                    f"Same weights: {p.get('label', p['engine'])}'s codes equal "
                    f"{p.get('reference', 'mimi_py')}'s for {100 * (p['codes_equal_fraction'] or 0):.1f}% of "
                    "entries; decoded audio max abs diff "
                    f"{fmt_num(p['audio_max_abs_diff'], 7) if p['audio_max_abs_diff'] is not None else '—'}."
                )
    L.append("")


def _codec_rows(L: list, c: dict) -> list:
    """The offline table's rows, one per (label, threads); returns the starved torch rows."""
    starved = []
    for r in c["runs"]:
        name = row_label(r)
        if not r.get("ok"):
            L.append(f"| {name} | {r['threads']} | error: {fmt_err(r)} | | | | | |")
            continue
        flag = ""
        if torch_starved(r):
            flag = " ⚠"
            starved.append(f"{name} at {r['threads']} threads")
        L.append(
            f"| {name} | {r['threads']} | {r['encode_s']:.3f} s | {r['encode_rtf']:.2f} | "
            f"{r['decode_s']:.3f} s | {r['decode_rtf']:.2f} | {r['encode_cpu_per_wall']:.2f} / "
            f"{r['decode_cpu_per_wall']:.2f}{flag} | {r['load_s']:.2f} s |"
        )
    for eng, why in c.get("skipped", {}).items():
        L.append(f"| {eng} | — | {why} | | | | | |")
    return starved


def _render_streaming(L: list, st: dict, args: dict) -> None:
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
        starved = _streaming_rows(L, st)
        if starved:
            L.append("")
            L.append("⚠ " + ", ".join(starved) + STARVED_NOTE)
        if st.get("speed_ratios"):
            L += ["", "Peer ÷ mimi_py per-frame time:", ""]
            fields = {"median_speed_ratio": "median", "p99_speed_ratio": "p99"}
            ratio_table(L, st["speed_ratios"], fields, by_threads=False)
        notes = precision_notes(st["runs"])
        if notes:
            L += [""] + notes
    L.append("")


def _streaming_rows(L: list, st: dict) -> list:
    """The streaming table's rows, one per label; returns the starved torch rows."""
    starved = []
    for r in st["runs"]:
        name = row_label(r)
        if not r.get("ok"):
            L.append(f"| {name} | error: {fmt_err(r)} | | | | | | | |")
            continue
        e, d, t = r["encode_step"], r["decode_step"], r["frame_total"]
        flag = " ⚠" if torch_starved(r) else ""
        if flag:
            starved.append(f"{name} (CPU÷wall {r['cpu_per_wall']:.2f})")
        cs = r.get("context_switches_per_frame")
        cs_txt = f"{cs['voluntary']:.1f} / {cs['nonvoluntary']:.1f}" if cs else "—"
        L.append(
            f"| {name}{flag} | {fmt_us(e['median_us'])} | {fmt_us(e['p99_us'])} | {fmt_us(d['median_us'])} | "
            f"{fmt_us(d['p99_us'])} | {fmt_us(t['median_us'])} | {fmt_us(t['p99_us'])} | {cs_txt} | "
            f"{r.get('cpu_per_wall', float('nan')):.2f} |"
        )
    for eng, why in st.get("skipped", {}).items():
        L.append(f"| {eng} | {why} | | | | | | | |")
    return starved


def _render_rss(L: list, rs: dict, args: dict) -> None:
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
    L.append("| goal | bound | measured | met |")
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
        "| threads | precision | "
        + " | ".join(f"B={b} median / p99 ms" for b in s["batches"])
        + " | streams held |"
    )
    L.append("| --- | --- | " + " | ".join("---" for _ in s["batches"]) + " | --- |")
    for r in s["runs"]:
        p = precision_of(r)
        if not r.get("ok"):
            L.append(f"| {r.get('threads')} | {p} | error: {fmt_err(r)} |")
            continue
        cells = [f"{b['median_us'] / 1e3:.1f} / {b['p99_us'] / 1e3:.1f}" for b in r["batches"]]
        L.append(f"| {r['threads']} | {p} | " + " | ".join(cells) + f" | {r['streams_held']} |")
    L.append("")
    for r in s["runs"]:
        if r.get("ok"):
            per = ", ".join(f"B={b['batch']} {b['median_us'] / 1e3 / b['batch']:.1f}" for b in r["batches"])
            L.append(f"- ms per stream-frame (median), {precision_of(r)}, {r['threads']} thread(s): {per}")
    for r in s["runs"]:
        if r.get("ok"):
            m = r["masked"]
            L.append(
                f"- masked, {precision_of(r)}, {r['threads']} thread(s): "
                f"B={m['batch']} with {m['active']} active, median "
                f"{m['masked']['median_us'] / 1e3:.1f} ms, against {m['active']} rows all active "
                f"{m['dense_active_only']['median_us'] / 1e3:.1f} ms (ratio {m['overhead_ratio']})"
            )
    for p in s.get("peers", []):
        if p.get("ok"):
            t = p["frame_total"]
            L.append(
                f"- {row_label(p)}, one stream (no batched streaming): median {t['median_us'] / 1e3:.1f} ms, "
                f"p99 {t['p99_us'] / 1e3:.1f} ms, streams held {p['streams_held']}"
            )
    for e, why in s.get("skipped", {}).items():
        L.append(f"- {e}: {why}")
    L.append("")


def render_layers(L: list, s: dict) -> None:
    """The layers suite's tables: ms per frame of each layer (all rows), per precision."""
    L.append("")
    L.append("### Layers: where a batched streaming frame goes (`mimi_step_profile`)")
    L.append("")
    if s.get("skipped") and not s.get("runs"):
        L.append(f"_skipped: {s['skipped']}_")
        return
    L.append(
        "Milliseconds per frame (median over frames) of each layer for all B rows: one masked "
        "`encode_step` then `decode_step`, real-size seeded weights, native engine, no Python."
    )
    for r in s["runs"]:
        L.append("")
        L.append(f"{precision_of(r)}, {r['threads']} thread(s):")
        L.append("")
        if not r.get("ok"):
            L.append(f"_error: {fmt_err(r)}_")
            continue
        rows = r["batches"]
        L.append("| layer | " + " | ".join(f"B={b['batch']}" for b in rows) + " |")
        L.append("| --- | " + " | ".join("---" for _ in rows) + " |")
        per = [{x["layer"]: x["ms"] for x in b["layers"]} for b in rows]
        for name in [x["layer"] for x in rows[-1]["layers"]]:
            L.append(f"| `{name}` | " + " | ".join(f"{p.get(name, 0):.2f}" for p in per) + " |")
        L.append("| frame | " + " | ".join(f"{b['frame_median_ms']:.1f}" for b in rows) + " |")
    L.append("")


def render_efficiency(L: list, s: dict, machine: dict) -> None:
    """The efficiency suite's tables (appended to L): per frame, then per run."""
    L += ["", "### Efficiency: batched streaming against the offline path and the memory floor", ""]
    if s.get("skipped") and not s.get("runs"):
        L.append(f"_skipped: {s['skipped']}_")
        return
    L.append(
        f"On {machine_name(machine)}. One frame = one `encode_step` of B rows of 1920 samples (no mask), "
        f"then `decode_step` of its codes; median and p99 over {s['frames']} frames after {s['warmup']} "
        "warm-up. Per stream-frame = median ÷ B; ÷ offline = that ÷ the offline ms per frame (an "
        f"`encode` then `decode` of {s['offline_seconds']:g} s in the same process). Floor = the "
        "weights one frame reads ÷ the read bandwidth of as many threads (numpy sums over "
        f"{s['bandwidth_bytes'] / 2**30:g} GiB, best pass). Held: the largest B whose p99 is ≤ {s['real_time_us'] / 1e3:g} ms."
    )
    L += ["", "| threads | precision | B | median ms | p99 ms | ms per stream-frame | ÷ offline | CPU÷wall |"]
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in s["runs"]:
        if not r.get("ok"):
            L.append(f"| {r.get('threads')} | {precision_of(r)} | error: {fmt_err(r)} | | | | | |")
            continue
        for b in r["batches"]:
            L.append(
                f"| {r['threads']} | {precision_of(r)} | {b['batch']} | {b['median_us'] / 1e3:.1f} | "
                f"{b['p99_us'] / 1e3:.1f} | {b['ms_per_stream_frame']:.2f} | {fmt_x(b['over_offline'])} | "
                f"{b['cpu_per_wall']:.2f} |"
            )
    _render_efficiency_runs(L, s)


def _overhead(r: dict) -> str:
    """The plan's overhead: a B = 1 frame with the products skipped, and its share of a frame."""
    if r.get("plan_overhead_ms") is None:
        return "not measured"
    return f"{r['plan_overhead_ms']:.2f} ms ({100 * r['plan_overhead_share']:.1f}% of a B=1 frame)"


def _render_efficiency_runs(L: list, s: dict) -> None:
    """Per run: offline, read bandwidth, the B = 1 memory floor, CPU ÷ wall, streams held."""
    L += [
        "",
        "| threads | precision | offline ms per frame | read GB/s | weights read per frame | B=1 floor "
        "| B=1 median ÷ floor | B=1 ÷ (floor + offline) | CPU÷wall, all frames | streams held "
        "| plan overhead |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    reasons = {}
    for r in s["runs"]:
        if not r.get("ok"):
            continue
        reasons.update(r["not_measured"])
        floor = r["memory_floor_ms"]
        L.append(
            f"| {r['threads']} | {precision_of(r)} | {r['offline']['ms_per_frame']:.2f} | "
            f"{r['bandwidth']['gb_per_s']:.1f} | {fmt_bytes(r['weights_nbytes'], 1)} | "
            f"{fmt_us(None if floor is None else floor * 1e3)} | {fmt_x(r['b1_over_floor'])} | "
            f"{fmt_x(r.get('b1_over_floor_plus_offline'))} | "
            f"{r['cpu_per_wall']:.2f} | {r['streams_held']} | "
            f"{_overhead(r)} |"
        )
    L.append("")
    L += [f"- {key}: not measured ({why})" for key, why in reasons.items()]
    L.append("")


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
