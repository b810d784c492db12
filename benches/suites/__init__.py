"""The suites of `python -m benches`, in the order they run, and what they share: their rows
(mimi_py per precision, moshi per torch mode, other peers once), ratios and code agreement. A
suite declares `PEERS`, `SIZES` ({"tiny": ..., "full": ...}), `jobs(ctx, sizes) -> (jobs,
skipped)` (each job runs in a fresh worker), `measure(worker, task) -> dict` (one row, in that
worker), `COLUMNS` (its table) and optionally `summary(ctx, rows) -> dict`.
"""

from __future__ import annotations

CPU_SUITES = "transformer offline aggregate streaming rss corpus serving server layers efficiency".split()
CPU_SUITES += ["precision", "threads", "soak"]
GPU_SUITES = ["gpu_rows", "gpu_steady", "gpu_census"]
# The GPU suites' rows (`--sections`): which suite measures each kind.
SECTIONS = {
    "gpu_rows": ["offline", "streaming", "masked", "transformer"],
    "gpu_steady": ["steady", "held"],
    "gpu_census": ["census"],
}
REAL_TIME_US = 80_000.0  # one Mimi frame: 1920 samples at 24 kHz
# mimi_py's precision -> the torch mode that computes alike (float32 products, or bfloat16
# products with float32 sums); "high" has no like in torch.
LIKE_FOR_LIKE = {"highest": "float32", "medium": "bf16"}


def label(engine: str, precision: str | None = None, torch_mode: str | None = None) -> str:
    if engine == "mimi_py":
        return f"mimi_py {precision}" if precision else "mimi_py"
    return f"{engine} (torch bf16)" if torch_mode == "bf16" else engine


def engine_jobs(ctx, peers, tasks, threads=None, per_precision=True) -> tuple[list, dict]:
    """One job per row of a suite at each thread count of `threads` (default: the main one):
    mimi_py at each precision (or once, at highest), moshi in float32 and, when medium is
    asked, torch's bf16 mode, the other peers once; and why each skipped engine did not run."""
    jobs, (engines, skipped) = [], ctx.runnable(["mimi_py", *peers])
    for eng in engines:
        if eng == "mimi_py":
            rows = [{"precision": p} for p in (ctx.precisions if per_precision else ["highest"])]
        elif eng == "moshi":
            rows = [{"torch_mode": "float32"}] + [{"torch_mode": "bf16"}] * ("medium" in ctx.precisions)
        else:
            rows = [{}]
        for row in rows:
            for th in threads or [ctx.main_threads]:
                name = label(eng, row.get("precision"), row.get("torch_mode"))
                job = dict(ctx.codec(), engine=eng, label=name, threads=th, **row)
                jobs.append(dict(job, tasks=[dict(t) for t in tasks]))
    return jobs, skipped


def ratios(rows: list[dict], key: str, higher_is_faster: bool = True) -> list[dict]:
    """mimi_py's speed over each peer's at the same thread count (> 1: mimi_py faster), like for
    like (highest against float32, medium against torch's bf16 mode), from a figure `key` of
    the rows: a rate, or a time when not `higher_is_faster`."""
    out = []
    for p in (r for r in rows if r["ok"] and r["engine"] != "mimi_py"):
        for m in rows:
            mode = LIKE_FOR_LIKE.get(m.get("precision"))
            like = m["engine"] == "mimi_py" and mode == (p.get("torch_mode") or "float32")
            if like and m["ok"] and m["threads"] == p["threads"] and m.get("round", 1) == 1:
                a, b = (m[key], p[key]) if higher_is_faster else (p[key], m[key])
                out.append(
                    {
                        "mimi_py": m["label"],
                        "peer": p["label"],
                        "threads": p["threads"],
                        "ratio": round(a / b, 3),
                    }
                )
    return out


def agreement(rows: list[dict]) -> list[dict]:
    """The fraction of equal codes of each row that saved its codes (`codes_file`), against the
    first mimi_py row of the same kind and batch (its first precision, dtype and variant)."""
    import numpy as np

    out, refs = [], {}
    for r in rows:
        if not r["ok"] or not r.get("codes_file"):
            continue
        key = (r.get("kind"), r.get("batch"))
        if key not in refs:
            if r["engine"] == "mimi_py":
                refs[key] = r
            continue
        a, b = np.load(refs[key]["codes_file"]), np.load(r["codes_file"])
        f = min(a.shape[-1], b.shape[-1])
        same = a.shape[:2] == b.shape[:2]
        frac = round(float((a[..., :f] == b[..., :f]).mean()), 4) if same else None
        first = round(float((a[:, 0, :f] == b[:, 0, :f]).mean()), 4) if same else None
        out.append(
            {"label": r["label"], "variant": r.get("variant"), "dtype": r.get("dtype"), "kind": key[0]}
        )
        out[-1].update(batch=key[1], against=refs[key]["label"], equal=frac, first_codebook_equal=first)
    return out
