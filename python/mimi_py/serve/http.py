"""The server's plain HTTP side: the page, ``/health``, ``/metrics``, the handshake's checks,
and the paths that are not WebSockets.

``process_request`` (websockets' hook) answers ``GET /``, the page's files, ``/health`` and
``/metrics`` itself; refuses a stream whose ``Origin`` is not allowed (403), a stream or
``/metrics`` without the token (401), unknown paths (404) and unknown formats (400), all before
any upgrade, so a WebSocket handler only ever sees an allowed, valid
:class:`~mimi_py.serve.protocol.Route`.
"""

from __future__ import annotations

import json
from importlib import resources

from .metrics import metrics_text
from .protocol import HEALTH_PATH, METRICS_PATH, STREAM_PATHS, Refusal, parse_route

# What a refused request is told (never which of missing or wrong a token was).
REFUSED_BODY = {
    Refusal.ORIGIN: "this Origin may not open streams here (the server's own host, or --allow-origin)\n",
    Refusal.TOKEN: "a valid token is needed: Authorization: Bearer TOKEN, or ?token=TOKEN\n",
}

__all__ = ["PAGE_FILES", "page_file", "process_request"]

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
