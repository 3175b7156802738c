"""Idempotent side effects outside runs: :func:`with_idempotency`.

Contract (every clause is a test in ``tests/test_idempotency.py``):

* **One execution per key.** Concurrent callers of one key, in any number of
  processes, race in one SQL statement (``pgdurable.idempotency_claim_v2``):
  exactly one *claims* the key and executes ``fn``; the others wait and then
  receive its result. The result is stored as JSONB in
  ``pgdurable.idempotency_keys`` and returned to every caller until it
  expires (``ttl``, default one day, judged by the database clock); after that
  the key may execute again.
* **Failures are stored too.** If ``fn`` raises, the failure
  (``{"type", "message"}``) is recorded: the executing caller gets its own
  exception back, every other caller (until ``ttl``) gets
  :class:`~pgdurable.foundation.errors.EffectFailed` carrying the stored error
  (``exc.error``), and ``fn`` is not executed again for that key.
* **Results must be JSON** (dict, list, str, int, float, bool, None; see
  :mod:`pgdurable.foundation.jsonb`). A non-JSON result raises ``TypeError``/``ValueError``
  to the executing caller, and the key is recorded as *failed* with that error
  (the effect did happen, so it is not executed again): it is never left stuck
  as running.
* **A dead owner does not block forever.** A running claim is a *lease*: the
  row's ``owner`` plus ``expires_at = now() + lease`` on the database clock.
  The executing caller renews it every ``lease / 3`` from the moment ``fn``
  starts until its outcome is recorded. If the owner dies (SIGKILL, lost
  machine) renewals stop; once ``expires_at`` passes, the next claim attempt
  of a waiter (or of a new caller) takes the key over. Without ``reconcile``
  it executes ``fn`` again: *exactly once while owners live, at least once
  across owner deaths*. An owner whose claim was taken over finds its final
  write refused and gets :class:`~pgdurable.foundation.errors.LeaseLost`.
* **An outcome unknown is reconciled, when the caller can.** A key's outcome
  is unknown when its owner's claim lapsed (it may have started ``fn``) or
  when it was recorded ``Interrupted`` (below). A caller that passes
  ``reconcile`` (a no-argument function, like ``ctx.effect``'s) takes such a
  key over and calls ``reconcile()`` instead of ``fn``: it returns the real
  outcome, which is stored and returned as the key's result, or
  :data:`NOT_PERFORMED` when the effect never happened (then ``fn`` runs now,
  once, under this caller's claim). If ``reconcile`` raises (or returns
  non-JSON), the caller gets :class:`~pgdurable.foundation.errors.ReconcileFailed` and
  the key stays ``Interrupted`` for the next caller that can reconcile.
* **An interrupted owner never opens the door to a second execution.** A
  caller interrupted (``asyncio.CancelledError``, ``KeyboardInterrupt``, e.g.
  a worker's heartbeat cancelling a stalled step) in its claim statement,
  before ``fn`` started, releases its claim at once (it may have committed
  before the answer arrived), so the next caller executes without waiting.
  Once ``fn`` has started it may have acted, so an owner interrupted while
  ``fn`` runs records the key *failed* (type ``Interrupted``, "outcome
  unknown"): later callers get :class:`~pgdurable.foundation.errors.EffectFailed` until
  ``ttl`` (or reconcile it), and ``fn`` is not executed again behind its back.
* **Recording an outcome survives the caller's interruption and lost
  connections.** A result ``fn`` returned is never thrown away: the write
  that records it (or its failure) is shielded from the caller's
  cancellation (and, in the sync twin, from ``KeyboardInterrupt`` in the main
  thread), and sent again after a lost connection (on a new one) while the
  claim is trusted (until the claim, or its last renewal, plus
  ``lease - lease/6``; the write is idempotent for its owner and fenced, so
  it is never applied after a takeover). An interruption that arrived
  meanwhile is raised once the outcome is recorded.
* **Waiting** polls the key with capped exponential backoff and jitter (50 ms
  growing to 1 s, never more than ``lease / 2``), one short statement each, on
  no held connection between polls. ``wait_timeout`` (default ``None``: as long
  as it takes; the lease guarantees progress) bounds it with
  :class:`~pgdurable.foundation.errors.DeadlineExceeded`.
* **Bad input** (empty/non-str/NUL/over-long key, non-callable ``fn`` or
  ``reconcile``, non-positive ``ttl``/``lease``/``wait_timeout``) raises
  ``TypeError`` or ``ValueError`` before any SQL runs.

``pool_or_conninfo`` is a psycopg pool (``AsyncConnectionPool`` for
:func:`with_idempotency`, ``ConnectionPool`` for :func:`with_idempotency_sync`),
used one short statement at a time, or a conninfo string: then one library
connection is opened for the call and closed after it. The Durable app's
``app.with_idempotency(key, fn, ttl=...)`` delegates here with its own pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import inspect
import logging
import random
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar, overload

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from . import jsonb as _json
from .aio import through_cancel, wait_set
from .db import connect, translated, validate_dsn
from .errors import DatabaseUnavailable, DeadlineExceeded, EffectFailed, LeaseLost, ReconcileFailed
from .migrations import acheck_schema, check_schema
from .pooler import aconnect
from .queries import idempotency as iq
from .queries.core import Query
from .retry import retry_while, retry_while_sync
from .run_queries import MAX_NAME_BYTES, check_size

__all__ = ["DEFAULT_LEASE", "DEFAULT_TTL", "MAX_KEY_BYTES", "NOT_PERFORMED", "NotPerformed",
           "with_idempotency", "with_idempotency_sync"]

T = TypeVar("T")

log = logging.getLogger("pgdurable.effects")

DEFAULT_TTL = timedelta(days=1)
DEFAULT_LEASE = timedelta(seconds=30)
MAX_KEY_BYTES = MAX_NAME_BYTES  # a btree entry must stay well under ~2700 bytes


class NotPerformed(enum.Enum):
    """The type of :data:`NOT_PERFORMED` (one member)."""

    NOT_PERFORMED = "not performed"

    def __repr__(self) -> str:
        return "pgdurable.NOT_PERFORMED"


#: What a ``reconcile`` function returns to say "the effect never happened"
#: (for ``ctx.effect`` and :func:`with_idempotency` alike): ``fn`` then runs
#: once, under the current claim or lease token, and its outcome is recorded
#: as usual.
NOT_PERFORMED = NotPerformed.NOT_PERFORMED

# The statements (claim, renew, finish, fail, release) and their typed answers:
# pgdurable.foundation.queries.idempotency (imported as ``iq``).

_FIRST_DELAY = 0.05
_MAX_DELAY = 1.0

AnyPool = AsyncConnectionPool[Any] | ConnectionPool[Any]
_checked_pools: weakref.WeakSet[Any] = weakref.WeakSet()


# --------------------------------------------------------------------------
# shared core: validation, row parsing, backoff, trust (used by both shells)
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Params:
    key: str
    ttl: timedelta
    lease: timedelta
    wait_timeout: float | None
    reconciles: bool


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


def _params(key: object, fn: object, ttl: object, lease: object, wait_timeout: object,
            reconcile: object) -> _Params:
    k = validate_key(key)
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    if reconcile is not None and not callable(reconcile):
        raise TypeError(f"reconcile must be callable or None, not {type(reconcile).__name__}")
    t = _duration(ttl, "ttl")
    le = _duration(lease, "lease")
    w = _duration(wait_timeout, "wait_timeout", allow_none=True)
    assert t is not None and le is not None
    return _Params(k, t, le, None if w is None else w.total_seconds(), reconcile is not None)


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


def _unreconciled(exc: BaseException) -> Jsonb:
    return Jsonb({
        "type": "Interrupted",
        "message": f"the outcome of fn is unknown and reconcile failed "
                   f"({type(exc).__name__}: {str(exc).replace(chr(0), '')}); fn is not "
                   "executed again",
    })


def _outcome(key: str, claim: iq.Claim | None) -> tuple[str, bool, Any]:
    """Judge a claim: ('execute', unknown, None) | ('done', _, result) | ('wait', _, None).

    Raises :class:`EffectFailed` for a failed key.
    """
    if claim is None:  # pragma: no cover - the SQL function always returns a row
        raise DatabaseUnavailable("idempotency_claim_v2 returned no row")
    if claim.claimed:
        return "execute", bool(claim.unknown), None
    if claim.status == "succeeded":
        return "done", False, claim.result
    if claim.status == "failed":
        err = claim.error if isinstance(claim.error, dict) else {}
        exc = EffectFailed(
            f"effect {key!r} failed: {err.get('type', 'Error')}: {err.get('message', '')}"
        )
        exc.error = err
        raise exc
    return "wait", False, None


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


class _Trust:
    """Until when (monotonic) the owner trusts its claim: the send time of the
    claim, or of the last renewal that held, plus ``lease - lease/6`` (the
    worker's own margin). Written by one thread or task, read by another: a
    float assignment is atomic."""

    def __init__(self, lease: timedelta) -> None:
        self._span = lease.total_seconds() * 5 / 6
        self._until = 0.0

    def held(self, sent: float) -> None:
        """The claim (or a renewal) sent at ``sent`` held."""
        self._until = max(self._until, sent + self._span)

    def __call__(self) -> bool:
        return time.monotonic() < self._until


# --------------------------------------------------------------------------
# the protocol, once: a generator yielding I/O requests that a shell performs
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Query:
    """Run one statement; send back the record of its row (None: no row)."""

    query: Query[Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class _Settle:
    """Record the outcome: run one fenced, owner-idempotent statement to its
    end even if the caller is interrupted meanwhile (the interruption is raised
    after it), sent again after a lost connection while the claim is trusted;
    send back its answer (False: this owner lost the claim; None: no row)."""

    query: Query[bool]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class _Sleep:
    """Sleep this many seconds; send back None."""

    seconds: float


@dataclass(frozen=True)
class _Call:
    """Call ``fn`` or ``reconcile`` (the heartbeat renews the claim from now on
    until the protocol ends); send back ``(value,)`` or the exception raised."""

    which: Literal["fn", "reconcile"]


_Op = _Query | _Settle | _Sleep | _Call
_Ran = tuple[Any] | BaseException


def _protocol(p: _Params, owner: str) -> Generator[_Op, Any, Any]:
    """with_idempotency's whole logic; returns the result or raises the outcome."""
    started = time.monotonic()
    delays = _delays(p.lease)
    while True:
        claim = yield _Query(iq.CLAIM, (p.key, owner, p.lease, p.reconciles))
        verdict, unknown, result = _outcome(p.key, claim)
        if verdict == "done":
            return result
        if verdict == "execute":
            break
        _check_deadline(p, started)
        yield _Sleep(next(delays))
    if unknown and p.reconciles:
        found = yield from _reconcile(p, owner)
        if found is not NOT_PERFORMED:
            return found
    ran: _Ran = yield _Call("fn")
    if isinstance(ran, BaseException):
        # fn has started (it is called at once), so it may have acted: even an
        # interrupted fn is settled as failed, never released for a re-run
        error = _encode_error(ran) if isinstance(ran, Exception) else _interrupted(ran)
        held = yield _Settle(iq.FAIL, (p.key, owner, error, p.ttl))
        if not isinstance(ran, Exception):
            raise ran
        if held is False:
            raise _lost(p.key) from ran
        raise ran
    value = ran[0]
    try:
        payload = _json.dumps(value, "result")
    except (TypeError, ValueError) as exc:
        # the effect did happen: recorded failed, never left running
        held = yield _Settle(iq.FAIL, (p.key, owner, _encode_error(exc), p.ttl))
        if held is False:
            raise _lost(p.key) from exc
        raise exc
    held = yield _Settle(iq.FINISH, (p.key, owner, payload, p.ttl))
    if held is False:
        raise _lost(p.key)
    return value


def _reconcile(p: _Params, owner: str) -> Generator[_Op, Any, Any]:
    """The claimed key's outcome is unknown: ask ``reconcile``. Returns the
    recorded outcome, or :data:`NOT_PERFORMED` (the caller then runs ``fn``).
    A failing ``reconcile`` keeps the key Interrupted and raises ReconcileFailed."""
    ran: _Ran = yield _Call("reconcile")
    if isinstance(ran, BaseException) and not isinstance(ran, Exception):
        yield _Settle(iq.FAIL, (p.key, owner, _interrupted(ran), p.ttl))
        raise ran
    try:
        if isinstance(ran, BaseException):
            raise ran
        value = ran[0]
        if value is NOT_PERFORMED:
            return NOT_PERFORMED
        payload = _json.dumps(value, "reconciled result")
    except Exception as exc:
        held = yield _Settle(iq.FAIL, (p.key, owner, _unreconciled(exc), p.ttl))
        if held is False:
            raise _lost(p.key) from exc
        raise ReconcileFailed(
            f"reconcile of idempotency key {p.key!r} failed: {type(exc).__name__}: {exc}; the "
            "outcome of fn stays unknown (the key is kept Interrupted), so fn is not executed"
        ) from exc
    held = yield _Settle(iq.FINISH, (p.key, owner, payload, p.ttl))
    if held is False:
        raise _lost(p.key)
    return value


class _Interrupts:
    """The caller's interruptions (``CancelledError``, ``KeyboardInterrupt``)
    seen by a shell: the one that interrupted ``fn``, and those that arrived
    while an outcome was recorded (deferred, and logged once, so that whoever
    waits for the caller to stop knows why it has not yet)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.seen: list[BaseException] = []
        self._told = False

    def deferred(self, exc: BaseException) -> None:
        """``exc`` arrived while the outcome is being recorded: raise it after."""
        if not self._told:
            self._told = True
            log.warning("interrupted (%s) while recording the outcome of idempotency key %r: "
                        "recording it first, then stopping", type(exc).__name__, self.key)
        self.seen.append(exc)

    def called(self, ran: _Ran) -> _Ran:
        """``fn`` (or ``reconcile``) ran: note an interruption it ended with."""
        if isinstance(ran, BaseException) and not isinstance(ran, Exception):
            self.seen.append(ran)
        return ran

    def end(self, error: BaseException | None, result: Any) -> Any:
        """Return ``result`` or raise: an interruption wins over the
        protocol's own exception ``error`` (which becomes its cause)."""
        if not self.seen or error is self.seen[0] or (
            error is not None and not isinstance(error, Exception)
        ):
            if error is not None:
                raise error
            return result
        first = self.seen[0]
        if error is not None:
            first.__cause__ = error
        raise first


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


async def _aone(conns: Callable[[], Any], query: Query[T], args: tuple[Any, ...]) -> T | None:
    async with conns() as c:
        with translated():
            cur = await c.execute(query.sql, args)
            return query.first(await cur.fetchone())


@overload
async def with_idempotency(
    pool_or_conninfo: AsyncConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], Awaitable[T]],
    *,
    ttl: timedelta | float = ...,
    lease: timedelta | float = ...,
    wait_timeout: timedelta | float | None = ...,
    reconcile: Callable[[], Any] | None = ...,
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
    reconcile: Callable[[], Any] | None = ...,
) -> T: ...


