"""Who may connect, against the real server: cross-origin browsers get 403, a missing or wrong
token 401 (the same answer), a request that repeats Host, Origin or Authorization or has no Host
400, a
non-loopback bind without a token does not start, a handshake
over the cap gets 503 and one that stalls is dropped, TLS handshakes included (the Host check is
in test_serve_hosts.py); TLS serves wss:// and https://. Every
refusal leaves the client already streaming exact, and /metrics (Prometheus' text format, read
with prometheus_client's own parser) counts them."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import numpy as np
import pytest

import mimi_py
from support.extras import optional
from support.servers import health, health_until, http_get, make_tls, running_server, until

pytestmark = pytest.mark.extra("serve")
with optional("serve"):
    import websockets
    from prometheus_client import parser as prometheus_parser

    from mimi_py.serve import loadgen, protocol

TOKEN = "s3cret-token-that-must-not-be-logged"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def noise(frames: int, seed: int) -> np.ndarray:
    return (0.2 * np.random.default_rng(seed).standard_normal(frames * 1920)).astype(np.float32)


async def handshake(url: str, **kwargs) -> tuple[int, bytes, dict]:
    """(HTTP status, body, headers) of a WebSocket opening handshake: 101 when it opened."""
    try:
        async with websockets.connect(url, **kwargs):
            return 101, b"", {}
    except websockets.InvalidStatus as e:
        return e.response.status_code, e.response.body, e.response.headers


def metrics(url: str, **kwargs) -> dict:
    """GET /metrics parsed by prometheus_client: {(sample name, labels...): value}."""
    status, ctype, body = http_get(url, "/metrics", **kwargs)
    assert status == 200 and ctype.startswith("text/plain; version="), (status, ctype)
    out = {}
    for family in prometheus_parser.text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.values()))] = s.value
    return out


def test_refused_handshakes_get_their_answers_and_the_streaming_client_stays_exact(
    serve_checkpoint, serve_offline, tmp_path
):
    good = noise(40, 1)
    allowed = "https://app.example.com"

    async def scenario(url):
        honest = asyncio.create_task(loadgen.encode_stream(url, good, additional_headers=BEARER))
        await health_until(url, lambda h: h["frames_served"] >= 1, "served the honest client")
        enc = url + "/encode"
        seen = {
            "cross-origin": await handshake(enc + f"?token={TOKEN}", origin="http://evil.example"),
            "null origin": await handshake(enc + f"?token={TOKEN}", origin="null"),
            "no token": await handshake(enc),
            "wrong token": await handshake(enc + "?token=s3cret-token-that-must-not-be-logge"),
            "wrong bearer": await handshake(enc, additional_headers={"Authorization": "Bearer nope"}),
            "token, no origin": await handshake(enc + f"?format=s16le&token={TOKEN}"),
            "bearer, own origin": await handshake(
                enc, origin=url.replace("ws://", "http://"), additional_headers=BEARER
            ),
            "allowed origin": await handshake(enc + f"?token={TOKEN}", origin=allowed),
        }
        return seen, await honest

    args = ["--slots", "2", "--weights", str(serve_checkpoint), "--allow-origin", allowed + "/"]
    with running_server(args, tmp_path / "log", env={protocol.TOKEN_ENV: TOKEN}) as (url, proc):
        seen, honest = asyncio.run(asyncio.wait_for(scenario(url), timeout=60))
        unauthorized = [http_get(url, "/metrics"), http_get(url, f"/metrics?token={TOKEN[:-1]}")]
        m = metrics(url, headers=BEARER)
        page, h = http_get(url, "/"), health(url)  # neither needs the token
        assert proc.poll() is None
    assert seen["cross-origin"][0] == seen["null origin"][0] == 403
    assert b"Origin" in seen["cross-origin"][1]
    no_token = seen["no token"]
    assert no_token[0] == 401 and no_token[2].get("WWW-Authenticate") == "Bearer"
    for kind in ("wrong token", "wrong bearer"):  # the same answer, whichever it was
        assert seen[kind][:2] == no_token[:2], kind
    for kind in ("token, no origin", "bearer, own origin", "allowed origin"):
        assert seen[kind][0] == 101, (kind, seen[kind])
    assert all(s == 401 for s, _, _ in unauthorized) and page[0] == 200 and h["slots"]["total"] == 2
    np.testing.assert_array_equal(honest.codes(), serve_offline.encode(good)[0])
    assert honest.close_code == 1000 and honest.done == 40
    assert m[("mimi_serve_refused_total", "origin")] == 2
    assert m[("mimi_serve_refused_total", "token")] == 3 + 2  # the handshakes, then /metrics twice
    assert m[("mimi_serve_slots",)] == 2 and m[("mimi_serve_frames_served_total",)] >= 40
    assert h["refused"] == {"origin": 2, "token": 5}
    assert TOKEN not in (tmp_path / "log").read_text() and TOKEN[:-1] not in (tmp_path / "log").read_text()


def test_metrics_count_frames_ticks_step_times_and_close_codes(serve_checkpoint, tmp_path):
    async def scenario(url):
        await loadgen.encode_stream(url, noise(6, 2), realtime=False)
        async with websockets.connect(url + "/encode") as ws:  # 1003: an unknown text message
            await ws.send("start")
            await ws.wait_closed()

    with running_server(["--slots", "1", "--weights", str(serve_checkpoint)], tmp_path / "log") as (url, _):
        asyncio.run(asyncio.wait_for(scenario(url), timeout=30))
        m, h = metrics(url), health(url)
    assert m[("mimi_serve_frames_served_total",)] == h["frames_served"] == 6
    # /metrics was read first: /health's counts are the same or later ones, grown by its ticks since
    late, ticks = m[("mimi_serve_late_ticks_total",)], m[("mimi_serve_ticks_total",)]
    assert 0 < ticks <= h["ticks"] and late <= h["late_ticks"] <= late + (h["ticks"] - ticks)
    assert m[("mimi_serve_closed_total", "1000")] == 1 and m[("mimi_serve_closed_total", "1003")] == 1
    assert m[("mimi_serve_slots",)] == 1 and m[("mimi_serve_slots_busy",)] == 0
    assert m[("mimi_serve_behind",)] == 0
    count = m[("mimi_serve_step_seconds_count",)]
    assert count > 0 and m[("mimi_serve_step_seconds_bucket", "+Inf")] == count
    assert m[("mimi_serve_step_seconds_sum",)] > 0


def serve_cmd(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "mimi_py", "serve", "--port", "0", *args],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip


def test_a_non_loopback_host_without_a_token_does_not_start():
    from mimi_py.serve.access import is_loopback

    r = serve_cmd("--host", "0.0.0.0")
    assert r.returncode == 1 and r.stdout == "", r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--token" in lines[0] and "--no-auth" in lines[0], r.stderr
    r = serve_cmd("--token", "x", "--no-auth")
    assert r.returncode == 1 and "contradict" in r.stderr
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost")] == [True] * 5
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "", "192.0.2.1")] == [False] * 4


def test_handshakes_over_the_cap_get_503_and_a_stalled_upgrade_is_dropped(serve_checkpoint, serve_offline):
    from mimi_py.serve import Server, run_server
    from mimi_py.serve.http import BUSY_RESPONSE

    server = Server(mimi_py.MimiCodec(serve_checkpoint), 2, max_handshakes=3, handshake_timeout=1.0)
    audio = noise(5, 3)

    async def scenario():
        stop, ports = asyncio.Event(), asyncio.Queue()
        task = asyncio.create_task(run_server(server, "127.0.0.1", 0, stop, ports.put_nowait))
        port = await ports.get()
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        idle[0][1].write(b"GET /encode HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a request that never ends
        await until(lambda: server.handshakes.in_flight == 3, "3 handshakes in flight")
        extra = await asyncio.open_connection("127.0.0.1", port)
        over = await asyncio.wait_for(extra[0].read(), timeout=5)
        dropped = [await asyncio.wait_for(r.read(), timeout=10) for r, _ in idle]  # EOF once timed out
        for _, w in [*idle, extra]:
            w.close()
            await w.wait_closed()
        after = await loadgen.encode_stream(f"ws://127.0.0.1:{port}", audio, realtime=False)
        stop.set()
        await task
        return over, dropped, after

    over, dropped, after = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert over == BUSY_RESPONSE and over.startswith(b"HTTP/1.1 503 ")
    assert dropped == [b"", b"", b""]
    assert after.close_code == 1000 and server.handshakes.in_flight == 0
    np.testing.assert_array_equal(after.codes(), serve_offline.encode(audio)[0])
    assert server.stats.refused == {protocol.Refusal.HANDSHAKES: 1}


async def eof(reader: asyncio.StreamReader) -> bytes:
    """What a connection reads until the server closes it (a reset reads as a close)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


