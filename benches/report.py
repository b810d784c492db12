"""The report: benches/README.md's tables and the two charts, from the results files.

    python -m benches report [RESULTS.json ...] [--readme PATH] [--charts DIR]

Every machine's results file (benches/results/*.json, tiny runs left out) gives one section:
the machine, versions and commit, then each suite's table (its `COLUMNS`, over its rows or its
summary's `table`), its speed ratios against the peers and its code agreement. The tables go
between the README's `results:start` / `results:end` markers. The charts, drawn with
matplotlib (the bench environment's; no dependency of the package), are SVG files: offline
speed (encode real-time factor) and streams held, mimi_py against each peer, per machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
RESULTS = BENCH_DIR / "results"
START, END = "<!-- results:start -->", "<!-- results:end -->"


def load(paths: list[str]) -> list[dict]:
    """The results files given, else every full-size one under benches/results/."""
    files = [Path(p) for p in paths] or sorted(
        p for p in RESULTS.glob("*.json") if not p.stem.endswith("-tiny")
    )
    return [json.loads(p.read_text()) for p in files]


def cell(v) -> str:
    if v is None or v == {} or v == []:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    if isinstance(v, list):
        return ", ".join(cell(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {cell(x)}" for k, x in v.items())
    return str(v).replace("|", "/")


def table(spec: str, rows: list[dict]) -> list[str]:
    """A markdown table of `spec`'s columns ("header=key | key | ..."); a failed row says why
    in place of its figures."""
    columns = [(c.split("=")[0].strip(), c.split("=")[-1].strip()) for c in spec.split("|")]
    out = ["| " + " | ".join(c for c, _ in columns) + " |", "|" + " --- |" * len(columns)]
    for r in rows:
        cells = [cell(r.get(k)) for _, k in columns]
        if not r.get("ok", True):
            cells = cells[:1] + [f"failed: {cell(r.get('error'))[:120]}"] + [""] * (len(cells) - 2)
        out.append("| " + " | ".join(cells) + " |")
    return out


SWITCHES = "dtype | row | variant | each round ms=rounds_ms | mean ms=mean_ms | ÷ first variant=over_first"


def flat(rows: list[dict]) -> list[dict]:
    """A row that measured several (its `rows`) gives one table row each, with its labels."""
    return [dict(r, **x) for r in rows for x in r.get("rows") or [{}]]


def notes(s: dict) -> list[str]:
    """A suite's lines under its table: engines not run, speed ratios, code agreement."""
    out = [f"not run: {k}: {v}" for k, v in (s.get("skipped") or {}).items() if v]
    for key in ("encode_ratios", "decode_ratios", "frame_ratios"):
        if s.get(key):
            pairs = "; ".join(f"{r['mimi_py']} ÷ {r['peer']} {cell(r['ratio'])}×" for r in s[key])
            out.append(f"{key.split('_')[0]} speed, mimi_py over each peer, like for like: {pairs}")
    if s.get("agreement"):
        who = [
            " ".join(str(r[k]) for k in ("label", "dtype", "variant", "kind") if r[k]) for r in s["agreement"]
        ]
        got = "; ".join(f"{w} {cell(r['equal'])}" for w, r in zip(who, s["agreement"]))
        out.append(f"codes equal to {s['agreement'][0]['against']}'s: {got}")
    return [""] + [f"- {n}" for n in out] if out else []


def suite_section(name: str, s: dict) -> list[str]:
    """One suite's table, its notes, and its switches (variants in alternating rounds)."""
    mod = importlib.import_module(f"suites.{name}")
    title = re.split(r"[:,.]", " ".join((mod.__doc__ or name).split()))[0]
    when = f"{s.get('date', '?')[:16].replace('T', ' ')}, commit {s.get('commit')}; sizes: {cell(s.get('sizes'))}"
    out = ["", f"#### {name}: {title}", "", f"_{when}_", ""] + table(
        mod.COLUMNS, s.get("table") or flat(s["rows"])
    )
    out += notes(s)
    if len({x["variant"] for x in s.get("switches", [])}) > 1:
        out += ["", "Switches, rounds alternated (A B, then B A):", ""] + table(SWITCHES, s["switches"])
    return out


