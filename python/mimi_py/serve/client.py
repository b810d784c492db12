"""One connection's state: its route, its inbound frames and its outbound messages.

Inbound data becomes whole frames at once: PCM fills one preallocated frame buffer, codes are
split into frames, and each whole frame joins a deque bounded by ``MAX_AHEAD_SECONDS``.
Outbound messages wait in a queue bounded by ``queue_frames``; a client that lets it fill is
too slow and is closed (1008). Nothing here touches the codec: the ticker takes frames from
:meth:`Client.take` and posts results with :meth:`Client.post`.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque

import numpy as np

from .protocol import END, MAX_AHEAD_SECONDS, Close, ProtocolError, Route

__all__ = ["Client", "Shape"]


class Shape:
    """What a frame is for this server's codec: samples per frame, codebooks and cardinality."""

    def __init__(self, frame_size: int, num_codebooks: int, cardinality: int, frame_rate: float):
        self.frame_size, self.num_codebooks = frame_size, num_codebooks
        self.cardinality, self.frame_rate = cardinality, frame_rate
        self.max_ahead = int(MAX_AHEAD_SECONDS * frame_rate)


class Client:
    """A connected client: encode (PCM in, codes out) or decode (codes in, PCM out)."""

    def __init__(self, ws, route: Route, shape: Shape, queue_frames: int, closed: Counter):
        self.ws, self.route, self.shape, self.closed = ws, route, shape, closed
        self.inbox: deque[np.ndarray] = deque()
        self.pending = np.zeros(shape.frame_size, np.float32)  # the encode frame being filled
        self.filled = 0
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.queue_frames = queue_frames
        self.row: int | None = None
        self.ending = self.done = self.left = False
        self.frames_out = 0
        self.closing: tuple[Close, str] | None = None

    @property
    def kind(self) -> str:
        """``encode`` or ``decode``."""
        return self.route.kind

    def receive(self, msg: str | bytes) -> None:
        """One message from the client; raises ProtocolError for anything off the protocol."""
        if isinstance(msg, str):
            if msg.strip() != END:
                shown = msg if len(msg) <= 40 else msg[:40] + "..."
                raise ProtocolError(
                    Close.UNSUPPORTED, f"unknown text message {shown!r}: the only one is 'end'"
                )
            self.end()
            return
        if self.ending:
            raise ProtocolError(Close.INVALID, f"a {len(msg)}-byte message after 'end'")
        if self.kind == "encode":
            self._pcm(self.route.format.to_float(msg))
        else:
            self._codes(msg)
        if len(self.inbox) > self.shape.max_ahead:
            raise ProtocolError(
                Close.POLICY,
                f"more than {MAX_AHEAD_SECONDS:g} s ahead of real time ({len(self.inbox)} frames queued)",
            )

    def _pcm(self, x: np.ndarray) -> None:
        """Samples into the frame buffer; every whole frame joins the inbox."""
        f, i = self.shape.frame_size, 0
        while i < len(x):
            n = min(f - self.filled, len(x) - i)
            self.pending[self.filled : self.filled + n] = x[i : i + n]
            self.filled, i = self.filled + n, i + n
            if self.filled == f:
                self.inbox.append(self.pending.copy())
                self.filled = 0

    def _codes(self, data: bytes) -> None:
        """Whole frames of K little-endian uint32 codes, each below the cardinality."""
        k, card = self.shape.num_codebooks, self.shape.cardinality
        if len(data) == 0 or len(data) % (4 * k):
            raise ProtocolError(
                Close.INVALID,
                f"a codes message of {len(data)} bytes is not whole frames of {k} uint32 codes "
                f"({4 * k} bytes each)",
            )
        codes = np.frombuffer(data, "<u4").reshape(-1, k)
        if (bad := np.argwhere(codes >= card)).size:
            t, q = bad[0]
            raise ProtocolError(
                Close.INVALID,
                f"code {codes[t, q]} (codebook {q} of the message's frame {t}) is not below "
                f"the cardinality {card}",
            )
        self.inbox.extend(codes.astype(np.uint32))

    def end(self) -> None:
        """``end``: a last partial PCM frame is padded with zeros and queued."""
        self.ending = True
        if self.filled:
            self.pending[self.filled :] = 0.0
            self.inbox.append(self.pending.copy())
            self.filled = 0

    def take(self) -> np.ndarray | None:
        """The next whole frame to step, if any."""
        return self.inbox.popleft() if self.inbox else None

    def finished(self) -> bool:
        """Ended, and every frame stepped (the ticker then sends ``done``)."""
        return self.ending and not self.inbox and not self.done

    def post(self, msg: str | bytes) -> bool:
        """Queues a message; False (and the client is closed, 1008) when it is too slow."""
        if self.closing is not None:
            return False
        if self.outbox.qsize() >= self.queue_frames:
            self.close(Close.POLICY, f"too slow to take its frames ({self.outbox.qsize()} messages queued)")
            return False
        self.outbox.put_nowait(msg)
        return True

    def close(self, code: Close, reason: str) -> None:
        """Closes after the messages already queued (the sender sends them, then closes)."""
        if self.closing is None:
            self.closing = (code, reason)
            self.closed[int(code)] += 1
            self.outbox.put_nowait(None)
            if code == Close.POLICY:  # a slow client's queue is not worth waiting for
                asyncio.ensure_future(self.ws.close(int(code), reason))
