"""A real-time Mimi server: many WebSocket clients, one batched codec stepping every frame.

    python -m mimi_py serve [--host 127.0.0.1] [--port 8765] [--slots auto|N] [--token T | --no-auth]
                            [--allow-origin URL] [--allow-host NAME] [--certfile PEM --keyfile PEM]
                            [--weights PATH|hf:REPO]
                            [--num-codebooks K] [--weights-dtype float32|bfloat16] [--threads N]

``ws://HOST:PORT/encode`` takes PCM and sends codes per frame; ``/decode`` takes codes and
sends PCM per frame; ``GET /`` is a page that streams the microphone through both,
``GET /health`` reports the slots and step times, ``GET /metrics`` the same for Prometheus.
``docs/protocol.md`` is the protocol (:mod:`mimi_py.serve.protocol` declares it). With
``--slots auto`` (the default) the slots are measured at start-up
(:mod:`mimi_py.serve.capacity`); with a token, streams and ``/metrics`` need it, and without
one every request must name the server by a loopback name, its ``--host`` or an ``--allow-host``
(:mod:`mimi_py.serve.access`); with ``--certfile`` the server speaks ``wss://`` and ``https://``.
SIGINT or SIGTERM shut the server down: every client gets the frames already queued, then close
code 1001. Needs the ``serve`` extra (``pip install 'mimi_py[serve]'``: websockets,
prometheus_client).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys

from ..options import add_precision
from .access import ANY_HOST, Access, host_name, is_loopback
from .protocol import MAX_MESSAGE_BYTES, TOKEN_ENV
from .server import Server, websockets_module

__all__ = ["Server", "add_arguments", "main", "make_access", "run_server", "serve"]

log = logging.getLogger("mimi_py.serve")

# Seconds a closing handshake (WebSocket, or TLS shutdown) may take before the socket is dropped.
CLOSE_TIMEOUT = 5.0


async def serve(args: argparse.Namespace) -> None:
    """Loads the codec, measures the slots (``--slots auto``) and serves until SIGINT/SIGTERM;
    the first stdout line is the address."""
    from ..hub import load_codec
    from .capacity import calibrate

    tls = tls_context(args.certfile, args.keyfile)
    codec = load_codec(
        args.weights,
        num_codebooks=args.num_codebooks,
        precision=args.precision,
        weights_dtype=args.weights_dtype,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    calibration = None
    if args.slots == "auto":
        calibration = await asyncio.to_thread(calibrate, codec, 1.0 / codec.frame_rate)
        log.info("%s", calibration.line())
    slots = calibration.slots if calibration is not None else args.slots
    access = make_access(args)

    def ready(port: int) -> None:
        print(f"listening on {'wss' if tls else 'ws'}://{args.host}:{port}", flush=True)
        log.info("%d slots, %s, precision %s, %s", slots, codec.device, codec.precision, _who(access))

    server = Server(codec, slots, access=access, calibration=calibration)
    await run_server(server, args.host, args.port, stop, ready, tls=tls)


def make_access(args: argparse.Namespace) -> Access:
    """The server's :class:`Access` from its options: ``--token`` (resolved by
    :func:`check_access`), ``--allow-origin``, ``--allow-host`` and ``--host``."""
    return Access(args.token, args.allow_origin, args.allow_host, host=args.host)


def _who(access: Access) -> str:
    """Who may connect, for the start-up log line."""
    if access.needs_token:
        return "token required"
    if access.any_host:
        return "no token, any Host (--allow-host '*': no DNS-rebinding protection)"
    return "no token, Host: loopback names" + "".join(f", {h}" for h in sorted(access.allow_hosts))


async def run_server(
    server: Server, host: str, port: int, stop: asyncio.Event, ready=None, tls: ssl.SSLContext | None = None
) -> None:
    """Serves `server` on host:port (TLS with `tls`) until `stop` is set, then shuts down
    gracefully (queued frames, then 1001). ``ready(port)`` is called once it listens."""
    from .http import gated_connection, process_request

    async def handler(ws):
        await server.handle(ws, ws.route)

    # TLS is not websockets' (ssl=): GatedConnection runs its handshake, inside the handshake cap.
    gated = gated_connection(server.handshakes, tls, server.handshake_timeout, CLOSE_TIMEOUT)
    ws_serve = websockets_module().asyncio.server.serve
    async with ws_serve(
        handler, host, port, process_request=process_request(server), max_size=MAX_MESSAGE_BYTES,
        compression=None, close_timeout=CLOSE_TIMEOUT, open_timeout=server.handshake_timeout,
        create_connection=gated,
    ) as ws_server:  # fmt: skip
        if ready is not None:
            ready(ws_server.sockets[0].getsockname()[1])
        ticker = asyncio.create_task(server.run())
        await stop.wait()
        await server.stop()
        await ticker
        ws_server.close(close_connections=False)
        await asyncio.wait_for(ws_server.wait_closed(), timeout=10)


def tls_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """A server TLS context from PEM files (the key may be in the certificate file), or None."""
    if certfile is None:
        if keyfile is not None:
            raise SystemExit("error: --keyfile needs --certfile")
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise SystemExit(f"error: --certfile {certfile} / --keyfile {keyfile}: cannot load: {e}") from None
    return ctx


def check_access(args: argparse.Namespace) -> None:
    """Resolves the token (``--token``, else ``MIMI_PY_SERVE_TOKEN``) into ``args.token``; a
    non-loopback ``--host`` without one refuses to start (exit 1, one line) unless ``--no-auth``."""
    if args.token is None:
        args.token = os.environ.get(TOKEN_ENV) or None
    if args.token is not None and args.no_auth:
        raise SystemExit(f"error: --no-auth and a token (--token or {TOKEN_ENV}) contradict each other")
    if args.token is None and not is_loopback(args.host):
        if not args.no_auth:
            raise SystemExit(
                f"error: --host {args.host} is not a loopback address: anyone who reaches it could "
                f"stream; pass --token (or set {TOKEN_ENV}), or --no-auth to serve without one"
            )
        log.warning("serving %s without a token (--no-auth): anyone who reaches it may stream", args.host)


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not at least 1")
    return n


def _host(text: str) -> str:
    """An argparse type: a host name or address (a port is ignored), or ``*``."""
    if text.strip() != ANY_HOST and host_name(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a host name or address (nor '*')")
    return text


def _slots(text: str) -> int | str:
    """An argparse type: ``auto`` or an integer of at least 1."""
    return text if text == "auto" else _positive(text)


def _add_access(p: argparse.ArgumentParser) -> None:
    """Who may connect, and TLS."""
    p.add_argument(
        "--token", default=None,
        help=f"streams and /metrics need it (Authorization: Bearer TOKEN, or ?token=TOKEN; the page "
        f"takes it from its URL: /#token=TOKEN). Default: the {TOKEN_ENV} environment variable, which "
        "other users cannot read from the process list. Required when --host is not loopback",
    )  # fmt: skip
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback --host without a token (behind your own auth)",
    )
    p.add_argument(
        "--allow-origin", action="append", default=[], metavar="ORIGIN",
        help="a browser origin (https://app.example.com) allowed to open streams besides the server's "
        "own; repeat for more",
    )  # fmt: skip
    p.add_argument(
        "--allow-host", action="append", default=[], type=_host, metavar="NAME",
        help="without a token, a Host name (or address) served besides loopback ones (localhost, "
        "*.localhost, 127.0.0.1, [::1]) and --host; others get 403, which stops DNS rebinding. "
        "Repeat for more; '*' allows any Host (then any web page a user visits may stream through "
        "the server)",
    )  # fmt: skip
    p.add_argument("--certfile", default=None, help="a PEM certificate (chain): serve wss:// and https://")
    p.add_argument("--keyfile", default=None, help="its PEM private key (default: in --certfile)")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's options (``mimi-py serve`` and ``python -m mimi_py.serve`` share them)."""
    p.add_argument(
        "--host", default="127.0.0.1", help="default 127.0.0.1; any other needs --token or --no-auth"
    )
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed on the first line)")
    p.add_argument(
        "--slots", type=_slots, default="auto", metavar="auto|N",
        help="concurrent streams (rows of the batched codec); auto (default): the most whose p99 step "
        "stays within 70%% of a frame on this machine, measured at start-up",
    )  # fmt: skip
    _add_access(p)
    p.add_argument(
        "--weights", default=None, help="a checkpoint path or hf:REPO_ID (default: seeded random weights)"
    )
    p.add_argument("--num-codebooks", type=int, default=None, help="default: the checkpoint's own number")
    add_precision(p)
    p.add_argument("--threads", type=_positive, default=None, help="compute threads (default: one per core)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> None:
    """Serves with parsed arguments (sets the thread count before the codec's pool starts)."""
    if args.threads is not None:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("websockets").setLevel(logging.WARNING)  # not a line per connection
    check_access(args)
    asyncio.run(serve(args))


def main(argv: list[str] | None = None) -> None:
    """``python -m mimi_py.serve``: parse the command line and serve."""
    p = argparse.ArgumentParser(prog="python -m mimi_py.serve", description=__doc__.splitlines()[0])
    run(add_arguments(p).parse_args(argv))
