"""mimi_py.serve, for real: the server (``python -m mimi_py.serve``) in a subprocess on 127.0.0.1,
several WebSocket clients that join and leave at different times. Each finished client's codes must equal an
offline `MimiCodec.encode` of its audio, with no frame lost or duplicated. Bounded in time."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mimi_py
from fixtures import CODEC_DIR

websockets = pytest.importorskip("websockets", reason="the serve extra (websockets) is not installed")

REPO = Path(__file__).resolve().parents[1]
RATE = 24000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The small fixture codec as a checkpoint directory (config.json + model.safetensors)."""
    d = tmp_path_factory.mktemp("small_codec")
    shutil.copy(CODEC_DIR / "mimi_small_hf_config.json", d / "config.json")
    shutil.copy(CODEC_DIR / "mimi_small.safetensors", d / "model.safetensors")
    return d


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    """The server on a free port of 127.0.0.1 (3 slots, 5 ms ticks), killed at the end."""
    cmd = [sys.executable, "-m", "mimi_py.serve", "--port", "0", "--slots", "3"]
    cmd += ["--weights", str(checkpoint), "--tick-ms", "5", "--decode"]
    log = tmp_path_factory.mktemp("serve") / "stderr.txt"
    with open(log, "w") as err, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True) as proc:
        try:
            line = proc.stdout.readline()
            assert line.startswith("listening on "), line + log.read_text()
            yield line.split()[2]
        finally:
            proc.kill()
            proc.communicate(timeout=10)


async def client(url, audio, chunk, delay=0.0, leave_after=None):
    """Sends `audio` in chunks, then `end`; returns (codes frames, audio frames, done count).
    With `leave_after` (samples), disconnects without `end` once that much is sent."""
    await asyncio.sleep(delay)
    codes, pcm, done = [], [], None
    async with websockets.connect(url, max_size=2**24) as ws:
        for i in range(0, len(audio), chunk):
            await ws.send(audio[i : i + chunk].astype("<f4").tobytes())
            if leave_after is not None and i + chunk >= leave_after:
                return None
            await asyncio.sleep(0.002)
        await ws.send("end")
        async for msg in ws:
            if isinstance(msg, bytes):
                pcm.append(np.frombuffer(msg, "<f4"))
                continue
            msg = json.loads(msg)
            if "done" in msg:
                done = msg["done"]
            else:
                assert msg["frame"] == len(codes), "frames must arrive in order, once each"
                codes.append(msg["codes"])
    return np.array(codes).T, pcm, done


def speech(frames, seed):
    """`frames` whole frames (80 ms each) of a pitched tone in noise. Whole frames: a stream
    pads a last partial frame with zeros, where the offline encode pads every layer."""
    rng = np.random.default_rng(seed)
    t = np.arange(frames * 1920) / RATE
    return (0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t) + 0.05 * rng.standard_normal(len(t))).astype(
        np.float32
    )


def test_clients_joining_and_leaving_get_exactly_their_offline_codes(server, checkpoint):
    audios = [speech(n, i) for i, n in enumerate([11, 16, 6, 9, 4])]

    async def scenario():
        return await asyncio.gather(
            client(server, audios[0], 1000),
            client(server, audios[1], 3000, delay=0.05),
            client(server, audios[2], 700, delay=0.1, leave_after=5000),  # leaves mid-stream
            client(server, audios[3], 1920, delay=0.6),  # joins after a slot freed up
            client(server, audios[4], 4096, delay=0.9),
        )

    results = asyncio.run(asyncio.wait_for(scenario(), timeout=90))
    offline = mimi_py.MimiCodec(checkpoint)
    assert results[2] is None
    for i in (0, 1, 3, 4):
        codes, pcm, done = results[i]
        expect = offline.encode(audios[i])[0]
        assert done == expect.shape[1] == codes.shape[1], f"client {i}: frame count"
        np.testing.assert_array_equal(codes, expect, err_msg=f"client {i}: codes")
        assert len(pcm) == done and all(len(p) == offline.frame_size for p in pcm)
        np.testing.assert_allclose(
            np.concatenate(pcm), offline.decode(expect[None])[0, 0], atol=1e-4, rtol=1e-4
        )


def test_a_full_server_turns_a_client_away_with_a_clear_close_code(server):
    async def scenario():
        async def hold():
            async with websockets.connect(server) as ws:
                await ws.send(np.zeros(10, "<f4").tobytes())
                await asyncio.sleep(0.5)

        holders = [asyncio.create_task(hold()) for _ in range(3)]
        await asyncio.sleep(0.2)
        async with websockets.connect(server) as ws:
            with pytest.raises(websockets.ConnectionClosed) as ei:
                await asyncio.wait_for(ws.recv(), timeout=10)
        await asyncio.gather(*holders)
        return ei.value.rcvd.code

    assert asyncio.run(asyncio.wait_for(scenario(), timeout=30)) == 1013


def test_the_example_script_runs_the_packaged_server():
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "serve.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m mimi_py.serve") and "--tick-ms" in r.stdout
