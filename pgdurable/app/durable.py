"""Durable runs: the async app (:class:`Durable`) and :class:`RunInfo`; the
sync client :class:`DurableClient` lives in :mod:`pgdurable.app.client` (and is
re-exported here).

A run lives in ``pgdurable.runs``; workers (:mod:`pgdurable.engine`) lease it,
run steps and checkpoint after each one. Every state transition is one SQL
function (``sql/0003_runs.sql``; parking and signals in ``0005_signals.sql``,
effects in ``0008_durable_runs.sql``, retry in ``0007_operations.sql``); this module validates arguments in Python
first (bad input changes nothing) and then makes one round trip.

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
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..engine.worker import Worker
from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.db import acheck_connection, resolve_dsn, translated, validate_dsn
from ..foundation.effects import DEFAULT_LEASE as DEFAULT_IDEMPOTENCY_LEASE
from ..foundation.effects import DEFAULT_TTL as DEFAULT_IDEMPOTENCY_TTL
from ..foundation.effects import with_idempotency
from ..foundation.errors import InvalidInput, ProviderClosed
from ..foundation.migrations import acheck_pool_schema
from ..foundation.notifier import Notifier, notifier_for
from ..foundation.pooler import Pooler, aconfigure, aprobe, listen_conninfo, resolve_pooler
from ..foundation.registry import Task, TaskRegistry, start_params
from ..foundation.signals import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_SIGNAL_TTL,
    signal_params,
    signal_run_params,
)
from ..foundation.stream_tokens import Scope, make_token, secrets_of
from ..models.durable_runs import durable_task_spec
from ..models.durable_tasks import DurableTask
from ..models.step_tasks import task_decorator
from ..models.workflows import workflow_decorator
from ..runs import flow
from ..runs.batch_start import Start, start_many
from ..runs.children import TreeNode, run_tree
from ..runs.events import (
    DEFAULT_MAX_EVENT_DATA,
    Handler,
    SentEvent,
    cancel_on_statement,
    declare_trigger,
    declare_triggers,
    declared_triggers,
    make_trigger,
    prune_events,
    send_event,
    trigger_step,
)
from ..runs.fork import ForkedRun, fork, fork_failed, rewind
from ..runs.metadata import start_statement
from ..runs.results import await_result
from ..runs.schedules import Schedule, declare
from ..runs.search import Page, list_runs_query, make_page
from ..runs.stream import StreamEvent, stream_run, stream_thread
from ..runs.threads import (
    SEND_V2,
    SET_DOUBLE_TEXT,
    Delivery,
    DoubleText,
    ThreadRoute,
    check_double_text,
    encode_thread_key,
    parse_delivery,
    routes_of,
    send_params,
)
from .client import DurableClient
from .common import RETRY, conn_kwargs, env_listen_dsn, ids, mark_incompatible_params, one

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["RETRY", "Durable", "DurableClient", "RunInfo", "Task", "TaskRegistry", "start_params"]

RunInfo = q.RunInfo
F = TypeVar("F", bound=Callable[..., Any])




class Durable:
    """The async pgdurable app: task registry, run API and worker factory.

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
    """

    #: Largest signal payload (bytes of JSON) :meth:`signal` accepts; set it on the app.
    max_signal_payload: int = DEFAULT_MAX_PAYLOAD
    #: Largest event data (bytes of JSON) :meth:`send_event` accepts; set it on the app.
    max_event_data: int = DEFAULT_MAX_EVENT_DATA
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
    ) -> None:
        self.pooler: Pooler | None = resolve_pooler(pooler)
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
            self._pool: AsyncConnectionPool[Any] = self._new_pool(dsn, max(2, pool_size))
        else:
            self.conninfo = conninfo
            self._pool = pool

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
        return AsyncConnectionPool(
            dsn, min_size=1, max_size=size, kwargs=conn_kwargs(dsn, self.pooler), open=False,
            configure=aconfigure(self.pooler), name="pgdurable", check=acheck_connection,
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
                    await acheck_pool_schema(self._pool, self.open_timeout)
            except BaseException:
                if self._own_pool and self.conninfo is not None:
                    # a pool that failed to open is closed for good: start afresh
                    failed = self._pool
                    self._pool = self._new_pool(self.conninfo, failed.max_size)
                    await failed.close()
                raise
            self._opened = True

    async def close(self) -> None:
        """Close the owned pool; later calls raise ProviderClosed."""
        self._closed = True
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
        return None if conninfo is None else notifier_for(conninfo)

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        """The connection pool (for workers and extensions)."""
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        return self._pool

    async def _ready(self) -> AsyncConnectionPool[Any]:
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

    async def start(
        self,
        task: str,
        state: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        idempotency_key: str | None = None,
        deadline: Any = None,
        budget: float | None = None,
        revision: str | None = None,
        max_attempts: int | None = None,
        metadata: dict[str, Any] | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
        key: str | None = None,
        at: datetime | None = None,
        delay: timedelta | None = None,
        affinity_of: str | uuid.UUID | None = None,
        cancel_on: Iterable[tuple[str, str, Any]] | None = None,
    ) -> str:
        """Start a run of ``task`` and return its id.

        ``deadline`` is a timedelta (from now, database clock) or an aware
        datetime. The same ``idempotency_key`` returns the existing run's id.
        With ``conn=`` the run is inserted inside the caller's transaction
        (workers are notified on commit only). An unregistered ``task`` needs
        ``revision=`` (else :class:`UnknownTask`). Flow control
        (docs/flow_control.md): ``key`` is the run's concurrency/fairness key;
        ``at`` (aware datetime) or ``delay`` (timedelta) delays its start.
        ``metadata`` (a JSON object) labels the run for search (:meth:`list_runs`,
        see :mod:`pgdurable.runs.metadata`). ``affinity_of`` (a run id) starts the run
        with the affinity that run has now: its next claims prefer (or wait for)
        the worker holding that run's service (docs/affinity.md; an unknown id:
        :class:`RunNotFound`, nothing started). ``cancel_on`` (a list of ``(event name,
        "data.path", value)``): an event of that name whose path equals the value,
        sent after the start, cancels the run (:meth:`cancel`; also while it is parked;
        see docs/events.md), registered in the same statement.
        """
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        params = start_params(
            self._registry, task, state, queue, priority, idempotency_key, deadline, budget,
            revision, max_attempts,
        )
        sql, params = flow.start_sql(params, key, at, delay)
        # metadata, trace context and affinity
        sql, params = start_statement(sql, params, metadata, affinity_of)
        sql, params = cancel_on_statement(sql, params, cancel_on)
        if conn is not None:
            with translated():
                cur = await conn.execute(sql, params)
                row = await cur.fetchone()
        else:
            row = await self.fetchone(sql, params)
        metrics.run_started(task)
        return str(one(row))

    async def start_many(
        self, starts: Iterable[Start | dict[str, Any]], *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[str]:
        """Start many runs with ONE statement; return their ids in input order.

        Each :class:`~pgdurable.Start` (or dict of its fields) takes the
        arguments of :meth:`start`. All or nothing: bad input in any start
        raises before any SQL; at most one NOTIFY per queue; ``conn=`` for the
        caller's transaction. See :mod:`pgdurable.runs.batch_start`.
        """
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        return await start_many(self, self._registry, starts, conn)

    async def list_runs(self, **filters: Any) -> Page:
        """One page of runs, newest first (keyset pagination; see :func:`pgdurable.runs.search.list_runs_query`).

        Filters: ``status`` (one or a list), ``task``, ``queue``, ``metadata``
        (containment), ``since``/``until`` (created_at), ``id_prefix``,
        ``limit`` (1..1000, default 50) and ``cursor`` (``page.next_cursor``).
        """
        sql, params = list_runs_query(**filters)
        limit = int(params[-1]) - 1
        return make_page(await self.fetchall(sql, params, prepare=None), limit)

    async def set_queue(
        self, name: str, *, concurrency: int | None = None, per_key_concurrency: int | None = None,
        rate: flow.Rate | None = None, burst: float | None = None,
    ) -> None:
        """Set the flow limits of queue ``name`` for every worker (all ``None``:
        unlimited again); they apply at the next claim. See docs/flow_control.md."""
        await self.fetchone(
            flow.SET_QUEUE, flow.queue_params(name, concurrency, per_key_concurrency, rate, burst)
        )

    async def set_bucket(self, name: str, *, rate: flow.Rate, burst: float | None = None) -> None:
        """Create or change the shared token bucket ``name`` (for ``ctx.acquire``)."""
        await self.fetchone(flow.SET_BUCKET, flow.bucket_params(name, rate, burst))

    async def get_run(self, run_id: Any) -> RunInfo:
        """The run's current row as :class:`RunInfo` (:class:`RunNotFound` if none)."""
        rid = q.check_run_id(run_id)
        return q.parse_run(await self.fetchone(q.GET_RUN, (rid,)), rid)

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

    async def run_tree(self, run_id: Any) -> list[TreeNode]:
        """The run and its descendants in tree order (see :mod:`pgdurable.runs.children`)."""
        return await run_tree(self, run_id)

    async def cancel(self, run_id: Any) -> str:
        """Cancel a run; return the resulting status.

        ``runnable``/``waiting`` runs become ``cancelled`` at once. A ``leased``
        run gets a cancel request (NOTIFY to its worker, which stops the step
        and records ``cancelled``); ``"leased"`` is returned. The first commit
        wins: if the worker completes first, the final status is ``completed``.
        Terminal runs are left alone and their status is returned.
        """
        return str(one(await self.fetchone(q.CANCEL, (q.check_run_id(run_id),))))

    async def retry(self, run_id: Any) -> str:
        """Make a ``failed`` or ``cancelled`` run live again; return its new status.

        The run resumes from its last checkpoint with attempts and reclaims
        reset and its queue notified: ``"runnable"``. What failed runs again
        (docs/fork.md, "Retry"): a workflow step whose uncaught error failed the
        run is run again (its record is dropped, kept in ``run_rewinds``);
        effects that failed after that checkpoint follow their replay policy
        (``fn`` again, or ``reconcile`` first); the outcome of the last wait is
        kept (a wait that timed out waits again). A run that failed after
        waiting on children retries its failed children and waits for them
        again: ``"waiting"``. Unknown run: :class:`~pgdurable.RunNotFound`; a run
        in any other status, or a child whose parent has ended:
        :class:`~pgdurable.InvalidInput` (nothing changes).
        """
        return str(one(await self.fetchone(RETRY, (q.check_run_id(run_id),))))

    async def fork(self, run_id: Any, from_step: int | None = None, state: Any = None, *,
                   state_mode: Literal["merge", "replace"] = "merge",
                   revision: str | None = None, force: bool = False) -> str:
        """Fork a run from its checkpoint ``from_step`` into a new run; return its id.

        See :mod:`pgdurable.runs.fork`: history and effects of steps 1..from_step are
        copied, ``state`` patches (``state_mode="merge"``, RFC 7396) or replaces
        the state, ``revision`` must be registered by a worker unless ``force``.
        ``from_step=None`` forks from where :meth:`retry` would continue the run
        (before the record of a workflow step whose uncaught error failed it:
        the fork runs that step again).
        """
        return await fork(self, run_id, from_step, state, state_mode=state_mode,
                          revision=revision, force=force)

    async def fork_failed(self, task: str, *, error: str | None, since: datetime,
                          revision: str | None = None, force: bool = False,
                          limit: int = 1000) -> list[ForkedRun]:
        """Bulk fork: every failed run of ``task`` with error type ``error`` since ``since``."""
        return await fork_failed(self, task, error=error, since=since, revision=revision,
                                 force=force, limit=limit)

    async def rewind(self, run_id: Any, to_step: int, state: Any = None, *,
                     state_mode: Literal["merge", "replace"] = "merge",
                     revision: str | None = None, force: bool = False) -> str:
        """Rewind a failed or cancelled run in place to checkpoint ``to_step``; ``"runnable"``."""
        return await rewind(self, run_id, to_step, state, state_mode=state_mode,
                            revision=revision, force=force)

    async def mark_incompatible(self, task: str, revision: str, reason: str | None = None) -> int:
        """End the runs of ``(task, revision)`` that no worker can run; return how many.

        Workers never do this on their own: a run whose revision no worker has
        stays ``runnable``/``waiting`` and visible until a capable worker comes.
        This is the operator's explicit opt-in (e.g. after retiring revision
        "1"): every such run not held under a live lease becomes terminal
        ``incompatible`` with error type ``IncompatibleCheckpoint``.
        """
        params = mark_incompatible_params(task, revision, reason)
        return int(one(await self.fetchone(q.MARK_INCOMPATIBLE, params)))

    async def signal(
        self,
        kind: str,
        ref: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    ) -> list[str]:
        """Send a signal: wake the runs waiting on ``(kind, ref)``; return their ids.

        One transaction stores the signal, makes the waiting runs runnable
        (``ctx.wake`` = ``{"type": "signal", "kind", "ref", "payload", "at",
        "signal"}``) and notifies their queues. If none waits, the signal is
        kept (until ``ttl``; ``None`` = forever) for the next run that parks on
        ``(kind, ref)``. ``signal_id`` deduplicates: the same id with the same
        kind, ref and payload changes nothing and returns the ids the first send
        woke; with other content it raises :class:`~pgdurable.SignalConflict`.
        The payload must be JSON of at most ``max_signal_payload`` bytes
        (default 1 MiB); bad input raises ``TypeError``/``ValueError`` and
        changes nothing.
        """
        params = signal_params(kind, ref, payload, signal_id, ttl, self.max_signal_payload)
        return ids(await self.fetchall(q.SIGNAL, params))

    async def signal_run(
        self,
        run_id: Any,
        kind: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    ) -> list[str]:
        """Send a signal to ONE run; return ``[run_id]`` if it woke, else ``[]``.

        The run wakes if it is parked on a ``Wait`` of this ``kind`` (whatever
        its ref). Otherwise the signal is kept for that run alone (until
        ``ttl``) and handed over when it parks on ``kind``. A finished run
        stores nothing. Unknown run: :class:`~pgdurable.RunNotFound`.
        ``signal_id`` deduplicates as in :meth:`signal`.
        """
        params = signal_run_params(run_id, kind, payload, signal_id, ttl, self.max_signal_payload)
        return ids(await self.fetchall(q.SIGNAL_RUN, params))

    async def send_event(
        self, name: str, data: dict[str, Any] | None = None, *, id: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> SentEvent:
        """Send an event: ``name``, ``data`` (a JSON object), ``id`` for deduplication.

        ONE statement (``pgdurable.send_event``; with ``conn=``, inside the caller's
        transaction: nothing happens unless it commits) stores the event, cancels the
        runs whose ``cancel_on`` it matches, wakes the runs parked on a matching
        ``wait_event`` and adds it to the windows of the triggers on ``name``
        (:meth:`on_event`). The same ``id`` again with the same data does nothing and
        answers the first event's number with ``created=False``; with other data it
        raises :class:`~pgdurable.EventConflict`. Bad input (empty name, data that is
        not a dict or not JSON, over :attr:`max_event_data` bytes): TypeError/
        ValueError, nothing written. See docs/events.md.
        """
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        return await send_event(self, name, data, id, conn=conn, max_bytes=self.max_event_data)

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

    async def with_idempotency(
        self,
        key: str,
        fn: Callable[[], Any],
        *,
        ttl: timedelta | float = DEFAULT_IDEMPOTENCY_TTL,
        lease: timedelta | float = DEFAULT_IDEMPOTENCY_LEASE,
        wait_timeout: timedelta | float | None = None,
        reconcile: Callable[[], Any] | None = None,
    ) -> Any:
        """Run ``fn`` at most once per ``key`` across processes, on this app's pool.

        :func:`pgdurable.with_idempotency` (same contract): concurrent callers
        of ``key`` get the one stored JSON result (or :class:`EffectFailed`)
        until ``ttl`` passes; ``reconcile`` resolves a key whose outcome is
        unknown. For side effects outside runs; inside a step use
        ``ctx.effect``.
        """
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        return await with_idempotency(
            await self._ready(), key, fn, ttl=ttl, lease=lease, wait_timeout=wait_timeout,
            reconcile=reconcile,
        )

    # -- threads and the output stream (pgdurable.threads, pgdurable.stream) --

    def thread_task(
        self,
        prefix: str,
        task: str,
        *,
        queue: str = "default",
        priority: int = 0,
        idle_ttl: timedelta | None = None,
        revision: str | None = None,
        double_text: DoubleText | None = None,
    ) -> ThreadRoute:
        """Run threads whose key starts with ``prefix`` with ``task`` (``""``: every thread).

        The longest matching prefix wins. ``idle_ttl`` is the thread lease's
        TTL while its owner run is parked (default 1 hour, renewed by sends).
        ``revision`` is needed only for a task this app does not register.
        ``double_text``: what a message sent while its thread is answering does
        by default (``"enqueue"`` when None; see :meth:`send`).
        """
        return routes_of(self._registry).add(prefix, task, queue, priority, idle_ttl, revision,
                                             double_text)

    async def send(
        self,
        thread_key: str,
        message: Any,
        *,
        message_id: str | None = None,
        sender: str | None = None,
        state: Any = None,
        double_text: DoubleText | None = None,
    ) -> Delivery:
        """Send ``message`` to a thread: start its owner run or deliver to the owner.

        Durable before it returns. See :mod:`pgdurable.runs.threads` for the
        contract; ``state`` is the initial state of a newly started run when
        the thread has no previous run. ``double_text`` says what happens when
        the thread's owner run is still answering: ``"reject"``
        (:class:`~pgdurable.ThreadBusy`, nothing stored), ``"enqueue"`` (it is
        answered next), ``"interrupt"`` (the answering step stops at its next
        safe point and runs again with both messages) or ``"rollback"`` (the
        unfinished answer and the older unanswered messages are discarded; the
        step runs again with this one); None: the thread's
        (:meth:`set_double_text`), else its route's, else ``"enqueue"``.
        """
        if self._closed:
            raise ProviderClosed("this Durable app is closed")
        params, mid = send_params(self._registry, thread_key, message, message_id, sender, state,
                                  double_text)
        return parse_delivery(await self.fetchone(SEND_V2, params), mid)

    async def set_double_text(self, thread_key: str, strategy: DoubleText | None) -> None:
        """Set a thread's double-texting strategy (None: its route's default); see :meth:`send`."""
        check_double_text(strategy, "strategy")
        await self.fetchone(SET_DOUBLE_TEXT, (encode_thread_key(thread_key), strategy))

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
        """A :class:`~pgdurable.engine.worker.Worker` for this app (see its options)."""
        return Worker(self, queues=queues, concurrency=concurrency, lease_ttl=lease_ttl, **options)

