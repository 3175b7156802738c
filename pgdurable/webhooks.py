"""Webhooks: a dependency-free ASGI app that turns HTTP callbacks into signals.

``pgdurable.webhooks.app(durable, secret=...)`` maps

    POST /signals/{kind}/{ref}      (body: JSON, the signal's payload)

to ``await durable.signal(kind, ref, payload, signal_id=...)``. Serve it with
any ASGI server (``uvicorn mymodule:hooks``) or mount it in FastAPI/Starlette
(``api.mount("/hooks", hooks)`` -> ``POST /hooks/signals/ci/build-7``).

Authentication: the sender signs the raw body with HMAC-SHA256 and the shared
secret and sends ``X-Pgdurable-Signature: sha256=<hex digest>``
(:func:`sign` computes it). The digest is verified in constant time before
the body is parsed. Replays of a captured request are harmless when the
sender sets ``Idempotency-Key`` (or ``X-Signal-Id``): it becomes the signal's
``signal_id``, so a repeat changes nothing and gets the same answer.

Path segments are percent-decoded (``/signals/ci/feature%2Fx`` is ref
``feature/x``). An empty body is the payload ``null``.

Responses (JSON):

* ``200 {"woken": [run ids], "pending": false}`` -- runs were woken;
* ``202 {"woken": [], "pending": true}`` -- no run waits yet: the signal is
  kept (TTL) for the run that parks on it (or, for a repeated signal id, the
  first send woke nobody);
* ``400`` bad JSON, NUL, empty kind/ref, bad signal id; ``401`` missing or
  bad signature; ``404`` unknown path; ``405`` not POST; ``409`` the signal
  id was used with another payload; ``413`` body over ``max_payload``
  (default 1 MiB); ``503`` database unavailable or busy (a lock or statement
  timeout, a deadlock: retry later). Every error is
  ``{"error": "<one line>"}`` and changes nothing.

Lifespan: on startup the app opens the :class:`~pgdurable.Durable` (checks the
schema once); on shutdown it closes it only if ``close_on_shutdown=True``.
Mounted sub-apps get no lifespan events in Starlette; the app then opens
lazily on the first request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote, unquote

import psycopg

from .errors import (
    DatabaseUnavailable,
    PgDurableError,
    ProviderClosed,
    SignalConflict,
    first_line,
)
from .runs import Durable
from .signals import DEFAULT_MAX_PAYLOAD, parse_payload

__all__ = ["SIGNATURE_HEADER", "WebhookApp", "app", "sign"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: The request header carrying ``sha256=<hex HMAC of the raw body>``.
SIGNATURE_HEADER = "X-Pgdurable-Signature"
_SIG = SIGNATURE_HEADER.lower().encode()
_ID_HEADERS = (b"idempotency-key", b"x-signal-id")


def sign(secret: str | bytes, body: bytes) -> str:
    """The signature header value for ``body``: ``"sha256=<hex>"``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