async def with_idempotency(
    pool_or_conninfo: AsyncConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], Any],
    *,
    ttl: timedelta | float = DEFAULT_TTL,
    lease: timedelta | float = DEFAULT_LEASE,
    wait_timeout: timedelta | float | None = None,
    reconcile: Callable[[], Any] | None = None,
) -> Any:
    """Run ``fn`` at most once per ``key`` across processes; return its (stored) result.

    ``fn`` takes no arguments and may be sync or async (a sync ``fn`` blocks the
    event loop, and with it the heartbeat: keep it short or use an async one).
    ``reconcile`` (no arguments, sync or async) is asked instead of ``fn`` when
    the key was started but its outcome is unknown: it returns the real
    outcome or :data:`NOT_PERFORMED`. See the module docstring for the full
    contract (waiting, failures, cancellation, leases of dead owners).
    """
    p = _params(key, fn, ttl, lease, wait_timeout, reconcile)
    _check_target(pool_or_conninfo, AsyncConnectionPool)
    owner = uuid.uuid4().hex
    calls = {"fn": fn, "reconcile": reconcile}
    async with _aconnection(pool_or_conninfo) as conns:
        return await _adrive(_protocol(p, owner), conns, p, owner, calls)


async def _adrive(proto: Generator[_Op, Any, Any], conns: Callable[[], Any], p: _Params,
                  owner: str, calls: dict[str, Any]) -> Any:
    """Perform the protocol's requests; the caller's cancellations while an
    outcome is recorded are raised once it is."""
    trust = _Trust(p.lease)
    interrupts = _Interrupts(p.key)
    stop = asyncio.Event()
    beat: asyncio.Task[None] | None = None
    error: BaseException | None = None
    result: Any = None
    reply: Any = None
    try:
        while True:
            try:
                op = proto.send(reply)
            except StopIteration as done:
                result = done.value
                break
            if isinstance(op, _Query):
                sent = time.monotonic()
                try:
                    reply = await _aone(conns, op.query, op.args)
                except BaseException as exc:
                    # interrupted, the claim may have committed unseen: give it up
                    if op.query is iq.CLAIM and not isinstance(exc, Exception):
                        with contextlib.suppress(Exception):
                            await _aone(conns, iq.RELEASE, (p.key, owner))
                    raise
                if isinstance(reply, iq.Claim) and reply.claimed:
                    trust.held(sent)
            elif isinstance(op, _Settle):
                call = functools.partial(_aone, conns, op.query, op.args)
                reply = await through_cancel(retry_while(call, trust), interrupts.deferred)
            elif isinstance(op, _Sleep):
                await asyncio.sleep(op.seconds)
                reply = None
            else:
                if beat is None:
                    beat = asyncio.create_task(_aheartbeat(conns, p, owner, trust, stop))
                reply = interrupts.called(await _acall(calls[op.which]))
    except BaseException as exc:
        error = exc
    if beat is not None:
        stop.set()
        with contextlib.suppress(Exception):
            await through_cancel(beat, interrupts.deferred)
    return interrupts.end(error, result)