def machine_section(res: dict) -> list[str]:
    m = res["machine"]
    flags = ", ".join(m.get("cpu_flags", [])) or "none"
    out = ["", f"### {m.get('gpu') or m['cpu']} ({m['cores']} cores available; CPU flags: {flags})", ""]
    out += [f"{m['platform']}, Python {m['python']}; {cell({k: v for k, v in m['versions'].items() if v})}."]
    out += [f"Weights: {res['weights']['architecture']}, {res['weights']['num_codebooks']} codebooks."]
    for name, s in res["suites"].items():
        out += suite_section(name, s)
    return out


def render(results: list[dict]) -> str:
    lines = [START, "", "Written by `python -m benches report` from `benches/results/`; do not edit by hand."]
    for res in results:
        lines += machine_section(res)
    return "\n".join(lines + ["", END])


def write_readme(path: Path, md: str) -> None:
    """The tables between the page's markers (a new page: the tables alone)."""
    text = path.read_text() if path.exists() else f"{START}\n{END}\n"
    a, b = text.index(START), text.index(END) + len(END)
    path.write_text(text[:a] + md + text[b:])


# Each chart's rows: (suite, the kind and batch of a GPU row or None, the figure); a CPU suite's
# at its largest thread count, every row of the first round.
CHART_ROWS = {
    "offline": [("offline", None, "encode_rtf"), ("gpu_rows", ("offline", 1), "encode_rtf")],
    "held": [("serving", None, "streams_held"), ("gpu_steady", ("held", None), "streams_held")],
}


def bars(results: list[dict], chart: str) -> dict[str, dict[str, float]]:
    """{machine: {label: figure}} of one chart, mimi_py's rows and each peer's."""
    out = {}
    for res in results:
        m, got = res["machine"], {}
        for suite, where, key in CHART_ROWS[chart]:
            rows = [
                r for r in res["suites"].get(suite, {}).get("rows", []) if r["ok"] and r.get("round", 1) == 1
            ]
            top = max((r["threads"] for r in rows), default=0)
            for r in rows:
                if (where is None and r["threads"] == top) or (
                    where and (r.get("kind"), r.get("batch")) == where
                ):
                    got[r["label"] + (f" {r['dtype']}" if where else "")] = r[key]
        if got:
            out[m.get("gpu") or f"{m['cpu']}, {m['cores']} cores"] = got
    return out


def chart(data: dict, title: str, xlabel: str, path: Path) -> None:
    """Horizontal bars per machine (mimi_py's rows first), written as SVG without a date."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams.update({"svg.hashsalt": "mimi_py", "svg.fonttype": "none"})  # text stays text
    n = sum(len(v) for v in data.values()) + len(data)
    fig, ax = plt.subplots(figsize=(7, 0.32 * n + 1.2))
    y, ticks, names = 0, [], []
    for machine, rows in data.items():
        ticks.append(y)
        names.append(machine)
        y += 1
        for label, v in rows.items():
            ax.barh(y, v or 0, color="#1f77b4" if label.startswith("mimi_py") else "#aaaaaa")
            ax.text(v or 0, y, f" {cell(v)}", va="center", fontsize=8)
            ticks.append(y)
            names.append(label)
            y += 1
    ax.set_yticks(ticks, names, fontsize=8)
    for t in ax.get_yticklabels():
        t.set_fontweight("bold" if t.get_text() in data else "normal")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


CHARTS = {
    "offline": (
        "offline_rtf.svg",
        "Offline encode, real-time factor (higher is faster)",
        "seconds of audio per second",
    ),
    "held": ("streams_held.svg", "Streams held in real time (frame p99 within 80 ms)", "streams"),
}


def draw(results: list[dict], folder: Path) -> list[Path]:
    """The two charts, where the results have their rows; the files written."""
    out = [folder / name for key, (name, *_) in CHARTS.items() if bars(results, key)]
    for key, (name, title, xlabel) in CHARTS.items():
        if folder / name in out:
            chart(bars(results, key), title, xlabel, folder / name)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", help="results files (default: benches/results/*.json)")
    p.add_argument("--readme", default=str(BENCH_DIR / "README.md"), help="the page to rewrite")
    p.add_argument("--charts", default=str(RESULTS), help="where the SVG charts go")
    a = p.parse_args(argv)
    results = load(a.results)
    write_readme(Path(a.readme), render(results))
    try:
        drawn = draw(results, Path(a.charts))
    except ImportError:
        drawn = []
        print("report: matplotlib is not installed here; the charts were not redrawn", file=sys.stderr)
    charts = ", ".join(map(str, drawn)) or "none"
    print(f"report: {len(results)} machine(s) into {a.readme}; charts: {charts}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
