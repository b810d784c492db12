"""The GPU suites' steady state: streams whose key/value rings are full, as in a stream that
has run for minutes, and how many such streams one device holds in real time.

After `context` tokens (250: 10 s at the transformer's 25 Hz) every step attends over a full
ring. moshi always attends over its whole ring, so its young streams already cost what its old
ones do; mimi_py's do not. A row streams `steady_warmup` frames (130: 260 tokens) in calls of
several frames (`warm_to_full`), checks every row's rings are full, then times single frames,
unmasked, then masked (mimi_py's `active=`, moshi's `set_exec_mask`, set before each frame and
counted in its time). moshi warms up with its CUDA graphs off (a graph replays one shape).
"""

from __future__ import annotations

import gc
import time

import numpy as np

import common
from suites import REAL_TIME_US

PEERS = ("moshi",)
TINY = dict(steady_batches=[1, 2], steady_warmup=130, steady_frames=3, warmup=1, held_max=4, held_frames=3)
FULL = dict(steady_batches=[1, 8, 64, 256], steady_warmup=130, steady_frames=30, warmup=5, held_max=4096)
SIZES = {"tiny": dict(TINY, held_budget=10.0, held_start=2)}
SIZES["full"] = dict(FULL, held_frames=20, held_budget=30.0, held_start=256)
COLUMNS = (
    "engine=label | dtype | variant | row=kind | B=batch | frame median ms=median_ms | "
    "frame p99 ms=p99_ms | per stream ms=per_stream_ms | "
    "masked ÷ unmasked=masked_over_unmasked | streams held=streams_held"
)
# Kept for the census out of a worker's time when its streams-held search would reach the
# worker's deadline: torch's import, then each census batch.
CENSUS_RESERVE_S = (4.0, 8.0)


def jobs(ctx, sizes):
    from suites.gpu_rows import gpu_jobs

    return gpu_jobs(ctx, sizes, {"steady": "steady_batches", "held": None})


def measure(w, task) -> dict:
    known = w.shared.setdefault("known", {})
    eng = w.engine()
    if task["kind"] == "steady":
        from suites.gpu_rows import save_codes

        codes = []
        row = steady_row(eng, task, task["batch"], known, codes)
        row["codes_file"] = save_codes(w, task, "steady", np.concatenate(codes, axis=-1)) if codes else None
        return row
    budget = task["held_budget"]
    if w.job.get("deadline_unix"):
        census = [t for t in w.job["tasks"] if t["kind"] == "census"]
        reserve = CENSUS_RESERVE_S[0] * bool(census) + CENSUS_RESERVE_S[1] * len(census)
        budget = min(budget, w.job["deadline_unix"] - time.time() - reserve)
    return dict(held_row(eng, dict(task, held_budget=budget), known), budget_s=round(budget, 1))


def flat(r: dict) -> dict:
    """A GPU row's table cells: its frame figures (the unmasked ones of a full-ring row) in ms."""
    out = {
        k: r.get(k) for k in ("ok", "error", "label", "engine", "dtype", "variant", "round", "kind", "batch")
    }
    out.update({k: r.get(k) for k in ("encode_rtf", "decode_rtf", "streams_held", "masked_over_unmasked")})
    t = (r.get("unmasked") or r).get("frame_total")
    if t:
        out.update(median_ms=round(t["median_us"] / 1e3, 2), p99_ms=round(t["p99_us"] / 1e3, 2))
        out["per_stream_ms"] = round(t["median_us"] / 1e3 / (r.get("batch") or 1), 3)
    if r.get("young_masked_over_unmasked"):
        out["masked_over_unmasked"] = (
            f"young {r['young_masked_over_unmasked']}, full {r['full_masked_over_unmasked']}"
        )
    return out


def switches(rows: list[dict]) -> list[dict]:
    """mimi_py's frame medians per variant (`--variant`), each round's and their mean, over the
    first variant's mean: the before and after of a switch, rounds alternated."""
    kinds = ("streaming", "steady")
    mine = [flat(r) for r in rows if r["engine"] == "mimi_py" and r["ok"] and r["kind"] in kinds]
    out = []
    for dt, kind, b in dict.fromkeys((r["dtype"], r["kind"], r["batch"]) for r in mine):
        base = None
        for v in dict.fromkeys(r["variant"] for r in mine):
            ms = [
                r["median_ms"]
                for r in mine
                if (r["dtype"], r["kind"], r["batch"], r["variant"]) == (dt, kind, b, v)
            ]
            mean = round(sum(ms) / len(ms), 3) if ms else None
            base = base or mean
            out.append({"ok": True, "dtype": dt, "row": f"{kind} B = {b}", "variant": v, "rounds_ms": ms})
            out[-1].update(mean_ms=mean, over_first=mean and base and round(mean / base, 3))
    return out


