"""Distributed leases on PostgreSQL: the seed's ``LeaseProvider`` contract.

Contract
========

A lease gives one *owner* (a string, e.g. a run id) exclusive use of a *key*
(a string, e.g. a thread key) until it expires. Time is the database's clock
only (``pgdurable.now()``); the client's clock is never consulted, so skewed
clients change nothing. Every operation is one SQL function in
``sql/0002_leases.sql`` (callable from psql) executed in one round trip.

``acquire_lease(key, owner, ttl_ms) -> LeaseGrant(acquired, owner, token, expires_at)``
    One statement. A free, released or expired key is granted to ``owner`` with
    a new fencing ``token`` (previous token + 1; tokens never decrease per key,
    also across releases). If ``owner`` already holds it, the TTL is refreshed
    and the token kept. Otherwise ``acquired`` is False and ``owner``, ``token``
    and ``expires_at`` describe the live holder, read in the same call: a loser
    never sees ``owner=None`` while the key is actually free.
``get_lease_owner(key) -> str | None``
    The live holder; None when free, released or expired.
``release_lease(key, owner, *, token=None) -> None``
    Frees the key if ``owner`` (and ``token``, when given) holds it now;
    otherwise a silent no-op. A late release never removes a successor.
``renew_lease(key, owner, ttl_ms, *, token=None) -> bool``
    Extends a live lease to now + ttl. False when it was lost (expired,
    released, taken over, or another token); it is never resurrected.
``transfer_lease(key, from_owner, to_owner, ttl_ms, *, token=None) -> bool``
    One UPDATE: the live lease of ``from_owner`` passes to ``to_owner`` with a
    fresh TTL and token + 1; the key is never free in between, so a competing
    acquire cannot slip in. False (nothing changes) when ``from_owner`` does not
    hold it: the caller then acquires afresh. ``a -> a`` refreshes the TTL and
    keeps the token (like a same-owner re-acquire).

Keys and owners are any non-empty ``str`` (quotes, ``%``, emoji, 10 kB, NUL):
they are stored as UTF-8 ``bytea`` and round-trip exactly; a lone surrogate is
refused. ``ttl_ms`` is an ``int`` in 1 .. 86 400 000 (24 h). Bad input raises
``TypeError``/``ValueError`` before any SQL runs.

Failures: a closed (or never opened) provider raises :class:`ProviderClosed`,
never a false success. A connection that broke (server restarted, backend
terminated) is retried once on a fresh connection for the idempotent calls
(all but transfer, whose repeat would wrongly report False); transfer, or a
retry that fails again, raises :class:`DatabaseUnavailable`, and the next call
uses a fresh connection.

Pipelining: ``pipeline=True`` lets concurrent callers share round trips and
commits (``pgdurable.foundation.lease_pipeline``): the calls queued while a batch is in
flight go together, as one transaction, in the next one. Every guarantee above
holds per call; an answer comes only after its batch committed.

Capability detection is structural (:func:`is_lease_provider`: all five methods
callable). :func:`resolve_lease_provider` unwraps ``get_lease_provider()`` and
falls back to :class:`NoopLeaseProvider`, which always wins (single-process
behaviour). :func:`keep_lease` renews a held lease every ttl/3 from its own
task while the body works and cancels the body with :class:`LeaseLost` when the
lease is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, TypeGuard, TypeVar, runtime_checkable

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from . import lease_core as core
from .db import validate_dsn
from .errors import DatabaseUnavailable, InvalidInput, LeaseLost, ProviderClosed, translate
from .lease_core import MAX_TTL_MS, LeaseGrant
from .lease_pipeline import AsyncLanes, SyncLanes
from .migrations import acheck_pool_schema, check_pool_schema
from .pooler import aconfigure, configure, connect_kwargs, connect_timeout
from .schemas import araw_cursor, raw_cursor

__all__ = [
    "MAX_TTL_MS",
    "AsyncLeaseProvider",
    "AsyncNoopLeaseProvider",
    "AsyncPostgresLeaseProvider",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseProvider",
    "NoopLeaseProvider",
    "PostgresLeaseProvider",
    "is_lease_provider",
    "is_noop_lease_provider",
    "keep_lease",
    "resolve_async_lease_provider",
    "resolve_lease_provider",
]

T = TypeVar("T")

LEASE_METHODS = ("acquire_lease", "get_lease_owner", "release_lease", "renew_lease",
                 "transfer_lease")


# --------------------------------------------------------------------------- protocols


@runtime_checkable
class LeaseProvider(Protocol):
    """The five lease operations, synchronous (see the module docstring)."""

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant: ...
    def get_lease_owner(self, key: str) -> str | None: ...
    def release_lease(self, key: str, owner: str) -> None: ...
    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...
    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int) -> bool: ...


@runtime_checkable
class AsyncLeaseProvider(Protocol):
    """The five lease operations, as coroutines (see the module docstring)."""

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant: ...
    async def get_lease_owner(self, key: str) -> str | None: ...
    async def release_lease(self, key: str, owner: str) -> None: ...
    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool: ...
    async def transfer_lease(
        self, key: str, from_owner: str, to_owner: str, ttl_ms: int
    ) -> bool: ...


def is_lease_provider(obj: object) -> TypeGuard[LeaseProvider | AsyncLeaseProvider]:
    """True when ``obj`` has all five lease methods, each callable (structural, no isinstance)."""
    return obj is not None and all(callable(getattr(obj, m, None)) for m in LEASE_METHODS)


# --------------------------------------------------------------------------- no-op


class NoopLeaseProvider:
    """The fallback when no real provider exists: every caller wins (single process).

    ``acquire_lease`` returns ``acquired=True, owner=<caller>`` (no token, no
    expiry); ``get_lease_owner`` is None; release is a no-op; renew and transfer
    return True. Liveness checks (:func:`keep_lease`) short-circuit on it.
    """

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant:
        """Always wins."""
        return LeaseGrant(True, owner)

    def get_lease_owner(self, key: str) -> str | None:
        """Nobody is tracked: always None."""
        return None

    def release_lease(self, key: str, owner: str, *, token: int | None = None) -> None:
        """No-op."""

    def renew_lease(self, key: str, owner: str, ttl_ms: int, *, token: int | None = None) -> bool:
        """Always True."""
        return True

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int, *,
                       token: int | None = None) -> bool:
        """Always True."""
        return True


class AsyncNoopLeaseProvider:
    """Async twin of :class:`NoopLeaseProvider` (same answers, as coroutines)."""

    _sync = NoopLeaseProvider()

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant:
        """Always wins."""
        return self._sync.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        """Always None."""
        return None

    async def release_lease(self, key: str, owner: str, *, token: int | None = None) -> None:
        """No-op."""

    async def renew_lease(self, key: str, owner: str, ttl_ms: int, *,
                          token: int | None = None) -> bool:
        """Always True."""
        return True

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int, *,
                             token: int | None = None) -> bool:
        """Always True."""
        return True


def is_noop_lease_provider(obj: object) -> bool:
    """True for the no-op providers (liveness checks short-circuit on them)."""
    return isinstance(obj, NoopLeaseProvider | AsyncNoopLeaseProvider)


def _unwrap(obj: object) -> object | None:
    if is_lease_provider(obj):
        return obj
    getter = getattr(obj, "get_lease_provider", None)
    if callable(getter):
        inner = getter()
        if is_lease_provider(inner):
            return inner
    return None


def resolve_lease_provider(obj: object) -> LeaseProvider:
    """``obj`` if it is a lease provider, else what its ``get_lease_provider()`` returns
    if that is one, else a :class:`NoopLeaseProvider` (None included)."""
    found = _unwrap(obj)
    return found if found is not None else NoopLeaseProvider()  # type: ignore[return-value]


def resolve_async_lease_provider(obj: object) -> AsyncLeaseProvider:
    """Like :func:`resolve_lease_provider`, falling back to :class:`AsyncNoopLeaseProvider`."""
    found = _unwrap(obj)
    return found if found is not None else AsyncNoopLeaseProvider()  # type: ignore[return-value]


# --------------------------------------------------------------------------- Postgres


class _LeaseConnection(psycopg.Connection[Any]):
    """Connection of an owned pool: keeps one raw cursor for the lease calls."""

    lease_cursor: psycopg.RawCursor[Any] | None = None


class _AsyncLeaseConnection(psycopg.AsyncConnection[Any]):
    """Async twin of :class:`_LeaseConnection`."""

    lease_cursor: psycopg.AsyncRawCursor[Any] | None = None


def _pool_kwargs(conninfo: str) -> dict[str, Any]:
    # the DSN's (or PGCONNECT_TIMEOUT's) connect timeout wins: pool kwargs override the DSN
    return {**connect_kwargs(), **connect_timeout(conninfo)}


class _Base:
    """State shared by both shells: the pool, ownership, open/closed, prepare flag."""

    _pool: Any
    _owned: bool

    def __init__(self, conninfo_or_pool: object, pool_cls: type[Any], conn_cls: type[Any], *,
                 min_size: int, max_size: int, prepare: bool, timeout: float,
                 pipeline: bool) -> None:
        if not isinstance(pipeline, bool):
            raise TypeError(f"pipeline must be a bool, not {type(pipeline).__name__}")
        if pipeline and not psycopg.Pipeline.is_supported():
            raise InvalidInput("pipeline=True needs libpq >= 14 (psycopg's pipeline mode)")
        if isinstance(conninfo_or_pool, str):
            conninfo = validate_dsn(conninfo_or_pool)
            setup = aconfigure() if pool_cls is AsyncConnectionPool else configure()
            self._pool = pool_cls(conninfo, kwargs=_pool_kwargs(conninfo), min_size=min_size,
                                  max_size=max_size, open=False, timeout=timeout,
                                  connection_class=conn_cls, configure=setup,
                                  name="pgdurable-leases")
            self._owned = True
        elif isinstance(conninfo_or_pool, pool_cls):
            self._pool = conninfo_or_pool
            self._owned = False
        else:
            raise TypeError(
                f"expected a conninfo str or a {pool_cls.__name__}, "
                f"not {type(conninfo_or_pool).__name__}"
            )
        self._prepare = prepare
        self._timeout = timeout
        self._opened = False
        self._closed = False

    def _needs_open(self) -> bool:
        """False when already open (open() is idempotent); ProviderClosed once closed."""
        if self._closed:
            raise ProviderClosed("the lease provider is closed")
        return not self._opened

    def _open_failed(self, exc: BaseException) -> BaseException:
        """Close a provider whose open failed (build a new one); the error open() raises."""
        self._closed = True
        return _opening_error(exc) if isinstance(exc, Exception) else exc

    def _live_pool(self) -> Any:
        if self._closed:
            raise ProviderClosed("the lease provider is closed")
        if not self._opened:
            raise ProviderClosed("the lease provider is not open: call open() or use `with`")
        return self._pool

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed


class AsyncPostgresLeaseProvider(_Base):
    """Leases on PostgreSQL, asyncio flavour.

    Build it from a conninfo (it then owns a pool of ``min_size``..``max_size``
    connections) or from an existing :class:`psycopg_pool.AsyncConnectionPool`
    (used as is, never closed by this provider). Use ``async with`` or call
    :meth:`open` / :meth:`close`. ``prepare=False`` disables server-side prepared
    statements (PgBouncer in transaction mode).

    ``pipeline=True``: concurrent calls share round trips and commits. Calls
    made while a batch is in flight go together in the next one, sent on one
    connection in psycopg's pipeline mode and run as one transaction (at most
    ``pipeline_lanes`` batches in flight, each on its own pooled connection; the
    second lane keeps calls moving while a batch waits on an outside row lock).
    Every answer comes after its batch committed; see
    ``pgdurable.foundation.lease_pipeline`` and ``docs/performance-writes.md``.
    """

    def __init__(self, conninfo_or_pool: str | AsyncConnectionPool[Any], *, min_size: int = 1,
                 max_size: int = 4, prepare: bool = True, timeout: float = 30.0,
                 pipeline: bool = False, pipeline_lanes: int = 2) -> None:
        super().__init__(conninfo_or_pool, AsyncConnectionPool, _AsyncLeaseConnection,
                         min_size=min_size,
                         max_size=max_size, prepare=prepare, timeout=timeout,
                         pipeline=pipeline)
        self._lanes = (AsyncLanes(self._pool, prepare, _check_lanes(pipeline_lanes))
                       if pipeline else None)

    async def open(self) -> None:
        """Open the pool (when owned) and check the schema once.

        Raises :class:`SchemaVersionMismatch` or :class:`DatabaseUnavailable`; a
        provider whose open failed is closed.
        """
        if not self._needs_open():
            return
        try:
            if self._owned:
                await self._pool.open(wait=True, timeout=self._timeout)
            await acheck_pool_schema(self._pool, self._timeout)
        except BaseException as exc:
            err = self._open_failed(exc)
            if self._owned:
                await self._pool.close()
            if err is exc:
                raise
            raise err from exc
        self._opened = True

    async def close(self) -> None:
        """Close the provider (and its pool when owned). Later calls raise ProviderClosed."""
        self._closed = True
        if self._owned:
            await self._pool.close()

    async def __aenter__(self) -> AsyncPostgresLeaseProvider:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, call: core.Call[T]) -> T:
        pool = self._live_pool()
        for attempt in (0, 1):
            try:
                if self._lanes is not None:
                    return call.parse(await self._lanes.execute(call))
                conn = await pool.getconn()
                try:
                    cur = getattr(conn, "lease_cursor", None)
                    if cur is None:
                        cur = araw_cursor(conn)
                        if isinstance(conn, _AsyncLeaseConnection):
                            conn.lease_cursor = cur
                    await cur.execute(call.sql, call.params, prepare=self._prepare, binary=True)
                    row = await cur.fetchone()
                    if not conn.autocommit:
                        await conn.commit()
                finally:
                    await pool.putconn(conn)
                return call.parse(row)
            except Exception as exc:
                err = core.failure(exc, call, attempt, self._closed)
                if core.connection_broke(exc):
                    with contextlib.suppress(Exception):
                        await pool.check()  # drop the pool's other dead connections
                if err is None:
                    continue
                if err is exc:
                    raise
                raise err from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant:
        """Acquire ``key`` for ``owner`` or learn the live holder (see module docstring)."""
        return await self._run(core.acquire(key, owner, ttl_ms))

    async def get_lease_owner(self, key: str) -> str | None:
        """The live holder of ``key``, None when free or expired."""
        return await self._run(core.get_owner(key))

    async def get_lease(self, key: str) -> LeaseGrant | None:
        """The live grant on ``key`` (owner, token, expiry), None when free or expired."""
        return await self._run(core.get_lease(key))

    async def release_lease(self, key: str, owner: str, *, token: int | None = None) -> None:
        """Release ``key`` if ``owner`` (with ``token``, when given) holds it; else no-op."""
        await self._run(core.release(key, owner, token))

    async def renew_lease(self, key: str, owner: str, ttl_ms: int, *,
                          token: int | None = None) -> bool:
        """Extend the live lease to now + ttl; False when lost (never resurrects)."""
        return await self._run(core.renew(key, owner, ttl_ms, token))

    async def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int, *,
                             token: int | None = None) -> bool:
        """Atomically hand the live lease to ``to_owner``; False when ``from_owner`` lost it."""
        return await self._run(core.transfer(key, from_owner, to_owner, ttl_ms, token))


class PostgresLeaseProvider(_Base):
    """Leases on PostgreSQL, synchronous twin of :class:`AsyncPostgresLeaseProvider`.

    Same SQL, validation and parsing (``pgdurable.foundation.lease_core``); thread-safe
    (each call borrows a pool connection). Built from a conninfo (owns its pool)
    or an existing :class:`psycopg_pool.ConnectionPool` (not owned).
    ``pipeline=True``: concurrent threads' calls share round trips and commits
    (the calling threads take turns sending the queued calls; see
    :class:`AsyncPostgresLeaseProvider`).
    """

    def __init__(self, conninfo_or_pool: str | ConnectionPool[Any], *, min_size: int = 1,
                 max_size: int = 4, prepare: bool = True, timeout: float = 30.0,
                 pipeline: bool = False, pipeline_lanes: int = 2) -> None:
        super().__init__(conninfo_or_pool, ConnectionPool, _LeaseConnection, min_size=min_size,
                         max_size=max_size, prepare=prepare, timeout=timeout,
                         pipeline=pipeline)
        self._lock = threading.Lock()
        self._lanes = (SyncLanes(self._pool, prepare, _check_lanes(pipeline_lanes))
                       if pipeline else None)

    def open(self) -> None:
        """Open the pool (when owned) and check the schema once.

        Raises :class:`SchemaVersionMismatch` or :class:`DatabaseUnavailable`; a
        provider whose open failed is closed.
        """
        with self._lock:
            if not self._needs_open():
                return
            try:
                if self._owned:
                    self._pool.open(wait=True, timeout=self._timeout)
                check_pool_schema(self._pool, self._timeout)
            except BaseException as exc:
                err = self._open_failed(exc)
                if self._owned:
                    self._pool.close()
                if err is exc:
                    raise
                raise err from exc
            self._opened = True

    def close(self) -> None:
        """Close the provider (and its pool when owned). Later calls raise ProviderClosed."""
        self._closed = True
        if self._owned:
            self._pool.close()

    def __enter__(self) -> PostgresLeaseProvider:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: core.Call[T]) -> T:
        pool = self._live_pool()
        for attempt in (0, 1):
            try:
                if self._lanes is not None:
                    return call.parse(self._lanes.execute(call))
                conn = pool.getconn()
                try:
                    cur = getattr(conn, "lease_cursor", None)
                    if cur is None:
                        cur = raw_cursor(conn)
                        if isinstance(conn, _LeaseConnection):
                            conn.lease_cursor = cur
                    row = cur.execute(call.sql, call.params, prepare=self._prepare,
                                      binary=True).fetchone()
                    if not conn.autocommit:
                        conn.commit()
                finally:
                    pool.putconn(conn)
                return call.parse(row)
            except Exception as exc:
                err = core.failure(exc, call, attempt, self._closed)
                if core.connection_broke(exc):
                    with contextlib.suppress(Exception):
                        pool.check()  # drop the pool's other dead connections
                if err is None:
                    continue
                if err is exc:
                    raise
                raise err from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant:
        """Acquire ``key`` for ``owner`` or learn the live holder (see module docstring)."""
        return self._run(core.acquire(key, owner, ttl_ms))

    def get_lease_owner(self, key: str) -> str | None:
        """The live holder of ``key``, None when free or expired."""
        return self._run(core.get_owner(key))

    def get_lease(self, key: str) -> LeaseGrant | None:
        """The live grant on ``key`` (owner, token, expiry), None when free or expired."""
        return self._run(core.get_lease(key))

    def release_lease(self, key: str, owner: str, *, token: int | None = None) -> None:
        """Release ``key`` if ``owner`` (with ``token``, when given) holds it; else no-op."""
        self._run(core.release(key, owner, token))

    def renew_lease(self, key: str, owner: str, ttl_ms: int, *,
                    token: int | None = None) -> bool:
        """Extend the live lease to now + ttl; False when lost (never resurrects)."""
        return self._run(core.renew(key, owner, ttl_ms, token))

    def transfer_lease(self, key: str, from_owner: str, to_owner: str, ttl_ms: int, *,
                       token: int | None = None) -> bool:
        """Atomically hand the live lease to ``to_owner``; False when ``from_owner`` lost it."""
        return self._run(core.transfer(key, from_owner, to_owner, ttl_ms, token))


def _check_lanes(lanes: object) -> int:
    """``pipeline_lanes``: an int >= 1 (batches in flight at once)."""
    if isinstance(lanes, bool) or not isinstance(lanes, int):
        raise TypeError(f"pipeline_lanes must be an int, not {type(lanes).__name__}")
    if lanes < 1:
        raise ValueError(f"pipeline_lanes must be at least 1, got {lanes}")
    return lanes


def _opening_error(exc: BaseException) -> BaseException:
    err = translate(exc)
    if err is exc and isinstance(exc, psycopg.Error | PoolTimeout):
        return DatabaseUnavailable(f"cannot open the lease provider: {exc}".splitlines()[0])
    return err


# --------------------------------------------------------------------------- keep_lease

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseUnavailable, psycopg.OperationalError, OSError, TimeoutError,
)
"""Renewal errors :func:`keep_lease` tolerates (twice in a row) before calling the lease lost."""


class LeaseKeeper:
    """Async context manager returned by :func:`keep_lease`.

    While the body runs, a separate task renews the lease every ``ttl/3``
    (retrying after ``ttl/10`` following a transient error). The lease is lost
    when a renewal returns False, when a third consecutive transient error
    occurs (or the last successful renewal is a full TTL old), or on any other
    error. Then ``lost`` is True, ``error`` holds the last exception (if any),
    and with ``cancel_on_loss`` the body is cancelled and the block raises
    :class:`LeaseLost`. The keeper neither acquires nor releases the lease.
    Renewal runs on the event loop: a body that blocks the loop blocks it too.
    """

    max_transient_errors = 2

    def __init__(self, provider: object, key: str, owner: str, ttl_ms: int, *,
                 cancel_on_loss: bool = True, token: int | None = None) -> None:
        core.encode_name(key, "key")
        core.encode_name(owner, "owner")
        core.check_ttl(ttl_ms)
        core.check_token(token)
        if not is_lease_provider(provider):
            raise TypeError(f"{type(provider).__name__} is not a lease provider")
        self.provider = provider
        self.key, self.owner, self.ttl_ms, self.token = key, owner, ttl_ms, token
        self.cancel_on_loss = cancel_on_loss
        self.lost = False
        self.error: BaseException | None = None
        self.renewals = 0
        self._task: asyncio.Task[None] | None = None
        self._body: asyncio.Task[Any] | None = None
        self._cancelled_body = False

    async def __aenter__(self) -> LeaseKeeper:
        if is_noop_lease_provider(self.provider):
            return self
        self._body = asyncio.current_task()
        self._task = asyncio.create_task(self._keep(), name=f"keep_lease {self.key!r}")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        if self._task is not None:
            self._task.cancel()
            try:
                await asyncio.wait([self._task])
            except asyncio.CancelledError:
                if not self._cancelled_body:
                    raise  # cancelled from outside while stopping the renewals
        if not (self.lost and self.cancel_on_loss):
            return False
        if self._cancelled_body and self._body is not None and self._body.uncancel() > 0:
            return False  # cancelled from outside as well: let that cancellation through
        raise LeaseLost(
            f"lease {self.key!r} of {self.owner!r} was lost"
            + (f": {self.error}" if self.error else "")
        ) from self.error

    async def _renew(self) -> bool:
        """One renewal: a coroutine method is awaited, a blocking one runs in a thread."""
        kwargs: dict[str, Any] = {} if self.token is None else {"token": self.token}
        fn: Callable[..., Any] = self.provider.renew_lease
        if inspect.iscoroutinefunction(fn):
            result = fn(self.key, self.owner, self.ttl_ms, **kwargs)
        else:
            result = await asyncio.to_thread(fn, self.key, self.owner, self.ttl_ms, **kwargs)
        if inspect.isawaitable(result):  # a plain function returning an awaitable
            result = await result
        return bool(result)

    async def _keep(self) -> None:
        loop = asyncio.get_running_loop()
        ttl = self.ttl_ms / 1000
        interval, retry = ttl / 3, ttl / 10
        trusted_until = loop.time() + ttl
        failures = 0
        while True:
            await asyncio.sleep(retry if failures else interval)
            started = loop.time()
            try:
                async with asyncio.timeout(interval):
                    ok = await self._renew()
            except TRANSIENT_ERRORS as exc:
                failures += 1
                self.error = exc
                if failures > self.max_transient_errors or loop.time() >= trusted_until:
                    self._lose()
                    return
                continue
            except Exception as exc:
                self.error = exc
                self._lose()
                return
            if not ok:
                self._lose()
                return
            failures = 0
            self.error = None
            self.renewals += 1
            trusted_until = started + ttl

    def _lose(self) -> None:
        self.lost = True
        if self.cancel_on_loss and self._body is not None and not self._body.done():
            self._cancelled_body = True
            self._body.cancel(f"lease {self.key!r} lost")


def keep_lease(provider: object, key: str, owner: str, ttl_ms: int, *,
               cancel_on_loss: bool = True, token: int | None = None) -> LeaseKeeper:
    """Keep a held lease alive while the ``async with`` body runs (see :class:`LeaseKeeper`).

    ``async with keep_lease(p, "thread:1", run_id, 15_000) as k: ...`` renews
    every 5 s; if the lease is lost the body is cancelled and :class:`LeaseLost`
    is raised (or, with ``cancel_on_loss=False``, ``k.lost`` turns True). With
    a no-op provider nothing is renewed. ``provider`` may be sync or async.
    """
    return LeaseKeeper(provider, key, owner, ttl_ms, cancel_on_loss=cancel_on_loss, token=token)

