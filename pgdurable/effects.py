"""Idempotent side effects outside runs: :func:`with_idempotency`.

Contract (every clause is a test in ``tests/test_idempotency.py``):

* **One execution per key.** Concurrent callers of one key, in any number of
  processes, race in one SQL statement (``pgdurable.idempotency_claim``):
  exactly one *claims* the key and executes ``fn``; the others wait and then
  receive its result. The result is stored as JSONB in
  ``pgdurable.idempotency_keys`` and returned to every caller until it
  expires (``ttl``, default one day, judged by the database clock); after that
  the key may execute again.
* **Failures are stored too.** If ``fn`` raises, the failure
  (``{"type", "message"}``) is recorded: the executing caller gets its own
  exception back, every other caller (until ``ttl``) gets
  :class:`~pgdurable.errors.EffectFailed` carrying the stored error
  (``exc.error``), and ``fn`` is not executed again for that key.
* **Results must be JSON** (dict, list, str, int, float, bool, None; see
  :mod:`pgdurable._json`). A non-JSON result raises ``TypeError``/``ValueError``
  to the executing caller, and the key is recorded as *failed* with that error
  (the effect did happen, so it is not executed again): it is never left stuck
  as running.
* **A dead owner does not block forever.** A running claim is a *lease*: the
  row's ``owner`` plus ``expires_at = now() + lease`` on the database clock.
  The executing caller renews it every ``lease / 3`` while ``fn`` runs. If
  the owner dies (SIGKILL, lost machine) renewals stop; once ``expires_at``
  passes, the next claim attempt of a waiter (or of a new caller) takes the
  key over and executes ``fn`` again. So the guarantee is *exactly once while
  owners live, at least once across owner deaths*: an effect that must never
  repeat even then needs its own reconciliation. An owner whose claim was
  taken over finds its final write refused and gets
  :class:`~pgdurable.errors.LeaseLost`.
* **An interrupted owner never opens the door to a second execution.** A
  caller interrupted (``asyncio.CancelledError``, ``KeyboardInterrupt``, e.g.
  a worker's heartbeat cancelling a stalled step) in its claim statement,
  before ``fn`` started, releases its claim at once (it may have committed
  before the answer arrived), so the next caller executes without waiting.
  Once ``fn`` has started it may have acted, so an owner interrupted while
  ``fn`` runs records the key *failed* (type ``Interrupted``, "outcome
  unknown"): later callers get :class:`~pgdurable.errors.EffectFailed` until
  ``ttl``, and ``fn`` is not executed again behind its back. Recording the outcome survives a lost connection: the
  owner reconnects and retries a few times (about 3 s; the write is
  idempotent for its owner and fenced by the lease), so a connection that
  dies right after ``fn`` does not leave the claim to lapse and the effect to
  run again.
* **Waiting** polls the key with capped exponential backoff and jitter (50 ms
  growing to 1 s, never more than ``lease / 2``), one short statement each, on
  no held connection between polls. ``wait_timeout`` (default ``None``: as long
  as it takes; the lease guarantees progress) bounds it with
  :class:`~pgdurable.errors.DeadlineExceeded`.
* **Bad input** (empty/non-str/NUL/over-long key, non-callable ``fn``,
  non-positive ``ttl``/``lease``/``wait_timeout``) raises ``TypeError`` or
  ``ValueError`` before any SQL runs.

``pool_or_conninfo`` is a psycopg pool (``AsyncConnectionPool`` for
:func:`with_idempotency`, ``ConnectionPool`` for :func:`with_idempotency_sync`),
used one short statement at a time, or a conninfo string: then one library
connection is opened for the call and closed after it. The Durable app's
``app.with_idempotency(key, fn, ttl=...)`` delegates here with its own pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, overload

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from . import _json
from ._aio import wait_set
from ._db import connect, translated, validate_dsn
from ._retry import SETTLE_DELAYS
from ._runs_sql import MAX_NAME_BYTES, check_size
from .errors import DatabaseUnavailable, DeadlineExceeded, EffectFailed, LeaseLost
from .migrations import acheck_schema, check_schema
from .pooler import aconnect

__all__ = ["DEFAULT_LEASE", "DEFAULT_TTL", "MAX_KEY_BYTES", "with_idempotency",
           "with_idempotency_sync"]

T = TypeVar("T")

DEFAULT_TTL = timedelta(days=1)
DEFAULT_LEASE = timedelta(seconds=30)
MAX_KEY_BYTES = MAX_NAME_BYTES  # a btree entry must stay well under ~2700 bytes

# -- claim the key or read it as it stands: (claimed, status, owner, result, error, expires_at)
_CLAIM = "SELECT * FROM pgdurable.idempotency_claim(%s, %s, %s)"
# -- extend the running claim; false when this owner lost it
_RENEW = "SELECT pgdurable.idempotency_renew(%s, %s, %s)"
# -- store the result (owner only); false when this owner lost the claim
_FINISH = "SELECT pgdurable.idempotency_finish(%s, %s, %s::jsonb, %s)"
# -- store the failure (owner only); false when this owner lost the claim
_FAIL = "SELECT pgdurable.idempotency_fail(%s, %s, %s, %s)"
# -- give up the running claim without an outcome (owner only)
_RELEASE = "SELECT pgdurable.idempotency_release(%s, %s)"

_FIRST_DELAY = 0.05
_MAX_DELAY = 1.0

AnyPool = AsyncConnectionPool[Any] | ConnectionPool[Any]
_checked_pools: weakref.WeakSet[Any] = weakref.WeakSet()


# --------------------------------------------------------------------------
# shared core: validation, row parsing, backoff (used by both shells)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Params:
    key: str
    ttl: timedelta
    lease: timedelta
    wait_timeout: float | None


def _duration(value: object, name: str, *, allow_none: bool = False) -> timedelta | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise TypeError(f"{name} must be a timedelta or seconds, not {type(value).__name__}")
    td = value if isinstance(value, timedelta) else timedelta(seconds=value)
    if td <= timedelta(0):
        raise ValueError(f"{name} must be positive, got {td}")
    return td


def validate_key(key: object) -> str:
    """Check an idempotency key: a non-empty ``str`` without NUL, at most MAX_NAME_BYTES (1,000) bytes."""
    if not isinstance(key, str):
        raise TypeError(f"idempotency key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("idempotency key must not be empty")
    if "\x00" in key:
        raise ValueError("idempotency key contains a NUL character (\\x00)")
    check_size(key, "idempotency key")
    return key


def _params(key: object, fn: object, ttl: object, lease: object, wait_timeout: object) -> _Params:
    k = validate_key(key)
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    t = _duration(ttl, "ttl")
    le = _duration(lease, "lease")
    w = _duration(wait_timeout, "wait_timeout", allow_none=True)
    assert t is not None and le is not None
    return _Params(k, t, le, None if w is None else w.total_seconds())


def _check_target(target: object, pool_cls: type[Any]) -> None:
    """TypeError unless ``target`` is a ``pool_cls`` (the shell's pool type) or a conninfo str."""
    if not isinstance(target, pool_cls | str):
        name = pool_cls.__name__
        article = "an" if name[0] in "AEIOU" else "a"
        raise TypeError(
            f"pool_or_conninfo must be {article} {name} or a conninfo string, not "
            f"{type(target).__name__}"
        )


def _encode_error(exc: BaseException) -> Jsonb:
    return Jsonb({"type": type(exc).__name__, "message": str(exc).replace("\x00", "\\x00")})


def _interrupted(exc: BaseException) -> Jsonb:
    return Jsonb({
        "type": "Interrupted",
        "message": f"fn was interrupted ({type(exc).__name__}) after it started; its outcome "
                   "is unknown, so it is not executed again",
    })


def _outcome(key: str, row: tuple[Any, ...] | None) -> tuple[str, Any]:
    """Judge a claim row: ('execute', None) | ('done', result) | ('wait', None).

    Raises :class:`EffectFailed` for a failed key.
    """
    if row is None:  # pragma: no cover - the SQL function always returns a row
        raise DatabaseUnavailable("idempotency_claim returned no row")
    claimed, status, _owner, result, error, _expires = row
    if claimed:
        return "execute", None
    if status == "succeeded":
        return "done", result
    if status == "failed":
        err = error if isinstance(error, dict) else {}
        exc = EffectFailed(
            f"effect {key!r} failed: {err.get('type', 'Error')}: {err.get('message', '')}"
        )
        exc.error = err
        raise exc
    return "wait", None


def _delays(lease: timedelta) -> Iterator[float]:
    """Backoff between polls: 50 ms doubling to 1 s (at most lease/2), with jitter."""
    cap = min(_MAX_DELAY, lease.total_seconds() / 2)
    delay = min(_FIRST_DELAY, cap)
    while True:
        yield delay * random.uniform(0.5, 1.0)
        delay = min(delay * 2, cap)


def _check_deadline(p: _Params, started: float) -> None:
    if p.wait_timeout is not None and time.monotonic() - started >= p.wait_timeout:
        raise DeadlineExceeded(
            f"waited {p.wait_timeout:g} s for idempotency key {p.key!r} held by another caller"
        )


def _lost(key: str) -> LeaseLost:
    return LeaseLost(
        f"the claim on idempotency key {key!r} lapsed and was taken over before the effect "
        "finished; another caller may have executed it too"
    )


# --------------------------------------------------------------------------
# the protocol, once: a generator yielding I/O requests that a shell performs
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Query:
    """Run one statement; send back its first row. With ``soft``, a lost
    connection (:class:`DatabaseUnavailable`) is sent back instead of raised."""

    sql: str
    args: tuple[Any, ...]
    soft: bool = False


@dataclass(frozen=True)
class _Sleep:
    """Sleep this many seconds; send back None."""

    seconds: float


@dataclass(frozen=True)
class _Execute:
    """Run fn under the heartbeat; send back ``(value, json)`` or the exception raised."""


_Op = _Query | _Sleep | _Execute
_Ran = tuple[Any, str] | BaseException


def _protocol(p: _Params, owner: str) -> Generator[_Op, Any, Any]:
    """with_idempotency's whole logic; returns the result or raises the outcome."""
    started = time.monotonic()
    delays = _delays(p.lease)
    while True:
        verdict, result = _outcome(p.key, (yield _Query(_CLAIM, (p.key, owner, p.lease))))
        if verdict == "done":
            return result
        if verdict == "execute":
            break
        _check_deadline(p, started)
        yield _Sleep(next(delays))
    ran: _Ran = yield _Execute()
    if isinstance(ran, BaseException):
        # fn has started (it is called at once), so it may have acted: even an
        # interrupted fn is settled as failed, never released for a re-run
        error = _encode_error(ran) if isinstance(ran, Exception) else _interrupted(ran)
        row = yield from _settle(_FAIL, (p.key, owner, error, p.ttl))
        if not isinstance(ran, Exception):
            raise ran
        if row is not None and not row[0]:
            raise _lost(p.key) from ran
        raise ran
    value, payload = ran
    row = yield from _settle(_FINISH, (p.key, owner, payload, p.ttl))
    if row is not None and not row[0]:
        raise _lost(p.key)
    return value


def _settle(sql: str, args: tuple[Any, ...]) -> Generator[_Op, Any, Any]:
    """Record the outcome, retrying a lost connection a few times (≈ 3.4 s in
    all): the effect has run, and while the claim is unsettled any caller
    after its lease would run it again. A write after the lease lapsed is
    refused by the fence (-> LeaseLost), never applied late."""
    for delay in SETTLE_DELAYS:
        reply = yield _Query(sql, args, soft=True)
        if not isinstance(reply, DatabaseUnavailable):
            return reply
        yield _Sleep(delay)
    reply = yield _Query(sql, args)
    return reply


# --------------------------------------------------------------------------
# async shell
# --------------------------------------------------------------------------
@asynccontextmanager
async def _aconnection(
    target: AsyncConnectionPool[Any] | str,
) -> AsyncIterator[Callable[[], Any]]:
    """Yield a factory of connection contexts: pooled per statement, or one held."""
    if isinstance(target, AsyncConnectionPool):
        if target not in _checked_pools:
            async with target.connection() as c:
                with translated():
                    await acheck_schema(c)
            _checked_pools.add(target)

        def pooled() -> Any:
            return target.connection()

        yield pooled
        return
    validate_dsn(target)
    conn = await aconnect(target)
    lock = asyncio.Lock()

    @asynccontextmanager
    async def held() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        nonlocal conn
        async with lock:
            if conn.broken or conn.closed:  # lost: reconnect (settle retries need it)
                conn = await aconnect(target)
            yield conn

    try:
        with translated():
            await acheck_schema(conn)
        yield held
    finally:
        await conn.close()


async def _aone(conns: Callable[[], Any], sql: str, args: tuple[Any, ...]) -> Any:
    async with conns() as c:
        with translated():
            cur = await c.execute(sql, args)
            return await cur.fetchone()


@overload
async def with_idempotency(
    pool_or_conninfo: AsyncConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], Awaitable[T]],
    *,
    ttl: timedelta | float = ...,
    lease: timedelta | float = ...,
    wait_timeout: timedelta | float | None = ...,
) -> T: ...


