"""The server (``mimi-py serve``) for real: a subprocess on 127.0.0.1 with the small fixture
codec and real 80 ms ticks, and real WebSocket clients (mimi_py.serve.loadgen) at real-time
pace or at once. Every whole frame's codes equal ``MimiCodec.encode``'s, every decoded frame
equals ``MimiCodec.decode``'s, and latency is checked by counting the frames that fall late."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import numpy as np
import pytest

from support.extras import optional
from support.paths import REPO
from support.servers import assert_real_time, health, http_get, late_per_window, running_server

pytestmark = pytest.mark.extra("serve")
with optional("serve"):
    import websockets

    from mimi_py.serve import loadgen, protocol

RATE, FRAME = 24000, 1920


@pytest.fixture(scope="module")
def server(serve_checkpoint, tmp_path_factory):
    """4 slots, real-time ticks; yields ws://127.0.0.1:PORT."""
    with running_server(
        ["--slots", "4", "--weights", str(serve_checkpoint)], tmp_path_factory.mktemp("s") / "log"
    ) as (
        url,
        _,
    ):
        yield url


def speech(frames: float, seed: int) -> np.ndarray:
    """`frames` frames (80 ms each) of a pitched tone in noise, float32 in [-0.4, 0.4]."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(frames * FRAME)) / RATE
    x = 0.3 * np.sin(2 * np.pi * (120 + 40 * seed) * t) + 0.05 * rng.standard_normal(len(t))
    return x.astype(np.float32)


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


def test_encode_clients_joining_and_leaving_get_exactly_their_offline_codes(server, serve_offline):
    """Clients join at once, after one left mid-stream, and after one finished; each event is
    awaited, not waited for."""
    audios = [speech(n, i) for i, n in enumerate([11, 16, 6, 9])]

    async def leaver():
        async with websockets.connect(server + "/encode") as ws:
            await ws.send(speech(5, 9).tobytes())
            await ws.recv()  # its first frame: seated and stepping; it leaves mid-stream, without `end`

    async def after(task, coro):
        await task
        return await coro

    async def scenario():
        first = asyncio.create_task(loadgen.encode_stream(server, audios[0], chunk=1000, realtime=False))
        left = asyncio.create_task(leaver())
        return await asyncio.gather(
            first,
            loadgen.encode_stream(server, audios[1], chunk=3000),
            after(left, loadgen.encode_stream(server, audios[2], chunk=1920)),  # a row freed by a leaver
            after(first, loadgen.encode_stream(server, audios[3], chunk=4096, realtime=False)),
        )

    for i, r in enumerate(run(scenario())):
        expect = serve_offline.encode(audios[i])[0]
        assert r.close_code == 1000 and r.out_of_order == 0, f"client {i}: {r.close_code} {r.close_reason}"
        assert r.done == expect.shape[1] == len(r.frames), f"client {i}: frame count"
        np.testing.assert_array_equal(r.codes(), expect, err_msg=f"client {i}: codes")


def test_three_real_time_clients_get_their_frames_by_the_deadline_and_late_frames_do_not_grow(
    server, serve_offline
):
    """Real time is judged by counting the frames that miss their deadline (two ticks after
    their last sample): `assert_real_time`. A ticker that sleeps a whole tick after each step
    falls a step further behind every tick, and fails it."""
    audios = [speech(50, i) for i in range(3)]  # 4 s each
    before = health(server)

    async def scenario():
        return await asyncio.gather(*(loadgen.encode_stream(server, a, chunk=480) for a in audios))

    results = run(scenario())
    late_ticks = health(server)["late_ticks"] - before["late_ticks"]
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.codes(), serve_offline.encode(audios[i])[0], err_msg=f"client {i}")
        assert r.done == 50 and r.out_of_order == 0 and len(r.latencies) == 50
        print(f"client {i}: {r.summary()}, late frames per second {late_per_window(r.latencies)}")
    assert_real_time(results, late_ticks)


@pytest.mark.parametrize("fmt", ["f32le", "s16le"])
def test_decode_clients_get_the_offline_decoding_in_either_format(server, serve_offline, fmt):
    codes = serve_offline.encode(speech(12, 3))[0]
    r = run(loadgen.decode_stream(server, codes, fmt=fmt, frames_per_message=5, realtime=False))
    assert r.close_code == 1000 and r.done == 12 and len(r.frames) == 12, r.close_reason
    expect = serve_offline.decode(codes[None])[0, 0]
    if fmt == "f32le":
        np.testing.assert_allclose(r.pcm(fmt), expect, atol=1e-5, rtol=1e-5)
    else:  # int16: clipped to full scale, rounded to 1/32768
        np.testing.assert_allclose(r.pcm(fmt), np.clip(expect, -1, 32767 / 32768), atol=1 / 32768 + 1e-6)


def test_s16le_encode_equals_the_offline_encode_of_the_same_samples(server, serve_offline):
    x = np.rint(speech(8, 4) * 32768).astype(np.int16)
    r = run(loadgen.encode_stream(server, x.astype(np.float32) / 32768, fmt="s16le", realtime=False))
    np.testing.assert_array_equal(r.codes(), serve_offline.encode(x)[0])


def test_a_last_partial_frame_is_padded_with_zeros(server, serve_offline):
    x = speech(2.5, 5)
    r = run(loadgen.encode_stream(server, x, realtime=False))
    padded = np.concatenate([x, np.zeros(FRAME // 2, np.float32)])
    assert r.done == 3
    np.testing.assert_array_equal(r.codes(), serve_offline.encode(padded)[0])


def test_health_reports_slots_frames_late_ticks_and_step_times(server, serve_offline):
    before = health(server)
    run(loadgen.encode_stream(server, speech(6, 6), realtime=False))
    h = health(server)
    assert h["slots"]["total"] == 4 and h["slots"]["busy"] + h["slots"]["free"] == 4
    assert h["frames_served"] - before["frames_served"] == 6
    # late ticks are a count of the ticks, which only grows
    assert h["ticks"] > before["ticks"]
    assert 0 <= h["late_ticks"] - before["late_ticks"] <= h["ticks"] - before["ticks"]
    assert set(h["step_ms"]) == {"median", "p99"} and h["step_ms"]["median"] > 0 and h["step_ms"]["p99"] > 0
    assert h["codec"] == {
        "sample_rate": serve_offline.sample_rate,
        "frame_size": serve_offline.frame_size,
        "frame_rate": serve_offline.frame_rate,
        "num_codebooks": serve_offline.num_codebooks,
        "cardinality": serve_offline.cardinality,
    }


def test_step_times_are_the_median_and_p99_of_the_last_1000_steps():
    from mimi_py.serve.metrics import Stats, prometheus

    stats = Stats(prometheus().CollectorRegistry())
    assert stats.summary() == {"median": None, "p99": None}
    for ms in range(1, 1201):  # the window keeps the last 1000: 201 ... 1200 ms
        stats.step(ms / 1000)
    assert stats.summary() == {"median": 700.5, "p99": 1191.0}


def test_the_page_is_served_from_the_installed_package(server):
    status, ctype, body = http_get(server, "/")
    assert status == 200 and ctype.startswith("text/html") and b'src="app.js"' in body
    for path in ("/app.js", "/worklets.js"):
        status, ctype, body = http_get(server, path)
        assert status == 200 and ctype.startswith("text/javascript") and len(body) > 500, path


def test_unknown_paths_get_404_and_unknown_formats_400(server):
    status, _, body = http_get(server, "/transcribe")
    assert status == 404 and b"unknown path '/transcribe'" in body
    status, _, body = http_get(server, "/encode?format=mp3")
    assert status == 400 and b"format='mp3' is not one of f32le, s16le" in body


def test_the_command_line_entry_points_all_serve():
    for cmd in (
        [sys.executable, "-m", "mimi_py", "serve", "--help"],
        [sys.executable, "-m", "mimi_py.serve", "--help"],
        [sys.executable, str(REPO / "examples" / "serve.py"), "--help"],
    ):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "--slots" in r.stdout and "--num-codebooks" in r.stdout and "--threads" in r.stdout, cmd
    r = subprocess.run(
        [sys.executable, "-m", "mimi_py", "serve", "--slots", "0"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "--slots: 0 is not at least 1" in r.stderr


def test_the_protocol_document_lists_every_close_code_and_format():
    doc = (REPO / "docs" / "protocol.md").read_text()
    rows = dict(re.findall(r"^\| (\d{4}) \| (.+) \|$", doc, re.M))
    assert rows == {str(int(c)): text for c, text in protocol.CLOSE_REASONS.items()}
    assert set(protocol.CLOSE_REASONS) == set(protocol.Close)
    for name in protocol.FORMATS:
        assert f"`{name}`" in doc
    assert "16 MiB" in doc and "10 s" in doc and "zero" in doc
    refusals = {
        r: (f"HTTP {n}" if n < 1000 else f"close {n}", text) for r, (n, text) in protocol.REFUSALS.items()
    }
    rows = {
        r: (a, t) for r, a, t in re.findall(r"^\| ([a-z_]+) \| ((?:HTTP|close) \d+) \| (.+) \|$", doc, re.M)
    }
    assert rows == {r.value: v for r, v in refusals.items()} and set(protocol.REFUSALS) == set(
        protocol.Refusal
    )
    assert (
        f"{protocol.MAX_HANDSHAKES} connections" in doc
        and f"{protocol.HANDSHAKE_TIMEOUT:g} s is dropped" in doc
    )
    assert protocol.TOKEN_ENV in doc and protocol.METRICS_PATH in doc
