"""A streaming Mimi server: many WebSocket clients, one batched codec stepping every frame.

    python -m mimi_py.serve [--host 127.0.0.1] [--port 8765] [--slots 8] [--weights PATH|hf:REPO]
                            [--decode] [--tick-ms 80]

Each connection gets a slot (a row of the batched codec). A client sends float32 little-endian
mono PCM at the codec's sample rate (24 kHz for Mimi) in binary messages of any size, then the text message ``end``. Every tick
(one frame, 80 ms) one ``encode_step(..., active=mask)`` advances every slot that has a whole
frame buffered; silent slots are masked out and keep their state. For each frame the client
gets a text message ``{"frame": i, "codes": [...]}`` (a speech-to-text front end) and, with
``--decode``, the decoded audio as a binary message. Every whole frame's codes equal
``MimiCodec.encode``'s. After ``end`` a last partial frame is padded with zeros (a stream
cannot look ahead, so that one frame may differ from ``encode``'s, which pads every layer),
then ``{"done": n_frames}`` arrives. A slot that
changes hands is reset (``reset_state(rows=[slot])``); a client that disconnects frees its
slot; a client too slow to take its frames (a full send queue) is disconnected, so it never
stalls the others. Needs the ``serve`` extra (``pip install 'mimi_py[serve]'``: ``websockets``).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import numpy as np

from ._core import MimiCodec
from .hub import load_codec

__all__ = ["Server", "Slot", "main", "serve"]


def _websockets():
    """websockets (the serve extra), imported when first used so that the module imports without it."""
    try:
        import websockets
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("mimi_py.serve needs websockets: pip install 'mimi_py[serve]'") from e
    return websockets


class Slot:
    """One client: its socket, buffered samples, frames sent and a bounded send queue."""

    def __init__(self, ws, queue_frames: int):
        self.ws, self.pcm, self.frames = ws, np.zeros(0, np.float32), 0
        self.ending = self.closed = False
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=queue_frames)


class Server:
    """The slots and the ticker that steps the batched codec. Only the ticker assigns, resets
    and frees rows, between steps, so a row never changes hands during a step."""

    def __init__(self, codec: MimiCodec, slots: int, decode: bool, tick: float):
        self.codec, self.decode, self.tick = codec, decode, tick
        self.slots: list[Slot | None] = [None] * slots
        self.joining: list[Slot] = []
        self.f = codec.frame_size

    async def handle(self, ws) -> None:
        """One connection: buffer its audio until it ends or leaves; the ticker does the rest."""
        slot = Slot(ws, queue_frames=50)
        self.joining.append(slot)
        sender = asyncio.create_task(self.send(slot))
        try:
            async for msg in ws:
                if isinstance(msg, str):
                    slot.ending = slot.ending or msg.strip() == "end"
                else:
                    slot.pcm = np.concatenate([slot.pcm, np.frombuffer(msg, "<f4")])
        except _websockets().ConnectionClosed:
            pass
        finally:
            slot.closed = True
            sender.cancel()

    async def send(self, slot: Slot) -> None:
        """Sends a slot's queued messages; `None` closes the connection."""
        while (msg := await slot.queue.get()) is not None:
            await slot.ws.send(msg)
        await slot.ws.close()

    async def seat(self) -> None:
        """Frees the rows of clients that left and gives free rows to new clients (reset)."""
        for r, slot in enumerate(self.slots):
            if slot is not None and slot.closed:
                self.slots[r] = None
        fresh = []
        while self.joining:
            slot = self.joining.pop(0)
            if slot.closed:
                continue
            if None not in self.slots:
                await slot.ws.close(1013, "all slots are busy")
                continue
            r = self.slots.index(None)
            self.slots[r] = slot
            fresh.append(r)
        if fresh:
            await asyncio.to_thread(self.codec.reset_state, rows=fresh)

    def take_frame(self, slot: Slot) -> np.ndarray | None:
        """The slot's next whole frame, padding the remainder with zeros once it has ended."""
        if len(slot.pcm) < self.f and slot.ending and len(slot.pcm) > 0:
            slot.pcm = np.concatenate([slot.pcm, np.zeros(self.f - len(slot.pcm), np.float32)])
        if len(slot.pcm) < self.f:
            return None
        frame, slot.pcm = slot.pcm[: self.f], slot.pcm[self.f :]
        return frame

    def post(self, slot: Slot, msg) -> None:
        """Queues a message; a client whose queue is full is too slow and is dropped."""
        try:
            slot.queue.put_nowait(msg)
        except asyncio.QueueFull:
            asyncio.ensure_future(slot.ws.close(1008, "too slow to take its frames"))

    async def run(self) -> None:
        """The ticker: one masked encode (and decode) step of all slots per frame."""
        b = len(self.slots)
        while True:
            await asyncio.sleep(self.tick)
            await self.seat()
            pcm = np.zeros((b, 1, self.f), np.float32)
            stepped: list[tuple[int, Slot]] = []
            for r, slot in enumerate(self.slots):
                if slot is not None and (frame := self.take_frame(slot)) is not None:
                    pcm[r, 0] = frame
                    stepped.append((r, slot))
            if stepped:
                active = np.zeros(b, bool)
                active[[r for r, _ in stepped]] = True
                codes = await asyncio.to_thread(self.codec.encode_step, pcm, active=active)
                assert codes is not None  # a whole frame per active row gives a frame of codes
                audio = None
                if self.decode:
                    audio = await asyncio.to_thread(self.codec.decode_step, codes, active=active)
                self.deliver(stepped, codes, audio)
            for slot in self.slots:
                if slot is not None and slot.ending and len(slot.pcm) == 0:
                    slot.ending = False
                    self.post(slot, json.dumps({"done": slot.frames}))
                    self.post(slot, None)

    def deliver(self, stepped, codes: np.ndarray, audio: np.ndarray | None) -> None:
        """Queues each stepped slot's frame: its codes, and its audio with --decode."""
        for r, slot in stepped:
            self.post(slot, json.dumps({"frame": slot.frames, "codes": codes[r, :, 0].tolist()}))
            if audio is not None:
                self.post(slot, audio[r, 0].astype("<f4").tobytes())
            slot.frames += 1


async def serve(args: argparse.Namespace) -> None:
    """Loads the codec and serves until cancelled; prints the address it listens on."""
    codec = load_codec(args.weights, num_codebooks=args.num_codebooks)
    server = Server(codec, args.slots, args.decode, args.tick_ms / 1000)
    async with _websockets().serve(server.handle, args.host, args.port, max_size=2**24) as ws:
        port = ws.sockets[0].getsockname()[1]
        print(f"listening on ws://{args.host}:{port} with {args.slots} slots", flush=True)
        await server.run()


def parser() -> argparse.ArgumentParser:
    """The server's command line."""
    p = argparse.ArgumentParser(prog="python -m mimi_py.serve", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed)")
    p.add_argument("--slots", type=int, default=8, help="concurrent streams (codec batch rows)")
    p.add_argument("--weights", default=None, help="checkpoint path or hf:REPO (default: seeded)")
    p.add_argument("--num-codebooks", type=int, default=None)
    p.add_argument("--decode", action="store_true", help="also send the decoded audio back")
    p.add_argument("--tick-ms", type=float, default=80.0, help="frame period (80 ms is real time)")
    return p


def main(argv: list[str] | None = None) -> None:
    """``python -m mimi_py.serve``: parse the command line and serve."""
    asyncio.run(serve(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
