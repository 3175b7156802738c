"""The dashboard's boundary: trusted hosts, body size, who may read and act.

Every request passes, outermost first:

1. the **Host check** (Starlette's ``TrustedHostMiddleware``): the ``Host``
   header must name a trusted host (:data:`LOOPBACK_HOSTS` unless configured),
   else 400. A page of ``attacker.example`` whose name was rebound to
   127.0.0.1 (DNS rebinding) sends ``Host: attacker.example``: refused.
2. the **size check** (:class:`BodyLimit`): a declared ``Content-Length`` over
   the form cap is refused (413) before any other work; the form itself is
   then read streamed, with the same cap (:func:`read_form`).
3. **authentication** (:class:`Authenticate`), when a token or an
   ``authorize`` hook is configured: the hook is called on every request; with
   a token, a request needs a valid session cookie (:class:`Sessions`, set by
   the login form) or ``Authorization: Bearer <token>``. Only the login form
   and its stylesheet are served without.

Wrong tokens (login, bearer, an action's token) are counted per client
(:class:`Attempts`): past the limit the client is locked out for a window,
whatever it sends. Origins of POSTs are compared with the trusted hosts too
(:func:`origin_allowed`).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import ipaddress
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["COOKIE", "LOOPBACK_HOSTS", "MAX_FORM_BYTES", "MIN_TOKEN_BYTES", "Attempts",
           "Authenticate", "Authorize", "BodyLimit", "FormTooLarge", "Sessions", "check_token",
           "client_of", "is_loopback", "origin_allowed", "read_form", "same_token",
           "trusted_hosts"]

log = logging.getLogger("pgdurable.dashboard")

#: The hosts trusted unless told otherwise: this machine's loopback names.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
#: The shortest token accepted (a secret anyone on the network may try to guess).
MIN_TOKEN_BYTES = 32
#: The largest form body read (a POST declaring more is refused unread).
MAX_FORM_BYTES = 65536
#: The session cookie's name.
COOKIE = "pgdurable_session"

#: ``authorize(request) -> bool`` (or awaitable): may this request read or act?
Authorize = Callable[[Request], "bool | Awaitable[bool]"]


def check_token(token: object) -> str | None:
    """``token`` if it is a str of at least :data:`MIN_TOKEN_BYTES` bytes (UTF-8), else ValueError."""
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"token must be a str, not {type(token).__name__}")
    size = len(token.encode("utf-8", "surrogatepass"))
    if size < MIN_TOKEN_BYTES:
        raise ValueError(
            f"token must be at least {MIN_TOKEN_BYTES} bytes, not {size}: anyone who can reach "
            "the dashboard may try to guess it (e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))')")
    return token


def trusted_hosts(hosts: Iterable[str] | str | None) -> list[str]:
    """The trusted host patterns, normalised (lower case, IPv6 in brackets, no port).

    ``None``: :data:`LOOPBACK_HOSTS`. A pattern is a host name or address,
    ``*.example.com`` (its subdomains) or ``*`` (any host: no Host check)."""
    if hosts is None:
        return list(LOOPBACK_HOSTS)
    if isinstance(hosts, str):
        raise TypeError("trusted_hosts must be a list of host names, not a str")
    out: list[str] = []
    for h in hosts:
        if not isinstance(h, str) or not h.strip():
            raise ValueError(f"a trusted host must be a non-empty str, not {h!r}")
        p = h.strip().lower()
        if ":" in p and not p.startswith("["):
            try:
                ipaddress.IPv6Address(p)
            except ValueError:
                raise ValueError(f"trusted host {h!r}: a host name or address, without port"
                                 ) from None
            p = f"[{p}]"  # an IPv6 address, as a Host header writes it
        if "*" in p[1:] or (p.startswith("*") and p != "*" and not p.startswith("*.")):
            raise ValueError(f"trusted host {h!r}: a wildcard must be like '*.example.com'")
        if (p.startswith("[") and not p.endswith("]")) or "/" in p or "]:" in p:
            raise ValueError(f"trusted host {h!r}: a host name or address, without port or path")
        out.append(p)
    if not out:
        raise ValueError("trusted_hosts must name at least one host")
    return out


def _host_matches(host: str, patterns: list[str]) -> bool:
    return any(p == "*" or host == p or (p.startswith("*.") and host.endswith(p[1:]))
               for p in patterns)


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (``0.0.0.0``, ``::``: every interface)."""
    h = host.strip().lower().strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _split_host(value: str, default_port: int | None) -> tuple[str, int | None] | None:
    """``host[:port]`` as (host as a Host header writes it, port)."""
    try:
        parts = urlsplit(f"//{value}")
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return host, port if port is not None else default_port


