"""The server's wire protocol, declared once: its paths, PCM formats, limits and close codes.

``docs/protocol.md`` describes it for client authors; ``tests/serve/test_serve.py`` checks
that document against the tables here. Nothing in this module needs websockets or a codec.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass
from urllib.parse import parse_qs

import numpy as np

__all__ = [
    "CLOSE_REASONS",
    "END",
    "FORMATS",
    "HANDSHAKE_TIMEOUT",
    "HEALTH_PATH",
    "LATE_WINDOW",
    "MAX_AHEAD_SECONDS",
    "MAX_HANDSHAKES",
    "MAX_LATE_SECONDS",
    "MAX_MESSAGE_BYTES",
    "METRICS_PATH",
    "REFUSALS",
    "SINGLE_HEADERS",
    "STREAM_PATHS",
    "TOKEN_ENV",
    "Close",
    "PcmFormat",
    "ProtocolError",
    "Refusal",
    "Route",
    "parse_route",
    "serve_extra",
]

# The one text message a client sends: the end of its stream.
END = "end"
# A message larger than this closes the connection with 1009 (websockets enforces it).
MAX_MESSAGE_BYTES = 16 * 2**20
# A client may send at most this much audio (or codes) ahead of what the server has stepped.
MAX_AHEAD_SECONDS = 10.0
# New clients are turned away (1013) while more than MAX_LATE_SECONDS of the last LATE_WINDOW
# seconds went to late ticks and the ticker has not caught up; the clients already admitted stay.
MAX_LATE_SECONDS, LATE_WINDOW = 2.0, 5.0
# At most this many connections may be between their TCP accept and the end of their HTTP
# upgrade, their TLS handshake included; more get HTTP 503 at once (over TLS: closed at once,
# before any TLS handshake). A TLS handshake, or an HTTP upgrade, not done in HANDSHAKE_TIMEOUT
# seconds is dropped.
MAX_HANDSHAKES, HANDSHAKE_TIMEOUT = 64, 10.0
# The environment variable that holds the token when --token is not given.
TOKEN_ENV = "MIMI_PY_SERVE_TOKEN"
# The paths: WebSocket streams, and plain HTTP (the page's files are in http.PAGE_FILES).
STREAM_PATHS = ("/encode", "/decode")
HEALTH_PATH, METRICS_PATH = "/health", "/metrics"
# The request headers the server reads as one value. A request that carries one of them more
# than once, even twice the same, is ambiguous (which Host does it name? which token counts?) and
# gets HTTP 400 before any other check, on every path: RFC 9112 section 3.2 asks this of a repeated
# Host, and Origin (RFC 6454 section 7.3) and Authorization are single-valued too. The
# Sec-WebSocket-* headers are websockets' to read: it answers a repeated one with 400 itself.
SINGLE_HEADERS = ("Host", "Origin", "Authorization")


class Close(enum.IntEnum):
    """The close codes the server sends (RFC 6455 numbers)."""

    DONE = 1000
    GOING_AWAY = 1001
    UNSUPPORTED = 1003
    INVALID = 1007
    POLICY = 1008
    TOO_BIG = 1009
    INTERNAL = 1011
    TRY_AGAIN = 1013


# When each close code is sent: the table docs/protocol.md shows.
CLOSE_REASONS: dict[Close, str] = {
    Close.DONE: 'the stream ended: every frame was sent, then `{"done": n}`',
    Close.GOING_AWAY: "the server is shutting down (SIGINT/SIGTERM), after the frames already queued",
    Close.UNSUPPORTED: "a text message other than `end`",
    Close.INVALID: "PCM bytes that are not whole samples, a codes message that is not whole frames, a code not below the cardinality, or data after `end`",
    Close.POLICY: "a client too slow to take its frames (2 s of them queued after its socket buffers), or more than 10 s ahead of real time",
    Close.TOO_BIG: "a message over 16 MiB",
    Close.INTERNAL: "the codec failed a step (a bug: the server logs it, closes the clients of that step and goes on)",
    Close.TRY_AGAIN: "all slots are busy, or more than 2 s of the last 5 s of ticks ran late (try again later)",
}


class Refusal(enum.Enum):
    """Why a connection was turned away (the ``reason`` label of ``mimi_serve_refused_total``)."""

    HANDSHAKES = "handshakes"
    DUPLICATE = "duplicate"
    NO_HOST = "no_host"
    HOST = "host"
    ORIGIN = "origin"
    TOKEN = "token"
    SLOTS = "slots"
    LATE = "late"
    STOPPING = "stopping"


# Each refusal's answer (an HTTP status before the upgrade, a close code after it) and when it
# is given: the table docs/protocol.md shows. A foreign Host gets 403, as in Jupyter's check:
# the server refuses to answer for that name. Not 421 (Misdirected Request), which says the
# request reached the wrong server over a reused connection and invites a client to retry it
# on a new one.
REFUSALS: dict[Refusal, tuple[int, str]] = {
    Refusal.HANDSHAKES: (
        503,
        "64 connections are already between their TCP accept and the end of their upgrade, TLS "
        "handshakes included (over TLS the connection is closed at once, before a TLS handshake)",
    ),
    Refusal.DUPLICATE: (
        400,
        f"the request carries one of {', '.join(f'`{h}`' for h in SINGLE_HEADERS)} more than once "
        "(which one counts would be ambiguous), whatever its path and whether or not a token is set",
    ),
    Refusal.NO_HOST: (
        400,
        "the request has no `Host` (HTTP/1.1 requires one), whatever its path and whether or not "
        "a token is set",
    ),
    Refusal.HOST: (
        403,
        "no token is set and the `Host` is neither a loopback name or address, the server's "
        "`--host`, nor one given with `--allow-host` (what a DNS-rebinding page sends)",
    ),
    Refusal.ORIGIN: (
        403,
        "a browser's `Origin` is neither the server's own host nor one given with `--allow-origin`",
    ),
    Refusal.TOKEN: (401, "a token is set and the request's is missing or wrong (the same answer for both)"),
    Refusal.SLOTS: (1013, "all slots are busy"),
    Refusal.LATE: (
        1013,
        "more than 2 s of the last 5 s went to late ticks, and the ticker has not caught up yet",
    ),
    Refusal.STOPPING: (1001, "the server is shutting down"),
}


class ProtocolError(Exception):
    """A client broke the protocol: the connection closes with ``code`` and ``reason``."""

    def __init__(self, code: Close, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


@dataclass(frozen=True)
class PcmFormat:
    """A PCM sample format on the wire: little-endian float32 or int16 (full scale 32768)."""

    name: str
    dtype: str
    scale: float

    @property
    def itemsize(self) -> int:
        """Bytes per sample."""
        return np.dtype(self.dtype).itemsize

    def to_float(self, data: bytes) -> np.ndarray:
        """A message's samples as float32; raises ProtocolError (1007) if not whole samples."""
        if len(data) % self.itemsize:
            raise ProtocolError(
                Close.INVALID,
                f"a PCM message of {len(data)} bytes is not whole {self.name} samples "
                f"({self.itemsize} bytes each)",
            )
        x = np.frombuffer(data, self.dtype)
        return x.astype(np.float32) / self.scale if self.scale != 1.0 else x.astype(np.float32)

    def from_float(self, x: np.ndarray) -> bytes:
        """float32 samples on the wire (int16 clips to full scale and rounds)."""
        if self.scale == 1.0:
            return np.asarray(x, "<f4").tobytes()
        q = np.clip(np.rint(np.asarray(x, np.float32) * self.scale), -self.scale, self.scale - 1)
        return q.astype(self.dtype).tobytes()


