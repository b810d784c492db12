"""The server's doors under a coverage-guided fuzzer (atheris): arbitrary HTTP requests and
WebSocket sessions (handshakes, then frames of any opcode, length, mask and payload) sent over
loopback sockets to the real server, the code ``mimi-py serve`` runs (``run_server`` on a
``Server`` with the fixtures' small codec), hosted in this process so that atheris sees the
coverage of mimi_py.serve and websockets. A well-behaved client streams real-time audio to
``/encode`` beside it the whole time; its codes must equal the offline codes of the same audio.

Each input must get: an HTTP answer that is a well-formed status line and never a 5xx other than
503 (the handshake cap), or a WebSocket close code the protocol documents (never 1011, a failed
step); and the server must keep answering ``/health``. A wrong code for the honest client, a
crash or a hang (libFuzzer's -timeout) is a finding.

    python fuzz/serve_doors.py fuzz/corpus/serve -max_total_time=600

The last line it prints (and ``$MIMI_FUZZ_SERVE_STATS``, a JSON file, if set) holds the counts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import atheris
import numpy as np

with atheris.instrument_imports():
    import websockets  # noqa: F401  (instrumented: its frame parser is a door too)

    import mimi_py
    from mimi_py.serve import Server, run_server
    from mimi_py.serve.access import Access
    from mimi_py.serve.loadgen import encode_stream

ROOT = Path(__file__).resolve().parent.parent
CODEC = ROOT / "tests" / "data" / "codec"
# The close codes a client may be sent (docs/protocol.md, and websockets' 1002 for a frame that
# breaks RFC 6455). 1011 means a step failed: a bug.
ALLOWED_CLOSE = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1013}
PATHS = [
    "/encode",
    "/decode",
    "/encode?format=s16le",
    "/decode?format=f32le",
    "/health",
    "/metrics",
    "/",
    "/x",
]
HEADERS = ["Host", "Origin", "Authorization", "Upgrade", "Connection", "Sec-WebSocket-Key",
           "Sec-WebSocket-Version", "Content-Length", "Transfer-Encoding", "X-Fuzz"]  # fmt: skip
READ_TIMEOUT = 0.25
STATS = {"inputs": 0, "http": 0, "sessions": 0, "honest_exact": 0, "honest_wrong": 0, "health_checks": 0}
# Errors the server logged: ours fail the input; websockets' own "unexpected internal error" (its
# handshake asserting after a client's bytes made it fail the connection first) is counted apart:
# the connection is dropped and nothing else is affected.
SERVER_ERRORS: list[str] = []
STATS["websockets_internal_errors"] = 0


class ServerLog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR:
            return
        if record.name.startswith("websockets") and record.getMessage() == "unexpected internal error":
            STATS["websockets_internal_errors"] += 1
        else:
            SERVER_ERRORS.append(f"{record.name}: {record.getMessage()}")


def start_server() -> tuple[int, mimi_py.MimiCodec]:
    """The server on a free loopback port, in a thread of its own; returns (port, offline codec)."""
    folder = Path(tempfile.mkdtemp(prefix="mimi-fuzz-serve-"))
    shutil.copy(CODEC / "mimi_small_hf_config.json", folder / "config.json")
    shutil.copy(CODEC / "mimi_small.safetensors", folder / "model.safetensors")
    codec = mimi_py.MimiCodec(folder)
    ready = threading.Event()
    port: list[int] = []

    def serve() -> None:
        server = Server(mimi_py.MimiCodec(folder), 4, access=Access(None, [], [], host="127.0.0.1"))

        def listening(p: int) -> None:
            port.append(p)
            ready.set()

        asyncio.run(run_server(server, "127.0.0.1", 0, asyncio.Event(), listening))

    threading.Thread(target=serve, daemon=True, name="server").start()
    if not ready.wait(60):
        raise SystemExit("the server did not start")
    return port[0], codec


def honest_client(url: str, codec: mimi_py.MimiCodec) -> None:
    """Streams 2 s of noise at real time, again and again; counts exact and wrong results."""
    seed = 0
    while True:
        seed += 1
        pcm = (0.2 * np.random.default_rng(seed).standard_normal(25 * 1920)).astype(np.float32)
        result = asyncio.run(encode_stream(url, pcm))
        exact = result.close_code == 1000 and np.array_equal(result.codes(), codec.encode(pcm)[0])
        STATS["honest_exact" if exact else "honest_wrong"] += 1
        if not exact:
            print(f"honest client: close {result.close_code} {result.close_reason!r}", file=sys.stderr)


def read_all(s: socket.socket) -> bytes:
    """What the server sends until it closes or goes quiet for READ_TIMEOUT."""
    s.settimeout(READ_TIMEOUT)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionError):
        pass
    return out


def check_http(reply: bytes) -> None:
    """An answer is nothing (a dropped connection) or a status line, never an error of ours."""
    if not reply:
        return
    assert reply.startswith(b"HTTP/1.1 ") and reply[9:12].isdigit(), reply[:80]
    status = int(reply[9:12])
    assert status < 500 or status == 503, reply[:300]


def request(fdp: atheris.FuzzedDataProvider, upgrade: bool) -> bytes:
    """An HTTP request: a path, headers (from a list, fuzzed values, repeats) and a body."""
    method = fdp.PickValueInList([b"GET", b"POST", b"HEAD", fdp.ConsumeBytes(6)])
    path = fdp.PickValueInList(PATHS).encode() if fdp.ConsumeBool() else fdp.ConsumeBytes(30)
    lines = [method + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1"]
    if upgrade:
        key = base64.b64encode(fdp.ConsumeBytes(16).ljust(16, b"k"))
        lines += [b"Upgrade: websocket", b"Connection: Upgrade", b"Sec-WebSocket-Key: " + key]
        lines += [b"Sec-WebSocket-Version: 13"]
    for _ in range(fdp.ConsumeIntInRange(0, 5)):
        lines.append(fdp.PickValueInList(HEADERS).encode() + b": " + fdp.ConsumeBytes(40))
    body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def frame(fdp: atheris.FuzzedDataProvider) -> bytes:
    """A WebSocket frame from a client: any opcode, FIN or not, masked or not, any length field."""
    opcode = fdp.PickValueInList([0x0, 0x1, 0x2, 0x2, 0x2, 0x8, 0x9, 0xA, fdp.ConsumeIntInRange(0, 15)])
    kind = fdp.ConsumeIntInRange(0, 3)
    if kind == 0:
        payload = b"end"
    elif kind == 1:  # whole f32 samples (or whole frames of 4 codes below 64)
        payload = np.asarray(
            [fdp.ConsumeIntInRange(0, 63) for _ in range(4 * fdp.ConsumeIntInRange(0, 8))], "<u4"
        )
        payload = payload.tobytes()
    else:
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    head = bytes([(0x80 if fdp.ConsumeBool() else 0) | opcode])
    n, masked = len(payload), fdp.ConsumeIntInRange(0, 7) != 0
    if fdp.ConsumeIntInRange(0, 15) == 0:  # a length field that lies
        return head + bytes([0x80 | 127]) + struct.pack(">Q", fdp.ConsumeInt(8) % 2**63) + payload
    if n < 126:
        head += bytes([(0x80 if masked else 0) | n])
    else:
        head += bytes([(0x80 if masked else 0) | 126]) + struct.pack(">H", n)
    if not masked:
        return head + payload
    mask = fdp.ConsumeBytes(4).ljust(4, b"\0")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close_code(data: bytes) -> int | None:
    """The code of the first close frame the server sent (server frames are not masked)."""
    i = 0
    while i + 2 <= len(data):
        op, n, j = data[i] & 0x0F, data[i + 1] & 0x7F, i + 2
        if n == 126:
            n, j = struct.unpack(">H", data[j : j + 2])[0], j + 2
        elif n == 127:
            n, j = struct.unpack(">Q", data[j : j + 8])[0], j + 8
        if op == 0x8:
            return struct.unpack(">H", data[j : j + 2])[0] if n >= 2 else 1005
        i = j + n
    return None


def session(port: int, fdp: atheris.FuzzedDataProvider) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(request(fdp, upgrade=True))
        frames = [frame(fdp) for _ in range(fdp.ConsumeIntInRange(0, 6))]
        try:
            for f in frames:
                s.sendall(f)
            if fdp.ConsumeBool():
                s.sendall(bytes([0x88, 0x82, 0, 0, 0, 0, 0x03, 0xE8]))  # a masked close, 1000
        except ConnectionError:
            pass
        reply = read_all(s)
    head, _, rest = reply.partition(b"\r\n\r\n")
    check_http(head)
    if head.startswith(b"HTTP/1.1 101"):
        code = close_code(rest)
        assert code is None or code in ALLOWED_CLOSE, f"close code {code}: {rest[:200]!r}"


def http(port: int, fdp: atheris.FuzzedDataProvider) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        try:
            s.sendall(request(fdp, upgrade=False))
        except ConnectionError:
            return
        check_http(read_all(s))


def healthy(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    STATS["health_checks"] += 1


def report() -> None:
    line = json.dumps(STATS)
    print(f"serve_doors: {line}", flush=True)
    if path := os.environ.get("MIMI_FUZZ_SERVE_STATS"):
        Path(path).write_text(line)


def main() -> None:
    logging.getLogger().addHandler(ServerLog())
    port, codec = start_server()
    threading.Thread(target=honest_client, args=(f"ws://127.0.0.1:{port}", codec), daemon=True).start()
    last = [time.monotonic()]

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        STATS["inputs"] += 1
        if fdp.ConsumeBool():
            STATS["sessions"] += 1
            session(port, fdp)
        else:
            STATS["http"] += 1
            http(port, fdp)
        assert STATS["honest_wrong"] == 0, "the honest client's codes were not exact"
        assert not SERVER_ERRORS, SERVER_ERRORS
        if time.monotonic() - last[0] > 5:
            healthy(port)
            report()
            last[0] = time.monotonic()

    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
