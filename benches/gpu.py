#!/usr/bin/env python3
"""mimi_py against moshi's PyTorch Mimi on one accelerator: same random weights,
same device, float32 and bfloat16.

    python benches/gpu.py [--device cuda] [--dtypes float32,bfloat16] [--engines mimi_py,moshi]
                          [--seconds 10] [--batches 1,16] [--stream-batches 1,8,64]
                          [--frames 50] [--warmup 5] [--repeats 3] [--tiny] [--codec real|small]
                          [--out DIR]

For each (engine, dtype) one fresh process (`gpu.py --worker`) loads the codec from the moshi-layout
file that common.py writes (random weights of the real architecture, 8 codebooks), then measures:

* offline: `encode` of `--seconds` of audio at each batch size of `--batches` (B rows), then
  `decode` of those codes: one warm-up call at that size, then the median of `--repeats`;
* streaming: per 80 ms frame, `encode_step` of (B, 1, 1920) then `decode_step` of its codes, at
  each batch size of `--stream-batches`: `--warmup` frames, then `--frames` timed frames; the
  median and p99 per frame, and per stream (÷ B).
* masked streaming (engines with per-row streams: mimi_py): the same frames with an `active=`
  mask on both calls, three rows in four stepping (row r sits out frame i when (r + i) % 4 == 0;
  at B = 1 the mask is [True]); per active stream = the frames' total time ÷ their active rows.
* the transformer alone (mimi_py): Mimi's transformer on the device and dtype, steps of 2
  tokens (one frame's, at 25 Hz) at each of `--stream-batches`, in turns, of one model stepped
  unmasked (its rows stay at one position, as in the unmasked frames above) and one stepped
  with the masks above (its rows drift apart), on young rings (fresh models: positions below
  the context, as the codec's frames above) and on full ones: what of a masked frame's extra
  cost the transformer accounts for.

torch on CUDA is synchronized before each timer stops; mimi_py returns numpy arrays, so its calls
are synchronous. Every row that fails (out of memory, a dtype or device the build does not support,
an engine that is not installed) is recorded with its error; the script itself does not fail.
Code agreement: the fraction of equal codes between mimi_py and moshi (same dtype), and between
each engine's half-precision codes and its float32 codes (offline at the smallest batch, and the
streaming codes at the smallest streaming batch).

Writes DIR/gpu_results.json and DIR/gpu_results.md (DIR defaults to benches/).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import common  # noqa: E402

ROW_MARK = "@@ROW "
INFO_MARK = "@@INFO "
ENGINES = ["mimi_py", "moshi"]
DTYPES = ["float32", "bfloat16", "float16"]
NEEDS = {"mimi_py": ["mimi_py"], "moshi": ["torch", "moshi"]}
REAL_TIME_US = 80_000.0


def log(msg: str) -> None:
    print(f"[gpu bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="device of both engines: cuda (default), cuda:N, cpu")
    p.add_argument("--dtypes", default="float32,bfloat16", help="of: " + ",".join(DTYPES))
    p.add_argument("--engines", default=",".join(ENGINES), help="of: " + ",".join(ENGINES))
    p.add_argument("--seconds", type=float, default=None, help="offline audio per row (default 10; tiny 0.5)")
    p.add_argument("--batches", default=None, help="offline batch sizes (default 1,16; tiny 1,2)")
    p.add_argument("--stream-batches", default=None, help="streaming batch sizes (default 1,8,64; tiny 1,2)")
    p.add_argument("--frames", type=int, default=None, help="timed streaming frames (default 50; tiny 3)")
    p.add_argument("--warmup", type=int, default=None, help="streaming warm-up frames (default 5; tiny 1)")
    p.add_argument("--repeats", type=int, default=None, help="timed offline repeats (default 3; tiny 1)")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="dry-run sizes: 0.5 s, batches 1,2, 3 frames after 1 warm-up, 1 repeat",
    )
    p.add_argument(
        "--codec",
        choices=["real", "small"],
        default="real",
        help="real: random weights of the real Mimi (default); small: the fixtures' small codec "
        "(4 codebooks; mimi_py only, moshi builds only the real architecture)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of each process (RAYON/OMP_NUM_THREADS; default: the available cores; tiny 1)",
    )
    p.add_argument(
        "--timeout", type=float, default=240.0, help="seconds per (engine, dtype) process (default 240)"
    )
    p.add_argument(
        "--out", default=None, help="folder for gpu_results.json and gpu_results.md (default benches/)"
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        return a
    a.engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    a.dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    bad = [e for e in a.engines if e not in ENGINES] + [d for d in a.dtypes if d not in DTYPES]
    if bad:
        p.error(f"unknown engine(s) or dtype(s) {bad}")
    t = a.tiny
    a.seconds = a.seconds if a.seconds is not None else (0.5 if t else 10.0)
    a.batches = _ints(a.batches or ("1,2" if t else "1,16"))
    a.stream_batches = _ints(a.stream_batches or ("1,2" if t else "1,8,64"))
    a.frames = a.frames if a.frames is not None else (3 if t else 50)
    a.warmup = a.warmup if a.warmup is not None else (1 if t else 5)
    a.repeats = a.repeats if a.repeats is not None else (1 if t else 3)
    a.threads = a.threads or (1 if t else common.cpu_count_available())
    if min(a.batches + a.stream_batches + [a.frames, a.repeats]) < 1 or a.warmup < 0:
        p.error("sizes must be positive")
    a.out = Path(a.out).resolve() if a.out else BENCH_DIR
    return a


# ---------------------------------------------------------------------------------------------
# the worker: one (engine, dtype) in its own process


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


def _mask(batch: int, i: int):
    import numpy as np

    if batch == 1:
        return np.array([True])
    return np.array([(r + i) % 4 != 0 for r in range(batch)])


def _masked_row(eng, spec, batch, save_dir):
    """Streaming frames with an active= mask on encode_step and decode_step (see the docstring)."""
    import numpy as np

    if not getattr(eng, "masks", False):
        raise NotImplementedError(f"{eng.name}: no per-row streams (active= masks) in this bench")
    fs = common.FRAME_SIZE
    warm, frames = spec["warmup"], spec["frames"]
    pcm = np.stack([common.smooth_noise((warm + frames) * fs, seed=5 + r) for r in range(batch)])[:, None]
    eng.reset(batch)
    tot, enc, dec, active = [], [], [], []
    for i in range(warm + frames):
        mask = _mask(batch, i)
        t0 = time.perf_counter()
        codes = eng.encode_step(pcm[:, :, i * fs : (i + 1) * fs], active=mask)
        t1 = time.perf_counter()
        eng.decode_step(codes, active=mask)
        t2 = time.perf_counter()
        if i >= warm:
            tot.append(t2 - t0)
            enc.append(t1 - t0)
            dec.append(t2 - t1)
            active.append(int(mask.sum()))
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

    if not getattr(eng, "masks", False):
        raise NotImplementedError(f"{eng.name}: no per-row streams (active= masks) in this bench")
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
            for kind, kw in (("unmasked", {}), ("masked", {"active": _mask(batch, i)})):
                t0 = time.perf_counter()
                models[kind].step(x, **kw)
                if i >= spec["warmup"]:
                    times[kind].append(time.perf_counter() - t0)
        for kind, t in times.items():
            row[f"{rings}_{kind}"] = common.summary_us(t)
        ratio = row[f"{rings}_masked"]["median_us"] / row[f"{rings}_unmasked"]["median_us"]
        row[f"{rings}_masked_over_unmasked"] = round(ratio, 3)
    return row


def wanted_rows(spec: dict) -> list[tuple[str, int]]:
    """(kind, batch) of every row one (engine, dtype) reports."""
    return (
        [("offline", b) for b in spec["batches"]]
        + [("streaming", b) for b in spec["stream_batches"]]
        + [("masked", b) for b in spec["stream_batches"]]
        + [("transformer", b) for b in spec["stream_batches"]]
    )


def worker_main(spec: dict) -> int:
    """Measure every row of one (engine, dtype); each row is printed as it finishes, so a crash
    of the process loses only the rows after it."""
    from worker import Timer, make_engine  # benches/worker.py: the engines' common face

    rows = wanted_rows(spec)
    info = {"engine": spec["engine"], "dtype": spec["dtype"], "device": spec["device"]}
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
    except ImportError as e:
        info.update(ok=False, not_installed=True, error=_err(e))
    except Exception as e:
        info.update(ok=False, error=_err(e), traceback=traceback.format_exc()[-4000:])
    _emit(INFO_MARK, info)
    if not info["ok"]:
        return 0
    for kind, batch in rows:
        first = batch == min(spec["batches"] if kind == "offline" else spec["stream_batches"])
        save = spec["save_dir"] if first else None
        row = {"kind": kind, "batch": batch}
        measure = {
            "offline": _offline_row,
            "streaming": _streaming_row,
            "masked": _masked_row,
            "transformer": _transformer_row,
        }[kind]
        try:
            with Timer() as tr:
                row.update(measure(eng, spec, batch, save))
            row.update(ok=True, row_wall_s=round(tr.wall, 2))
        except Exception as e:
            row.update(ok=False, error=_err(e))
            _free(eng)
        _emit(ROW_MARK, row)
    return 0


# ---------------------------------------------------------------------------------------------
# the parent


def run_worker(spec: dict, threads: int, timeout: float) -> dict:
    env = os.environ.copy()
    t = str(threads)
    env.update(RAYON_NUM_THREADS=t, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(common.REPO),
        )
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
        died = None if rc == 0 else f"worker exited with status {rc}"
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        died = f"timed out after {timeout:g} s"
    info, rows = None, []
    for line in stdout.splitlines():
        if line.startswith(INFO_MARK):
            info = json.loads(line[len(INFO_MARK) :])
        elif line.startswith(ROW_MARK):
            rows.append(json.loads(line[len(ROW_MARK) :]))
    tail = stderr.strip()[-1500:]  # the protocol lines on stdout say nothing about a crash
    if info is None:
        info = {"ok": False, "error": f"{died or 'no result'}" + (f": {tail}" if tail else "")}
    want = wanted_rows(spec)
    done = {(r["kind"], r["batch"]) for r in rows}
    for kind, b in want:  # rows never reported: the load failed, or the process died on them
        if (kind, b) not in done:
            why = (
                info.get("error")
                if not info.get("ok")
                else (died or "not reported") + (f": {tail}" if tail else "")
            )
            rows.append({"kind": kind, "batch": b, "ok": False, "error": why})
    return dict(
        info,
        engine=spec["engine"],
        dtype=spec["dtype"],
        rows=rows,
        process_wall_s=round(time.perf_counter() - t0, 2),
    )


def _load(path: Path):
    import numpy as np

    return np.load(path) if path.exists() else None


def _agree(a, b) -> dict | None:
    if a is None or b is None or a.shape[:2] != b.shape[:2]:
        return None
    f = min(a.shape[-1], b.shape[-1])
    a, b = a[..., :f].astype("int64"), b[..., :f].astype("int64")
    return {
        "equal_fraction": round(float((a == b).mean()), 4),
        "first_codebook_equal_fraction": round(float((a[:, 0] == b[:, 0]).mean()), 4),
        "frames": int(f),
    }


def agreement(args, codes_dir: Path) -> list:
    """Fraction of equal codes: mimi_py vs moshi at each dtype; each engine's other dtypes vs its
    float32 (offline at the smallest batch, streaming at the smallest streaming batch)."""
    b0, s0 = min(args.batches), min(args.stream_batches)
    pairs = []
    for dt in args.dtypes:
        pairs.append((("mimi_py", dt), ("moshi", dt)))
    for eng in args.engines:
        for dt in args.dtypes:
            if dt != "float32" and "float32" in args.dtypes:
                pairs.append(((eng, dt), (eng, "float32")))
    out = []
    for a, b in pairs:
        if a[0] not in args.engines or b[0] not in args.engines:
            continue
        da, db = codes_dir / f"{a[0]}-{a[1]}", codes_dir / f"{b[0]}-{b[1]}"
        out.append(
            {
                "a": {"engine": a[0], "dtype": a[1]},
                "b": {"engine": b[0], "dtype": b[1]},
                "offline_batch": b0,
                "offline": _agree(_load(da / f"offline-b{b0}.npy"), _load(db / f"offline-b{b0}.npy")),
                "stream_batch": s0,
                "streaming": _agree(_load(da / f"stream-b{s0}.npy"), _load(db / f"stream-b{s0}.npy")),
            }
        )
    return out


def device_facts(device: str) -> dict:
    out = {"device": device, "cpu_model": common.cpu_model(), "cpu_cores": common.cpu_count()}
    if device.startswith("cuda") and shutil.which("nvidia-smi"):
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.strip()
            out["nvidia_smi"] = q.splitlines()
        except Exception as e:
            out["nvidia_smi_error"] = _err(e)
    return out


def not_installed_run(args, eng: str, dt: str, missing: list[str]) -> dict:
    """The failed rows of an engine that cannot be imported."""
    why = "not installed (" + ", ".join(missing) + ")"
    spec = {"batches": args.batches, "stream_batches": args.stream_batches}
    rows = [{"kind": k, "batch": b, "ok": False, "error": why} for k, b in wanted_rows(spec)]
    return {"engine": eng, "dtype": dt, "ok": False, "not_installed": True, "error": why, "rows": rows}


def run_engines(args, weights: dict, sizes: dict, codes_dir: Path) -> list:
    """One worker per (engine, dtype); each saves its codes under codes_dir for `agreement`."""
    import importlib.util

    runs = []
    for eng in args.engines:
        missing = [m for m in NEEDS[eng] if importlib.util.find_spec(m) is None]
        for dt in args.dtypes:
            if missing:
                runs.append(not_installed_run(args, eng, dt, missing))
                continue
            save = codes_dir / f"{eng}-{dt}"
            save.mkdir()
            spec = {
                "task": "gpu",
                "engine": eng,
                "dtype": dt,
                "device": args.device,
                "weights": weights["path"],
                "hf_config": weights["hf_config"],
                "num_codebooks": weights["num_codebooks"],
                **sizes,
                "save_dir": str(save),
            }
            log(f"{eng} {dt} on {args.device}")
            r = run_worker(spec, args.threads, args.timeout)
            bad = [f"{x['kind']} B={x['batch']}" for x in r["rows"] if not x.get("ok")]
            log(f"{eng} {dt}: {r['process_wall_s']:.1f} s" + (f"; failed: {', '.join(bad)}" if bad else ""))
            runs.append(r)
    return runs


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        return worker_main(json.loads(args.worker))
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    log(
        f"device {args.device}, engines {args.engines}, dtypes {args.dtypes}, {args.codec} codec, out {args.out}"
    )
    if args.codec != "small":
        log("random weights in the moshi checkpoint layout (cached in benches/.cache or $MIMI_BENCH_CACHE)")
    weights = common.bench_weights(small=args.codec == "small")
    # The sizes, recorded in the results and handed to each worker.
    sizes = {
        k: getattr(args, k) for k in ("seconds", "batches", "stream_batches", "frames", "warmup", "repeats")
    }
    with tempfile.TemporaryDirectory(prefix="mimi-gpu-bench-") as tmp:
        codes_dir = Path(tmp)
        runs = run_engines(args, weights, sizes, codes_dir)
        agree = agreement(args, codes_dir)

    res = {
        "schema": 1,
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python benches/gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {
            "device": args.device,
            "engines": args.engines,
            "dtypes": args.dtypes,
            **sizes,
            "tiny": args.tiny,
            "codec": args.codec,
            "threads": args.threads,
        },
        "machine": dict(
            device_facts(args.device), platform=platform.platform(), python=platform.python_version()
        ),
        "weights": weights,
        "runs": runs,
        "agreement": agree,
        "duration_s": round(time.perf_counter() - t_start, 1),
    }
    (args.out / "gpu_results.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / "gpu_results.md").write_text(render(res))
    log(
        f"wrote {args.out / 'gpu_results.json'} and {args.out / 'gpu_results.md'} ({res['duration_s']:.0f} s)"
    )
    return 0


# ---------------------------------------------------------------------------------------------
# markdown


def _ms(us) -> str:
    return "—" if us is None else f"{us / 1000:.2f} ms"


def _cell_err(e) -> str:
    return "error: " + (e or "failed").strip().splitlines()[-1][:160].replace("|", "\\|")


def _pct(d, key="equal_fraction") -> str:
    return "—" if not d else f"{100 * d[key]:.1f}%"


def render_masked(res) -> list[str]:
    a = res["args"]
    L = [
        "",
        f"## Streaming with masks: `active=` on both calls ({a['frames']} frames after {a['warmup']} warm-up)",
    ]
    L += [
        "",
        "Three rows in four step each frame (B = 1: a mask of [True]). Per active stream = total time ÷ active row-frames.",
        "",
    ]
    L.append(
        "| engine | dtype | B | active rows | frame median | frame p99 | per active stream | encode_step median | decode_step median | real time |"
    )
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in res["runs"]:
        for x in (x for x in r["rows"] if x["kind"] == "masked"):
            if x.get("ok"):
                t = x["frame_total"]
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {x['mean_active_rows']:g} | "
                    f"{_ms(t['median_us'])} | {_ms(t['p99_us'])} | {_ms(x['per_active_stream_mean_us'])} | "
                    f"{_ms(x['encode_step']['median_us'])} | {_ms(x['decode_step']['median_us'])} | "
                    f"{'✅' if x['real_time'] else '❌'} |"
                )
            else:
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {_cell_err(x.get('error'))} | | | | | | |"
                )
    return L


def render_transformer(res) -> list[str]:
    L = ["", "## The transformer alone: 2-token steps of an unmasked and a masked model, in turns", ""]
    L.append("| engine | dtype | B | rings | unmasked median | masked median | masked ÷ unmasked |")
    L.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in res["runs"]:
        for x in (x for x in r["rows"] if x["kind"] == "transformer"):
            if not x.get("ok"):
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {_cell_err(x.get('error'))} | | | |"
                )
                continue
            for rings in ("young", "full"):
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {rings} | "
                    f"{_ms(x[rings + '_unmasked']['median_us'])} | {_ms(x[rings + '_masked']['median_us'])} | "
                    f"{x[rings + '_masked_over_unmasked']:.2f} |"
                )
    return L


def render(res) -> str:
    a, m = res["args"], res["machine"]
    L = [f"# mimi_py vs moshi on {a['device']}", ""]
    if a["tiny"] or a["device"] == "cpu":
        L += ["**Dry-run sizes or CPU: the numbers are not meaningful.**", ""]
    L.append(f"- run {res['date']}, {res['duration_s']:.0f} s in all; command: `{res['command']}`")
    L.append(f"- device: {a['device']}" + (f" ({'; '.join(m['nvidia_smi'])})" if m.get("nvidia_smi") else ""))
    L.append(f"- host: {m['cpu_model']}, {m['cpu_cores']} cores, {a['threads']} CPU thread(s) per process")
    L.append(
        f"- weights: {res['weights']['architecture']}, {res['weights']['num_codebooks']} codebooks, random"
    )
    for r in res["runs"]:
        state = f"loaded in {r['load_s']:.2f} s" if r.get("ok") else _cell_err(r.get("error"))
        if r.get("torch_tf32"):
            state += f", torch TF32 allowed: {', '.join(k for k, v in r['torch_tf32'].items() if v) or 'no'}"
        L.append(f"- {r['engine']} {r['dtype']}: {r.get('version') or ''} {state}".replace("  ", " "))
    L.append("")
    L.append(
        f"## Offline: encode {a['seconds']:g} s per row, then decode its codes (median of {a['repeats']} after a warm-up)"
    )
    L.append("")
    L.append("RTF = audio seconds of all B rows ÷ wall seconds.")
    L.append("")
    L.append("| engine | dtype | B | encode | encode RTF | decode | decode RTF |")
    L.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in res["runs"]:
        for x in (x for x in r["rows"] if x["kind"] == "offline"):
            if x.get("ok"):
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {x['encode_s'] * 1e3:.1f} ms | "
                    f"{x['encode_rtf']:.1f} | {x['decode_s'] * 1e3:.1f} ms | {x['decode_rtf']:.1f} |"
                )
            else:
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {_cell_err(x.get('error'))} | | | |"
                )
    L.append("")
    L.append(
        f"## Streaming: `encode_step` + `decode_step` per 80 ms frame ({a['frames']} frames after {a['warmup']} warm-up)"
    )
    L.append("")
    L.append("Per stream = the frame time ÷ B. Real time: p99 of the frame ≤ 80 ms.")
    L.append("")
    L.append(
        "| engine | dtype | B | frame median | frame p99 | per stream median | per stream p99 | "
        "encode_step median | decode_step median | real time |"
    )
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in res["runs"]:
        for x in (x for x in r["rows"] if x["kind"] == "streaming"):
            if x.get("ok"):
                t = x["frame_total"]
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {_ms(t['median_us'])} | {_ms(t['p99_us'])} | "
                    f"{_ms(x['per_stream_median_us'])} | {_ms(x['per_stream_p99_us'])} | "
                    f"{_ms(x['encode_step']['median_us'])} | {_ms(x['decode_step']['median_us'])} | "
                    f"{'✅' if x['real_time'] else '❌'} |"
                )
            else:
                L.append(
                    f"| {r['engine']} | {r['dtype']} | {x['batch']} | {_cell_err(x.get('error'))} | | | | | | |"
                )
    L += render_masked(res)
    L += render_transformer(res)
    L.append("")
    L.append("## Code agreement (fraction of equal codes)")
    L.append("")
    if res["agreement"]:
        L.append(
            "| codes | against | offline (B) | offline, first codebook | streaming (B) | streaming, first codebook |"
        )
        L.append("| --- | --- | --- | --- | --- | --- |")
        for g in res["agreement"]:
            L.append(
                f"| {g['a']['engine']} {g['a']['dtype']} | {g['b']['engine']} {g['b']['dtype']} | "
                f"{_pct(g['offline'])} ({g['offline_batch']}) | {_pct(g['offline'], 'first_codebook_equal_fraction')} | "
                f"{_pct(g['streaming'])} ({g['stream_batch']}) | {_pct(g['streaming'], 'first_codebook_equal_fraction')} |"
            )
        L.append("")
        L.append("— : one side has no codes (it failed or was not run).")
    else:
        L.append("_no pair of engines/dtypes to compare_")
    return "\n".join(L).rstrip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