def summary(ctx, rows) -> dict:
    from suites import agreement

    return {"table": [flat(r) for r in rows], "agreement": agreement(rows), "switches": switches(rows)}


WARM_ROWS = 8  # distinct rows of audio; a batch repeats them (B = 4096 × 2.5 min would not fit)
WARM_CALL_ROW_FRAMES = 1024  # frames × rows of one warm-up call, at most 26 frames


def mask(batch: int, i: int) -> np.ndarray:
    """Frame i's active rows: row r sits out when (r + i) % 4 == 0 (three rows in four step);
    B = 1 steps always."""
    if batch == 1:
        return np.array([True])
    return np.array([(r + i) % 4 != 0 for r in range(batch)])


class Audio:
    """Smooth noise for `batch` rows and `frames` frames: WARM_ROWS distinct rows, repeated."""

    def __init__(self, batch: int, frames: int, seed: int):
        n = min(batch, WARM_ROWS)
        self.bank = np.stack(
            [common.smooth_noise(frames * common.FRAME_SIZE, seed=seed + r) for r in range(n)]
        )
        self.bank = self.bank[:, None]
        self.rows = np.arange(batch) % n
        self.frames = frames

    def chunk(self, i: int, k: int = 1) -> np.ndarray:
        """(B, 1, k × frame size): frames i .. i + k of every row."""
        if i + k > self.frames:
            raise IndexError(f"frames {i}..{i + k} past the {self.frames} prepared")
        fs = common.FRAME_SIZE
        return np.ascontiguousarray(self.bank[:, :, i * fs : (i + k) * fs][self.rows])


def _moshi_mask(eng, active) -> None:
    import torch

    rows = eng._stream_batch
    m = np.ones(rows, dtype=bool) if active is None else np.asarray(active, dtype=bool)
    eng.model.set_exec_mask(torch.from_numpy(m).to(eng.device))


def step_frame(eng, chunk, active=None) -> tuple[float, float, object]:
    """One encode_step then decode_step of its codes, each waited for; with `active`, only those
    rows step. Returns (encode seconds, decode seconds, codes)."""
    moshi = eng.name == "moshi"
    kw = {} if moshi or active is None else {"active": active}
    if not moshi and active is not None and not eng.masks:
        raise NotImplementedError(f"{eng.name}: no per-row streams (active= masks) in this bench")
    t0 = time.perf_counter()
    if moshi and active is not None:
        if eng._stream is None:
            eng.reset(np.shape(chunk)[0])
        _moshi_mask(eng, active)
    codes = eng.encode_step(chunk, **kw)
    eng.sync()
    t1 = time.perf_counter()
    if codes is None or np.shape(codes)[-1] == 0:
        raise RuntimeError("encode_step gave no codes for whole frames")
    eng.decode_step(codes, **kw)
    eng.sync()
    return t1 - t0, time.perf_counter() - t1, codes


def unmask(eng) -> None:
    """moshi: every row steps again (its exec mask is state of the streaming modules)."""
    if eng.name == "moshi" and eng._stream is not None:
        _moshi_mask(eng, None)


def ring_fill(eng) -> dict:
    """The fewest tokens any row's key/value rings have taken (encoder and decoder), and the
    rings' length."""
    if eng.name == "moshi":
        held, context = [], []
        for mod in eng.model.modules():
            kv = getattr(getattr(mod, "_streaming_state", None), "kv_cache", None)
            if kv is not None and hasattr(kv, "end_offset"):
                held.append(int(kv.end_offset.min()))
                context.append(int(kv.capacity))
        if not held:
            return {"tokens": None, "context": None}
        return {"tokens": min(held), "context": max(context)}
    codec = eng.codec
    cfg = codec.config
    hop = int(np.prod(cfg.seanet.get("ratios", [8, 6, 5, 4])))
    per_frame = max(1, round(cfg.sample_rate / hop / cfg.frame_rate))
    frames = min(int(np.min(codec.positions)), int(np.min(codec.decode_positions)))
    return {"tokens": frames * per_frame, "context": int(cfg.transformer.context)}