def origin_allowed(request: Request, patterns: list[str]) -> bool:
    """Whether a state-changing request comes from this dashboard's own pages.

    ``Sec-Fetch-Site``, when sent, must be ``same-origin`` or ``none``. An
    ``Origin``, when sent, must name a trusted host, and the same port as the
    request when it names the same host (another port is another origin).
    Browsers send at least one of the two on a form POST."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
        return False  # includes "null" (a sandboxed or file: page)
    default = 443 if parts.scheme == "https" else 80
    theirs = _split_host(parts.netloc, default)
    if theirs is None or not _host_matches(theirs[0], patterns):
        return False
    ours = _split_host(request.headers.get("host", ""), 443 if request.url.scheme == "https"
                       else 80)
    return ours is None or ours[0] != theirs[0] or ours[1] == theirs[1]


class FormTooLarge(Exception):
    """A form body over the cap (the caller answers 413)."""


async def read_form(request: Request, cap: int = MAX_FORM_BYTES) -> dict[str, str]:
    """The urlencoded form of ``request``, read streamed: never more than ``cap``
    bytes are held (a declared ``Content-Length`` over it is refused unread)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > cap):
        raise FormTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise FormTooLarge
        chunks.append(chunk)
    body = b"".join(chunks).decode("utf-8", "replace")
    return {k: v[0] for k, v in parse_qs(body).items()}


class BodyLimit:
    """Refuse (413) a request whose declared ``Content-Length`` is over ``cap``
    (or is not a number: 400), before anything else reads it."""

    def __init__(self, app: ASGIApp, cap: int = MAX_FORM_BYTES) -> None:
        self.app = app
        self.cap = cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"content-length":
                    if not value.isdigit():
                        await PlainTextResponse("bad Content-Length", 400)(scope, receive, send)
                        return
                    if int(value) > self.cap:
                        await PlainTextResponse(f"request body over {self.cap} bytes", 413)(
                            scope, receive, send)
                        return
        await self.app(scope, receive, send)


class Sessions:
    """Session cookies: ``v1.<expiry>.<nonce>.<HMAC>``, signed with a key derived
    from the token (every process serving the same token accepts them; a new
    token ends every session), valid until their expiry."""

    def __init__(self, token: str, ttl: float) -> None:
        self._key = hmac.new(token.encode("utf-8", "surrogatepass"),
                             b"pgdurable-dashboard-session-v1", hashlib.sha256).digest()
        self.ttl = ttl

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        payload = f"v1.{int(time.time() + self.ttl)}.{secrets.token_hex(16)}"
        return f"{payload}.{self._mac(payload)}"

    def valid(self, value: str | None) -> bool:
        if not value or value.count(".") != 3:
            return False
        payload, _, mac = value.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return False
        expiry = payload.split(".")[1]
        return expiry.isdigit() and int(expiry) > time.time()


