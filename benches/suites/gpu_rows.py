"""The GPU suites' young-stream rows, mimi_py against moshi's PyTorch Mimi on one device, same
random weights, for each dtype (`--dtypes`): offline `encode` then `decode` at each of
`batches`; streaming frames (`encode_step` then `decode_step`) at each of `stream_batches`;
the same frames masked (three rows in four step: mimi_py's `active=`, moshi's exec mask); and
mimi_py's transformer alone, masked and unmasked, on young and full rings. torch is synchronized
before each timer stops; mimi_py returns numpy arrays, so its calls are synchronous. The GPU
suites of one (engine, dtype, variant) share one worker (one load of the codec).
"""

from __future__ import annotations

import time
from pathlib import Path

import common
from suites import gpu_steady as steady

PEERS = ("moshi",)
KINDS = {
    "offline": "batches",
    "streaming": "stream_batches",
    "masked": "stream_batches",
    "transformer": "stream_batches",
}
SIZES = {
    "tiny": dict(seconds=0.5, batches=[1, 2], stream_batches=[1, 2], frames=3, warmup=1, repeats=1),
    "full": dict(seconds=10.0, batches=[1, 16], stream_batches=[1, 8, 64], frames=50, warmup=5, repeats=3),
}
COLUMNS = (
    "engine=label | dtype | variant | row=kind | B=batch | encode RTF=encode_rtf | "
    "decode RTF=decode_rtf | frame median ms=median_ms | frame p99 ms=p99_ms | "
    "per stream ms=per_stream_ms | masked ÷ unmasked=masked_over_unmasked"
)


def gpu_jobs(ctx, sizes, kinds: dict) -> tuple[list, dict]:
    """One job per (engine, dtype) with a task per (kind, batch) of `kinds` in `--sections`;
    the tasks at a kind's smallest batch save their codes (the agreement)."""
    out, (engines, skipped) = [], ctx.runnable(["mimi_py", *PEERS])
    for eng in engines:
        for dt in ctx.args.dtypes:
            tasks = []
            for kind, key in kinds.items():
                if kind in ctx.args.sections:
                    sizes_of = sizes[key] if key else [None]
                    tasks += [
                        dict(sizes, kind=kind, batch=b, save=b == min(sizes_of or [0])) for b in sizes_of
                    ]
            job = dict(ctx.codec(), engine=eng, dtype=dt, device=ctx.args.device, label=eng, share="gpu")
            out += [dict(job, tasks=tasks, save_dir=str(ctx.tmp))] if tasks else []
    return out, skipped


def jobs(ctx, sizes):
    return gpu_jobs(ctx, sizes, KINDS)


def save_codes(w, task, kind: str, codes) -> str | None:
    """Saves a task's codes in the first round, for the agreement; their file."""
    import numpy as np

    if not task.get("save") or w.job.get("round", 1) != 1:
        return None
    j = w.job
    path = Path(j["save_dir"]) / f"{j['engine']}-{j['dtype']}-{j.get('variant')}-{kind}-b{task['batch']}.npy"
    np.save(path, np.asarray(codes))
    return str(path)


def _offline_row(w, task):
    """`encode` of `seconds` per row at B rows, then `decode`: the median of the repeats after
    a warm-up call at that size."""
    import numpy as np

    from suites.offline import clip, timed

    pcm = np.concatenate(
        [clip(task["seconds"], seed=r) for r in range(task["batch"])]
    )  # row 0: offline's clip
    out = timed(w.engine(), pcm, pcm, task["repeats"])
    return dict(out, codes_file=save_codes(w, task, "offline", out.pop("codes")))


def _young_row(w, task, masked: bool) -> dict:
    """Streaming frames of fresh streams (their rings never fill), unmasked (the codes saved)
    or masked (three rows in four step: gpu_steady.mask)."""
    import numpy as np

    eng, b = w.engine(), task["batch"]
    audio = steady.Audio(b, task["warmup"] + task["frames"], seed=5 if masked else 2)
    eng.reset(b)
    codes = None if masked else []
    row, _ = steady.timed_frames(eng, audio, 0, dict(task, steady_frames=task["frames"]), masked, codes=codes)
    row["codes_file"] = codes and save_codes(w, task, "streaming", np.concatenate(codes, axis=-1))
    return row


def _transformer_row(w, task):
    """Mimi's transformer alone: 2-token steps, in turns, of a model stepped unmasked (its rows
    stay at one position: the one-position path, as the codec's unmasked frames) and of a model
    stepped masked (its rows drift apart: the per-row path), on young rings (fresh models,
    positions below the context, as in the codec's frames here) and on full ones."""
    import numpy as np

    eng, spec, batch = w.engine(), dict(task, device=w.job["device"], dtype=w.job["dtype"]), task["batch"]
    if eng.name != "mimi_py":
        raise NotImplementedError(f"{eng.name}: the transformer alone is timed for mimi_py only")
    import mimi_py

    cfg = mimi_py.TransformerConfig.mimi()
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((batch, 2, cfg.d_model)) * 0.1).astype(np.float32)
    row = {}
    for rings in ("young", "full"):
        models = {}
        for kind in ("unmasked", "masked"):
            models[kind] = mimi_py.StreamingTransformer(
                cfg, seed=0, device=spec["device"], dtype=spec["dtype"]
            )
            if rings == "full":
                fill = rng.standard_normal((batch, cfg.context, cfg.d_model)) * 0.1
                models[kind].step(fill.astype(np.float32))
        times = {"unmasked": [], "masked": []}
        for i in range(spec["warmup"] + spec["frames"]):
            for kind, kw in (("unmasked", {}), ("masked", {"active": steady.mask(batch, i)})):
                t0 = time.perf_counter()
                models[kind].step(x, **kw)
                if i >= spec["warmup"]:
                    times[kind].append(time.perf_counter() - t0)
        for kind, t in times.items():
            row[f"{rings}_{kind}"] = common.summary_us(t)
        ratio = row[f"{rings}_masked"]["median_us"] / row[f"{rings}_unmasked"]["median_us"]
        row[f"{rings}_masked_over_unmasked"] = round(ratio, 3)
    return row


def measure(w, task) -> dict:
    if task["kind"] in ("streaming", "masked"):
        return _young_row(w, task, task["kind"] == "masked")
    return {"offline": _offline_row, "transformer": _transformer_row}[task["kind"]](w, task)


def summary(ctx, rows) -> dict:
    from suites import agreement

    return {
        "table": [steady.flat(r) for r in rows],
        "agreement": agreement(rows),
        "switches": steady.switches(rows),
    }
