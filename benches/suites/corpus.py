"""A folder of audio to codes: `mimi_py.data.tokenize` on a local Ray (bound to 127.0.0.1), with
1 and 2 workers of one thread each, against a plain loop (soundfile, the mean of the channels,
soxr, `MimiCodec.encode`) in one process; hours of audio per wall hour, and whether the codes
agree with the loop's."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import common

PEERS = ()
LENGTHS = [12, 45, 20, 38, 27, 33, 15, 50, 24, 30, 18, 42, 36, 22, 28, 40, 16, 35, 25, 44]  # 600 s
SIZES = {
    "tiny": {"seconds": [0.4, 0.3, 0.5], "workers": [1]},
    "full": {"seconds": LENGTHS, "workers": [1, 2]},
}
RATES = [24000, 16000, 44100, 24000]  # cycled; every third file is stereo
COLUMNS = "run=label | files | audio h per wall h=rate | wall s=wall_s | codes equal=codes_equal"


def make_corpus(folder: Path, seconds) -> None:
    """wav (24 and 16 kHz) and flac (44.1 kHz) files, mono and stereo."""
    import soundfile as sf

    folder.mkdir(parents=True, exist_ok=True)
    for i, sec in enumerate(seconds):
        sr = RATES[i % len(RATES)]
        chans = [common.smooth_noise(int(sec * sr), seed=100 + i + 100 * c) for c in range(1 + (i % 3 == 2))]
        path = folder / f"{i:02d}-{sr // 1000}k-{len(chans)}ch.{'flac' if sr == 44100 else 'wav'}"
        sf.write(path, np.stack(chans, axis=1), sr, subtype="PCM_16")


def jobs(ctx, sizes):
    folder = ctx.tmp / "corpus"
    make_corpus(folder, sizes["seconds"])
    base = dict(ctx.codec(), engine="mimi_py", threads=1, once=True)
    tasks = [{"kind": "loop", "folder": str(folder), "out": str(ctx.tmp / "corpus-loop.npz")}]
    out = [dict(base, label="plain loop", tasks=tasks)]
    for n in sizes["workers"]:
        task = {"kind": "tokenize", "folder": str(folder), "out": str(ctx.tmp / f"corpus-{n}"), "workers": n}
        out.append(dict(base, label=f"tokenize, {n} worker(s)", threads=n, tasks=[task]))
    return out, {}


def _config(job):
    import json

    import mimi_py

    return (
        mimi_py.CodecConfig.from_hf(json.loads(Path(job["hf_config"]).read_text()))
        if job["hf_config"]
        else None
    )


def measure(w, task) -> dict:
    import mimi_py

    job, t0 = w.job, time.perf_counter()
    files = sorted(Path(task["folder"]).iterdir())
    if task["kind"] == "loop":
        import soundfile as sf
        import soxr

        codec = mimi_py.MimiCodec(job["weights"], config=_config(job), num_codebooks=job["num_codebooks"])
        codes, audio = {}, 0.0
        for path in files:
            x, sr = sf.read(path, dtype="float32", always_2d=True)
            audio += len(x) / sr
            mono = x[:, 0] if x.shape[1] == 1 else x.mean(axis=1).astype(np.float32)
            mono = mono if sr == codec.sample_rate else soxr.resample(mono, sr, codec.sample_rate)
            codes[path.name] = codec.encode(mono)[0]
        np.savez(task["out"], **codes)
        wall = time.perf_counter() - t0
        return {
            "files": len(files),
            "audio_s": round(audio, 2),
            "wall_s": round(wall, 2),
            "rate": round(audio / wall, 1),
        }
    return _tokenize(task, job, files, t0)


def _tokenize(task, job, files, t0) -> dict:
    import logging

    import pyarrow.parquet as pq
    import ray

    from mimi_py import data

    ray.init(
        num_cpus=task["workers"],
        include_dashboard=False,
        logging_level=logging.WARNING,
        _node_ip_address="127.0.0.1",
    )
    try:
        m = data.tokenize(
            task["folder"],
            task["out"],
            weights=job["weights"],
            config=_config(job),
            num_codebooks=job["num_codebooks"],
            workers=task["workers"],
            threads_per_worker=1,
            progress_every=None,
        )
    finally:
        ray.shutdown()
    wall, audio = time.perf_counter() - t0, m["counts"]["audio_hours"] * 3600
    rows = pq.read_table(task["out"]).to_pylist()
    loop = np.load(str(Path(task["out"]).parent / "corpus-loop.npz"))
    same = all(np.array_equal(np.array(r["codes"]), loop[Path(r["path"]).name]) for r in rows)
    return {
        "files": len(rows),
        "audio_s": round(audio, 2),
        "wall_s": round(wall, 2),
        "rate": round(audio / wall, 1),
        "codes_equal": same,
    }