@overload
async def with_idempotency(
    pool_or_conninfo: AsyncConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], T],
    *,
    ttl: timedelta | float = ...,
    lease: timedelta | float = ...,
    wait_timeout: timedelta | float | None = ...,
) -> T: ...


async def with_idempotency(
    pool_or_conninfo: AsyncConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], Any],
    *,
    ttl: timedelta | float = DEFAULT_TTL,
    lease: timedelta | float = DEFAULT_LEASE,
    wait_timeout: timedelta | float | None = None,
) -> Any:
    """Run ``fn`` at most once per ``key`` across processes; return its (stored) result.

    ``fn`` takes no arguments and may be sync or async (a sync ``fn`` blocks the
    event loop, and with it the heartbeat: keep it short or use an async one).
    See the module docstring for the full contract (waiting, failures, leases
    of dead owners).
    """
    p = _params(key, fn, ttl, lease, wait_timeout)
    _check_target(pool_or_conninfo, AsyncConnectionPool)
    owner = uuid.uuid4().hex
    proto = _protocol(p, owner)
    async with _aconnection(pool_or_conninfo) as conns:
        reply: Any = None
        while True:
            try:
                op = proto.send(reply)
            except StopIteration as done:
                return done.value
            if isinstance(op, _Query):
                try:
                    reply = await _aone(conns, op.sql, op.args)
                except DatabaseUnavailable as exc:
                    if not op.soft:
                        raise
                    reply = exc
                except BaseException as exc:
                    # interrupted, the claim may have committed unseen: give it up
                    if op.sql is _CLAIM and not isinstance(exc, Exception):
                        with contextlib.suppress(Exception):
                            await _aone(conns, _RELEASE, (p.key, owner))
                    raise
            elif isinstance(op, _Sleep):
                await asyncio.sleep(op.seconds)
                reply = None
            else:
                reply = await _arun(conns, p, owner, fn)