def test_tls_handshakes_count_in_the_cap_and_stalled_ones_are_dropped_while_a_client_streams_exactly(
    serve_checkpoint, serve_offline, tmp_path
):
    from mimi_py.serve import Server, run_server, tls_context

    tls = make_tls(tmp_path / "tls")
    server = Server(mimi_py.MimiCodec(serve_checkpoint), 2, max_handshakes=3, handshake_timeout=2.0)
    good, later = noise(40, 5), noise(5, 6)

    async def scenario():
        stop, ports = asyncio.Event(), asyncio.Queue()
        context = tls_context(str(tls.certfile), str(tls.keyfile))
        task = asyncio.create_task(run_server(server, "127.0.0.1", 0, stop, ports.put_nowait, tls=context))
        url = f"wss://127.0.0.1:{await ports.get()}"
        port = int(url.rsplit(":", 1)[1])
        honest = asyncio.create_task(loadgen.encode_stream(url, good, ssl=tls.client))
        await until(lambda: server.stats.frames_served >= 1, "served the honest client")
        # three connections that never finish their TLS handshake: one sends a record header only
        stalled = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        stalled[0][1].write(b"\x16\x03\x01\x02\x00")
        await until(lambda: server.handshakes.in_flight == 3, "3 TLS handshakes in flight")
        full = server.stats.frames_served
        extra = await asyncio.open_connection("127.0.0.1", port)
        over = await asyncio.wait_for(eof(extra[0]), timeout=5)  # closed before any TLS
        try:
            async with websockets.connect(url, ssl=tls.client, open_timeout=5):
                refused_tls = "opened"
        except OSError as e:  # the TLS handshake ended by the server's close
            refused_tls = type(e).__name__
        dropped = [await asyncio.wait_for(eof(r), timeout=10) for r, _ in stalled]  # at the timeout
        at_drop = server.stats.frames_served
        await until(lambda: server.handshakes.in_flight == 0, "the stalled handshakes left the cap")
        after = await loadgen.encode_stream(url, later, realtime=False, ssl=tls.client)
        result = await honest
        for _, w in [*stalled, extra]:
            w.close()
            await w.wait_closed()
        stop.set()
        await task
        return over, refused_tls, dropped, full, at_drop, after, result

    over, refused_tls, dropped, full, at_drop, after, honest = asyncio.run(
        asyncio.wait_for(scenario(), timeout=60)
    )
    assert over == b"" and refused_tls != "opened", refused_tls
    assert dropped == [b"", b"", b""]
    assert at_drop > full  # the honest client got frames while the cap was full
    assert server.stats.refused == {protocol.Refusal.HANDSHAKES: 2}
    np.testing.assert_array_equal(honest.codes(), serve_offline.encode(good)[0])
    assert honest.close_code == 1000 and honest.done == 40
    np.testing.assert_array_equal(after.codes(), serve_offline.encode(later)[0])
    assert after.close_code == 1000 and server.handshakes.in_flight == 0


