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
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
RESULTS = BENCH_DIR / "results"
START, END = "<!-- results:start -->", "<!-- results:end -->"
CHARTS = {"offline": "offline_rtf.svg", "held": "streams_held.svg"}


def load(paths: list[str]) -> list[dict]:
    """The results files given, else every full-size one under benches/results/."""
    files = [Path(p) for p in paths] or sorted(
        p for p in RESULTS.glob("*.json") if not p.stem.endswith("-tiny")
    )
    return [json.loads(p.read_text()) for p in files]


def cell(v) -> str:
    if v is None:
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


RATIOS = "mimi_py | peer | threads | like for like=like_for_like | mimi_py ÷ peer speed=ratio"
AGREEMENT = "codes of=label | dtype | variant | row=kind | B=batch | against | equal | codebook 0 equal=first_codebook_equal"
SWITCHES = "dtype | row | variant | each round ms=rounds_ms | mean ms=mean_ms | ÷ first variant=over_first"


def suite_section(name: str, s: dict) -> list[str]:
    """One suite's tables: its rows, ratios, agreement and switches where it has them."""
    mod = importlib.import_module(f"suites.{name}")
    title = (mod.__doc__ or name).strip().split("\n")[0].split(":")[0].rstrip(".")
    out = [
        "",
        f"#### {name}: {title}",
        "",
        f"{s.get('date', '?')[:16]}, commit {s.get('commit')}, sizes: {cell(s.get('sizes'))}",
        "",
    ]
    out += table(mod.COLUMNS, s.get("table") or s["rows"])
    skipped = {k: v for k, v in (s.get("skipped") or {}).items() if v}
    out += ["", "Not run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items())] if skipped else []
    for key in ("encode_ratios", "decode_ratios", "frame_ratios"):
        if s.get(key):
            out += ["", f"{key.split('_')[0]} speed, mimi_py over each peer (> 1: mimi_py faster):", ""]
            out += table(RATIOS, s[key])
    if s.get("agreement"):
        out += ["", "Codes equal to the first mimi_py row's:", ""] + table(AGREEMENT, s["agreement"])
    if len({x["variant"] for x in s.get("switches", [])}) > 1:
        out += ["", "Switches, rounds alternated (A B, then B A):", ""] + table(SWITCHES, s["switches"])
    return out


def machine_section(res: dict) -> list[str]:
    m = res["machine"]
    name = m.get("gpu") or m["cpu"]
    out = [
        "",
        f"### {name} ({m['cores']} cores available; CPU flags: {', '.join(m.get('cpu_flags', [])) or 'none'})",
        "",
    ]
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


def _bars(results: list[dict], pick) -> dict[str, dict[str, float]]:
    """{machine: {label: figure}} of the rows `pick(res)` yields as (label, figure)."""
    out = {}
    for res in results:
        got = dict(pick(res))
        if got:
            out[res["machine"].get("gpu") or f"{res['machine']['cpu']}, {res['machine']['cores']} cores"] = (
                got
            )
    return out


def offline_bars(res: dict):
    rows = res["suites"].get("offline", {}).get("rows", [])
    top = max((r["threads"] for r in rows), default=0)
    yield from (
        (r["label"], r["encode_rtf"])
        for r in rows
        if r["ok"] and r["threads"] == top and r.get("round", 1) == 1
    )
    for r in res["suites"].get("gpu_rows", {}).get("rows", []):
        if r["ok"] and r.get("kind") == "offline" and r.get("round", 1) == 1 and r["batch"] == 1:
            yield f"{r['label']} {r['dtype']}", r["encode_rtf"]


def held_bars(res: dict):
    for r in res["suites"].get("serving", {}).get("rows", []):
        if (
            r["ok"]
            and r.get("round", 1) == 1
            and r["threads"] == max(x["threads"] for x in res["suites"]["serving"]["rows"])
        ):
            yield r["label"], r["streams_held"]
    for r in res["suites"].get("gpu_steady", {}).get("rows", []):
        if r["ok"] and r.get("kind") == "held" and r.get("round", 1) == 1:
            yield f"{r['label']} {r['dtype']}", r["streams_held"]


def chart(bars: dict, title: str, xlabel: str, path: Path) -> None:
    """Horizontal bars per machine (mimi_py's rows first), written as SVG without a date."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "mimi_py"
    n = sum(len(v) for v in bars.values()) + len(bars)
    fig, ax = plt.subplots(figsize=(7, 0.32 * n + 1.2))
    y, ticks, names = 0, [], []
    for machine, rows in bars.items():
        ax.text(0, y, machine, fontsize=8, fontweight="bold", va="center")
        y += 1
        for label, v in rows.items():
            ax.barh(y, v or 0, color="#1f77b4" if label.startswith("mimi_py") else "#aaaaaa")
            ax.text(v or 0, y, f" {cell(v)}", va="center", fontsize=8)
            ticks.append(y)
            names.append(label)
            y += 1
    ax.set_yticks(ticks, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def draw(results: list[dict], folder: Path) -> list[Path]:
    """The two charts, where the results have their rows; the files written."""
    out = []
    specs = [
        (
            "offline",
            offline_bars,
            "Offline encode, real-time factor (higher is faster)",
            "seconds of audio per second",
        ),
        ("held", held_bars, "Streams held in real time (frame p99 within 80 ms)", "streams"),
    ]
    for key, pick, title, xlabel in specs:
        bars = _bars(results, pick)
        if bars:
            chart(bars, title, xlabel, folder / CHARTS[key])
            out.append(folder / CHARTS[key])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", help="results files (default: benches/results/*.json)")
    p.add_argument(
        "--readme", default=str(BENCH_DIR / "README.md"), help="the page whose tables are rewritten"
    )
    p.add_argument("--charts", default=str(RESULTS), help="where the SVG charts go")
    a = p.parse_args(argv)
    results = load(a.results)
    write_readme(Path(a.readme), render(results))
    try:
        drawn = draw(results, Path(a.charts))
    except ImportError:
        drawn = []
        print("report: matplotlib is not installed here; the charts were not redrawn", file=sys.stderr)
    print(
        f"report: {len(results)} machine(s) into {a.readme}; charts: {', '.join(map(str, drawn)) or 'none'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