async def _arun(conns: Callable[[], Any], p: _Params, owner: str, fn: Callable[[], Any]) -> _Ran:
    stop = asyncio.Event()

    async def heartbeat() -> None:
        while True:
            if await wait_set(stop, p.lease.total_seconds() / 3):
                return
            try:
                row = await _aone(conns, _RENEW, (p.key, owner, p.lease))
            except Exception:
                continue  # a transient failure; the next beat retries
            if row is not None and not row[0]:
                return  # lost: the final write will say so

    beat = asyncio.create_task(heartbeat())
    try:
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        return value, _json.dumps(value, "result")
    except BaseException as exc:
        return exc
    finally:
        stop.set()
        await beat


# --------------------------------------------------------------------------
# sync shell
# --------------------------------------------------------------------------
@contextmanager
def _connection(target: ConnectionPool[Any] | str) -> Iterator[Callable[[], Any]]:
    if isinstance(target, ConnectionPool):
        if target not in _checked_pools:
            with target.connection() as c, translated():
                check_schema(c)
            _checked_pools.add(target)

        def pooled() -> Any:
            return target.connection()

        yield pooled
        return
    conn = connect(target)
    lock = threading.Lock()

    @contextmanager
    def held() -> Iterator[psycopg.Connection[Any]]:
        nonlocal conn
        with lock:
            if conn.broken or conn.closed:  # lost: reconnect (settle retries need it)
                conn = connect(target)
            yield conn

    try:
        with translated():
            check_schema(conn)
        yield held
    finally:
        conn.close()


