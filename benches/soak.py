#!/usr/bin/env python
"""Soak run: stream the Mimi-shape transformer and the Mimi codec for a long time, sampling RSS.

Two phases, each sampled every ``--sample-every`` steps (chunks for the codec):

1. ``StreamingTransformer(TransformerConfig.mimi(), seed=0)`` (d_model 512, 8 layers, context
   250, seeded weights), batch 1, one time step per call, for ``--steps`` steps (default
   45,000: one hour of Mimi frames at 12.5 Hz). Each sample records the stream position,
   ``state_nbytes`` (bytes of streaming state: must stop growing once ``context`` steps are
   in) and the process RSS (``VmRSS`` from ``/proc/self/status``).
2. ``MimiCodec(seed=0)`` (the real architecture, seeded weights), streaming ``--seconds`` of
   24 kHz audio (default 600 s, ten minutes) through ``encode_step`` in 1920-sample chunks
   and the codes back through ``decode_step`` (``--no-decode`` to skip it).

Prints start / peak / end RSS per phase and writes every sample to ``soak.csv`` and a summary
plus the samples to ``soak.json`` in ``--out`` (default: ``$TMPDIR/mimi_soak``).

    python benches/soak.py                          # the full run (about an hour on 2 cores)
    python benches/soak.py --steps 3000 --seconds 60  # a short run

The functions ``soak_transformer`` and ``soak_codec`` are also used, with a small model, by
``tests/threads/test_threads_soak.py``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time

import numpy as np

FIELDS = ["phase", "step", "position", "state_nbytes", "frames", "rss_kib", "elapsed_s"]


def rss_kib() -> int:
    """Resident set size of this process in KiB (VmRSS); the peak RSS where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def soak_transformer(
    t, steps: int, sample_every: int = 500, seed: int = 0, batch: int = 1, progress=None
) -> list[dict]:
    """Streams `steps` single time steps through transformer `t`; returns the samples."""
    rng = np.random.default_rng(seed)
    # A fixed pool of inputs, so the loop allocates nothing but the outputs.
    pool = rng.standard_normal((64, batch, 1, t.d_model)).astype(np.float32)
    t0 = time.perf_counter()

    def sample(i):
        return {
            "phase": "transformer",
            "step": i,
            "position": t.position,
            "state_nbytes": t.state_nbytes,
            "frames": None,
            "rss_kib": rss_kib(),
            "elapsed_s": round(time.perf_counter() - t0, 3),
        }

    samples = [sample(0)]
    for i in range(1, steps + 1):
        y = t.step(pool[i % 64])
        if i % sample_every == 0 or i == steps:
            if not np.isfinite(y).all():
                raise RuntimeError(f"non-finite transformer output at step {i}")
            samples.append(sample(i))
            if progress:
                progress(samples[-1])
    return samples


def chirp(start: int, n: int, sample_rate: int) -> np.ndarray:
    """A deterministic test signal: a slow chirp plus a little noise, amplitude ~0.3."""
    idx = np.arange(start, start + n, dtype=np.float64)
    tt = idx / sample_rate
    f = 200.0 + 150.0 * np.sin(2 * np.pi * tt / 7.0)
    x = 0.25 * np.sin(2 * np.pi * np.cumsum(f) / sample_rate + 0.3 * tt)
    noise = np.random.default_rng(start).standard_normal(n) * 0.02
    return (x + noise).astype(np.float32)


def soak_codec(
    codec,
    seconds: float,
    sample_every: int = 125,
    decode: bool = True,
    chunk: int | None = None,
    progress=None,
) -> list[dict]:
    """Streams `seconds` of audio through codec.encode_step (and the codes through
    decode_step) in chunks of `chunk` samples (default: one frame); returns the samples."""
    chunk = chunk or codec.frame_size
    n_chunks = int(round(seconds * codec.sample_rate / chunk))
    frames = 0
    audio_out = 0
    t0 = time.perf_counter()

    def sample(i):
        return {
            "phase": "codec",
            "step": i,
            "position": i * chunk,
            "state_nbytes": None,
            "frames": frames,
            "rss_kib": rss_kib(),
            "elapsed_s": round(time.perf_counter() - t0, 3),
        }

    samples = [sample(0)]
    for i in range(1, n_chunks + 1):
        pcm = chirp((i - 1) * chunk, chunk, codec.sample_rate)
        codes = codec.encode_step(pcm)
        if codes is not None:
            frames += codes.shape[-1]
            if decode:
                audio = codec.decode_step(codes)
                audio_out += 0 if audio is None else audio.shape[-1]
        if i % sample_every == 0 or i == n_chunks:
            samples.append(sample(i))
            if progress:
                progress(samples[-1])
    expected = (n_chunks * chunk) // codec.frame_size
    if frames != expected:
        raise RuntimeError(
            f"the stream gave {frames} frames for {n_chunks * chunk} samples, expected {expected}"
        )
    if decode and audio_out != frames * codec.frame_size:
        raise RuntimeError(f"decode_step gave {audio_out} samples for {frames} frames")
    return samples