def test_tls_serves_wss_and_https_with_a_token(serve_checkpoint, serve_offline, tmp_path):
    tls = make_tls(tmp_path / "tls")
    audio = noise(12, 4)
    args = ["--slots", "2", "--weights", str(serve_checkpoint), "--token", TOKEN]
    args += ["--certfile", str(tls.certfile), "--keyfile", str(tls.keyfile)]

    async def scenario(url):
        return await loadgen.encode_stream(
            url, audio, realtime=False, ssl=tls.client, additional_headers=BEARER
        )

    with running_server(args, tmp_path / "log") as (url, _):
        assert url.startswith("wss://127.0.0.1:")
        r = asyncio.run(asyncio.wait_for(scenario(url), timeout=30))
        status, ctype, page = http_get(url, "/", tls=tls.client)
        m = metrics(url, headers=BEARER, tls=tls.client)
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):  # not a CA this client trusts
            health(url)
    assert r.close_code == 1000 and r.done == 12
    np.testing.assert_array_equal(r.codes(), serve_offline.encode(audio)[0])
    assert status == 200 and ctype.startswith("text/html") and b"app.js" in page
    assert m[("mimi_serve_frames_served_total",)] == 12


def test_bad_tls_files_are_one_line_errors(tmp_path):
    (tmp_path / "junk.pem").write_text("not a certificate")
    r = serve_cmd("--certfile", str(tmp_path / "junk.pem"))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "cannot load" in r.stderr
    r = serve_cmd("--keyfile", str(tmp_path / "junk.pem"))
    assert r.returncode == 1 and "--keyfile needs --certfile" in r.stderr


