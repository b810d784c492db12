"""Real clients for a running server: stream PCM to ``/encode`` or codes to ``/decode`` at
real-time pace (or faster) and measure each frame's latency.

A frame's latency runs from sending the message that holds its last sample (or its codes) to
receiving its result. The tests and ``benches/run.py --suites server`` load the server with
these clients; a deployment can point them at its own server the same way::

    import asyncio
    from mimi_py.serve.loadgen import encode_stream
    result = asyncio.run(encode_stream("ws://127.0.0.1:8765", pcm))
    print(result.summary())
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np

from .protocol import FORMATS, MAX_MESSAGE_BYTES

__all__ = ["StreamResult", "codec_info", "decode_stream", "encode_stream", "http_url", "latency_summary"]


def latency_summary(latencies: list[float], frame_rate: float = 12.5) -> dict:
    """Median and p99 (ms) of all frames, and the medians of the first and the last second."""
    if not latencies:
        return {"frames": 0}
    ms = np.asarray(latencies) * 1000
    n = max(1, int(frame_rate))
    return {
        "frames": len(ms),
        "median_ms": round(float(np.median(ms)), 1),
        "p99_ms": round(float(np.quantile(ms, 0.99)), 1),
        "first_second_median_ms": round(float(np.median(ms[:n])), 1),
        "last_second_median_ms": round(float(np.median(ms[-n:])), 1),
    }


@dataclass
class StreamResult:
    """What one client saw: its results in order, ``done``, the close code and latencies."""

    frames: list = field(default_factory=list)
    done: int | None = None
    close_code: int | None = None
    close_reason: str = ""
    latencies: list[float] = field(default_factory=list)
    out_of_order: int = 0

    def codes(self) -> np.ndarray:
        """An encode client's codes, (num_codebooks, frames) uint32."""
        return np.array(self.frames, np.uint32).T

    def pcm(self, fmt: str = "f32le") -> np.ndarray:
        """A decode client's audio, float32."""
        f = FORMATS[fmt]
        return np.concatenate([np.frombuffer(b, f.dtype) for b in self.frames]).astype(np.float32) / f.scale

    def summary(self, frame_rate: float = 12.5) -> dict:
        """:func:`latency_summary` of this client's frames."""
        return latency_summary(self.latencies, frame_rate)


def http_url(base_url: str) -> str:
    """``ws://`` -> ``http://``, ``wss://`` -> ``https://``."""
    return "http" + base_url.removeprefix("ws") if base_url.startswith("ws") else base_url


def codec_info(base_url: str, ssl=None) -> dict:
    """The served codec's shape (sample rate, frame size, frame rate, codebooks), from ``/health``
    (`ssl`: the client's ``ssl.SSLContext`` for a ``wss://`` server)."""
    import urllib.request

    with urllib.request.urlopen(http_url(base_url) + "/health", timeout=10, context=ssl) as r:
        return json.load(r)["codec"]


async def _send_paced(ws, messages: list[tuple[bytes, list[int]]], period: float, sent_at: dict) -> None:
    """Sends each message at t0 + i * period (period 0: at once), then ``end``; records, per
    frame completed by a message, the time it was sent."""
    t0 = time.perf_counter()
    for i, (msg, frames) in enumerate(messages):
        delay = t0 + i * period - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await ws.send(msg)
        now = time.perf_counter()
        for j in frames:
            sent_at[j] = now
    await ws.send("end")


async def _receive(ws, result: StreamResult, sent_at: dict) -> None:
    """Collects results until the server closes; latencies from ``sent_at``."""
    async for msg in ws:
        now = time.perf_counter()
        if isinstance(msg, str):
            m = json.loads(msg)
            if "done" in m:
                result.done = m["done"]
                continue
            result.out_of_order += m["frame"] != len(result.frames)
            msg = m["codes"]
        i = len(result.frames)
        result.frames.append(msg)
        if i in sent_at:
            result.latencies.append(now - sent_at[i])


async def _run(url: str, messages, period: float, connect_kwargs) -> StreamResult:
    """One connection: the paced sender and the receiver, until the server closes."""
    import websockets

    result, sent_at = StreamResult(), dict[int, float]()
    async with websockets.connect(url, max_size=MAX_MESSAGE_BYTES, compression=None, **connect_kwargs) as ws:
        sender = asyncio.create_task(_send_paced(ws, messages, period, sent_at))
        try:
            await _receive(ws, result, sent_at)
        except websockets.ConnectionClosed:
            pass
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        rcvd = ws.close_code, ws.close_reason
    result.close_code, result.close_reason = rcvd[0], rcvd[1] or ""
    return result


async def encode_stream(
    base_url: str,
    pcm: np.ndarray,
    *,
    fmt: str = "f32le",
    chunk: int = 480,
    realtime: bool = True,
    **connect_kwargs,
) -> StreamResult:
    """Streams mono 24 kHz ``pcm`` to ``/encode`` in messages of ``chunk`` samples, at real
    time (``realtime``) or at once, then ``end``; returns the codes and the latencies.
    ``connect_kwargs`` go to ``websockets.connect`` (``ssl=``, ``additional_headers=`` for a
    token: ``{"Authorization": "Bearer TOKEN"}``)."""
    info = await asyncio.to_thread(codec_info, base_url, connect_kwargs.get("ssl"))
    f, rate, frame = FORMATS[fmt], info["sample_rate"], info["frame_size"]
    data = np.frombuffer(f.from_float(np.asarray(pcm, np.float32)), f.dtype)
    messages = []
    for i in range(0, len(data), chunk):
        j = min(i + chunk, len(data))
        done = list(range(i // frame, j // frame)) if j // frame > i // frame else []
        messages.append((data[i:j].tobytes(), done))
    period = chunk / rate if realtime else 0.0
    return await _run(f"{base_url}/encode?format={fmt}", messages, period, connect_kwargs)


async def decode_stream(
    base_url: str, codes: np.ndarray, *, fmt: str = "f32le", frames_per_message: int = 1, realtime: bool = True,
    **connect_kwargs,
) -> StreamResult:  # fmt: skip
    """Streams ``codes`` ((num_codebooks, frames) integers) to ``/decode``,
    ``frames_per_message`` frames per message at real time (or at once), then ``end``."""
    frames = np.ascontiguousarray(np.asarray(codes).T, "<u4")
    messages = [
        (
            frames[i : i + frames_per_message].tobytes(),
            list(range(i, min(i + frames_per_message, len(frames)))),
        )
        for i in range(0, len(frames), frames_per_message)
    ]
    period = (
        frames_per_message
        / (await asyncio.to_thread(codec_info, base_url, connect_kwargs.get("ssl")))["frame_rate"]
        if realtime
        else 0.0
    )
    return await _run(f"{base_url}/decode?format={fmt}", messages, period, connect_kwargs)
