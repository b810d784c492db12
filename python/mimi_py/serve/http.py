"""The server's plain HTTP side: the page, ``/health``, ``/metrics``, the handshake's checks,
and the paths that are not WebSockets.

``process_request`` (websockets' hook) answers ``GET /``, the page's files, ``/health`` and
``/metrics`` itself; refuses a stream whose ``Origin`` is not allowed (403), a stream or
``/metrics`` without the token (401), unknown paths (404) and unknown formats (400), all before
any upgrade, so a WebSocket handler only ever sees an allowed, valid
:class:`~mimi_py.serve.protocol.Route`. :class:`GatedConnection` answers 503 to a connection
over the cap on handshakes in flight, before its request is read. Imported when serving
(it needs websockets).
"""

from __future__ import annotations

import json
from importlib import resources

from websockets.asyncio.server import ServerConnection

from .access import HandshakeGate
from .metrics import metrics_text
from .protocol import HEALTH_PATH, METRICS_PATH, STREAM_PATHS, Refusal, parse_route

__all__ = [
    "BUSY_RESPONSE",
    "PAGE_FILES",
    "GatedConnection",
    "gated_connection",
    "page_file",
    "process_request",
]

# What a refused request is told (never which of missing or wrong a token was).
REFUSED_BODY = {
    Refusal.ORIGIN: "this Origin may not open streams here (the server's own host, or --allow-origin)\n",
    Refusal.TOKEN: "a valid token is needed: Authorization: Bearer TOKEN, or ?token=TOKEN\n",
}

# The page: static files in the package, served as they are (no build step).
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/worklets.js": ("worklets.js", "text/javascript; charset=utf-8"),
}


def page_file(name: str) -> bytes:
    """One of the page's files, from the installed package."""
    return (resources.files(__package__) / "page" / name).read_bytes()


def _response(connection, status: int, body: bytes, content_type: str):
    """A response with a body and its content type (``connection.respond`` is text/plain)."""
    r = connection.respond(status, "")
    r.body = body
    for name, value in (("Content-Type", content_type), ("Content-Length", str(len(body)))):
        del r.headers[name]  # websockets' headers are a multidict: replace, don't add
        r.headers[name] = value
    r.headers["Cache-Control"] = "no-store"
    return r


def _refused(connection, status: int, why: Refusal):
    """403 or 401, with ``WWW-Authenticate: Bearer`` on a 401."""
    r = _response(connection, status, REFUSED_BODY[why].encode(), "text/plain; charset=utf-8")
    if why is Refusal.TOKEN:
        r.headers["WWW-Authenticate"] = "Bearer"
    return r


def process_request(server):
    """websockets' ``process_request`` for this server: HTTP answers, or None to go on to the
    WebSocket handshake of ``/encode`` and ``/decode``."""

    def process(connection, request):
        base = request.path.partition("?")[0]
        if base == HEALTH_PATH:
            body = json.dumps(server.health()).encode()
            return _response(connection, 200, body, "application/json")
        if base in PAGE_FILES:
            name, content_type = PAGE_FILES[base]
            return _response(connection, 200, page_file(name), content_type)
        if base in (*STREAM_PATHS, METRICS_PATH):
            refused = server.access.check(request, stream=base != METRICS_PATH)
            if refused is not None:
                return _refused(connection, server.refuse(refused), refused)
        if base == METRICS_PATH:
            return _response(connection, 200, *metrics_text(server.registry))
        route = parse_route(request.path)
        if isinstance(route, str):
            status = 404 if route.startswith("unknown path") else 400
            return _response(connection, status, (route + "\n").encode(), "text/plain; charset=utf-8")
        connection.route = route
        return None

    return process


# The answer to a connection over the handshake cap, written before its request is read.
_BUSY_BODY = b"too many connections are opening at once; try again later\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class GatedConnection(ServerConnection):
    """A websockets connection that passes its server's :class:`HandshakeGate` (``gate``, set by
    :func:`gated_connection`): one over the cap gets :data:`BUSY_RESPONSE` and is closed."""

    gate: HandshakeGate
    gated = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.gated = self.gate.enter()
        if not self.gated:
            transport.write(BUSY_RESPONSE)
            transport.close()

    def _leave(self) -> None:
        if self.gated:
            self.gated = False
            self.gate.leave()

    async def handshake(self, *args, **kwargs) -> None:
        try:
            await super().handshake(*args, **kwargs)
        finally:
            self._leave()

    def connection_lost(self, exc) -> None:
        self._leave()
        super().connection_lost(exc)


def gated_connection(gate: HandshakeGate) -> type[GatedConnection]:
    """websockets' ``create_connection`` for one server: :class:`GatedConnection` on `gate`."""
    return type("GatedConnection", (GatedConnection,), {"gate": gate})
