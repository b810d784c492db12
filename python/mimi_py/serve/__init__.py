"""A real-time Mimi server: many WebSocket clients, one batched codec stepping every frame.

    python -m mimi_py serve [--host 127.0.0.1] [--port 8765] [--slots 8] [--weights PATH|hf:REPO]
                            [--num-codebooks K] [--weights-dtype float32|bfloat16] [--threads N]

``ws://HOST:PORT/encode`` takes PCM and sends codes per frame; ``/decode`` takes codes and
sends PCM per frame; ``GET /`` is a page that streams the microphone through both, and
``GET /health`` reports the slots and step times. ``docs/protocol.md`` is the protocol
(:mod:`mimi_py.serve.protocol` declares it). SIGINT or SIGTERM shut the server down: every
client gets the frames already queued, then close code 1001. Needs the ``serve`` extra
(``pip install 'mimi_py[serve]'``: websockets).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from .protocol import MAX_MESSAGE_BYTES
from .server import Server, websockets_module

__all__ = ["Server", "add_arguments", "main", "run_server", "serve"]


async def serve(args: argparse.Namespace) -> None:
    """Loads the codec and serves until SIGINT/SIGTERM; the first stdout line is the address."""
    from ..hub import load_codec

    codec = load_codec(args.weights, num_codebooks=args.num_codebooks, weights_dtype=args.weights_dtype)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def ready(port: int) -> None:
        print(f"listening on ws://{args.host}:{port}", flush=True)
        logging.getLogger("mimi_py.serve").info(
            "%d slots, %s, %s weights", args.slots, codec.device, args.weights_dtype
        )

    await run_server(Server(codec, args.slots), args.host, args.port, stop, ready)


async def run_server(server: Server, host: str, port: int, stop: asyncio.Event, ready=None) -> None:
    """Serves `server` on host:port until `stop` is set, then shuts down gracefully (queued
    frames, then 1001). ``ready(port)`` is called once it listens."""
    from .http import process_request

    async def handler(ws):
        await server.handle(ws, ws.route)

    ws_serve = websockets_module().asyncio.server.serve
    async with ws_serve(
        handler, host, port, process_request=process_request(server),
        max_size=MAX_MESSAGE_BYTES, compression=None, close_timeout=5,
    ) as ws_server:  # fmt: skip
        if ready is not None:
            ready(ws_server.sockets[0].getsockname()[1])
        ticker = asyncio.create_task(server.run())
        await stop.wait()
        await server.stop()
        await ticker
        ws_server.close(close_connections=False)
        await asyncio.wait_for(ws_server.wait_closed(), timeout=10)


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's options (``mimi-py serve`` and ``python -m mimi_py.serve`` share them)."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on the first line)")
    p.add_argument("--slots", type=_positive, default=8, help="concurrent streams: rows of the batched codec")
    p.add_argument(
        "--weights", default=None, help="a checkpoint path or hf:REPO_ID (default: seeded random weights)"
    )
    p.add_argument("--num-codebooks", type=int, default=None, help="default: the checkpoint's own number")
    p.add_argument(
        "--weights-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="how the weights are stored (bfloat16: half the memory and bytes read per step; see the README)",
    )
    p.add_argument("--threads", type=_positive, default=None, help="compute threads (default: one per core)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> None:
    """Serves with parsed arguments (sets the thread count before the codec's pool starts)."""
    if args.threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not a line per connection
    asyncio.run(serve(args))


def main(argv: list[str] | None = None) -> None:
    """``python -m mimi_py.serve``: parse the command line and serve."""
    p = argparse.ArgumentParser(prog="python -m mimi_py.serve", description=__doc__.splitlines()[0])
    run(add_arguments(p).parse_args(argv))