def _one(conns: Callable[[], Any], sql: str, args: tuple[Any, ...]) -> Any:
    with conns() as c, translated():
        return c.execute(sql, args).fetchone()


def with_idempotency_sync(
    pool_or_conninfo: ConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], T],
    *,
    ttl: timedelta | float = DEFAULT_TTL,
    lease: timedelta | float = DEFAULT_LEASE,
    wait_timeout: timedelta | float | None = None,
) -> T:
    """Sync twin of :func:`with_idempotency` (same protocol, same SQL); ``fn`` is sync.

    The heartbeat runs in a thread while ``fn`` runs.
    """
    p = _params(key, fn, ttl, lease, wait_timeout)
    _check_target(pool_or_conninfo, ConnectionPool)
    owner = uuid.uuid4().hex
    proto = _protocol(p, owner)
    with _connection(pool_or_conninfo) as conns:
        reply: Any = None
        while True:
            try:
                op = proto.send(reply)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(op, _Query):
                try:
                    reply = _one(conns, op.sql, op.args)
                except DatabaseUnavailable as exc:
                    if not op.soft:
                        raise
                    reply = exc
                except BaseException as exc:
                    # interrupted, the claim may have committed unseen: give it up
                    if op.sql is _CLAIM and not isinstance(exc, Exception):
                        with contextlib.suppress(Exception):
                            _one(conns, _RELEASE, (p.key, owner))
                    raise
            elif isinstance(op, _Sleep):
                time.sleep(op.seconds)
                reply = None
            else:
                reply = _run(conns, p, owner, fn)


def _run(conns: Callable[[], Any], p: _Params, owner: str, fn: Callable[[], Any]) -> _Ran:
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(p.lease.total_seconds() / 3):
            try:
                row = _one(conns, _RENEW, (p.key, owner, p.lease))
            except Exception:
                continue  # a transient failure; the next beat retries
            if row is not None and not row[0]:
                return

    beat = threading.Thread(target=heartbeat, name="pgdurable-idempotency-heartbeat", daemon=True)
    beat.start()
    try:
        value = fn()
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise TypeError("with_idempotency_sync needs a sync fn; use with_idempotency")
        return value, _json.dumps(value, "result")
    except BaseException as exc:
        return exc
    finally:
        stop.set()
        beat.join()
