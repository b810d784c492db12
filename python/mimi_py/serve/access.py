"""Who may connect: one of each header read as one value, the ``Host`` check, the ``Origin``
check, the token, and the cap on handshakes in flight.

A request that carries ``Host``, ``Origin`` or ``Authorization`` (``protocol.SINGLE_HEADERS``)
more than once, or no ``Host`` (HTTP/1.1 requires one), gets HTTP 400 before any other check,
whatever its path, token or not: the checks below then read exactly one ``Host`` and at most one
of the others.

DNS rebinding: a page on ``evil.example``, whose name its owner then makes resolve to 127.0.0.1,
reaches a loopback server with ``Host: evil.example`` and ``Origin: http://evil.example``, which
agree, so the Origin check passes it. So without a token every request (the streams, the page,
``/health``, ``/metrics``, any path) must name the server by a loopback name or address
(``localhost``, any name under ``.localhost``, 127.0.0.0/8, ``[::1]``; any port, any case), by the
server's own ``--host``, or by a name given with ``--allow-host`` (``*``: any Host, which lets
any web page its users visit stream through the server); any other ``Host`` gets HTTP 403 before
anything else. Names under ``.localhost`` cannot be rebound: browsers resolve them to loopback
themselves (RFC 6761). With a token the ``Host`` is not checked: a rebinding page has no token,
and what needs none (the page, ``/health``) holds no secret.

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
import re
import socket
from collections.abc import Iterable
from urllib.parse import parse_qs, urlsplit

from .protocol import METRICS_PATH, SINGLE_HEADERS, STREAM_PATHS, Refusal

__all__ = [
    "ANY_HOST",
    "Access",
    "HandshakeGate",
    "host_name",
    "is_loopback",
    "loopback_name",
    "repeated_headers",
    "request_token",
]

# The --allow-host value that lets any Host in (no DNS-rebinding protection).
ANY_HOST = "*"
# A Host header or --allow-host value: a name or IPv4 address, or an IPv6 address in brackets,
# then maybe a port. Anything else (a URL, a user@, a path) names no host.
_HOST = re.compile(r"(?:\[([0-9a-f:.]+)\]|([a-z0-9_.-]+))(?::[0-9]{1,5})?")


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


def host_name(text: str) -> str | None:
    """The name or address in a ``Host`` header or ``--allow-host`` value as compared: lower case,
    without its port, a trailing dot or an IPv6 address's brackets (a bare one, as ``--host ::1``,
    is taken too); None if `text` names no host."""
    text = text.strip().lower()
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"
    m = _HOST.fullmatch(text)
    if m is None:
        return None
    if m[1] is None:
        return m[2].removesuffix(".") or None
    try:
        return ipaddress.IPv6Address(m[1]).compressed
    except ValueError:
        return None


def loopback_name(name: str) -> bool:
    """Whether `name` (from :func:`host_name`) is one only this machine answers: ``localhost``, a
    name under ``.localhost``, or a loopback address (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104)."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def repeated_headers(headers) -> list[str]:
    """The headers of :data:`~mimi_py.serve.protocol.SINGLE_HEADERS` that `headers` (websockets'
    multidict) carries more than once, in that order."""
    return [name for name in SINGLE_HEADERS if len(headers.get_all(name)) > 1]


def request_token(headers, path: str) -> str | None:
    """The token a request carries: ``Authorization: Bearer ...``, else ``?token=``. `headers`
    carries at most one ``Authorization`` (:meth:`Access.check` refused the others)."""
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
    """The rules of one server: its token (None: none needed), the extra allowed origins, and the
    names its ``Host`` may carry without a token besides the loopback ones: `allow_hosts`
    (``--allow-host``; ``*`` for any) and `host`, the name or address it was started with."""

    def __init__(
        self,
        token: str | None = None,
        allow_origins: Iterable[str] = (),
        allow_hosts: Iterable[str] = (),
        host: str | None = None,
    ):
        if token is not None and not token:
            raise ValueError("an empty token would let everyone in")
        self._token = token.encode() if token is not None else None
        self.allow_origins = frozenset(_origin(o) for o in allow_origins)
        names = [h.strip() for h in allow_hosts]
        self.any_host = ANY_HOST in names
        names = [h for h in names if h != ANY_HOST]
        bad = [h for h in names if host_name(h) is None]
        if bad:
            raise ValueError(f"not a host name or address: {bad[0]!r}")
        bound = host_name(host) if host else None  # none for "" (every interface)
        self.allow_hosts = frozenset(n for n in [*map(host_name, names), bound] if n is not None)

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def host_allowed(self, headers) -> bool:
        """With a token, or ``--allow-host '*'``: any. Else the request's one ``Host`` must be a
        loopback name or address (:func:`loopback_name`), or one of :attr:`allow_hosts`."""
        if self._token is not None or self.any_host:
            return True
        hosts = headers.get_all("Host")
        name = host_name(hosts[0]) if len(hosts) == 1 else None
        return name is not None and (loopback_name(name) or name in self.allow_hosts)

    def origin_allowed(self, headers) -> bool:
        """No ``Origin`` (not a browser), the server's own host (the ``Host`` header, whatever
        the scheme: TLS may end at a proxy), or one of ``--allow-origin``. `headers` carries at
        most one of each (:meth:`check` refused the others)."""
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

    def check(self, request, base: str) -> Refusal | None:
        """Why a request for the path `base` is refused, if it is: a repeated header of
        :data:`~mimi_py.serve.protocol.SINGLE_HEADERS`, no ``Host``, then its ``Host`` (all three
        on every path),
        then a stream's ``Origin``, then a stream's or ``/metrics``' token."""
        if repeated_headers(request.headers):
            return Refusal.DUPLICATE
        if not request.headers.get_all("Host"):
            return Refusal.NO_HOST
        if not self.host_allowed(request.headers):
            return Refusal.HOST
        stream = base in STREAM_PATHS
        if stream and not self.origin_allowed(request.headers):
            return Refusal.ORIGIN
        if (stream or base == METRICS_PATH) and not self.token_ok(request.headers, request.path):
            return Refusal.TOKEN
        return None


class HandshakeGate:
    """Counts connections between their TCP accept (before TLS) and the end of their upgrade;
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