class WebhookApp:
    """The ASGI callable returned by :func:`app` (see the module docstring)."""

    def __init__(
        self,
        durable: Durable,
        *,
        secret: str | bytes,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        close_on_shutdown: bool = False,
    ) -> None:
        if not isinstance(durable, Durable):
            raise TypeError("webhooks.app needs a pgdurable.Durable")
        if not isinstance(secret, str | bytes) or not secret:
            raise ValueError("webhooks.app needs a non-empty secret (str or bytes)")
        if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload < 1:
            raise ValueError("max_payload must be an int >= 1 (bytes)")
        self.durable = durable
        self.max_payload = max_payload
        self.close_on_shutdown = close_on_shutdown
        self._key = secret.encode() if isinstance(secret, str) else bytes(secret)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point: ``lifespan`` and ``http`` scopes."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"pgdurable webhooks serve http only, not {scope['type']}")
        try:
            status, body = await self._handle(scope, receive)
            await _respond(send, status, body)
        except _HTTPError as exc:
            await _respond(send, exc.status, {"error": exc.message}, exc.headers)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.durable.open()
                except Exception as exc:  # reported to the server, which stops
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.close_on_shutdown:
                    await self.durable.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _route(self, scope: Scope) -> tuple[str, str]:
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if raw else quote(scope.get("path", ""))
        root = quote(scope.get("root_path", "") or "")
        if root and path.startswith(root):
            path = path[len(root):]
        path = path.split("?", 1)[0]
        parts = path.split("/")
        if len(parts) != 4 or parts[0] != "" or parts[1] != "signals":
            raise _HTTPError(404, "not found: POST /signals/{kind}/{ref}")
        if scope.get("method") != "POST":
            raise _HTTPError(405, "method not allowed: use POST", [(b"allow", b"POST")])
        try:
            kind = unquote(parts[2], errors="strict")
            ref = unquote(parts[3], errors="strict")
        except UnicodeDecodeError:
            raise _HTTPError(400, "kind and ref must be UTF-8") from None
        return kind, ref

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise _HTTPError(400, "bad Content-Length") from None
                if declared > self.max_payload:
                    raise _HTTPError(413, f"payload over {self.max_payload} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _HTTPError(400, "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_payload:
                raise _HTTPError(413, f"payload over {self.max_payload} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _verify(self, scope: Scope, body: bytes) -> None:
        given = next((v for n, v in scope.get("headers", []) if n == _SIG), None)
        if given is None:
            raise _HTTPError(401, f"missing {SIGNATURE_HEADER} header")
        expected = sign(self._key, body).encode()
        if not hmac.compare_digest(expected, bytes(given).strip()):
            raise _HTTPError(401, f"bad {SIGNATURE_HEADER}: HMAC-SHA256 of the body does not match")

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, Any]]:
        kind, ref = self._route(scope)
        body = await self._read_body(scope, receive)
        self._verify(scope, body)
        if not kind or not ref:
            raise _HTTPError(400, "kind and ref must be non-empty")
        signal_id: str | None = None
        for name, value in scope.get("headers", []):
            if name in _ID_HEADERS:
                try:
                    signal_id = bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    raise _HTTPError(400, "signal id header must be UTF-8") from None
        try:
            payload = parse_payload(body, self.max_payload)
        except ValueError as exc:
            raise _HTTPError(400, str(exc)) from None
        try:
            woken = await self.durable.signal(kind, ref, payload, signal_id=signal_id)
        except SignalConflict as exc:
            raise _HTTPError(409, str(exc)) from None
        except (DatabaseUnavailable, ProviderClosed) as exc:
            raise _HTTPError(503, f"database unavailable: {exc}") from None
        except psycopg.OperationalError as exc:
            # not translated by pgdurable: a lock or statement timeout, a
            # deadlock or serialization failure -- rolled back, retry later
            raise _HTTPError(503, f"database busy: {first_line(str(exc))}") from None
        except (TypeError, ValueError) as exc:  # includes InvalidInput
            raise _HTTPError(400, str(exc)) from None
        except PgDurableError as exc:
            raise _HTTPError(500, f"{type(exc).__name__}: {exc}") from None
        if woken:
            return 200, {"woken": woken, "pending": False}
        return 202, {"woken": [], "pending": True}


async def _respond(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()), *(headers or [])],
    })
    await send({"type": "http.response.body", "body": data})


def app(
    durable: Durable,
    *,
    secret: str | bytes,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    close_on_shutdown: bool = False,
) -> WebhookApp:
    """An ASGI app mapping ``POST /signals/{kind}/{ref}`` to ``durable.signal``.

    ``secret`` signs request bodies (HMAC-SHA256, header
    ``X-Pgdurable-Signature: sha256=<hex>``); ``max_payload`` bounds the body
    in bytes (413 above it). See the module docstring for the responses.
    """
    return WebhookApp(durable, secret=secret, max_payload=max_payload,
                      close_on_shutdown=close_on_shutdown)
