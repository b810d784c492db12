"""The corpus suite of benches/run.py: mimi_py.data.tokenize on a local Ray against a plain
Python loop over MimiCodec.encode, on a generated folder of audio files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import common

from . import log, ratio
from .children import run_child
from .suites import busy_core_seconds, codec_spec

# Lengths (s) of the corpus suite's files: 20 files, 600 s; tiny: 3 files, 1.2 s.
CORPUS_SECONDS = [12, 45, 20, 38, 27, 33, 15, 50, 24, 30, 18, 42, 36, 22, 28, 40, 16, 35, 25, 44]
CORPUS_SECONDS_TINY = [0.4, 0.3, 0.5]
CORPUS_RATES = [24000, 16000, 44100, 24000]  # cycled; every third file is stereo
# Goals on 2 cores: Ray's overhead per core against the plain loop, and 2 workers' throughput
# over 1 worker's.
CORPUS_GOALS = {"ray_overhead_per_core": ("max", 0.10), "two_over_one_worker": ("min", 1.8)}


def make_corpus(folder: Path, tiny: bool) -> list[str]:
    """The corpus suite's audio: wav (24/16 kHz) and flac (44.1 kHz) files, mono and stereo."""
    import numpy as np
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, sec in enumerate(CORPUS_SECONDS_TINY if tiny else CORPUS_SECONDS):
        sr = CORPUS_RATES[i % len(CORPUS_RATES)]
        n = int(round(sec * sr))
        chans = [common.smooth_noise(n, seed=100 + i)]
        if i % 3 == 2:
            chans.append(common.smooth_noise(n, seed=200 + i))
        path = folder / f"{i:02d}-{sr // 1000}k-{len(chans)}ch.{'flac' if sr == 44100 else 'wav'}"
        sf.write(path, np.stack(chans, axis=1), sr, subtype="PCM_16")
        files.append(str(path))
    return files


def _measured(args, runs: list, label: str, spec: dict, cores_used: int) -> dict:
    """Runs one corpus measurement in a fresh process, adds its rates, appends it to `runs`."""
    log(f"corpus: {label}")
    c0 = common.cpu_times()
    res = run_child(spec, 1, args.timeout)
    res["busy_core_s"] = busy_core_seconds(c0, common.cpu_times())
    res["label"], res["cores"] = label, cores_used
    if res.get("ok"):
        rate = res["audio_s"] / res["wall_s"]
        res["audio_h_per_wall_h"] = round(rate, 2)
        res["audio_h_per_core_h"] = round(rate / cores_used, 2)
        if res["busy_core_s"]:
            res["audio_h_per_busy_core_h"] = round(res["audio_s"] / res["busy_core_s"], 2)
    runs.append(res)
    return res


def _corpus_goals(runs: list, loop: dict, tiny: bool) -> list:
    """CORPUS_GOALS against the runs: measured, met (None when a run is missing)."""
    ok = {r["label"]: r for r in runs if r.get("ok")}
    one = ok.get("tokenize, 1 worker x 1 thread")
    two = ok.get("tokenize, 2 workers x 1 thread")
    measured_goals = {
        "ray_overhead_per_core": round(1 - one["audio_h_per_core_h"] / loop["audio_h_per_core_h"], 3)
        if one and loop.get("ok")
        else None,
        "two_over_one_worker": ratio(two["audio_h_per_wall_h"], one["audio_h_per_wall_h"])
        if one and two
        else None,
    }
    goals = []
    for key, (kind, bound) in CORPUS_GOALS.items():
        m = measured_goals[key]
        goals.append(
            {
                "key": key,
                "kind": kind,
                "bound": bound,
                "measured": m,
                "met": None if m is None else (m <= bound if kind == "max" else m >= bound),
                "meaningful": not tiny,
            }
        )
    return goals


def suite_corpus(args, weights, tmp: Path) -> dict:
    """mimi_py.data.tokenize against a plain Python loop over MimiCodec.encode: the same files,
    the same codes (checked), 1 thread per worker. Each run is a fresh process; tokenize's runs
    start their own local Ray (timed apart: on a cluster Ray is already up)."""
    missing = [m for m in ("ray", "pyarrow", "soundfile", "soxr") if importlib.util.find_spec(m) is None]
    if missing:
        return {"skipped": f"needs the data extra (pip install '.[data]'): {', '.join(missing)} missing"}
    import numpy as np

    from mimi_py import data

    files = make_corpus(tmp / "corpus", args.tiny)
    base = dict(codec_spec(args, weights), files=files)
    cores = common.cpu_count_available()
    runs: list = []
    loop_codes = tmp / "corpus-loop-codes.npz"
    loop_spec = dict(base, task="corpus_loop", codes_out=str(loop_codes))
    loop = _measured(args, runs, "plain loop, 1 process", loop_spec, 1)
    ref = dict(np.load(loop_codes)) if loop.get("ok") else None
    for workers in [1] if args.tiny else [1, 2]:
        out = tmp / f"corpus-codes-{workers}"
        spec = dict(
            base,
            task="corpus_tokenize",
            corpus=str(tmp / "corpus"),
            out=str(out),
            workers=workers,
            ray_cpus=max(cores, workers),
        )
        label = f"tokenize, {workers} worker{'s' if workers > 1 else ''} x 1 thread"
        res = _measured(args, runs, label, spec, workers)
        if res.get("ok") and ref is not None:
            t = data.read_codes(out)
            got = dict(zip(t.column("path").to_pylist(), data.codes_to_numpy(t.column("codes"))))
            res["codes_equal"] = all(
                got.get(f) is not None and np.array_equal(got[f], ref[str(i)]) for i, f in enumerate(files)
            )
    return {
        "files": len(files),
        "audio_s": round(sum(r["audio_s"] for r in runs[:1] if r.get("ok")), 3) or None,
        "threads_per_worker": 1,
        "cpu_cores_available": cores,
        "runs": runs,
        "goals": _corpus_goals(runs, loop, args.tiny),
    }