async def _acall(fn: Callable[[], Any]) -> _Ran:
    try:
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        return (value,)
    except BaseException as exc:
        return exc


async def _aheartbeat(conns: Callable[[], Any], p: _Params, owner: str, trust: _Trust,
                      stop: asyncio.Event) -> None:
    while not await wait_set(stop, p.lease.total_seconds() / 3):
        sent = time.monotonic()
        try:
            renewed = await _aone(conns, iq.RENEW, (p.key, owner, p.lease))
        except Exception:
            continue  # a transient failure; the next beat retries
        if not renewed:
            return  # lost (or settled): the final write says which
        trust.held(sent)


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


def _one(conns: Callable[[], Any], query: Query[T], args: tuple[Any, ...]) -> T | None:
    with conns() as c, translated():
        return query.first(c.execute(query.sql, args).fetchone())


def with_idempotency_sync(
    pool_or_conninfo: ConnectionPool[Any] | str,
    key: str,
    fn: Callable[[], T],
    *,
    ttl: timedelta | float = DEFAULT_TTL,
    lease: timedelta | float = DEFAULT_LEASE,
    wait_timeout: timedelta | float | None = None,
    reconcile: Callable[[], Any] | None = None,
) -> T:
    """Sync twin of :func:`with_idempotency` (same protocol, same SQL); ``fn``
    and ``reconcile`` are sync.

    The heartbeat runs in a thread while ``fn`` runs. In the main thread, the
    write recording the outcome runs in a thread of its own, so that a
    ``KeyboardInterrupt`` (or a signal handler's exception) does not abandon
    it: the interruption is raised once the outcome is recorded.
    """
    p = _params(key, fn, ttl, lease, wait_timeout, reconcile)
    _check_target(pool_or_conninfo, ConnectionPool)
    owner = uuid.uuid4().hex
    calls = {"fn": fn, "reconcile": reconcile}
    with _connection(pool_or_conninfo) as conns:
        return _drive(_protocol(p, owner), conns, p, owner, calls)  # type: ignore[no-any-return]


