"""Long streams, memory sampled as they go: the Mimi-shape transformer one token a call for
`steps` steps (45,000: an hour of frames at 12.5 Hz; its state must stop growing once its
context is in), then the real-size codec streaming `seconds` of audio through `encode_step`
and `decode_step`. Each phase's resident memory at its start, peak and end, and its growth
after warm-up (what a leak would show). Imports nothing of the bench at the top:
tests/threads loads `soak_transformer`, `soak_codec` and `summarize` from this file by path."""

from __future__ import annotations

import time

import numpy as np

PEERS = ()
SIZES = {
    "tiny": {"steps": 300, "seconds": 4.0, "every": 50},
    "full": {"steps": 45_000, "seconds": 600.0, "every": 500},
}
COLUMNS = (
    "phase | steps | s=elapsed_s | RSS start MiB=rss_start_mib | peak MiB=rss_peak_mib | "
    "end MiB=rss_end_mib | growth after warm-up MiB=rss_growth_after_warmup_mib | "
    "state bytes peak=state_nbytes_peak"
)


def jobs(ctx, sizes):
    tasks = [dict(sizes, kind="transformer"), dict(sizes, kind="codec")]
    return [
        {"engine": "mimi_py", "label": "soak", "threads": ctx.main_threads, "once": True, "tasks": tasks}
    ], {}


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))


def _sample(phase, i, position, state, frames, t0) -> dict:
    return {
        "phase": phase,
        "step": i,
        "position": position,
        "state_nbytes": state,
        "frames": frames,
        "rss_kib": rss_kib(),
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }


def soak_transformer(t, steps: int, sample_every: int = 500, seed: int = 0, batch: int = 1) -> list[dict]:
    """`steps` single steps through transformer `t`, from a fixed pool of inputs (the loop
    allocates nothing but the outputs); a sample every `sample_every` steps."""
    pool = np.random.default_rng(seed).standard_normal((64, batch, 1, t.d_model)).astype(np.float32)
    t0 = time.perf_counter()
    samples = [_sample("transformer", 0, t.position, t.state_nbytes, None, t0)]
    for i in range(1, steps + 1):
        y = t.step(pool[i % 64])
        if i % sample_every == 0 or i == steps:
            if not np.isfinite(y).all():
                raise RuntimeError(f"non-finite transformer output at step {i}")
            samples.append(_sample("transformer", i, t.position, t.state_nbytes, None, t0))
    return samples


def chirp(start: int, n: int, sample_rate: int) -> np.ndarray:
    """A slow chirp plus a little noise, amplitude ~0.3, from sample `start` on."""
    tt = np.arange(start, start + n, dtype=np.float64) / sample_rate
    f = 200.0 + 150.0 * np.sin(2 * np.pi * tt / 7.0)
    x = 0.25 * np.sin(2 * np.pi * np.cumsum(f) / sample_rate + 0.3 * tt)
    return (x + np.random.default_rng(start).standard_normal(n) * 0.02).astype(np.float32)


def soak_codec(codec, seconds: float, sample_every: int = 125, decode: bool = True) -> list[dict]:
    """`seconds` of audio through `encode_step` (and its codes through `decode_step`), one
    frame a call; checks that every frame came out, and every sample of it."""
    fs, frames, audio_out, t0 = codec.frame_size, 0, 0, time.perf_counter()
    n = int(round(seconds * codec.sample_rate / fs))
    samples = [_sample("codec", 0, 0, None, 0, t0)]
    for i in range(1, n + 1):
        codes = codec.encode_step(chirp((i - 1) * fs, fs, codec.sample_rate))
        if codes is not None:
            frames += codes.shape[-1]
            if decode:
                audio_out += codec.decode_step(codes).shape[-1]
        if i % sample_every == 0 or i == n:
            samples.append(_sample("codec", i, i * fs, None, frames, t0))
    if frames != n or (decode and audio_out != frames * fs):
        raise RuntimeError(f"{n} frames of audio gave {frames} frames of codes and {audio_out} samples back")
    return samples


def summarize(samples: list[dict]) -> dict:
    """A phase's figures from its samples."""
    rss = [s["rss_kib"] for s in samples]
    out = {
        "steps": samples[-1]["step"],
        "elapsed_s": samples[-1]["elapsed_s"],
        "rss_start_mib": round(rss[0] / 1024, 1),
    }
    out.update(rss_peak_mib=round(max(rss) / 1024, 1), rss_end_mib=round(rss[-1] / 1024, 1))
    later = rss[max(1, len(rss) // 10)] if len(rss) > 2 else rss[-1]
    out["rss_growth_after_warmup_mib"] = round((rss[-1] - later) / 1024, 1)
    nb = [s["state_nbytes"] for s in samples if s["state_nbytes"] is not None]
    if nb:
        out.update(state_nbytes_start=nb[0], state_nbytes_peak=max(nb), state_nbytes_end=nb[-1])
    return out


def measure(w, task) -> dict:
    import mimi_py

    if task["kind"] == "transformer":
        t = mimi_py.StreamingTransformer(mimi_py.TransformerConfig.mimi(), seed=0)
        samples = soak_transformer(t, task["steps"], task["every"])
    else:
        samples = soak_codec(mimi_py.MimiCodec(seed=0), task["seconds"], max(1, task["every"] // 4))
    return {"rows": [dict(summarize(samples), phase=task["kind"])], "samples": samples}
