"""The worker of benches/gpu.py: one (engine, dtype, variant) in its own process
(`gpu.py --worker '<json spec>'`). It measures each row it is asked for and prints it as it
finishes (`@@ROW {json}`), so that a crash or a timeout loses only the rows after it.

The rows, in the order they run: offline, streaming, masked, transformer (young rings), steady
(full rings) and held (streams held) from gpu_steady.py, then census (torch.profiler,
gpu_census.py), last because it imports torch.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import gpu_census
import gpu_steady
from gpu_steady import REAL_TIME_US

import common

ROW_MARK = "@@ROW "
INFO_MARK = "@@INFO "
SECTIONS = ["offline", "streaming", "masked", "transformer", "steady", "held", "census"]


def _emit(mark: str, obj: dict) -> None:
    sys.stdout.write(mark + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip()[:2000]


def _free(eng) -> None:
    """After a failure: leave moshi's streaming mode and give cached device memory back."""
    try:
        if hasattr(eng, "_offline"):
            eng._offline()
        torch = getattr(eng, "torch", None)
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


def _offline_row(eng, spec, batch, save_dir):
    import numpy as np

    n = int(round(spec["seconds"] * common.SAMPLE_RATE))
    pcm = np.stack([common.smooth_noise(n, seed=r) for r in range(batch)])[:, None]  # row 0: run.py's clip
    eng.decode(eng.encode(pcm))  # warm-up at this size (allocator, kernels, lazy init)
    eng.sync()
    enc, dec, codes = [], [], None
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        codes = eng.encode(pcm)
        eng.sync()
        t1 = time.perf_counter()
        eng.decode(codes)
        eng.sync()
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    if save_dir:
        np.save(Path(save_dir) / f"offline-b{batch}.npy", np.asarray(codes))
    audio = batch * n / common.SAMPLE_RATE
    e, d = common.median(enc), common.median(dec)
    return {
        "encode_s": round(e, 5),
        "decode_s": round(d, 5),
        "encode_all_s": [round(x, 5) for x in enc],
        "decode_all_s": [round(x, 5) for x in dec],
        "audio_s": audio,
        "encode_rtf": round(audio / e, 2),
        "decode_rtf": round(audio / d, 2),
        "codes_shape": list(codes.shape),
    }


def _streaming_row(eng, spec, batch, save_dir):
    import numpy as np

    fs = common.FRAME_SIZE
    warm, frames = spec["warmup"], spec["frames"]
    n = (warm + frames) * fs
    pcm = np.stack([common.smooth_noise(n, seed=2 + r) for r in range(batch)])[:, None]
    eng.reset(batch)
    enc, dec, tot, got = [], [], [], []
    for i in range(warm + frames):
        chunk = pcm[:, :, i * fs : (i + 1) * fs]
        t0 = time.perf_counter()
        codes = eng.encode_step(chunk)
        eng.sync()
        t1 = time.perf_counter()
        if codes is None or np.shape(codes)[-1] == 0:
            raise RuntimeError(f"frame {i}: encode_step gave no codes for a whole frame")
        eng.decode_step(codes)
        eng.sync()
        t2 = time.perf_counter()
        got.append(np.asarray(codes))
        if i >= warm:
            enc.append(t1 - t0)
            dec.append(t2 - t1)
            tot.append(t2 - t0)
    if save_dir:
        np.save(Path(save_dir) / f"stream-b{batch}.npy", np.concatenate(got, axis=-1))
    t = common.summary_us(tot)
    return {
        "frames": frames,
        "warmup": warm,
        "encode_step": common.summary_us(enc),
        "decode_step": common.summary_us(dec),
        "frame_total": t,
        "per_stream_median_us": round(t["median_us"] / batch, 1),
        "per_stream_p99_us": round(t["p99_us"] / batch, 1),
        "real_time": t["p99_us"] <= REAL_TIME_US,
    }


def _masked_row(eng, spec, batch, save_dir):
    """Streaming frames on young rings with masks on both calls (gpu_steady.mask: mimi_py's
    active=, moshi's exec mask)."""
    import numpy as np

    fs = common.FRAME_SIZE
    warm, frames = spec["warmup"], spec["frames"]
    pcm = np.stack([common.smooth_noise((warm + frames) * fs, seed=5 + r) for r in range(batch)])[:, None]
    eng.reset(batch)
    tot, enc, dec, active = [], [], [], []
    try:
        for i in range(warm + frames):
            mask = gpu_steady.mask(batch, i)
            e, d, _ = gpu_steady.step_frame(eng, pcm[:, :, i * fs : (i + 1) * fs], mask)
            if i >= warm:
                tot.append(e + d)
                enc.append(e)
                dec.append(d)
                active.append(int(mask.sum()))
    finally:
        gpu_steady.unmask(eng)
    t = common.summary_us(tot)
    mean_active = sum(active) / len(active)
    return {
        "frames": frames,
        "warmup": warm,
        "mean_active_rows": round(mean_active, 2),
        "encode_step": common.summary_us(enc),
        "decode_step": common.summary_us(dec),
        "frame_total": t,
        # all timed frames' time over all their active rows
        "per_active_stream_mean_us": round(1e6 * sum(tot) / sum(active), 1),
        "real_time": t["p99_us"] <= REAL_TIME_US,
    }


