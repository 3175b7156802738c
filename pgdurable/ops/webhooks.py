"""Webhooks: a dependency-free ASGI app that turns signed HTTP callbacks into signals.

``pgdurable.webhooks.app(durable, secrets={"ci": ci_secret})`` maps

    POST /signals/{kind}/{ref}      (body: JSON, the signal's payload)

to ``await durable.signal(kind, ref, payload, signal_id=...)``. Serve it with
any ASGI server (``uvicorn mymodule:hooks``) or mount it in FastAPI/Starlette
(``api.mount("/hooks", hooks)`` -> ``POST /hooks/signals/ci/build-7``).
``docs/webhooks.md`` is the sender's guide; this docstring is the contract.

**Authentication** (protocol ``v1``). The sender signs a canonical string
that binds every part of the request that changes what happens::

    v1 \\n <timestamp> \\n POST \\n /signals/<kind>/<ref> \\n <signal id> \\n <raw body>

* ``<timestamp>``: Unix seconds, also sent as ``X-Pgdurable-Timestamp``;
* ``<kind>``, ``<ref>``: the decoded kind and ref, re-encoded with every byte
  of their UTF-8 form except ``A-Z a-z 0-9 - . _ ~`` as ``%XX`` (upper-case
  hex; :func:`request_path`), whatever mount prefix or encoding the request
  used;
* ``<signal id>``: the ``Idempotency-Key`` (or ``X-Signal-Id``) header, or
  the empty string when the sender sends none;

and sends ``X-Pgdurable-Signature: v1=<hex HMAC-SHA256(secret, canonical)>``.
:func:`sign_request` returns these headers; :func:`canonical_string` and
:func:`signature` are its parts. The app checks, before parsing the body:

* the kind has a secret (per-kind ``secrets``, or ``secret`` with its
  ``kinds`` allow-list), else ``403``: the CI secret cannot sign approvals;
* the timestamp lies within ``tolerance`` (5 minutes) of this host's clock,
  else ``401``: a captured request expires;
* the signature matches one of the kind's secrets (several during a
  rotation), in constant time, else ``401``: a signature is valid for one
  kind, ref, signal id and body only.

With no signal id header the signal id is derived from the signature
(``v1:<hex>``), so a replay of the same request inside the window is
deduplicated (it changes nothing and gets the first answer). Signal ids are
scoped by kind (the database keys them by ``(kind, signal_id)``): a sender
allowed one kind cannot take the ``Idempotency-Key`` of another kind's signal. Secrets must be
at least 32 bytes (``secrets.token_hex(32)``); a shorter one is a
``ValueError`` when the app is built.

Path segments are percent-decoded as UTF-8 (``/signals/ci/feature%2Fx`` is
ref ``feature/x``). An empty body is the payload ``null``.

**Events** (docs/events.md): with ``events={name: secret}``, the app also maps

    POST /events/{name}             (body: a JSON object, the event's data)

to ``await durable.send_event(name, data, id=...)``, signed the same way over
the path ``/events/<name>`` (:func:`event_path`, :func:`sign_event_request`);
the ``Idempotency-Key`` is the event's id (else ``v1:<signature hex>``). An
event name's secret is its own: a signal kind's secret never signs an event,
nor the other way round. Answers ``200 {"event": <number>, "created": bool}``
(``created`` false: a repeated id, nothing done again), ``409`` for an id sent
before with other data, ``400`` for a body that is not a JSON object, ``403``
for a name without a secret; the other statuses as for signals.

Responses (JSON):

* ``200 {"woken": [run ids], "pending": false}`` -- runs were woken;
* ``202 {"woken": [], "pending": true}`` -- no run waits yet: the signal is
  kept (TTL) for the run that parks on it (or, for a repeated signal id, the
  first send woke nobody);
* ``400`` bad JSON, NUL, lone surrogate, empty kind/ref, bad signal id;
  ``401`` missing or bad signature or timestamp; ``403`` no secret for this
  kind; ``404`` unknown path; ``405`` not POST; ``409`` the signal id was
  used for this kind with another ref or payload; ``413`` body over ``max_payload`` (default
  1 MiB). Every 4xx is ``{"error": "<one line>"}`` and changes nothing.
* ``503`` database unavailable or busy, ``500`` anything unexpected: the body
  is generic (details go to the ``pgdurable.webhooks`` logger) and says that
  **the outcome is unknown**: the signal may have been stored before the
  answer was lost. Retry with the same ``Idempotency-Key`` (or resend the
  same signed request inside the window): a signal id is delivered once.

Lifespan: on startup the app opens the :class:`~pgdurable.Durable` (checks the
schema once); on shutdown it closes it only if ``close_on_shutdown=True``.
Mounted sub-apps get no lifespan events in Starlette; the app then opens
lazily on the first request.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import psycopg

from ..app.durable import Durable
from ..foundation.errors import (
    DatabaseUnavailable,
    EventConflict,
    PgDurableError,
    ProviderClosed,
    SignalConflict,
)
from ..foundation.run_queries import check_name
from ..foundation.signals import DEFAULT_MAX_PAYLOAD, parse_payload

__all__ = [
    "DEFAULT_TOLERANCE",
    "MIN_SECRET_BYTES",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "VERSION",
    "WebhookApp",
    "app",
    "canonical_string",
    "event_canonical_string",
    "event_path",
    "request_path",
    "sign_event_request",
    "sign_request",
    "signature",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: A secret, or several (any of them verifies: rotate by adding the new one first).
Secret = str | bytes | Sequence[str | bytes]

#: The protocol version: the first line of the canonical string and the
#: signature's prefix (``v1=<hex>``).
VERSION = "v1"
#: The request header carrying ``v1=<hex HMAC-SHA256 of the canonical string>``.
SIGNATURE_HEADER = "X-Pgdurable-Signature"
#: The request header carrying the signing time, Unix seconds.
TIMESTAMP_HEADER = "X-Pgdurable-Timestamp"
#: How far a request's timestamp may be from the receiver's clock.
DEFAULT_TOLERANCE = timedelta(minutes=5)
#: The shortest secret accepted, in bytes (UTF-8 for a str).
MIN_SECRET_BYTES = 32

_SIG = SIGNATURE_HEADER.lower().encode()
_TS = TIMESTAMP_HEADER.lower().encode()
_ID_HEADERS = (b"idempotency-key", b"x-signal-id")
_UNKNOWN_OUTCOME = ("the outcome is unknown (the signal may have been stored): retry with the "
                    "same Idempotency-Key, or resend the same signed request")

log = logging.getLogger("pgdurable.webhooks")


def request_path(kind: str, ref: str) -> str:
    """The canonical path ``/signals/<kind>/<ref>``: every byte of the UTF-8 of
    ``kind`` and ``ref`` except ``A-Z a-z 0-9 - . _ ~`` as ``%XX`` (upper-case).

    Senders POST to it (after their mount prefix) and sign it.
    """
    return f"/signals/{quote(kind, safe='')}/{quote(ref, safe='')}"


def canonical_string(*, timestamp: int, method: str, kind: str, ref: str,
                     signal_id: str | None, body: bytes) -> bytes:
    """The bytes a ``v1`` signature covers (see the module docstring).

    ``v1``, the timestamp, the method, :func:`request_path`, the signal id
    (empty when none) and the raw body, joined by ``\\n``.
    """
    head = "\n".join((VERSION, str(timestamp), method.upper(), request_path(kind, ref),
                      signal_id or ""))
    return head.encode("utf-8") + b"\n" + body


def signature(secret: str | bytes, canonical: bytes) -> str:
    """``"v1=<hex HMAC-SHA256(secret, canonical)>"``: the signature header value."""
    return f"{VERSION}=" + hmac.new(_key(secret), canonical, hashlib.sha256).hexdigest()


def sign_request(
    secret: str | bytes,
    kind: str,
    ref: str,
    body: bytes = b"",
    *,
    signal_id: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The headers a sender adds to ``POST request_path(kind, ref)`` with ``body``.

    ``X-Pgdurable-Timestamp`` (``timestamp``, default now), ``X-Pgdurable-Signature``
    and, when ``signal_id`` is given, ``Idempotency-Key``. Send ``body``
    byte for byte as signed. ``ValueError``/``TypeError`` for a secret under
    :data:`MIN_SECRET_BYTES` or a kind, ref or signal id the app would refuse.
    """
    key = _key(secret)
    check_name(kind, "kind")
    check_name(ref, "ref")
    _check_idempotency_key(signal_id, "signal_id")
    return _signed_headers(key, body, timestamp, signal_id, lambda ts: canonical_string(
        timestamp=ts, method="POST", kind=kind, ref=ref, signal_id=signal_id, body=body))