FORMATS = {f.name: f for f in (PcmFormat("f32le", "<f4", 1.0), PcmFormat("s16le", "<i2", 32768.0))}


@dataclass(frozen=True)
class Route:
    """A WebSocket request: ``kind`` is ``encode`` or ``decode``, in a PCM format."""

    kind: str
    format: PcmFormat


def parse_route(path: str) -> Route | str:
    """``/encode?format=s16le`` -> its Route, or the reason it is not one (for HTTP 404/400)."""
    base, _, query = path.partition("?")
    if base not in STREAM_PATHS:
        return f"unknown path {base!r}: the server serves /encode, /decode, /health, /metrics and /"
    names = parse_qs(query).get("format", ["f32le"])
    if len(names) != 1 or names[0] not in FORMATS:
        return f"format={','.join(names)!r} is not one of {', '.join(FORMATS)}"
    return Route(base[1:], FORMATS[names[0]])


def serve_extra(name: str, *submodules: str):
    """The serve extra's module ``name`` (with its ``submodules``), imported when first used so
    that ``mimi_py.serve`` imports without the extra; a missing one names the install command."""
    try:
        module = importlib.import_module(name)
        for sub in submodules:
            importlib.import_module(f"{name}.{sub}")
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"mimi_py.serve needs {name}: pip install 'mimi_py[serve]'") from e
    return module