def _drive(proto: Generator[_Op, Any, Any], conns: Callable[[], Any], p: _Params,
           owner: str, calls: dict[str, Any]) -> Any:
    """Sync twin of :func:`_adrive`."""
    trust = _Trust(p.lease)
    interrupts = _Interrupts(p.key)
    stop = threading.Event()
    beat: threading.Thread | None = None
    error: BaseException | None = None
    result: Any = None
    reply: Any = None
    try:
        while True:
            try:
                op = proto.send(reply)
            except StopIteration as done:
                result = done.value
                break
            if isinstance(op, _Query):
                sent = time.monotonic()
                try:
                    reply = _one(conns, op.query, op.args)
                except BaseException as exc:
                    # interrupted, the claim may have committed unseen: give it up
                    if op.query is iq.CLAIM and not isinstance(exc, Exception):
                        with contextlib.suppress(Exception):
                            _one(conns, iq.RELEASE, (p.key, owner))
                    raise
                if isinstance(reply, iq.Claim) and reply.claimed:
                    trust.held(sent)
            elif isinstance(op, _Settle):
                call = functools.partial(_one, conns, op.query, op.args)
                reply = _through_interrupt(functools.partial(retry_while_sync, call, trust),
                                           interrupts.deferred)
            elif isinstance(op, _Sleep):
                time.sleep(op.seconds)
                reply = None
            else:
                if beat is None:
                    beat = threading.Thread(target=_heartbeat, args=(conns, p, owner, trust, stop),
                                            name="pgdurable-idempotency-heartbeat", daemon=True)
                    beat.start()
                reply = interrupts.called(_call(calls[op.which]))
    except BaseException as exc:
        error = exc
    if beat is not None:
        stop.set()
        while beat.is_alive():
            try:
                beat.join()
            except BaseException as exc:  # KeyboardInterrupt: the outcome is recorded
                interrupts.deferred(exc)
    return interrupts.end(error, result)