def _no_graphs(eng):
    """moshi's CUDA graphs off for a block (a graph replays one shape); a null context else."""
    import contextlib

    if eng.name != "moshi":
        return contextlib.nullcontext()
    from moshi.utils.compile import no_cuda_graph

    return no_cuda_graph()


def warm_to_full(eng, audio: Audio, frames: int) -> dict:
    """Fresh streams of audio's rows, then `frames` frames streamed in calls of up to 26 frames
    (fewer at large B), unmasked; records whether every row's rings are full."""
    batch = len(audio.rows)
    eng.reset(batch)
    per_call = max(1, min(26, WARM_CALL_ROW_FRAMES // batch))
    t0 = time.perf_counter()
    at, calls = 0, 0
    with _no_graphs(eng):
        while at < frames:
            k = min(per_call, frames - at)
            step_frame(eng, audio.chunk(at, k))
            at, calls = at + k, calls + 1
    fill = ring_fill(eng)
    out = {
        "frames": frames,
        "calls": calls,
        "frames_per_call": per_call,
        "s": round(time.perf_counter() - t0, 3),
    }
    full = fill["tokens"] is not None and fill["tokens"] >= fill["context"]
    return dict(out, ring_tokens=fill["tokens"], context=fill["context"], rings_full=full)


def timed_frames(eng, audio: Audio, at: int, spec: dict, masked: bool, frames=None, codes=None):
    """`spec["warmup"]` untimed frames, then `frames` (default `spec["steady_frames"]`) timed ones, from
    audio's frame `at`, masked or not; the timed frames' codes appended to `codes` if given.
    Returns (the summary, the next frame)."""
    batch = len(audio.rows)
    frames = spec["steady_frames"] if frames is None else frames
    enc, dec, tot, active = [], [], [], []
    try:
        for i in range(spec["warmup"] + frames):
            m = mask(batch, i) if masked else None
            e, d, c = step_frame(eng, audio.chunk(at + i), m)
            if i >= spec["warmup"]:
                if codes is not None:
                    codes.append(np.asarray(c))
                enc.append(e)
                dec.append(d)
                tot.append(e + d)
                active.append(batch if m is None else int(m.sum()))
    finally:
        if masked:
            unmask(eng)
    t = common.summary_us(tot)
    out = {"frames": frames, "encode_step": common.summary_us(enc), "decode_step": common.summary_us(dec)}
    out.update(frame_total=t, per_stream_median_us=round(t["median_us"] / batch, 1))
    out["real_time"] = t["p99_us"] <= REAL_TIME_US
    if masked:
        out["mean_active_rows"] = round(sum(active) / len(active), 2)
        out["per_active_stream_mean_us"] = round(1e6 * sum(tot) / sum(active), 1)
    return out, at + spec["warmup"] + frames


def _frames_needed(spec: dict, timed_blocks: int) -> int:
    return spec["steady_warmup"] + timed_blocks * (spec["warmup"] + spec["steady_frames"]) + 1


def steady_row(eng, spec: dict, batch: int, known: dict, codes=None) -> dict:
    """Full rings at B: the warm-up, then unmasked frames (their codes appended to `codes` if
    given), then masked frames (rows at different positions from there on: they come last).
    The unmasked frames' result goes into `known`, for the streams-held search."""
    audio = Audio(batch, _frames_needed(spec, 2), seed=11)
    t0 = time.perf_counter()
    row = {"warmup": warm_to_full(eng, audio, spec["steady_warmup"])}
    row["unmasked"], at = timed_frames(eng, audio, spec["steady_warmup"], spec, False, codes=codes)
    t = row["unmasked"]["frame_total"]
    ok = t["p99_us"] <= REAL_TIME_US and row["warmup"]["rings_full"]
    known[batch] = {
        "batch": batch,
        "ok": ok,
        "p99_us": t["p99_us"],
        "median_us": t["median_us"],
        "from": "steady",
    }
    known[batch].update(frames=spec["steady_frames"], s=round(time.perf_counter() - t0, 3))
    try:
        row["masked"], at = timed_frames(eng, audio, at, spec, masked=True)
        ratio = row["masked"]["frame_total"]["median_us"] / row["unmasked"]["frame_total"]["median_us"]
        row["masked_over_unmasked"] = round(ratio, 3)
    except Exception as e:
        row["masked"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    row["ring_tokens_after"] = ring_fill(eng)["tokens"]
    return row


# ---------------------------------------------------------------------------------------------
# streams held: the largest B whose frame p99 stays within real time, on full rings


def probe_held(eng, spec: dict, batch: int) -> dict:
    """Full rings at B, then `held_frames` timed unmasked frames: does the p99 hold 80 ms?"""
    _release(eng)  # the last probe's streams and cached device memory, before a larger batch
    t0 = time.perf_counter()
    try:
        audio = Audio(batch, spec["steady_warmup"] + spec["warmup"] + spec["held_frames"] + 1, seed=23)
        warm = warm_to_full(eng, audio, spec["steady_warmup"])
        t, _ = timed_frames(eng, audio, spec["steady_warmup"], spec, False, frames=spec["held_frames"])
        p99 = t["frame_total"]["p99_us"]
        out = {"batch": batch, "ok": p99 <= REAL_TIME_US and warm["rings_full"], "p99_us": p99}
        out.update(median_us=t["frame_total"]["median_us"], frames=t["frames"], warmup_s=warm["s"])
        out["rings_full"] = warm["rings_full"]
    except Exception as e:  # out of memory, most likely: this B is not held
        out = {"batch": batch, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
        _release(eng)
    out["s"] = round(time.perf_counter() - t0, 3)
    return out


def _release(eng) -> None:
    try:
        eng.reset(1)
        gc.collect()  # moshi's streaming state and CUDA graphs of the last batch
        eng.free()
    except Exception:
        pass


def _predict(passed: list[dict], limit_us: float) -> int | None:
    """The B where a line through the two largest passing probes reaches the limit."""
    if len(passed) < 2:
        return None
    a, b = sorted(passed, key=lambda p: p["batch"])[-2:]
    slope = (b["p99_us"] - a["p99_us"]) / (b["batch"] - a["batch"])
    if slope <= 0:
        return None
    return int(b["batch"] + (limit_us - b["p99_us"]) / slope)


def next_batch(probes: list[dict], start: int, max_batch: int, limit_us: float):
    """The next B to probe, or (None, why the search stops). While every probe passes: the
    line's prediction, between 1.25× and 4× the largest passing B (2× without a line); while
    every probe fails: half the smallest; then bisection until the gap is under 1/8."""
    passed = [p for p in probes if p["ok"]]
    lo = max((p["batch"] for p in passed), default=0)
    hi = min((p["batch"] for p in probes if not p["ok"] and p["batch"] > lo), default=None)
    if not probes:
        return start, None
    if hi is None:
        guess = _predict(passed, limit_us) or 2 * lo
        nxt = min(max(guess, lo + max(1, lo // 4)), 4 * lo, max_batch)
        return (nxt, None) if nxt > lo else (None, "largest batch tried")
    if lo == 0:
        return (hi // 2, None) if hi > 1 else (None, "B = 1 misses")
    if hi - lo <= max(1, lo // 8):
        return None, "resolution"
    return (lo + hi) // 2, None


def search_held(probe, known: dict, spec: dict, clock=time.perf_counter) -> dict:
    """Probes B (`probe(B) -> {"batch", "ok", "p99_us", "s"}`) as `next_batch` says, starting
    from the steady rows' results (`known`), until it stops or the next probe, estimated from
    the last one's time scaled by B, would pass `held_budget` seconds."""
    limit = spec.get("limit_us", REAL_TIME_US)
    probes = sorted(known.values(), key=lambda p: p["batch"])
    t0, why = clock(), None
    last = probes[-1] if probes else None  # the cost estimate of the next probe scales this one
    while True:
        b, why = next_batch(probes, spec["held_start"], spec["held_max"], limit)
        if b is None:
            break
        if any(p["batch"] == b for p in probes):
            why = "resolution"
            break
        estimate = last["s"] * b / last["batch"] if last is not None else 0.0
        if clock() - t0 + estimate > spec["held_budget"]:
            why = "time budget"
            break
        last = probe(b)
        probes.append(last)
    passed = [p["batch"] for p in probes if p["ok"]]
    held = max(passed, default=0)
    fails = [p["batch"] for p in probes if not p["ok"] and p["batch"] > held]
    return {
        "streams_held": held,
        "first_failing": min(fails, default=None),
        "stopped": why,
        "limit_us": limit,
        "probes": sorted(probes, key=lambda p: p["batch"]),
        "search_s": round(clock() - t0, 3),
    }


def held_row(eng, spec: dict, known: dict) -> dict:
    """Streams held per device: `search_held` over full-ring frames."""
    return search_held(lambda b: probe_held(eng, spec, b), known, spec)
