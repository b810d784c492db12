"""Hostile, slow and surplus clients against the real server: each kind is closed with its
documented code (docs/protocol.md) while a well-behaved client streams beside it and stays
exact; then SIGTERM shuts the server down gracefully (queued frames, then 1001, exit 0)."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import struct

import numpy as np
import pytest

import mimi_py
from support.extras import optional
from support.servers import health, health_until, running_server

pytestmark = pytest.mark.extra("serve")
with optional("serve"):
    import websockets

    from mimi_py.serve import loadgen

FRAME = 1920


def noise(frames: int, seed: int) -> np.ndarray:
    return (0.2 * np.random.default_rng(seed).standard_normal(frames * FRAME)).astype(np.float32)


async def closed_with(url: str, *messages, connect=None) -> tuple[int, str]:
    """Sends the messages, then reads until the server closes; returns (code, reason)."""
    async with websockets.connect(url, max_size=2**25, **(connect or {})) as ws:
        try:
            for m in messages:
                await ws.send(m)
            async for _ in ws:
                pass
        except websockets.ConnectionClosed:
            pass
        return ws.close_code, ws.close_reason


HOSTILE = {
    "pcm that is not whole samples": ("/encode", [b"\x00" * 4001], 1007, "not whole f32le samples"),
    "s16le that is not whole samples": (
        "/encode?format=s16le",
        [b"\x00" * 3],
        1007,
        "not whole s16le samples",
    ),
    "codes that are not whole frames": (
        "/decode",
        [b"\x00" * 20],
        1007,
        "not whole frames of 4 uint32 codes",
    ),
    "a code above the cardinality": (
        "/decode",
        [np.array([1, 2, 3, 64], "<u4").tobytes()],
        1007,
        "code 64 (codebook 3 of the message's frame 0) is not below the cardinality 64",
    ),
    "data after end": ("/encode", [b"\x00" * 8, "end", b"\x00" * 8], 1007, "after 'end'"),
    "an unknown text message": ("/encode", ['{"start": true}'], 1003, "unknown text message"),
    "more than 10 s ahead of real time": ("/encode", [np.zeros(11 * 24000, "<f4").tobytes()], 1008, "ahead"),
}


def test_each_hostile_client_gets_its_close_code_and_the_others_stay_exact(
    serve_checkpoint, serve_offline, tmp_path
):
    good = noise(40, 1)

    async def scenario(url):
        honest = asyncio.create_task(loadgen.encode_stream(url, good))  # 3.2 s at real time
        await health_until(url, lambda h: h["frames_served"] >= 1, "served the honest client")
        seen = {}
        for name, (path, messages, _, _) in HOSTILE.items():
            seen[name] = await closed_with(url + path, *messages)
        return seen, await honest

    with running_server(["--slots", "2", "--weights", str(serve_checkpoint)], tmp_path / "log") as (
        url,
        proc,
    ):
        seen, honest = asyncio.run(asyncio.wait_for(scenario(url), timeout=60))
        h = health(url)
        assert proc.poll() is None, "the server must survive every hostile client"
    for name, (_, _, code, reason) in HOSTILE.items():
        assert seen[name][0] == code and reason in seen[name][1], f"{name}: {seen[name]}"
    np.testing.assert_array_equal(honest.codes(), serve_offline.encode(good)[0])
    assert honest.close_code == 1000 and honest.done == 40
    for code in (1003, 1007, 1008):
        assert h["closed"].get(str(code), 0) >= 1, h["closed"]


def oversized_message_close(url: str) -> tuple[int, bytes]:
    """A raw client: the opening handshake, then the header of a 16 MiB + 4 byte binary frame;
    returns the close code and reason the server answers with (before any payload is sent)."""
    host, port = url.removeprefix("ws://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            f"GET /encode HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 101"), reply
        rest = reply.split(b"\r\n\r\n", 1)[1]
        s.sendall(bytes([0x82, 0xFF]) + struct.pack(">Q", 16 * 2**20 + 4) + os.urandom(4))
        while len(rest) < 2 or len(rest) < 2 + rest[1]:
            rest += s.recv(4096)
    assert rest[0] == 0x88, rest  # a close frame
    return struct.unpack(">H", rest[2:4])[0], rest[4 : 2 + rest[1]]


def test_a_message_over_16_mib_is_closed_with_1009(serve_checkpoint, tmp_path):
    with running_server(["--slots", "2", "--weights", str(serve_checkpoint)], tmp_path / "log") as (
        url,
        proc,
    ):
        code, reason = oversized_message_close(url)
        assert proc.poll() is None and health(url)["closed"].get("1009") == 1
    assert code == 1009 and b"exceeds limit of 16777216 bytes" in reason, (code, reason)


def test_a_burst_beyond_the_slots_is_turned_away_with_1013(serve_checkpoint, serve_offline, tmp_path):
    audios = [noise(10, 10 + i) for i in range(8)]

    async def scenario(url):
        return await asyncio.gather(*(loadgen.encode_stream(url, a, realtime=False) for a in audios))

    with running_server(["--slots", "3", "--weights", str(serve_checkpoint)], tmp_path / "log") as (url, _):
        results = asyncio.run(asyncio.wait_for(scenario(url), timeout=60))
        h = health(url)
    served = [i for i, r in enumerate(results) if r.close_code == 1000]
    refused = [r for r in results if r.close_code == 1013]
    assert len(served) >= 3 and len(served) + len(refused) == 8, [r.close_code for r in results]
    assert all("all 3 slots are busy" in r.close_reason and not r.frames for r in refused)
    for i in served:
        np.testing.assert_array_equal(results[i].codes(), serve_offline.encode(audios[i])[0])
    assert h["closed"].get("1013", 0) == len(refused) and h["slots"]["busy"] == 0


def test_a_client_that_stops_reading_is_closed_with_1008_and_the_others_go_on(
    serve_checkpoint, serve_offline, tmp_path
):
    codes = serve_offline.encode(noise(120, 2))[0]  # 9.6 s of codes, sent at once
    good = noise(30, 3)

    async def slow(url):
        host, port = url.removeprefix("ws://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        async with websockets.connect(url + "/decode", sock=sock, max_queue=1) as ws:
            await ws.send(np.ascontiguousarray(codes.T, "<u4").tobytes())
            # not reading, until the server gives up on it
            await health_until(url, lambda h: h["closed"].get("1008", 0) >= 1, "closed it with 1008", 30)
            frames = 0
            try:
                async for _ in ws:
                    frames += 1
            except websockets.ConnectionClosed:
                pass
            return ws.close_code, ws.close_reason, frames

    async def scenario(url):
        return await asyncio.gather(slow(url), loadgen.encode_stream(url, good))

    with running_server(["--slots", "2", "--weights", str(serve_checkpoint)], tmp_path / "log") as (url, _):
        (code, reason, frames), honest = asyncio.run(asyncio.wait_for(scenario(url), timeout=60))
    assert code == 1008 and "too slow to take its frames" in reason, (code, reason)
    assert 0 < frames < 120
    np.testing.assert_array_equal(honest.codes(), serve_offline.encode(good)[0])


def test_sigterm_sends_the_queued_frames_then_1001_and_exits_0(serve_checkpoint, tmp_path):
    async def scenario(url, proc):
        async with websockets.connect(url + "/encode") as ws:
            await ws.send(noise(100, 4).tobytes())  # 8 s ahead
            frames = [await ws.recv() for _ in range(5)]  # stepping, with 95 frames to go
            proc.send_signal(signal.SIGTERM)
            try:
                async for m in ws:
                    frames.append(m)
            except websockets.ConnectionClosed:
                pass
            return ws.close_code, frames

    with running_server(["--slots", "2", "--weights", str(serve_checkpoint)], tmp_path / "log") as (
        url,
        proc,
    ):
        code, frames = asyncio.run(asyncio.wait_for(scenario(url, proc), timeout=30))
        assert proc.wait(timeout=20) == 0
    assert code == 1001
    assert 5 <= len(frames) < 100
    assert [m for m in frames if '"frame"' in m] == frames  # frames only, in order below
    assert [int(m.split(",")[0].split(":")[1]) for m in frames] == list(range(len(frames)))


class FailsOnce:
    """The real codec, but its next encode_step raises (a failure no client can provoke)."""

    def __init__(self, codec):
        self.codec, self.armed = codec, False

    def __getattr__(self, name):
        return getattr(self.codec, name)

    def encode_step(self, *args, **kwargs):
        if self.armed:
            self.armed = False
            raise mimi_py.ComputeError("an injected failure")
        return self.codec.encode_step(*args, **kwargs)


def test_a_failed_step_closes_its_clients_with_1011_and_the_server_goes_on(serve_checkpoint, serve_offline):
    from mimi_py.serve import Server, run_server

    codec = FailsOnce(mimi_py.MimiCodec(serve_checkpoint))
    server, audio = Server(codec, 2), noise(10, 7)

    async def scenario():
        stop, ports = asyncio.Event(), asyncio.Queue()
        task = asyncio.create_task(run_server(server, "127.0.0.1", 0, stop, ports.put_nowait))
        url = f"ws://127.0.0.1:{await ports.get()}"
        codec.armed = True
        failed = await loadgen.encode_stream(url, audio, realtime=False)
        after = await loadgen.encode_stream(url, audio, realtime=False)
        stop.set()
        await task
        return failed, after

    failed, after = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert failed.close_code == 1011 and "failed to step" in failed.close_reason, failed
    assert after.close_code == 1000 and after.done == 10
    np.testing.assert_array_equal(after.codes(), serve_offline.encode(audio)[0])
    assert server.stats.closed[1011] == 1
