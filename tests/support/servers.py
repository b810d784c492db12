"""The real server in a subprocess, for the serve tests: ``mimi-py serve`` on a free port of
127.0.0.1, its address read from its first stdout line (``ws://`` or ``wss://``), stopped with
SIGTERM at the end; real time judged by counting the frames that miss their deadline
(`assert_real_time`); and waiting for a condition (`until`, `health_until`), not for a while."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import inspect
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mimi_py.serve.loadgen import http_url
from support.paths import CODEC_DIR

# Mimi's tick: one frame every 80 ms.
TICK = 0.080
# A frame's deadline, from the server's own: a frame sent at real-time pace is stepped at the
# next tick (docs/protocol.md, Timing), and a step that ends after the tick after that makes
# that tick late. So a frame that arrives more than two ticks after its last sample was sent
# missed a deadline of the server's.
DEADLINE = 2 * TICK
# Late frames are counted in windows of one second of frames.
WINDOW = 12


def small_checkpoint(folder: Path) -> Path:
    """The small fixture codec as a checkpoint directory (config.json + model.safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(CODEC_DIR / "mimi_small_hf_config.json", folder / "config.json")
    shutil.copy(CODEC_DIR / "mimi_small.safetensors", folder / "model.safetensors")
    return folder


@contextlib.contextmanager
def running_server(args: list[str], log: Path, env: dict | None = None):
    """Yields (ws base url, process); SIGTERM at the end, and the process must exit 0 by itself."""
    cmd = [sys.executable, "-m", "mimi_py", "serve", "--port", "0", *args]
    env = None if env is None else {**os.environ, **env}
    with (
        open(log, "w") as err,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc,
    ):
        try:
            line = proc.stdout.readline()
            assert line.startswith(("listening on ws://", "listening on wss://")), line + log.read_text()
            yield line.split()[2], proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            finally:
                proc.kill()


def late_per_window(latencies: list[float], deadline: float = DEADLINE, window: int = WINDOW) -> list[int]:
    """How many frames of each `window` in turn arrived more than `deadline` seconds after the
    message that completed them (the last window may be shorter)."""
    return [sum(x > deadline for x in latencies[i : i + window]) for i in range(0, len(latencies), window)]


def assert_real_time(results, late_ticks: int | None = None) -> None:
    """Real time, counted: each client's frames that missed `DEADLINE`. A stall of the machine
    delays about one frame of every client; a ticker that cannot keep up falls further behind
    every tick, so that its late frames grow from second to second. So: at most one late frame
    per client, in all (one stall's worth), and in no client's last second (12 frames) more than
    one more than in its first. `late_ticks`, the server's own count, goes in the message."""
    windows = [late_per_window(r.latencies) for r in results]
    late = sum(map(sum, windows))
    why = f"late frames per client and second (deadline {1000 * DEADLINE:.0f} ms): {windows}; {late_ticks} late ticks"
    assert late <= len(results), f"{late} late frames of {sum(len(r.latencies) for r in results)}; {why}"
    for i, r in enumerate(results):
        first, last = (
            sum(x > DEADLINE for x in part) for part in (r.latencies[:WINDOW], r.latencies[-WINDOW:])
        )
        assert last <= first + 1, (
            f"client {i}: {last} late frames in its last second, {first} in its first; {why}"
        )


def health(url: str, tls: ssl.SSLContext | None = None) -> dict:
    """GET /health of a server at ws://HOST:PORT (or wss://, trusting `tls`)."""
    with urllib.request.urlopen(http_url(url) + "/health", timeout=10, context=tls) as r:
        return json.load(r)


def http_get(
    url: str, path: str, headers: dict | None = None, tls: ssl.SSLContext | None = None
) -> tuple[int, str, bytes]:
    """(status, content type, body) of GET path, errors included."""
    req = urllib.request.Request(http_url(url) + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=tls) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


@dataclass
class Tls:
    """A self-signed CA's certificate for 127.0.0.1 and localhost (trustme): the server's PEM
    files, a client context that trusts it, and the base64 SHA-256 of its public key (SPKI,
    what Chromium's --ignore-certificate-errors-spki-list takes)."""

    certfile: Path
    keyfile: Path
    client: ssl.SSLContext
    spki: str


def make_tls(folder: Path) -> Tls:
    import trustme
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    folder.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = folder / "cert.pem", folder / "key.pem"
    for i, blob in enumerate(cert.cert_chain_pems):
        blob.write_to_path(str(certfile), append=i > 0)
    cert.private_key_pem.write_to_path(str(keyfile))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    key = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return Tls(certfile, keyfile, client, base64.b64encode(hashlib.sha256(der).digest()).decode())


async def until(condition, what: str, timeout: float = 10.0):
    """Waits until `condition()` (or the awaitable it returns) is true, looking every 10 ms, and
    returns its value; fails, naming `what`, if it is still false after `timeout` seconds (a
    bound on a hang, not a measurement)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"never {what} (waited {timeout:g} s)")
        await asyncio.sleep(0.01)


async def health_until(url: str, test, what: str, timeout: float = 10.0, tls: ssl.SSLContext | None = None):
    """`until` a server's ``/health`` passes `test`; returns that health. Read in a thread, so
    that the clients on the event loop keep streaming meanwhile."""

    async def check():
        h = await asyncio.to_thread(health, url, tls)
        return h if test(h) else None

    return await until(check, what, timeout)
