"""Durable runs: the async app (:class:`Durable`) and :class:`RunInfo`; the
sync client :class:`DurableClient` lives in :mod:`pgdurable.app.client` (and is
re-exported here).

A run lives in ``pgdurable.runs``; workers (:mod:`pgdurable.engine`) lease it,
run steps and checkpoint after each one. Every state transition is one SQL
function (``sql/0003_runs.sql``; parking and signals in ``0005_signals.sql``,
effects in ``0008_durable_runs.sql``, retry in ``0007_operations.sql``); the run
API (:mod:`pgdurable.app.run_api`, shared with the sync client through its generated
twin) validates arguments in Python first (bad input changes nothing) and then
makes one round trip.

Connections: the app owns an ``AsyncConnectionPool`` of autocommit
connections with library settings (:mod:`pgdurable.foundation.pooler`: they go through
PgBouncer; ``pooler="transaction"`` for its transaction mode). A pool passed
in with ``pool=`` must hand out autocommit connections (the app does not open
or close it).

This is the app layer (``docs/architecture.md``): the app and the client
compose the engine, the programming models and the capabilities below; none
of those imports this module (they take :mod:`pgdurable.foundation.ports`). ``Task``,
``TaskRegistry`` and ``start_params`` live in :mod:`pgdurable.foundation.registry` and
are re-exported here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg_pool import AsyncConnectionPool

from ..engine.services import Service
from ..engine.worker import Worker
from ..foundation import run_queries as q
from ..foundation.cells import CellRoute, astart_following, astop_following, route_for
from ..foundation.db import acheck_connection, resolve_dsn, translated, validate_dsn
from ..foundation.errors import InvalidInput, ProviderClosed
from ..foundation.migrations import acheck_pool_schema
from ..foundation.notifier import Notifier, notifier_for
from ..foundation.pooler import Pooler, aconfigure, aprobe, listen_conninfo, resolve_pooler
from ..foundation.registry import Task, TaskRegistry, start_params
from ..foundation.schemas import resolve_schema, schema_of
from ..foundation.stream_tokens import Scope, make_token, secrets_of
from ..models.durable_runs import durable_task_spec
from ..models.durable_tasks import DurableTask
from ..models.step_tasks import task_decorator
from ..models.workflows import workflow_decorator
from ..runs.events import (
    EventTriggers,
    Handler,
    declare_trigger,
    declare_triggers,
    declared_triggers,
    make_trigger,
    prune_events,
    trigger_step,
)
from ..runs.fork import ServedRevisions
from ..runs.results import await_result
from ..runs.schedules import Schedule, Ticker, declare
from ..runs.stream import StreamEvent, stream_run, stream_thread
from .client import DurableClient
from .common import RETRY, conn_kwargs, env_listen_dsn
from .run_api import AsyncRunAPI

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["RETRY", "Durable", "DurableClient", "RunInfo", "Task", "TaskRegistry", "start_params"]

RunInfo = q.RunInfo
F = TypeVar("F", bound=Callable[..., Any])




class Durable(AsyncRunAPI):
    """The async pgdurable app: task registry, run API and worker factory.

    The run API (:meth:`start`, :meth:`get_run`, :meth:`cancel`, :meth:`signal`,
    :meth:`send`, ...) is :class:`~pgdurable.app.run_api.AsyncRunAPI`, written once
    for the app and for :class:`DurableClient` (its sync twin is generated).

    ``Durable(conninfo)`` owns an ``AsyncConnectionPool`` (opened by
    ``await app.open()`` or ``async with app:``, and lazily by the first
    call); ``Durable(pool=...)`` uses yours. After :meth:`close` every call
    raises :class:`ProviderClosed`.

    ``pooler`` (else ``PGDURABLE_POOLER``) says what ``conninfo`` goes
    through: ``None`` (direct) or ``"session"``, or ``"transaction"`` for a
    transaction-mode pooler such as PgBouncer's ``pool_mode = transaction``
    (no prepared statements, no session settings, no LISTEN through it).
    ``listen_dsn`` (else ``PGDURABLE_LISTEN_DSN``) is a direct connection
    for LISTEN (the process's one, :meth:`notifier`: workers' wake-ups,
    streams, results); without one behind a transaction pooler, they poll.
    See :mod:`pgdurable.foundation.pooler`.

    ``schema`` (else ``PGDURABLE_SCHEMA``, else ``"pgdurable"``) is the schema the
    app's runs live in, migrated by ``pgdurable --schema NAME migrate``: apps or
    tenants sharing a database each have their own, and never see each other's
    runs (:mod:`pgdurable.foundation.schemas`). With ``pool=``, configure its
    connections with :func:`pgdurable.use_schema` for any schema but ``pgdurable``.
    """

    _what = "Durable app"
    #: Seconds :meth:`open` waits for the database before it raises (and retries next time).
    open_timeout: float = 30.0
    #: The secrets of :meth:`stream_token` (the first signs, all verify: rotation);
    #: ``None``: ``PGDURABLE_STREAM_SECRETS`` (whitespace-separated).
    stream_secrets: list[str] | None = None

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        pool: AsyncConnectionPool[Any] | None = None,
        pool_size: int = 10,
        pooler: Pooler | None = None,
        listen_dsn: str | None = None,
        schema: str | None = None,
    ) -> None:
        self.pooler: Pooler | None = resolve_pooler(pooler)
        self.schema: str = resolve_schema(schema)
        self.listen_dsn: str | None = env_listen_dsn(listen_dsn)
        self._registry = TaskRegistry()
        self._own_pool = pool is None
        self._closed = False
        self._opened = False
        self._open_lock = asyncio.Lock()
        if pool is None:
            dsn = resolve_dsn(conninfo)
            if dsn is None:
                raise InvalidInput("no DSN: pass conninfo or set PGDURABLE_DSN / DATABASE_URL")
            self.conninfo: str | None = validate_dsn(dsn)
            #: where the pool connects: the DSN, or the node a cell moved to
            self._route: CellRoute | None = route_for(dsn, self.schema)
            self._pool: AsyncConnectionPool[Any] = self._new_pool(dsn, max(2, pool_size))
        else:
            self.conninfo = conninfo
            self._route = None  # a pool of the caller's goes where it goes
            self._pool = pool
        self._following: asyncio.Task[None] | None = None

    @property
    def tasks(self) -> dict[str, Task]:
        """Registered tasks by name."""
        return self._registry.tasks

    def task(
        self,
        name: str,
        *,
        revision: str = "1",
        max_attempts: int = 3,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
        max_reclaims: int = 5,
        step_timeout: timedelta | float | None = None,
        heartbeat_timeout: timedelta | float | None = None,
    ) -> Callable[[F], F]:
        """Register a step function ``(ctx, state) -> Continue | Done | Wait | Sleep``.

        ``max_attempts`` bounds failed steps; ``max_reclaims`` bounds crashes
        (expired leases in a row without a checkpoint, see :class:`Task`).
        ``step_timeout`` / ``heartbeat_timeout`` (> 0) bound each step's time
        and the time between its ``ctx.heartbeat()`` calls (see
        :mod:`pgdurable.runs.liveness`).
        """
        return task_decorator(
            self._registry, name, revision, max_attempts, retry_base, retry_cap, max_reclaims,
            step_timeout, heartbeat_timeout,
        )

    def workflow(
        self,
        name: str,
        *,
        revision: str = "1",
        max_attempts: int = 3,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
        max_reclaims: int = 5,
    ) -> Callable[[F], F]:
        """Register a workflow ``async def fn(ctx: WorkflowContext, input)``.

        Straight-line code with recorded steps and inline waits, run by the
        same workers as tasks (see :mod:`pgdurable.models.workflows`). Start it like a
        task: ``await app.start(name, input)``. ``max_attempts`` bounds failed
        attempts of the whole run (each step has its own ``StepPolicy``).
        """
        return workflow_decorator(
            self._registry, name, revision, max_attempts, retry_base, retry_cap, max_reclaims
        )

    def register(
        self,
        task: DurableTask[Any, Any],
        *,
        context: Any = None,
        retry_base: float = 1.0,
        retry_cap: float = 300.0,
    ) -> DurableTask[Any, Any]:
        """Register a durable task definition (:func:`~pgdurable.define_durable_task`).

        Its runs are started with ``await app.start(task.id, state=...)`` and
        run by leased workers with the semantics of ``task.run`` (see
        :mod:`pgdurable.models.durable_runs`); steps get a
        :class:`~pgdurable.models.durable_runs.DurableRunContext` whose ``app`` is
        ``context``. Returns ``task``.
        """
        self._registry.register(durable_task_spec(
            self, task, context=context, retry_base=retry_base, retry_cap=retry_cap
        ))
        return task

    def _new_pool(self, dsn: str, size: int) -> AsyncConnectionPool[Any]:
        # check=: a connection the server closed while it sat idle (restart,
        # failover, pooler) is replaced, not handed out to fail a statement
        # conninfo: the route's, read for each new connection (a cell that moved)
        conninfo = self._route.conninfo if self._route is not None else dsn
        return AsyncConnectionPool(
            conninfo, min_size=1, max_size=size, kwargs=conn_kwargs(dsn, self.pooler), open=False,
            configure=aconfigure(self.pooler, self.schema), name="pgdurable", check=acheck_connection,
        )
    def schedule(self, name: str, *, task: str, cron: str | None = None,
                 every: timedelta | None = None, timezone: str = "UTC", state: Any = None,
                 queue: str = "default", overlap: str = "skip", catchup: str = "latest",
                 catchup_limit: int = 100) -> Schedule:
        """Declare a schedule: each tick of ``cron`` (read in ``timezone``) or of
        ``every`` starts one run of the registered ``task`` with ``state``.

        Written to ``pgdurable.schedules`` when a worker of this app starts
        (idempotent). ``overlap``: ``skip`` | ``allow`` | ``cancel_previous``;
        ``catchup``: ``none`` | ``latest`` | ``all`` (at most ``catchup_limit``).
        Bad input (invalid cron, unknown time zone or task, both or neither of
        ``cron``/``every``): ValueError. See :mod:`pgdurable.runs.schedules`.
        """
        return declare(self, name, task=task, cron=cron, every=every, timezone=timezone,
                       state=state, queue=queue, overlap=overlap, catchup=catchup,
                       catchup_limit=catchup_limit)

    async def open(self) -> None:
        """Open the pool (if owned) and check the schema version once.

        Waits up to :attr:`open_timeout` seconds (default 30) for a first
        connection; on failure raises :class:`DatabaseUnavailable` and the
        next call tries again with a fresh pool.
        """
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        async with self._open_lock:
            if self._opened:
                return
            try:
                with translated():
                    if self._own_pool:
                        # one connection first: a refusal (a startup parameter the
                        # pooler refuses, bad credentials) is raised now with its
                        # cause, not as a pool timeout later
                        assert self.conninfo is not None  # set with an owned pool
                        await aprobe(self.conninfo, self.pooler)
                        await self._pool.open(wait=True, timeout=self.open_timeout)
                    else:
                        await self._check_pool_schema_name()
                    await acheck_pool_schema(self._pool, self.open_timeout)
                    await self._follow_cell()
            except BaseException:
                if self._own_pool and self.conninfo is not None:
                    # a pool that failed to open is closed for good: start afresh
                    failed = self._pool
                    self._pool = self._new_pool(self.conninfo, failed.max_size)
                    await failed.close()
                raise
            self._opened = True

    async def _follow_cell(self) -> None:
        """In a Citus cell, follow the schema when it moves to another node
        (:mod:`pgdurable.foundation.cells`): a task for as long as the app is open."""
        if self._route is not None and self._following is None:
            self._following = await astart_following(
                self._route, self._pool, self._reconnect_notifier, self.open_timeout)

    def _reconnect_notifier(self) -> None:
        notifier = self.notifier()
        if notifier is not None:
            notifier.reconnect()

    async def _check_pool_schema_name(self) -> None:
        """A pool of the caller's must speak to this app's schema (nothing else would
        tell a connection to ``pgdurable`` from one to another tenant's schema)."""
        async with self._pool.connection(timeout=self.open_timeout) as conn:
            if schema_of(conn) != self.schema:
                raise InvalidInput(
                    f"the pool's connections speak to schema {schema_of(conn)!r}, this app's "
                    f"is {self.schema!r}: configure them with "
                    f"pgdurable.use_schema(conn, {self.schema!r})")

    async def close(self) -> None:
        """Close the owned pool; later calls raise ProviderClosed."""
        self._closed = True
        await astop_following(self._following)
        self._following = None
        if self._own_pool:
            await self._pool.close()

    async def __aenter__(self) -> Durable:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def listen_conninfo(self) -> str | None:
        """Where workers and streams LISTEN: ``listen_dsn``, else the app's DSN unless
        it goes through a transaction pooler (None: they poll)."""
        info = self._pool.conninfo
        return listen_conninfo(info if isinstance(info, str) and info else self.conninfo,
                               self.pooler, self.listen_dsn)

    def notifier(self) -> Notifier | None:
        """The app's notifier: the process's one LISTEN connection to
        :meth:`listen_conninfo` in the running event loop, shared by its workers,
        streams and result waiters (and a dashboard on the same DSN); None
        where nothing can LISTEN (they poll). See :mod:`pgdurable.foundation.notifier`."""
        conninfo = self.listen_conninfo()
        return None if conninfo is None else notifier_for(conninfo, self.schema)

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The connection pool (for workers and extensions)."""
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        return self._pool

    async def _ready(self) -> AsyncConnectionPool[Any]:
        """The pool, opened (and the schema checked) on first use."""
        pool = self.pool
        if not self._opened:
            await self.open()
        return pool

    async def fetchone(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> tuple[Any, ...] | None:
        """Run one statement on a pooled connection; one row or None (errors translated)."""
        pool = await self._ready()
        with translated():
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params, prepare=prepare)
                row: tuple[Any, ...] | None = await cur.fetchone()
                return row

    async def fetchall(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> list[tuple[Any, ...]]:
        """Run one statement on a pooled connection; all rows (errors translated)."""
        pool = await self._ready()
        with translated():
            async with pool.connection() as conn:
                cur = await conn.execute(sql, params, prepare=prepare)
                rows: list[tuple[Any, ...]] = await cur.fetchall()
                return rows

    async def result(self, run_id: Any, timeout: timedelta | float | None = None) -> Any:  # noqa: ASYNC109
        """Wait for the run to end and return its result (from any process).

        A run already finished returns at once. ``failed``/``incompatible``
        raises :class:`~pgdurable.RunFailed` (``.error`` is the recorded error),
        ``cancelled`` raises :class:`~pgdurable.RunCancelled`, no end within
        ``timeout`` seconds raises :class:`~pgdurable.ResultTimeout`. Waits with
        LISTEN, not polling (see :mod:`pgdurable.runs.results`).
        """
        await self._ready()
        return await await_result(self, run_id, timeout)

    # -- threads and the output stream (pgdurable.threads, pgdurable.stream) --

    def on_event(
        self,
        event: str,
        *,
        key: str | None = None,
        debounce: timedelta | None = None,
        max_wait: timedelta | None = None,
        leading: bool = False,
        batch: int | None = None,
        batch_timeout: timedelta | None = None,
        name: str | None = None,
        queue: str = "default",
        revision: str = "1",
        max_attempts: int = 3,
    ) -> Callable[[Handler], Handler]:
        """Register ``handler(ctx, events)`` (async, or sync: run in a thread) to run on
        events named ``event``: a task named ``name`` (default: the function's name).

        Without ``debounce`` or ``batch``: one run per event. ``debounce``: one run per
        burst of events with the same ``key`` (a path, e.g. ``"data.thread_id"``;
        None: one key), started ``debounce`` after the burst's last event, or
        ``max_wait`` after its first (a steady stream still runs); ``leading=True``
        also runs the first event of a quiet period at once, alone. ``batch``: at most
        ``batch`` events per run, started when full or ``batch_timeout`` after the
        first. The handler gets every event of its window, oldest first
        (:class:`~pgdurable.Event`); its return value is the run's result. Exactly
        one run per window (the database decides). The trigger is written when a
        worker of this app starts (or by :meth:`declare_triggers`); events sent
        before that start nothing. Bad options: TypeError/ValueError here.
        """

        def decorate(fn: Handler) -> Handler:
            task_name = name if name is not None else getattr(fn, "__name__", "")
            trigger = make_trigger(task_name, event, task_name, revision, queue, max_attempts,
                                   key, debounce, max_wait, leading, batch, batch_timeout)
            known = declared_triggers(self).get(task_name)
            if known is not None and known != trigger:  # before registering anything
                raise ValueError(f"event trigger {task_name!r} is already declared differently")
            task_decorator(self._registry, task_name, revision, max_attempts, 1.0, 300.0)(
                trigger_step(fn))
            declare_trigger(self, trigger)
            return fn

        return decorate

    async def prune_events(self, older_than: timedelta, *, batch: int = 1000) -> int:
        """Retention for events: delete those older than ``older_than`` (database
        clock) that no unfinished run still needs, with the emptied windows of
        finished runs, ``batch`` rows a transaction; how many rows. A deleted
        event's id no longer deduplicates (``pgdurable.prune_events`` in SQL)."""
        return await prune_events(self, older_than, batch)

    async def declare_triggers(self) -> list[str]:
        """Write this app's triggers (:meth:`on_event`) now, as a starting worker does;
        what each write answered (``"created"``, ``"updated"``, ``"unchanged"``)."""
        return await declare_triggers(self)

    def stream_token(self, *, run_id: Any = None, thread: str | None = None,
                     scope: Scope = "read", ttl: timedelta | float = timedelta(minutes=10)) -> str:
        """A signed token for ONE run or thread, ``"read"`` or ``"write"``, for ``ttl``.

        Safe to hand to a browser: the HTTP endpoints
        (:func:`pgdurable.http.create_app`) check it without a database role
        of its own. Signed with the first of :attr:`stream_secrets` (else
        ``PGDURABLE_STREAM_SECRETS``); see :mod:`pgdurable.foundation.stream_tokens`.
        """
        rid = None if run_id is None else str(q.check_run_id(run_id))
        return make_token(secrets_of(self.stream_secrets), run_id=rid, thread=thread,
                          scope=scope, ttl=ttl)

    def stream(self, run_id: Any, after: int = 0, *, poll: float = 1.0) -> AsyncIterator[StreamEvent]:
        """Async iterator over a run's output events after ``after``, live, until its end."""
        return stream_run(self, run_id, after, poll=poll)

    def stream_thread(
        self, thread_key: str, after: Any = None, *, follow: bool = True, poll: float = 1.0
    ) -> AsyncIterator[StreamEvent]:
        """Async iterator over a thread's output events (all its runs) after ``after``."""
        return stream_thread(self, thread_key, after, follow=follow, poll=poll)

    def worker(
        self,
        *,
        queues: list[str] | tuple[str, ...] = ("default",),
        concurrency: int = 16,
        lease_ttl: timedelta = timedelta(seconds=60),
        **options: Any,
    ) -> Worker:
        """A :class:`~pgdurable.engine.worker.Worker` for this app (see its options).

        The engine gets what it needs of the app, not the app: its statements go to
        :meth:`fetchone`/:meth:`fetchall` (the pool, errors translated), its tasks come
        from the registry, and the periodic duties are plugged in as services: the
        schedule ticker of its queues, the writing of the app's event triggers and the
        registration of the task revisions it serves (:mod:`pgdurable.engine.services`)."""
        services: list[Service] = [Ticker(self, queues), EventTriggers(self),
                                   ServedRevisions(self, self.tasks)]
        return Worker(self, self._registry, open=self.open, listen_conninfo=self.listen_conninfo,
                      open_timeout=self.open_timeout, step_app=self, services=services,
                      pooler=self.pooler, schema=self.schema,
                      queues=queues, concurrency=concurrency, lease_ttl=lease_ttl, **options)