# The headers of a valid WebSocket upgrade, besides Host, Origin and Authorization.
UPGRADE = [
    ("Upgrade", "websocket"),
    ("Connection", "Upgrade"),
    ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("Sec-WebSocket-Version", "13"),
]


async def raw_request(port: int, path: str, headers: list[tuple[str, str]]) -> tuple[int, bytes]:
    """(HTTP status, body) of a GET of `path` on 127.0.0.1:`port` with exactly these header lines,
    repeated ones included (what no ordinary client sends); the connection is then closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), ""]
    writer.write("".join(f"{line}\r\n" for line in lines).encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
    body = await reader.readexactly(int(length[1])) if length else b""
    writer.close()
    await writer.wait_closed()
    return int(head.split(b" ", 2)[1]), body


def test_a_request_repeating_a_single_valued_header_or_without_host_gets_400_and_everyone_else_is_served(
    serve_checkpoint, serve_offline
):
    from mimi_py.serve import Server, run_server
    from mimi_py.serve.access import Access

    server = Server(mimi_py.MimiCodec(serve_checkpoint), 3, access=Access(token=TOKEN))
    good, later = noise(40, 7), noise(5, 8)

    async def scenario():
        stop, ports = asyncio.Event(), asyncio.Queue()
        task = asyncio.create_task(run_server(server, "127.0.0.1", 0, stop, ports.put_nowait))
        port = await ports.get()
        url = f"ws://127.0.0.1:{port}"
        honest = asyncio.create_task(loadgen.encode_stream(url, good, additional_headers=BEARER))
        await until(lambda: server.stats.frames_served >= 1, "served the honest client")
        own = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}", **BEARER}
        valid = [*own.items(), *UPGRADE]
        seen = {"none": await raw_request(port, "/encode", valid)}
        for name, value in [*own.items(), UPGRADE[2]]:  # twice the same value: still refused
            seen[name] = await raw_request(port, "/encode", [*valid, (name, value)])
        for path in ("/health", "/metrics", "/"):
            seen[path] = await raw_request(port, path, [*own.items(), ("Host", "localhost")])
        no_host = [(k, v) for k, v in valid if k != "Host"]
        seen["no Host"] = await raw_request(port, "/encode", no_host)
        after = await loadgen.encode_stream(url, later, realtime=False, additional_headers=BEARER)
        result = await honest
        stop.set()
        await task
        return seen, after, result

    seen, after, honest = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert seen["none"][0] == 101, seen["none"]
    for name in protocol.SINGLE_HEADERS:
        body = f"the request repeats {name}: a header read as one value may come once\n"
        assert seen[name] == (400, body.encode()), name
    for path in ("/health", "/metrics", "/"):
        assert seen[path][0] == 400 and b"repeats Host" in seen[path][1], (path, seen[path])
    assert seen["Sec-WebSocket-Key"][0] == 400  # websockets' own check
    assert seen["no Host"] == (400, b"the request has no Host header: HTTP/1.1 requires one\n")
    assert server.stats.refused == {protocol.Refusal.DUPLICATE: 6, protocol.Refusal.NO_HOST: 1}
    np.testing.assert_array_equal(honest.codes(), serve_offline.encode(good)[0])
    assert honest.close_code == 1000 and honest.done == 40
    np.testing.assert_array_equal(after.codes(), serve_offline.encode(later)[0])
    assert after.close_code == 1000
