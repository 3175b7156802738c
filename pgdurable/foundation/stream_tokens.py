"""Scoped stream tokens: what a browser holds to read (or write to) ONE run or thread.

``app.stream_token(run_id=..., scope="read", ttl=timedelta(minutes=10))``
(or ``thread=...``) returns ``v1.<payload>.<signature>``: the payload is
base64url JSON ``{"r": run id}`` or ``{"t": thread key}``, ``"s"``: the
scope (``"read"`` or ``"write"``: write may also read), ``"x"``: expiry
(Unix seconds); the signature is base64url HMAC-SHA256 over ``v1.<payload>``
with the first of the app's stream secrets. The HTTP endpoints
(:mod:`pgdurable.ops.http`) check a token in constant time against EVERY
secret (several during a rotation, as for webhooks: add the new secret
first, hand out tokens signed with it, drop the old one after the longest
TTL), then its expiry (this host's clock, with ``leeway`` seconds), then
that it names the run or thread of the request and a scope that covers the
action. No database role per browser: the endpoints act with the app's pool.

Secrets are at least 32 bytes (``secrets.token_hex(32)``): from
``Durable.stream_secrets`` (a list, first signs), else the environment's
``PGDURABLE_STREAM_SECRETS`` (whitespace-separated). A token cannot be
widened: another run, thread, scope or expiry changes the signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from .errors import PgDurableError

__all__ = ["Grant", "TokenRefused", "check_token", "make_token", "secrets_of"]

Scope = Literal["read", "write"]
PREFIX = "v1"
MAX_TTL = timedelta(days=7)


class TokenRefused(PgDurableError):
    """A stream token is malformed, badly signed, expired, or for another run,
    thread or scope (``status``: the HTTP status the endpoints answer with)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Grant:
    """What a valid token allows: one run or one thread (original key), a scope."""

    run_id: str | None
    thread: str | None
    scope: Scope
    expires: int


def secrets_of(configured: Sequence[str | bytes] | None) -> tuple[bytes, ...]:
    """The stream secrets: ``configured``, else ``PGDURABLE_STREAM_SECRETS``;
    each at least 32 bytes (ValueError); () when none is set."""
    if configured is None:
        configured = os.environ.get("PGDURABLE_STREAM_SECRETS", "").split()
    if isinstance(configured, str | bytes):
        configured = [configured]
    keys = []
    for s in configured:
        key = s.encode() if isinstance(s, str) else bytes(s)
        if len(key) < 32:
            raise ValueError("a stream secret must be at least 32 bytes (secrets.token_hex(32))")
        keys.append(key)
    return tuple(keys)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(key: bytes, body: str) -> str:
    return _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())


def make_token(keys: Sequence[bytes], *, run_id: str | None = None, thread: str | None = None,
               scope: Scope = "read", ttl: timedelta | float = timedelta(minutes=10),
               now: float | None = None) -> str:
    """A token for exactly one of ``run_id`` / ``thread`` (see the module docstring)."""
    if not keys:
        raise ValueError("no stream secret: set Durable.stream_secrets or "
                         "PGDURABLE_STREAM_SECRETS")
    if (run_id is None) == (thread is None):
        raise ValueError("a stream token is for exactly one of run_id= or thread=")
    if scope not in ("read", "write"):
        raise ValueError(f"scope must be 'read' or 'write', not {scope!r}")
    secs = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    if not math.isfinite(secs) or secs <= 0 or secs > MAX_TTL.total_seconds():
        raise ValueError(f"ttl must be > 0 and at most {MAX_TTL}, not {ttl!r}")
    claims: dict[str, object] = {"s": scope,
                                 "x": math.ceil((time.time() if now is None else now) + secs)}
    if run_id is not None:
        claims["r"] = run_id
    else:
        if not isinstance(thread, str) or not thread:
            raise ValueError("thread must be a non-empty str")
        claims["t"] = thread
    body = PREFIX + "." + _b64(json.dumps(claims, separators=(",", ":")).encode())
    return body + "." + _sign(keys[0], body)


def check_token(keys: Sequence[bytes], token: object, *, leeway: float = 0.0,
                now: float | None = None) -> Grant:
    """The :class:`Grant` of a valid token, else :class:`TokenRefused` (401)."""
    if not isinstance(token, str) or token.count(".") != 2 or not keys:
        raise TokenRefused("no valid stream token", 401)
    prefix, payload, sig = token.split(".")
    body = prefix + "." + payload
    if prefix != PREFIX or not any(
            hmac.compare_digest(_sign(k, body), sig) for k in keys):  # every key: rotation
        raise TokenRefused("stream token signature is not valid", 401)
    try:
        claims = json.loads(_unb64(payload))
        scope, expires = claims["s"], int(claims["x"])
        run_id, thread = claims.get("r"), claims.get("t")
    except (ValueError, KeyError, TypeError):
        raise TokenRefused("stream token is malformed", 401) from None
    if (time.time() if now is None else now) > expires + leeway:
        raise TokenRefused("stream token expired", 401)
    if scope not in ("read", "write"):
        raise TokenRefused("stream token is malformed", 401)
    return Grant(run_id, thread, scope, expires)