def event_path(name: str) -> str:
    """The canonical path ``/events/<name>`` (``name`` encoded as in :func:`request_path`)."""
    return f"/events/{quote(name, safe='')}"


def event_canonical_string(*, timestamp: int, name: str, event_id: str | None,
                           body: bytes) -> bytes:
    """The bytes a ``v1`` signature of an event covers: as :func:`canonical_string`,
    with :func:`event_path` for the path and the event id for the signal id."""
    head = "\n".join((VERSION, str(timestamp), "POST", event_path(name), event_id or ""))
    return head.encode("utf-8") + b"\n" + body


def sign_event_request(
    secret: str | bytes,
    name: str,
    body: bytes = b"{}",
    *,
    event_id: str | None = None,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The headers a sender adds to ``POST event_path(name)`` with ``body`` (a JSON
    object): as :func:`sign_request`, ``Idempotency-Key`` being the event id."""
    key = _key(secret)
    check_name(name, "event name")
    _check_idempotency_key(event_id, "event_id")
    return _signed_headers(key, body, timestamp, event_id, lambda ts: event_canonical_string(
        timestamp=ts, name=name, event_id=event_id, body=body))


def _check_idempotency_key(value: str | None, what: str) -> None:
    """A signal or event id sent as the ``Idempotency-Key`` header: a name, one line."""
    if value is not None:
        check_name(value, what)
        if any(c in value for c in "\r\n"):
            raise ValueError(f"{what} cannot hold CR or LF (it is sent as a header)")


def _signed_headers(key: bytes, body: object, timestamp: object, idempotency_key: str | None,
                    canonical: Callable[[int], bytes]) -> dict[str, str]:
    """The headers of a signed request: its time (``timestamp``, default now), the
    signature of ``canonical(time)`` and the ``Idempotency-Key``, if any."""
    if not isinstance(body, bytes):
        raise TypeError(f"body must be bytes, not {type(body).__name__}")
    ts = int(time.time()) if timestamp is None else timestamp
    if isinstance(ts, bool) or not isinstance(ts, int):
        raise TypeError("timestamp must be an int (Unix seconds)")
    headers = {TIMESTAMP_HEADER: str(ts), SIGNATURE_HEADER: signature(key, canonical(ts))}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return headers


def _key(secret: object) -> bytes:
    if isinstance(secret, str):
        key = secret.encode("utf-8")
    elif isinstance(secret, bytes | bytearray):
        key = bytes(secret)
    else:
        raise TypeError(f"a webhook secret is str or bytes, not {type(secret).__name__}")
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(f"a webhook secret must be at least {MIN_SECRET_BYTES} bytes "
                         f"(got {len(key)}); generate one with secrets.token_hex(32)")
    return key


def _keys(secret: object) -> tuple[bytes, ...]:
    items = [secret] if isinstance(secret, str | bytes | bytearray) else secret
    if not isinstance(items, Sequence) or not items:
        raise TypeError("a webhook secret is str or bytes, or a non-empty list of them")
    return tuple(_key(s) for s in items)


def _secrets_by_kind(secret: object, kinds: object, secrets: object) -> dict[str, tuple[bytes, ...]]:
    if (secret is None) == (secrets is None):
        raise TypeError("webhooks.app needs secrets={kind: secret} or secret=... with kinds=[...]")
    if secrets is not None:
        if kinds is not None:
            raise TypeError("kinds= goes with secret=; secrets= names its kinds itself")
        if not isinstance(secrets, Mapping) or not secrets:
            raise TypeError("secrets must be a non-empty mapping {kind: secret}")
        out = {check_name(kind, "kind"): _keys(s) for kind, s in secrets.items()}
        return out
    if kinds is None:
        raise TypeError("webhooks.app(secret=...) needs kinds=[...]: the signal kinds this "
                        "secret may send (or pass secrets={kind: secret}, one per kind)")
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise TypeError("kinds must be a list of signal kinds, e.g. kinds=['ci']")
    names = [check_name(k, "kind") for k in kinds]
    if not names:
        raise ValueError("kinds must name at least one signal kind")
    keys = _keys(secret)
    return {name: keys for name in names}


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
        secret: Secret | None = None,
        kinds: Iterable[str] | None = None,
        secrets: Mapping[str, Secret] | None = None,
        tolerance: timedelta = DEFAULT_TOLERANCE,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        close_on_shutdown: bool = False,
        events: Mapping[str, Secret] | None = None,
    ) -> None:
        if not isinstance(durable, Durable):
            raise TypeError("webhooks.app needs a pgdurable.Durable")
        if events is not None and (not isinstance(events, Mapping) or not events):
            raise TypeError("events must be a non-empty mapping {event name: secret}")
        self._keys_by_event = {check_name(n, "event name"): _keys(k)
                               for n, k in (events or {}).items()}
        if events is not None and secret is None and secrets is None and kinds is None:
            self._keys_by_kind: dict[str, tuple[bytes, ...]] = {}  # events only
        else:
            self._keys_by_kind = _secrets_by_kind(secret, kinds, secrets)
        if not isinstance(tolerance, timedelta) or tolerance <= timedelta(0):
            raise ValueError("tolerance must be a positive timedelta")
        if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload < 1:
            raise ValueError("max_payload must be an int >= 1 (bytes)")
        self.durable = durable
        self.tolerance = tolerance
        self.max_payload = max_payload
        self.close_on_shutdown = close_on_shutdown

    @property
    def kinds(self) -> frozenset[str]:
        """The signal kinds this app accepts (those with a secret)."""
        return frozenset(self._keys_by_kind)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point: ``lifespan`` and ``http`` scopes."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"pgdurable webhooks serve http only, not {scope['type']}")
        try:
            status, body = await self._handle(scope, receive)
        except _HTTPError as exc:
            await _respond(send, exc.status, {"error": exc.message}, exc.headers)
            return
        except Exception:  # a bug or an untranslated error: logged, generic answer
            log.exception("webhook %s %r failed", scope.get("method"), scope.get("path"))
            await _respond(send, 500, {"error": f"internal error; {_UNKNOWN_OUTCOME}"})
            return
        await _respond(send, status, body)

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

    def _route(self, scope: Scope) -> tuple[str, str, bool]:
        """(kind, ref, False) of ``/signals/{kind}/{ref}``, or ("", name, True) of
        ``/events/{name}`` (when the app takes events)."""
        raw = scope.get("raw_path")
        if raw:  # bytes as received: split first, so %2F stays inside a segment
            raw_parts = bytes(raw).split(b"?", 1)[0].split(b"/")
        else:  # no raw_path: the decoded path, re-encoded segment by segment
            raw_parts = [quote(p, safe="").encode() for p in str(scope.get("path", "")).split("/")]
        try:
            parts = [unquote_to_bytes(p).decode("utf-8") for p in raw_parts]
        except UnicodeDecodeError:
            raise _HTTPError(400, "the path must be UTF-8 (percent-encoded or not)") from None
        root = str(scope.get("root_path", "") or "").rstrip("/").split("/")
        if len(root) > 1 and parts[:len(root)] == root:
            parts = parts[len(root) - 1:]
            parts[0] = ""
        if (len(parts) == 3 and parts[0] == "" and parts[1] == "events"
                and self._keys_by_event):
            if scope.get("method") != "POST":
                raise _HTTPError(405, "method not allowed: use POST", [(b"allow", b"POST")])
            return "", parts[2], True
        if len(parts) != 4 or parts[0] != "" or parts[1] != "signals":
            raise _HTTPError(404, "not found: POST /signals/{kind}/{ref}")
        if scope.get("method") != "POST":
            raise _HTTPError(405, "method not allowed: use POST", [(b"allow", b"POST")])
        return parts[2], parts[3], False

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

    def _timestamp(self, headers: dict[bytes, bytes]) -> int:
        given = headers.get(_TS)
        if given is None:
            raise _HTTPError(401, f"missing {TIMESTAMP_HEADER} header (Unix seconds)")
        text = given.strip()
        if not text.isdigit() or len(text) > 12:
            raise _HTTPError(401, f"bad {TIMESTAMP_HEADER}: Unix seconds expected")
        ts = int(text)
        if abs(time.time() - ts) > self.tolerance.total_seconds():
            raise _HTTPError(401, f"{TIMESTAMP_HEADER} is more than "
                                  f"{self.tolerance.total_seconds():g} s from this server's "
                                  "clock: sign each delivery afresh (and check the clocks)")
        return ts

    def _signal_id(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        ids = set()
        for name, value in headers:
            if name in _ID_HEADERS:
                try:
                    ids.add(bytes(value).decode("utf-8"))
                except UnicodeDecodeError:
                    raise _HTTPError(400, "signal id header must be UTF-8") from None
        if len(ids) > 1:
            raise _HTTPError(400, "Idempotency-Key and X-Signal-Id differ: send one")
        if "" in ids:
            raise _HTTPError(400, "the signal id header is empty")
        return ids.pop() if ids else None

    def _verify(self, keys: tuple[bytes, ...], given: bytes | None, canonical: bytes) -> str:
        if given is None:
            raise _HTTPError(401, f"missing {SIGNATURE_HEADER} header")
        given = given.strip()
        ok = False
        for key in keys:  # every key is tried: the time does not tell which one matched
            ok |= hmac.compare_digest(signature(key, canonical).encode(), given)
        if not ok:
            raise _HTTPError(401, f"bad {SIGNATURE_HEADER}: it does not match the {VERSION} "
                                  "signature of this timestamp, path, signal id and body")
        return given.decode("ascii")

    async def _handle(self, scope: Scope, receive: Receive) -> tuple[int, dict[str, Any]]:
        kind, ref, is_event = self._route(scope)
        if is_event:
            return await self._handle_event(scope, receive, ref)
        if not kind or not ref:
            raise _HTTPError(400, "kind and ref must be non-empty")
        keys = self._keys_by_kind.get(kind)
        if keys is None:
            raise _HTTPError(403, "this endpoint accepts no signals of this kind")
        body = await self._read_body(scope, receive)
        raw_headers = [(bytes(n), bytes(v)) for n, v in scope.get("headers", [])]
        headers = dict(raw_headers)
        ts = self._timestamp(headers)
        signal_id = self._signal_id(raw_headers)
        canonical = canonical_string(timestamp=ts, method="POST", kind=kind, ref=ref,
                                     signal_id=signal_id, body=body)
        signed = self._verify(keys, headers.get(_SIG), canonical)
        if signal_id is None:  # a replay of this very request is the same signal
            signal_id = f"{VERSION}:" + signed.partition("=")[2]
        try:
            payload = parse_payload(body, self.max_payload)
        except ValueError as exc:
            raise _HTTPError(400, str(exc)) from None
        try:
            woken = await self.durable.signal(kind, ref, payload, signal_id=signal_id)
        except SignalConflict as exc:
            raise _HTTPError(409, str(exc)) from None
        except (DatabaseUnavailable, ProviderClosed, psycopg.OperationalError) as exc:
            # unavailable, or busy (a lock or statement timeout, a deadlock): the
            # statement may have committed before its answer was lost
            log.warning("webhook signal %r %r (signal id %r): database unavailable or busy: %s",
                        kind, ref, signal_id, exc)
            raise _HTTPError(503, f"database unavailable or busy; {_UNKNOWN_OUTCOME}",
                             [(b"retry-after", b"1")]) from None
        except (TypeError, ValueError) as exc:  # includes InvalidInput
            raise _HTTPError(400, str(exc)) from None
        except PgDurableError:
            log.exception("webhook signal %r %r (signal id %r) failed", kind, ref, signal_id)
            raise _HTTPError(500, f"internal error; {_UNKNOWN_OUTCOME}") from None
        if woken:
            return 200, {"woken": woken, "pending": False}
        return 202, {"woken": [], "pending": True}


    async def _handle_event(self, scope: Scope, receive: Receive,
                            name: str) -> tuple[int, dict[str, Any]]:
        """``POST /events/{name}``: verified as a signal is, then ``send_event``."""
        if not name:
            raise _HTTPError(400, "the event name must be non-empty")
        keys = self._keys_by_event.get(name)
        if keys is None:
            raise _HTTPError(403, "this endpoint accepts no events of this name")
        body = await self._read_body(scope, receive)
        raw_headers = [(bytes(n), bytes(v)) for n, v in scope.get("headers", [])]
        headers = dict(raw_headers)
        ts = self._timestamp(headers)
        event_id = self._signal_id(raw_headers)
        canonical = event_canonical_string(timestamp=ts, name=name, event_id=event_id,
                                           body=body)
        signed = self._verify(keys, headers.get(_SIG), canonical)
        if event_id is None:  # a replay of this very request is the same event
            event_id = f"{VERSION}:" + signed.partition("=")[2]
        try:
            data = parse_payload(body, self.max_payload)
        except ValueError as exc:
            raise _HTTPError(400, str(exc)) from None
        if not isinstance(data, dict):
            raise _HTTPError(400, "the event's data must be a JSON object")
        try:
            sent = await self.durable.send_event(name, data, id=event_id)
        except EventConflict as exc:
            raise _HTTPError(409, str(exc)) from None
        except (DatabaseUnavailable, ProviderClosed, psycopg.OperationalError) as exc:
            log.warning("webhook event %r (id %r): database unavailable or busy: %s",
                        name, event_id, exc)
            raise _HTTPError(503, f"database unavailable or busy; {_UNKNOWN_OUTCOME}",
                             [(b"retry-after", b"1")]) from None
        except (TypeError, ValueError) as exc:  # includes InvalidInput
            raise _HTTPError(400, str(exc)) from None
        except PgDurableError:
            log.exception("webhook event %r (id %r) failed", name, event_id)
            raise _HTTPError(500, f"internal error; {_UNKNOWN_OUTCOME}") from None
        return 200, {"event": sent.id, "created": sent.created}


async def _respond(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body, ensure_ascii=True).encode()
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
    secret: Secret | None = None,
    kinds: Iterable[str] | None = None,
    secrets: Mapping[str, Secret] | None = None,
    tolerance: timedelta = DEFAULT_TOLERANCE,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    close_on_shutdown: bool = False,
    events: Mapping[str, Secret] | None = None,
) -> WebhookApp:
    """An ASGI app mapping signed ``POST /signals/{kind}/{ref}`` to ``durable.signal``.

    Give either ``secrets={kind: secret}`` (one secret per kind: the CI
    secret cannot sign approvals) or ``secret=`` with ``kinds=[...]`` (one
    secret for the listed kinds). A secret may be a list during a rotation
    (any of them verifies). Secrets are at least :data:`MIN_SECRET_BYTES`
    bytes (``ValueError``). ``tolerance`` bounds the clock skew and the
    replay window; ``max_payload`` bounds the body in bytes (413 above it).
    ``events={name: secret}`` also accepts signed ``POST /events/{name}`` (the
    event's data as the body) for ``durable.send_event``; with only ``events=``,
    no signals. See the module docstring for the protocol and the responses.
    """
    return WebhookApp(durable, secret=secret, kinds=kinds, secrets=secrets, tolerance=tolerance,
                      max_payload=max_payload, close_on_shutdown=close_on_shutdown,
                      events=events)
