"""The server: slots (rows of one batched codec), a deadline ticker, admission, and the connections.

Each connection takes a slot, a row of the codec's encoder and decoder streams. Ticks are due
at ``t0 + n * tick``; each steps every encode slot that has a whole frame with one masked
``encode_step`` (its codes go out at once), then every decode slot with one masked
``decode_step``. A step that ends past the next tick's due time is counted as late, and the
next tick starts at once, never after a sleep. Steps run in a worker thread (the codec
releases the GIL), so sockets keep being served during them. Only the ticker seats, resets
and frees rows, between steps, so a row never changes hands during a step.

A new stream is admitted while a slot is free and the ticks are not running late
(:class:`~mimi_py.serve.capacity.Lateness`); otherwise it gets 1013. Clients already admitted
are never dropped for lateness.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import numpy as np

from .access import Access, HandshakeGate
from .capacity import Calibration, Lateness
from .client import Client, Shape
from .metrics import ServerCollector, Stats, prometheus
from .protocol import (
    HANDSHAKE_TIMEOUT,
    MAX_HANDSHAKES,
    REFUSALS,
    Close,
    ProtocolError,
    Refusal,
    Route,
    serve_extra,
)

__all__ = ["Server", "Stats"]

log = logging.getLogger("mimi_py.serve")

# Per-connection kernel send buffer: bounds what a slow reader holds in the kernel.
SEND_BUFFER_BYTES = 64 * 1024


def websockets_module():
    """websockets, with its asyncio implementation (websockets >= 14): see ``serve_extra``."""
    return serve_extra("websockets", "asyncio.server")


class Server:
    """The slots and the ticker stepping the batched codec once per frame."""

    def __init__(
        self,
        codec,
        slots: int,
        tick: float | None = None,
        queue_seconds: float = 2.0,
        *,
        access: Access | None = None,
        calibration: Calibration | None = None,
        max_handshakes: int = MAX_HANDSHAKES,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ):
        self.codec = codec
        self.shape = Shape(codec.frame_size, codec.num_codebooks, codec.cardinality, codec.frame_rate)
        self.tick = tick if tick is not None else 1.0 / codec.frame_rate
        self.queue_frames = max(4, int(queue_seconds * codec.frame_rate))
        self.rows: list[Client | None] = [None] * slots
        self.joining: list[Client] = []
        self.access = access if access is not None else Access()
        self.calibration = calibration
        self.registry = prometheus().CollectorRegistry()
        self.stats = Stats(self.registry)
        self.registry.register(ServerCollector(self))
        self.lateness = Lateness()
        self.handshakes = HandshakeGate(max_handshakes, lambda: self.refuse(Refusal.HANDSHAKES))
        self.handshake_timeout = handshake_timeout
        self.stopping = False

    def busy(self) -> int:
        """Slots held: seated or waiting for a row, and not yet left or done."""
        return sum(not (c.left or c.done) for c in [*self.rows, *self.joining] if c is not None)

    def health(self) -> dict:
        """``GET /health``: slots busy and free, frames served, late ticks, step times."""
        busy = self.busy()
        return {
            "slots": {"total": len(self.rows), "busy": busy, "free": len(self.rows) - busy},
            "frames_served": self.stats.frames_served,
            "ticks": self.stats.ticks,
            "late_ticks": self.stats.late_ticks,
            "closed": {str(code): n for code, n in sorted(self.stats.closed.items())},
            "tick_ms": round(1000 * self.tick, 3),
            "codec": {
                "sample_rate": self.codec.sample_rate,
                "frame_size": self.shape.frame_size,
                "frame_rate": self.shape.frame_rate,
                "num_codebooks": self.shape.num_codebooks,
                "cardinality": self.shape.cardinality,
            },
            "step_ms": self.stats.summary(),
            "behind": self.behind(),
            "refused": dict(sorted((r.value, n) for r, n in self.stats.refused.items())),
            "calibration": self.calibration.as_dict() if self.calibration is not None else None,
        }

    def behind(self) -> bool:
        """Whether the ticks keep running late (new clients then get 1013)."""
        return self.lateness.behind(time.monotonic())

    def refuse(self, why: Refusal) -> int:
        """Counts a refusal; returns its answer (an HTTP status or a close code)."""
        self.stats.refused[why] += 1
        return REFUSALS[why][0]

    def admission(self) -> tuple[Refusal, str] | None:
        """Why a new stream is turned away now, with the reason sent, or None to admit it."""
        if self.stopping:
            return Refusal.STOPPING, "the server is shutting down"
        if self.busy() >= len(self.rows):
            return Refusal.SLOTS, f"all {len(self.rows)} slots are busy; try again later"
        if self.behind():
            late = self.lateness.seconds(time.monotonic())
            return (
                Refusal.LATE,
                f"the server is behind ({late:.1f} s of the last {self.lateness.window:g} s of ticks ran late); try again later",
            )
        return None

    async def handle(self, ws, route: Route) -> None:
        """One connection: admit it, read its messages, and close it with its code."""
        if (refused := self.admission()) is not None:
            code = self.refuse(refused[0])
            self.stats.closed[code] += 1
            await ws.close(code, refused[1])
            return
        sock = ws.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        client = Client(ws, route, self.shape, self.queue_frames, self.stats.closed)
        self.joining.append(client)
        sender = asyncio.create_task(self.send(client))
        try:
            async for msg in ws:
                client.receive(msg)
        except ProtocolError as e:
            log.info("closing a %s client: %d %s", client.kind, e.code, e.reason)
            client.inbox.clear()
            client.closing = (e.code, e.reason)
            self.stats.closed[int(e.code)] += 1
            await ws.close(int(e.code), e.reason)
        except websockets_module().ConnectionClosed as e:
            if e.sent is not None and e.sent.code == Close.TOO_BIG:
                self.stats.closed[int(Close.TOO_BIG)] += 1
        finally:
            client.left = True  # the connection is closed: nothing more can be sent
            sender.cancel()

    async def send(self, client: Client) -> None:
        """Sends a client's queued messages in order; the `None` after them closes the socket."""
        closed = websockets_module().ConnectionClosed
        try:
            while (msg := await client.outbox.get()) is not None:
                await client.ws.send(msg)
            code, reason = client.closing or (Close.DONE, "")
            await client.ws.close(int(code), reason)
        except closed:
            pass

    async def seat(self) -> None:
        """Frees the rows of clients that left and gives free rows to new clients (reset)."""
        for r, c in enumerate(self.rows):
            if c is not None and (c.left or c.done):
                self.rows[r] = None
        fresh = []
        while self.joining and None in self.rows:
            c = self.joining.pop(0)
            if c.left:
                continue
            c.row = self.rows.index(None)
            self.rows[c.row] = c
            fresh.append(c.row)
        if fresh:
            await asyncio.to_thread(self.codec.reset_state, rows=fresh)

    async def step(self) -> None:
        """One tick: a masked encode step of the encode slots, then a decode step of the decode slots."""
        await self.seat()
        t = time.perf_counter()
        for kind in ("encode", "decode"):
            ready = [(r, c) for r, c in enumerate(self.rows) if c is not None and c.kind == kind and c.inbox]
            if ready:
                await self._step(kind, ready)
        self.stats.step(time.perf_counter() - t)
        for c in self.rows:
            if c is not None and c.finished():
                c.done = True
                c.post(json.dumps({"done": c.frames_out}))
                c.close(Close.DONE, "")

    async def _step(self, kind: str, ready: list[tuple[int, Client]]) -> None:
        """One masked step of the codec's encode or decode stream over the ready rows."""
        b, s = len(self.rows), self.shape
        active = np.zeros(b, bool)
        if kind == "encode":
            x = np.zeros((b, 1, s.frame_size), np.float32)
        else:
            x = np.zeros((b, s.num_codebooks, 1), np.uint32)
        for r, c in ready:
            active[r] = True
            if kind == "encode":
                x[r, 0] = c.take()
            else:
                x[r, :, 0] = c.take()
        fn = self.codec.encode_step if kind == "encode" else self.codec.decode_step
        y = await asyncio.to_thread(fn, x, active=active)
        for r, c in ready:
            if kind == "encode":
                msg: str | bytes = json.dumps({"frame": c.frames_out, "codes": y[r, :, 0].tolist()})
            else:
                msg = c.route.format.from_float(y[r, 0])
            if c.post(msg):
                c.frames_out += 1
                self.stats.frames_served += 1

    async def run(self) -> None:
        """The ticker: ticks due at t0 + n * tick until :meth:`stop`; late ticks never sleep."""
        loop = asyncio.get_running_loop()
        t0, n = loop.time(), 0
        while not self.stopping:
            n += 1
            behind = loop.time() - (t0 + n * self.tick)
            if behind < 0:
                await asyncio.sleep(-behind)
            else:
                self.stats.late(behind)
            self.lateness.tick(time.monotonic(), behind >= 0)
            self.stats.ticks += 1
            try:
                await self.step()
            except Exception:  # the ticker must outlive a failed step: its clients go, the rest stay
                log.exception("a codec step failed; closing its clients (1011)")
                await self.drop_all(Close.INTERNAL, "the server failed to step this stream")

    async def drop_all(self, code: Close, reason: str) -> None:
        """Closes every seated client (after a failed step, their rows' state is unknown)."""
        for c in self.rows:
            if c is not None:
                c.inbox.clear()
                c.done = True
                c.close(code, reason)

    async def stop(self) -> None:
        """Graceful shutdown: the ticker stops, every client gets its queued frames, then 1001."""
        self.stopping = True
        clients = [c for c in self.rows if c is not None] + self.joining
        for c in clients:
            c.close(Close.GOING_AWAY, "the server is shutting down")
        await asyncio.sleep(0)
