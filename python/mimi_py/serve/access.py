"""Who may connect: the ``Origin`` check, the token, and the cap on handshakes in flight.

A browser's WebSocket request carries an ``Origin``; one whose host is not the server's own (the
request's ``Host``) nor listed with ``--allow-origin`` gets HTTP 403, so another site's page
cannot use a visitor's browser to reach the server. Clients that send no ``Origin`` (scripts)
pass. With a token set, a stream or ``/metrics`` needs ``Authorization: Bearer TOKEN`` or
``?token=TOKEN`` (browsers cannot set headers on a WebSocket); a missing or wrong token gets the
same HTTP 401. Tokens are compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import parse_qs, urlsplit

from .protocol import Refusal

__all__ = ["Access", "HandshakeGate", "is_loopback", "request_token"]


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1, localhost).
    ``0.0.0.0``, ``::`` and the empty host (every interface) are not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(i[4][0]).split("%")[0]).is_loopback for i in infos)


def request_token(headers, path: str) -> str | None:
    """The token a request carries: ``Authorization: Bearer ...``, else ``?token=``."""
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    tokens = parse_qs(path.partition("?")[2]).get("token")
    return tokens[0] if tokens else None


def _origin(text: str) -> str:
    """An origin as compared: ``scheme://host[:port]``, lower case, no trailing slash."""
    return text.strip().rstrip("/").lower()


class Access:
    """The rules of one server: its token (None: none needed) and the extra allowed origins."""

    def __init__(self, token: str | None = None, allow_origins: Iterable[str] = ()):
        if token is not None and not token:
            raise ValueError("an empty token would let everyone in")
        self._token = token.encode() if token is not None else None
        self.allow_origins = frozenset(_origin(o) for o in allow_origins)

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def origin_allowed(self, headers) -> bool:
        """No ``Origin`` (not a browser), the server's own host (the ``Host`` header, whatever
        the scheme: TLS may end at a proxy), or one of ``--allow-origin``."""
        origin = headers.get("Origin")
        if origin is None:
            return True
        if _origin(origin) in self.allow_origins:
            return True
        host = headers.get("Host")
        netloc = urlsplit(_origin(origin)).netloc
        return host is not None and netloc != "" and netloc == host.strip().lower()

    def token_ok(self, headers, path: str) -> bool:
        """The request's token equals the server's (constant time); True when none is set."""
        if self._token is None:
            return True
        given = request_token(headers, path)
        return given is not None and hmac.compare_digest(given.encode(), self._token)

    def check(self, request, stream: bool) -> Refusal | None:
        """Why `request` is refused, if it is: a stream's Origin first, then the token."""
        if stream and not self.origin_allowed(request.headers):
            return Refusal.ORIGIN
        if not self.token_ok(request.headers, request.path):
            return Refusal.TOKEN
        return None


class HandshakeGate:
    """Counts connections between their TCP accept (after TLS) and the end of their upgrade;
    :meth:`enter` is False once `limit` are in flight (``http.GatedConnection`` asks it)."""

    def __init__(self, limit: int, on_refused=None):
        self.limit, self.in_flight, self.on_refused = limit, 0, on_refused

    def enter(self) -> bool:
        if self.in_flight >= self.limit:
            if self.on_refused is not None:
                self.on_refused()
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