def _through_interrupt(call: Callable[[], T], deferred: Callable[[BaseException], None]) -> T:
    """``call()`` to its end even if the main thread is interrupted meanwhile
    (KeyboardInterrupt, a signal handler's exception): there it runs in a
    thread of its own, and each interruption is handed to ``deferred``.
    Elsewhere nothing interrupts a thread: it is simply called."""
    if threading.current_thread() is not threading.main_thread():
        return call()
    box: list[_Ran] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((call(),))
        except BaseException as exc:
            box.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="pgdurable-idempotency-settle", daemon=True).start()
    while True:
        try:
            done.wait()
            break
        except BaseException as exc:
            deferred(exc)
    out = box[0]
    if isinstance(out, BaseException):
        raise out
    return out[0]  # type: ignore[no-any-return]


def _call(fn: Callable[[], Any]) -> _Ran:
    try:
        value = fn()
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()
            raise TypeError("with_idempotency_sync needs a sync fn; use with_idempotency")
        return (value,)
    except BaseException as exc:
        return exc


def _heartbeat(conns: Callable[[], Any], p: _Params, owner: str, trust: _Trust,
               stop: threading.Event) -> None:
    while not stop.wait(p.lease.total_seconds() / 3):
        sent = time.monotonic()
        try:
            renewed = _one(conns, iq.RENEW, (p.key, owner, p.lease))
        except Exception:
            continue  # a transient failure; the next beat retries
        if not renewed:
            return
        trust.held(sent)
