"""The Host check, which stops DNS rebinding, against the real server: without a token, a request
whose Host is not a loopback name or address, the server's --host or an --allow-host gets 403
before it takes a slot, whatever its path, also with an Origin of the same host (what a
rebinding page sends); loopback names and addresses and the allowed names stream exactly; with a
token any Host passes with the token. Every connection goes to 127.0.0.1: the foreign names are
only what the handshake says, as a rebinding page's are."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys

import numpy as np
import pytest

from support.extras import optional
from support.servers import health, health_until, http_get, running_server

pytestmark = pytest.mark.extra("serve")
with optional("serve"):
    import websockets
    from websockets.datastructures import Headers
    from websockets.http11 import Request

    from mimi_py.serve import add_arguments, loadgen, make_access, protocol
    from mimi_py.serve.access import Access, host_name

TOKEN = "host-check-token-0123456789"


def noise(frames: int, seed: int) -> np.ndarray:
    return (0.2 * np.random.default_rng(seed).standard_normal(frames * 1920)).astype(np.float32)


def loopback(port: int) -> socket.socket:
    """A TCP connection to 127.0.0.1:`port`, for a client whose URL names another host."""
    return socket.create_connection(("127.0.0.1", port))


async def handshake_as(host: str, port: int, path: str = "/encode", **kwargs) -> tuple[int, bytes]:
    """(HTTP status, body) of a WebSocket handshake to 127.0.0.1:`port` whose Host is `host`
    (websockets writes its URL's host there): 101 when it opened."""
    try:
        async with websockets.connect(f"ws://{host}{path}", sock=loopback(port), **kwargs):
            return 101, b""
    except websockets.InvalidStatus as e:
        return e.response.status_code, e.response.body


async def encode_as(host: str, port: int, pcm: np.ndarray, **kwargs) -> tuple[np.ndarray, int | None]:
    """Streams `pcm` at once to /encode on 127.0.0.1:`port` with `host` as its Host; the codes
    and the close code."""
    async with websockets.connect(f"ws://{host}/encode", sock=loopback(port), **kwargs) as ws:
        await ws.send(pcm.tobytes())
        await ws.send("end")
        messages = [json.loads(m) async for m in ws]
    return np.array([m["codes"] for m in messages if "codes" in m], np.uint32).T, ws.close_code


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_without_a_token_a_foreign_host_gets_403_before_a_slot_and_the_streaming_client_stays_exact(
    serve_checkpoint, serve_offline, tmp_path
):
    good, short = noise(40, 1), noise(3, 2)

    async def scenario(url):
        port = port_of(url)
        evil = f"evil.example:{port}"
        honest = asyncio.create_task(loadgen.encode_stream(url, good))  # holds the only slot
        await health_until(url, lambda h: h["frames_served"] >= 1, "served the honest client")
        refused = {
            "rebinding": await handshake_as(evil, port, origin=f"http://{evil}"),
            "no origin": await handshake_as(evil, port),
            "decode": await handshake_as(evil, port, "/decode?format=s16le"),
            "another address": await handshake_as(f"192.0.2.1:{port}", port),
            "an address as a subdomain": await handshake_as(f"127.0.0.1.evil.example:{port}", port),
            "localhost as a subdomain": await handshake_as(f"localhost.evil.example:{port}", port),
        }
        http = {
            p: await asyncio.to_thread(http_get, url, p, {"Host": evil})
            for p in ("/health", "/", "/metrics", "/nope")
        }
        during = await asyncio.to_thread(health, url)
        return refused, http, during, await honest

    async def allowed(url):
        port = port_of(url)
        names = ["localhost", f"localhost:{port}", f"app.localhost:{port}", f"127.0.0.2:{port}"]
        names += [f"[::1]:{port}", f"app.internal:{port}"]
        return {name: await encode_as(name, port, short) for name in names}

    args = ["--slots", "1", "--weights", str(serve_checkpoint), "--allow-host", "App.Internal"]
    with running_server(args, tmp_path / "log") as (url, proc):
        refused, http, during, honest = asyncio.run(asyncio.wait_for(scenario(url), timeout=60))
        streams = asyncio.run(asyncio.wait_for(allowed(url), timeout=60))
        spelled = [
            http_get(url, "/health", headers={"Host": h})[0] for h in ("LOCALHOST", "[::1]", "APP.internal.")
        ]
        after = health(url)
        assert proc.poll() is None
    for kind, (status, body) in refused.items():
        assert status == 403, (kind, status, body)
        assert b"--allow-host" in body and b"Host '" in body, (kind, body)
    assert (
        b"'evil.example:" in refused["rebinding"][1]
        and b"--allow-host evil.example " in refused["rebinding"][1]
    )
    for path, (status, ctype, body) in http.items():
        assert status == 403 and ctype.startswith("text/plain") and b"--allow-host evil.example " in body, (
            path
        )
    # the refusals came before admission: the only slot was held, yet none of them got 1013
    assert during["slots"] == {"total": 1, "busy": 1, "free": 0}
    assert during["refused"] == {"host": 10}
    np.testing.assert_array_equal(honest.codes(), serve_offline.encode(good)[0])
    assert honest.close_code == 1000 and honest.done == 40
    expect = serve_offline.encode(short)[0]
    for name, (codes, code) in streams.items():
        assert code == 1000, name
        np.testing.assert_array_equal(codes, expect, err_msg=name)
    assert spelled == [200, 200, 200]
    assert after["refused"] == {"host": 10} and after["slots"]["busy"] == 0


def test_with_a_token_any_host_passes_with_the_token_and_none_without(
    serve_checkpoint, serve_offline, tmp_path
):
    audio = noise(4, 3)
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    async def scenario(url):
        port = port_of(url)
        evil = f"evil.example:{port}"
        return (
            await encode_as(evil, port, audio, origin=f"http://{evil}", additional_headers=bearer),
            await handshake_as(evil, port, origin=f"http://{evil}"),
        )

    args = ["--slots", "1", "--weights", str(serve_checkpoint)]
    with running_server(args, tmp_path / "log", env={protocol.TOKEN_ENV: TOKEN}) as (url, _):
        (codes, code), (status, _body) = asyncio.run(asyncio.wait_for(scenario(url), timeout=60))
        page = http_get(url, "/health", headers={"Host": "evil.example"})
        h = health(url)
    assert code == 1000
    np.testing.assert_array_equal(codes, serve_offline.encode(audio)[0])
    assert status == 401  # the token is checked, not the Host
    assert page[0] == 200
    assert h["refused"] == {"token": 1}


def request(*hosts: str, path: str = "/encode") -> Request:
    return Request(path, Headers([("Host", h) for h in hosts]))


def test_host_names_are_compared_without_port_case_brackets_or_a_trailing_dot():
    names = {
        "LocalHost:8765": "localhost",
        "app.localhost.": "app.localhost",
        "[::1]:80": "::1",
        "[0:0:0:0:0:0:0:1]": "::1",
        "::1": "::1",
        "127.0.0.1:1": "127.0.0.1",
        "Box.Lan": "box.lan",
    }
    assert {text: host_name(text) for text in names} == names
    for junk in (
        "",
        ":80",
        "[::1",
        "[evil]:80",
        "evil@127.0.0.1",
        "http://localhost",
        "a/b",
        "a:b:c",
        "x:123456",
    ):
        assert host_name(junk) is None, junk


def test_the_host_rule_loopback_the_bound_host_allow_host_and_star():
    args = add_arguments(argparse.ArgumentParser()).parse_args(
        ["--host", "Box.Lan", "--no-auth", "--allow-host", "app.example:443", "--allow-host", "[::2]"]
    )
    access = make_access(args)
    passes = ["localhost", "a.b.localhost:1", "127.255.0.1:9", "[::1]", "[::ffff:127.0.0.1]", "box.lan:8765"]
    passes += ["APP.example", "[::2]:80"]
    for host in passes:
        assert access.check(request(host), "/encode") is None, host
    refused = ["evil.example", "localhost.evil.example", "192.0.2.1", "[::2]x", "app.example.evil", "[::]"]
    for host in refused:
        assert access.check(request(host), "/health") is protocol.Refusal.HOST, host
    assert access.check(request(), "/") is protocol.Refusal.NO_HOST
    assert access.check(request("localhost", "localhost"), "/") is protocol.Refusal.DUPLICATE  # two
    anyone = Access(allow_hosts=["*"])
    assert anyone.check(request("evil.example"), "/encode") is None
    assert anyone.check(request(), "/encode") is protocol.Refusal.NO_HOST
    token = Access(token=TOKEN)
    assert token.check(request(), "/health") is protocol.Refusal.NO_HOST  # a token or not
    assert token.check(request("evil.example"), "/health") is None
    assert token.check(request("evil.example"), "/encode") is protocol.Refusal.TOKEN
    with pytest.raises(ValueError, match="not a host name"):
        Access(allow_hosts=["http://app.example"])


def test_a_bad_allow_host_is_a_one_line_usage_error():
    r = subprocess.run(
        [sys.executable, "-m", "mimi_py", "serve", "--allow-host", "http://app.example"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--allow-host: 'http://app.example' is not a host name" in r.stderr, r.stderr
