"""The server's plain HTTP side: the page, ``/health``, ``/metrics``, the handshake's checks,
and the paths that are not WebSockets.

``process_request`` (websockets' hook) first refuses a request that repeats ``Host``, ``Origin``
or ``Authorization``, or has no ``Host`` (400, whatever its path), then, without a token, one whose ``Host`` is not
allowed (403, whatever its path: a DNS-rebinding page); then answers ``GET /``, the
page's files and ``/health`` itself; refuses a stream whose ``Origin`` is not allowed (403), a
stream or ``/metrics`` without the token (401), unknown paths (404) and unknown formats (400),
all before any upgrade, so a WebSocket handler only ever sees an allowed, valid
:class:`~mimi_py.serve.protocol.Route`. :class:`GatedConnection` counts each connection in the
cap on handshakes in flight from its TCP accept, its TLS handshake included (it runs that
handshake itself), and answers one over the cap at once: 503, or a close over TLS. Imported when
serving (it needs websockets).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from importlib import resources

from websockets.asyncio.server import ServerConnection

from .access import HandshakeGate, host_name, repeated_headers
from .metrics import metrics_text
from .protocol import HANDSHAKE_TIMEOUT, HEALTH_PATH, METRICS_PATH, Refusal, parse_route

__all__ = [
    "BUSY_RESPONSE",
    "PAGE_FILES",
    "GatedConnection",
    "gated_connection",
    "host_refused_body",
    "page_file",
    "process_request",
]

# What a refused request is told (never which of missing or wrong a token was).
REFUSED_BODY = {
    Refusal.NO_HOST: "the request has no Host header: HTTP/1.1 requires one\n",
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


def host_refused_body(hosts: list[str]) -> str:
    """What a request whose ``Host`` is not allowed is told: the Host it sent (shortened), and
    the option that would allow it."""
    shown = ", ".join(repr(h[:100]) for h in hosts) if hosts else "(none)"
    name = host_name(hosts[0]) if len(hosts) == 1 else None
    return (
        f"Host {shown} is not served without a token: this server answers only loopback names and "
        f"addresses (localhost, 127.0.0.1, [::1]) and its own --host; to serve this name, start it "
        f"with --allow-host {name or 'NAME'} (or with a token)\n"
    )


def _refused_body(why: Refusal, headers) -> str:
    """What a request refused before its upgrade is told: the repeated headers, the ``Host``, or
    the refusal's fixed text."""
    if why is Refusal.DUPLICATE:
        return f"the request repeats {', '.join(repeated_headers(headers))}: a header read as one value may come once\n"
    if why is Refusal.HOST:
        return host_refused_body(headers.get_all("Host"))
    return REFUSED_BODY[why]


def _refused(connection, status: int, why: Refusal, request):
    """400, 403 or 401, with ``WWW-Authenticate: Bearer`` on a 401."""
    text = _refused_body(why, request.headers)
    r = _response(connection, status, text.encode(), "text/plain; charset=utf-8")
    if why is Refusal.TOKEN:
        r.headers["WWW-Authenticate"] = "Bearer"
    return r


def process_request(server):
    """websockets' ``process_request`` for this server: HTTP answers, or None to go on to the
    WebSocket handshake of ``/encode`` and ``/decode``."""

    def process(connection, request):
        base = request.path.partition("?")[0]
        refused = server.access.check(request, base)
        if refused is not None:
            return _refused(connection, server.refuse(refused), refused, request)
        if base == HEALTH_PATH:
            body = json.dumps(server.health()).encode()
            return _response(connection, 200, body, "application/json")
        if base in PAGE_FILES:
            name, content_type = PAGE_FILES[base]
            return _response(connection, 200, page_file(name), content_type)
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
    :func:`gated_connection`) from its TCP accept to the end of its upgrade; one over the cap
    gets :data:`BUSY_RESPONSE` and is closed (over TLS it is closed at once: a 503 would need a
    TLS handshake first). With ``tls``, this class runs the TLS handshake itself
    (``loop.start_tls``, which websockets' ``ssl=`` would run before the connection is made, out
    of the gate's sight); one not done in ``tls_timeout`` seconds, or failed, is dropped."""

    gate: HandshakeGate
    tls: ssl.SSLContext | None = None
    tls_timeout: float = HANDSHAKE_TIMEOUT
    tls_shutdown_timeout: float = HANDSHAKE_TIMEOUT
    gated = False
    made = False  # websockets' connection_made ran: from here on it owns the connection
    early: list[bytes | None] | None = None  # TLS done, not yet made: the data (None: EOF) meanwhile

    def connection_made(self, transport) -> None:
        self.gated = self.gate.enter()
        if self.tls is None:
            self._made(transport)
            if not self.gated:
                transport.write(BUSY_RESPONSE)
                transport.close()
        elif not self.gated:
            transport.abort()
        else:
            transport.pause_reading()  # nothing may reach websockets before the TLS handshake
            self.tls_task = asyncio.get_running_loop().create_task(self._start_tls(transport))

    def _made(self, transport) -> None:
        self.made = True
        super().connection_made(transport)

    async def _start_tls(self, transport) -> None:
        """The TLS handshake; then the connection is made, with what arrived meanwhile."""
        secure, self.early = None, []
        tls = self.tls
        assert tls is not None, "a TLS handshake without a TLS context"  # connection_made's branch
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport, self, tls, server_side=True, ssl_handshake_timeout=self.tls_timeout,
                ssl_shutdown_timeout=self.tls_shutdown_timeout,
            )  # fmt: skip
        except Exception:
            pass  # failed, reset, or not done in time: dropped, as websockets' own TLS would
        finally:  # also when cancelled (the server's loop ending)
            if secure is None:
                transport.abort()
                self._leave()
        if secure is None:
            return
        early, self.early = self.early, None
        self._made(secure)
        for data in early:
            if data is None:
                super().eof_received()
            else:
                super().data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.early is not None:
            self.early.append(data)
        else:
            super().data_received(data)

    def eof_received(self) -> None:
        if self.early is not None:
            self.early.append(None)
        else:
            super().eof_received()

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
        if self.made:
            super().connection_lost(exc)


def gated_connection(
    gate: HandshakeGate,
    tls: ssl.SSLContext | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    shutdown_timeout: float = HANDSHAKE_TIMEOUT,
) -> type[GatedConnection]:
    """websockets' ``create_connection`` for one server: :class:`GatedConnection` on `gate`,
    with its TLS context and its handshake and shutdown timeouts (seconds)."""
    attrs = {"gate": gate, "tls": tls, "tls_timeout": timeout, "tls_shutdown_timeout": shutdown_timeout}
    return type("GatedConnection", (GatedConnection,), attrs)