def _transformer_row(eng, spec, batch, save_dir):
    """Mimi's transformer alone: 2-token steps, in turns, of a model stepped unmasked (its rows
    stay at one position: the one-position path, as the codec's unmasked frames) and of a model
    stepped masked (its rows drift apart: the per-row path), on young rings (fresh models,
    positions below the context, as in the codec's frames here) and on full ones."""
    import numpy as np

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
            for kind, kw in (("unmasked", {}), ("masked", {"active": gpu_steady.mask(batch, i)})):
                t0 = time.perf_counter()
                models[kind].step(x, **kw)
                if i >= spec["warmup"]:
                    times[kind].append(time.perf_counter() - t0)
        for kind, t in times.items():
            row[f"{rings}_{kind}"] = common.summary_us(t)
        ratio = row[f"{rings}_masked"]["median_us"] / row[f"{rings}_unmasked"]["median_us"]
        row[f"{rings}_masked_over_unmasked"] = round(ratio, 3)
    return row


def _steady_row(eng, spec, batch, save_dir, known):
    codes = [] if save_dir else None
    row = gpu_steady.steady_row(eng, spec, batch, known, codes)
    if codes:
        import numpy as np

        np.save(Path(save_dir) / f"steady-b{batch}.npy", np.concatenate(codes, axis=-1))
    return row


# Kept for the census out of a worker's time when its streams-held search would run into the
# worker's deadline: torch's import, then each census batch (warm-up, frames, trace export).
CENSUS_RESERVE_S = (4.0, 8.0)


def _held_row(eng, spec, batch, save_dir, known):
    """The streams-held search, its budget cut where the worker's deadline (its timeout, from
    the parent) leaves less before the census."""
    budget = spec["held_budget"]
    if spec.get("deadline_unix"):
        census = len(spec["census_batches"]) if "census" in spec.get("sections", SECTIONS) else 0
        reserve = CENSUS_RESERVE_S[0] * bool(census) + CENSUS_RESERVE_S[1] * census
        budget = min(budget, spec["deadline_unix"] - time.time() - reserve)
    row = gpu_steady.held_row(eng, dict(spec, held_budget=budget), known)
    row["budget_s"] = round(budget, 1)
    return row


MEASURES = {
    "offline": lambda eng, spec, b, save, known: _offline_row(eng, spec, b, save),
    "streaming": lambda eng, spec, b, save, known: _streaming_row(eng, spec, b, save),
    "masked": lambda eng, spec, b, save, known: _masked_row(eng, spec, b, save),
    "transformer": lambda eng, spec, b, save, known: _transformer_row(eng, spec, b, save),
    "steady": _steady_row,
    "held": _held_row,
    "census": lambda eng, spec, b, save, known: gpu_census.census_row(eng, spec, b),
}
BATCHES = {
    "offline": "batches",
    "streaming": "stream_batches",
    "masked": "stream_batches",
    "transformer": "stream_batches",
    "steady": "steady_batches",
    "census": "census_batches",
}


def wanted_rows(spec: dict) -> list[tuple[str, int | None]]:
    """(kind, batch) of every row one worker reports, in the order it measures them; the
    streams-held search is one row (batch None)."""
    out: list[tuple[str, int | None]] = []
    for kind in SECTIONS:
        if kind in spec.get("sections", SECTIONS):
            out += [(kind, None)] if kind == "held" else [(kind, b) for b in spec[BATCHES[kind]]]
    return out


def _load_engine(spec: dict):
    """(the engine or None, the info line): version, device name and torch's TF32 switches."""
    from worker import Timer, make_engine  # benches/worker.py: the engines' common face

    info = {"engine": spec["engine"], "dtype": spec["dtype"], "device": spec["device"]}
    eng = None
    try:
        with Timer() as tl:
            eng, _ = make_engine(spec)
        info.update(ok=True, load_s=round(tl.wall, 3), version=eng.version())
        torch = getattr(eng, "torch", None)
        if torch is not None and str(spec["device"]).startswith("cuda"):
            info["device_name"] = torch.cuda.get_device_name(torch.device(spec["device"]))
            # torch's defaults, left as moshi's users get them: cuDNN convolutions may use TF32
            info["torch_tf32"] = {
                "cudnn_conv": torch.backends.cudnn.allow_tf32,
                "cuda_matmul": torch.backends.cuda.matmul.allow_tf32,
            }
        if hasattr(eng, "codec"):
            info["codec_device"] = eng.codec.device
            info["codec_dtype"] = eng.codec.dtype
            # the MIMI_PY_* switches this process runs with (an older build may not say)
            info["settings"] = getattr(eng.m, "settings", dict)()
    except ImportError as e:
        info.update(ok=False, not_installed=True, error=_err(e))
    except Exception as e:
        info.update(ok=False, error=_err(e), traceback=traceback.format_exc()[-4000:])
    return eng, info


def worker_main(spec: dict) -> int:
    """Measure every row of one (engine, dtype, variant); each row is printed as it finishes."""
    from worker import Timer

    eng, info = _load_engine(spec)
    _emit(INFO_MARK, info)
    if not info["ok"]:
        return 0
    known: dict = {}  # the steady rows' unmasked frames, where the streams-held search starts
    for kind, batch in wanted_rows(spec):
        sizes = spec.get(BATCHES.get(kind, ""), [batch])
        save = (
            spec["save_dir"] if batch == min(sizes) and kind in ("offline", "streaming", "steady") else None
        )
        row = {"kind": kind, "batch": batch}
        try:
            with Timer() as tr:
                row.update(MEASURES[kind](eng, spec, batch, save, known))
            row.update(ok=True, row_wall_s=round(tr.wall, 2))
        except Exception as e:
            row.update(ok=False, error=_err(e))
            _free(eng)
        _emit(ROW_MARK, row)
    return 0