class Attempts:
    """Wrong tokens per client: ``limit`` within ``window`` seconds lock the
    client out until the oldest of them is ``window`` old. At most
    ``clients`` clients are tracked (the stalest are forgotten first)."""

    def __init__(self, limit: int = 10, window: float = 300.0, clients: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.clients = clients
        self._failures: dict[str, list[float]] = {}

    def _recent(self, client: str, now: float) -> list[float]:
        kept = [t for t in self._failures.get(client, ()) if now - t < self.window]
        if kept:
            self._failures[client] = kept
        else:
            self._failures.pop(client, None)
        return kept

    def locked(self, client: str) -> float:
        """Seconds ``client`` is still locked out for (0: it may try)."""
        now = time.monotonic()
        recent = self._recent(client, now)
        if len(recent) < self.limit:
            return 0.0
        return max(0.0, recent[-self.limit] + self.window - now)

    def failed(self, client: str) -> None:
        """Count a wrong token of ``client``."""
        now = time.monotonic()
        recent = self._recent(client, now)
        recent.append(now)
        self._failures.pop(client, None)
        self._failures[client] = recent  # last in the dict: the most recent failure
        while len(self._failures) > self.clients:
            del self._failures[next(iter(self._failures))]  # the stalest client


def client_of(request: Request) -> str:
    """Who the attempts are counted for: the peer address (a proxy's, behind one)."""
    return request.client.host if request.client is not None else "unknown"


def route_path(scope: Scope) -> str:
    """The path inside this app (without the ``root_path`` it is mounted at)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def login_redirect(scope: Scope) -> Response:
    """A 303 to the login form, coming back to this page after."""
    root = scope.get("root_path", "")
    here = route_path(scope)
    if scope.get("query_string"):
        here += "?" + scope["query_string"].decode("latin-1")
    return RedirectResponse(f"{root}/login?next={quote(here, safe='')}", 303)


def bearer(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if any."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def same_token(given: str, token: str) -> bool:
    """Constant-time comparison of a token given with the configured one."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               token.encode("utf-8", "surrogatepass"))


#: Paths served without authentication: the login form, its stylesheet and the icon.
PUBLIC = ("/login", "/static/style.css", "/static/favicon.svg", "/favicon.ico")


class Authenticate:
    """In front of every route: the ``authorize`` hook (each request) and/or the
    token (a session cookie or a bearer header). ``refuse(request, status,
    message)`` renders a refusal."""

    def __init__(self, app: ASGIApp, *, sessions: Sessions | None, token: str | None,
                 authorize: Authorize | None, attempts: Attempts,
                 refuse: Callable[[Request, int, str], Response]) -> None:
        self.app = app
        self.sessions = sessions
        self.token = token
        self.authorize = authorize
        self.attempts = attempts
        self.refuse = refuse
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.token is None and self.authorize is None):
            if not self._warned and scope["type"] == "http":
                self._warned = True  # served by any server (mounted, say): say it once
                server = scope.get("server") or ("", None)
                if server[0] and not is_loopback(str(server[0])):
                    log.warning("the pgdurable dashboard answers on %s (not loopback) with no "
                                "token and no authorize hook: anyone who reaches it reads "
                                "every run", server[0])
            await self.app(scope, receive, send)
            return
        request = Request(scope)  # headers only: the body is not read here
        public = self.token is not None and route_path(scope) in PUBLIC
        response = None if public else await self._check(request)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _check(self, request: Request) -> Response | None:
        if self.token is not None and self.sessions is not None:
            given = bearer(request)
            if given is not None:
                client = client_of(request)
                wait = self.attempts.locked(client)
                if wait > 0:
                    return locked_out(wait)
                if not same_token(given, self.token):
                    self.attempts.failed(client)
                    return PlainTextResponse("wrong bearer token", 401)
            elif not self.sessions.valid(request.cookies.get(COOKIE)):
                if request.method in ("GET", "HEAD") and route_path(request.scope) not in (
                        "/events", "/metrics") and not route_path(request.scope).startswith(
                        "/static/"):
                    return login_redirect(request.scope)
                return PlainTextResponse("log in first (or send Authorization: Bearer <token>)",
                                         401, headers={"WWW-Authenticate": "Bearer"})
        if self.authorize is not None:
            ok: Any = self.authorize(request)
            if inspect.isawaitable(ok):
                ok = await ok
            if not ok:
                return self.refuse(request, 403, "refused by the authorize hook")
        return None


def locked_out(wait: float) -> Response:
    """429: too many wrong tokens from this client."""
    seconds = max(1, int(wait + 0.999))
    return PlainTextResponse(f"too many wrong tokens from this address: try again in {seconds} s",
                             429, headers={"Retry-After": str(seconds)})