def summarize(samples: list[dict]) -> dict:
    rss = [s["rss_kib"] for s in samples]
    out = {
        "samples": len(samples),
        "steps": samples[-1]["step"],
        "elapsed_s": samples[-1]["elapsed_s"],
        "rss_start_mib": round(rss[0] / 1024, 1),
        "rss_peak_mib": round(max(rss) / 1024, 1),
        "rss_end_mib": round(rss[-1] / 1024, 1),
        # growth after warm-up (the first sample after 10% of the run, at least the second
        # sample): what a leak would show; the state itself fills up during warm-up
        "rss_growth_after_warmup_mib": round((rss[-1] - rss[max(1, len(rss) // 10)]) / 1024, 1)
        if len(rss) > 2
        else 0.0,
    }
    nb = [s["state_nbytes"] for s in samples if s["state_nbytes"] is not None]
    if nb:
        out.update(state_nbytes_start=nb[0], state_nbytes_peak=max(nb), state_nbytes_end=nb[-1])
    if samples[-1]["frames"] is not None:
        out["frames"] = samples[-1]["frames"]
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=45_000, help="transformer steps (default 45000)")
    ap.add_argument("--seconds", type=float, default=600.0, help="seconds of codec audio (default 600)")
    ap.add_argument(
        "--sample-every",
        type=int,
        default=500,
        help="transformer steps between RSS samples (default 500); the codec is "
        "sampled every sample-every/4 chunks",
    )
    ap.add_argument("--no-decode", action="store_true", help="codec: encode_step only")
    ap.add_argument("--skip-transformer", action="store_true")
    ap.add_argument("--skip-codec", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out",
        default=os.path.join(tempfile.gettempdir(), "mimi_soak"),
        help="output folder for soak.csv and soak.json",
    )
    return ap.parse_args(argv)


def write_results(args, samples: list[dict], summary: dict) -> tuple[str, str]:
    """soak.csv (one row per sample) and soak.json (the summary and the samples); their paths."""
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "soak.csv")
    json_path = os.path.join(args.out, "soak.json")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(samples)
    with open(json_path, "w") as f:
        json.dump({"summary": summary, "samples": samples}, f, indent=1)
    return csv_path, json_path


def print_summary(summary: dict) -> None:
    print("\nsummary")
    for phase in ("transformer", "codec"):
        if phase in summary:
            s = summary[phase]
            line = (
                f"  {phase:11s} RSS start {s['rss_start_mib']} MiB, peak {s['rss_peak_mib']} MiB, "
                f"end {s['rss_end_mib']} MiB (growth after warm-up "
                f"{s['rss_growth_after_warmup_mib']} MiB), {s['steps']} steps in {s['elapsed_s']:.0f} s"
            )
            if "state_nbytes_peak" in s:
                line += (
                    f"; state_nbytes start {s['state_nbytes_start']}, peak "
                    f"{s['state_nbytes_peak']}, end {s['state_nbytes_end']}"
                )
            if "frames" in s:
                line += f"; {s['frames']} frames"
            print(line)


def main(argv=None) -> int:
    args = parse_args(argv)

    rss_import0 = rss_kib()
    import mimi_py

    print(
        f"mimi_py {mimi_py.__version__} (candle {mimi_py.candle_version}), pid {os.getpid()}, "
        f"{os.cpu_count()} CPUs, RSS after importing numpy: {rss_import0 / 1024:.1f} MiB"
    )
    samples: list[dict] = []
    summary: dict = {"args": vars(args)}

    def progress(s):
        extra = f"state {s['state_nbytes']} B" if s["state_nbytes"] is not None else f"{s['frames']} frames"
        print(
            f"  {s['phase']:11s} step {s['step']:>7d}  RSS {s['rss_kib'] / 1024:8.1f} MiB  "
            f"{extra}  {s['elapsed_s']:.0f} s",
            flush=True,
        )

    if not args.skip_transformer:
        cfg = mimi_py.TransformerConfig.mimi()
        t = mimi_py.StreamingTransformer(cfg, seed=args.seed)
        print(
            f"transformer: {cfg.d_model} d_model, {cfg.num_layers} layers, context "
            f"{cfg.context}, {args.steps} steps ({args.steps / 12.5 / 60:.1f} min of frames)"
        )
        s = soak_transformer(t, args.steps, args.sample_every, seed=args.seed, progress=progress)
        samples += s
        summary["transformer"] = summarize(s)
        del t
    if not args.skip_codec:
        codec = mimi_py.MimiCodec(seed=args.seed)
        every = max(1, args.sample_every // 4)
        print(
            f"codec: real architecture (seeded), {args.seconds:.0f} s of audio in "
            f"{codec.frame_size}-sample chunks, encode_step{'' if args.no_decode else ' + decode_step'}"
        )
        s = soak_codec(codec, args.seconds, every, decode=not args.no_decode, progress=progress)
        samples += s
        summary["codec"] = summarize(s)

    csv_path, json_path = write_results(args, samples, summary)
    print_summary(summary)
    print(f"  samples: {csv_path}\n  summary: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
