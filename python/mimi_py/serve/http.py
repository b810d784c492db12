"""The server's plain HTTP side: the page, ``/health``, and the paths that are not WebSockets.

``process_request`` (websockets' hook) answers ``GET /``, the page's files and ``/health``
itself, and refuses unknown paths (404) and unknown formats (400) before any handshake, so a
WebSocket handler only ever sees a valid :class:`~mimi_py.serve.protocol.Route`.
"""

from __future__ import annotations

import json
from importlib import resources

from .protocol import parse_route

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


def process_request(server):
    """websockets' ``process_request`` for this server: HTTP answers, or None to go on to the
    WebSocket handshake of ``/encode`` and ``/decode``."""

    def process(connection, request):
        base = request.path.partition("?")[0]
        if base == "/health":
            body = json.dumps(server.health()).encode()
            return _response(connection, 200, body, "application/json")
        if base in PAGE_FILES:
            name, content_type = PAGE_FILES[base]
            return _response(connection, 200, page_file(name), content_type)
        route = parse_route(request.path)
        if isinstance(route, str):
            status = 404 if route.startswith("unknown path") else 400
            return _response(connection, status, (route + "\n").encode(), "text/plain; charset=utf-8")
        connection.route = route
        return None

    return process
