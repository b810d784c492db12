"""Streams held end to end through `mimi-py serve`: for each precision and slot count N, a fresh
server with N slots takes N real WebSocket clients (mimi_py.serve.loadgen) streaming at
real-time pace, their phases spread over a tick; a frame's latency runs from the message
holding its last sample to its codes. N streams are held when every client got all its frames
and the p99 stays within two frame periods (160 ms). Then a `--slots auto` server: as many
clients as it measured at start-up, and two more, which must be turned away (close 1013)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import urllib.request

import numpy as np

import common

PEERS = ()
HELD_P99_MS = 160.0
# chunk: samples a client sends a message (tiny: the fixture codec seats dozens of clients, and
# one message a frame keeps them light).
SIZES = {"tiny": {"slots": [1, 2], "seconds": 1.6, "chunk": 1920}}
SIZES["full"] = {"slots": [1, 2, 4, 6, 8, 10, 12], "seconds": 6.0, "chunk": 480}
COLUMNS = "precision | slots | clients | complete | p99 ms=p99_ms | median ms=median_ms | held"


def jobs(ctx, sizes):
    weights = []
    if ctx.tiny:
        folder = ctx.tmp / "server-codec"
        folder.mkdir(exist_ok=True)
        shutil.copy(common.CODEC_FIXTURES / "mimi_small_hf_config.json", folder / "config.json")
        shutil.copy(common.CODEC_FIXTURES / "mimi_small.safetensors", folder / "model.safetensors")
        weights = ["--weights", str(folder)]
    tasks = [dict(sizes, kind="server", precision=p, args=weights) for p in ctx.precisions]
    return [{"engine": "mimi_py", "label": "mimi-py serve", "once": True, "tasks": tasks}], {}


def _speech(seconds: float, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * 24000)) / 24000
    noise = 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * np.sin(2 * np.pi * (140 + 30 * seed) * t) + noise).astype(np.float32)


@contextlib.contextmanager
def serving(slots: str, args: list[str]):
    """A `mimi-py serve` process on a free port; its ws:// URL."""
    cmd = [sys.executable, "-m", "mimi_py", "serve", "--port", "0", "--slots", slots, *args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            yield proc.stdout.readline().split()[2]
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def health(url: str) -> dict:
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/health", timeout=10) as r:
        return json.loads(r.read().decode())


def clients(url: str, n: int, extra: int, task: dict) -> tuple[list, list]:
    """n real-time clients, phases spread over a tick; once they stream, `extra` more."""
    from mimi_py.serve import loadgen

    seconds = task["seconds"]
    audios = [_speech(seconds, i) for i in range(n + extra)]
    asyncio.run(loadgen.encode_stream(url, audios[0][:4800], realtime=False))  # warm-up

    async def one(i):
        await asyncio.sleep((i + 0.5) / n * 0.080 if i < n else 0.5)
        return await loadgen.encode_stream(url, audios[i], chunk=task["chunk"])

    async def run():
        return await asyncio.gather(*(one(i) for i in range(n + extra)))

    done = asyncio.run(asyncio.wait_for(run(), timeout=seconds * 4 + 60))
    return done[:n], done[n:]


def measure(w, task) -> dict:
    from mimi_py.serve import loadgen

    frames, runs = int(np.ceil(task["seconds"] * 12.5)), []
    args = [*task["args"], "--precision", task["precision"], "--threads", str(w.job["threads"])]
    for n in [*task["slots"], "auto"]:
        with serving(str(n), args) as url:
            seated = health(url)["calibration"]["slots"] if n == "auto" else n
            got, extra = clients(url, seated, 2 if n == "auto" else 0, task)
        summary = loadgen.latency_summary([x for r in got for x in r.latencies])
        complete = all(r.done == frames and r.close_code == 1000 and not r.out_of_order for r in got)
        run = {"slots": str(n), "clients": seated, "complete": complete, **summary}
        run["held"] = bool(complete and summary["p99_ms"] <= HELD_P99_MS)
        run["extra_turned_away"] = (
            all(r.close_code == 1013 and not r.frames for r in extra) if extra else None
        )
        runs.append(run)
        if n != "auto" and not run["held"] and len(task["slots"]) > 2:
            break  # larger slot counts miss too
    held = max([r["clients"] for r in runs if r["held"] and r["slots"] != "auto"], default=0)
    return {"rows": runs, "streams_held": held}
