"""The sync client (:class:`DurableClient`): the run API for code that is not async.

The sync twin of :class:`~pgdurable.app.durable.Durable` (a script, a Django view, a
Celery task): the same SQL, validation and parsing, on a
``psycopg_pool.ConnectionPool`` of autocommit connections. Pass ``app=`` to
use an app's task registry and its ``pooler``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import psycopg
from psycopg_pool import ConnectionPool

from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.db import check_connection, resolve_dsn, translated, validate_dsn
from ..foundation.effects import DEFAULT_LEASE as DEFAULT_IDEMPOTENCY_LEASE
from ..foundation.effects import DEFAULT_TTL as DEFAULT_IDEMPOTENCY_TTL
from ..foundation.effects import with_idempotency_sync
from ..foundation.errors import InvalidInput, ProviderClosed, RunNotFound
from ..foundation.migrations import check_pool_schema
from ..foundation.pooler import Pooler, configure, listen_conninfo, probe, resolve_pooler
from ..foundation.ports import AppSettings
from ..foundation.registry import TaskRegistry, start_params
from ..foundation.signals import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_SIGNAL_TTL,
    signal_params,
    signal_run_params,
)
from ..runs import flow
from ..runs.batch_start import Start, start_many_sync
from ..runs.children import RUN_TREE, TreeNode, parse_tree
from ..runs.events import (
    DEFAULT_MAX_EVENT_DATA,
    SentEvent,
    cancel_on_statement,
    send_event_sync,
)
from ..runs.fork import ForkedRun, fork_failed_sync, fork_sync, rewind_sync
from ..runs.metadata import start_statement
from ..runs.results import result_sync
from ..runs.search import Page, list_runs_query, make_page
from ..runs.threads import SEND_V2, Delivery, ThreadRoute, parse_delivery, routes_of, send_params
from .common import RETRY, conn_kwargs, env_listen_dsn, ids, mark_incompatible_params, one

if TYPE_CHECKING:
    from ..foundation.run_queries import RunInfo

__all__ = ["DurableClient"]

class DurableClient:
    """Sync twin of the run API: start, get_run, result, cancel, retry, mark_incompatible, signal, send.

    Shares SQL, validation and parsing with :class:`Durable`. Pass ``app=`` to
    use its task registry (revisions, max_attempts) and its ``pooler``;
    otherwise ``start`` needs ``revision=``. ``pooler`` as for :class:`Durable`.
    """

    #: Largest signal payload (bytes of JSON) :meth:`signal` accepts.
    max_signal_payload: int = DEFAULT_MAX_PAYLOAD
    #: Largest event data (bytes of JSON) :meth:`send_event` accepts.
    max_event_data: int = DEFAULT_MAX_EVENT_DATA
    #: Seconds :meth:`open` waits for the database before it raises (and retries next time).
    open_timeout: float = 30.0

    def __init__(
        self, conninfo: str | None = None, *, app: AppSettings | None = None, pool_size: int = 4,
        pooler: Pooler | None = None,
    ) -> None:
        dsn = resolve_dsn(conninfo or (app.conninfo if app is not None else None))
        if dsn is None:
            raise InvalidInput("no DSN: pass conninfo or set PGDURABLE_DSN / DATABASE_URL")
        self.conninfo: str = validate_dsn(dsn)
        self._dsn = dsn
        self.pooler: Pooler | None = resolve_pooler(
            pooler if pooler is not None or app is None else app.pooler)
        self._registry = app._registry if app is not None else TaskRegistry()
        # where result() LISTENs: as a worker would (listen_dsn; none behind a transaction pooler)
        self._listen_to = listen_conninfo(
            dsn, self.pooler, app.listen_dsn if app is not None else env_listen_dsn(None))
        self._pool: ConnectionPool[Any] = self._new_pool(dsn, max(1, pool_size))
        self._opened = False
        self._closed = False

    def open(self) -> None:
        """Open the pool and check the schema (done lazily by the first call).

        Waits up to :attr:`open_timeout` seconds for a first connection; on
        failure raises :class:`DatabaseUnavailable` and the next call tries
        again with a fresh pool.
        """
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
        if self._opened:
            return
        try:
            with translated():
                probe(self.conninfo, self.pooler)  # a refusal, at once
                self._pool.open(wait=True, timeout=self.open_timeout)
                check_pool_schema(self._pool, self.open_timeout)
        except BaseException:
            # a pool that failed to open is closed for good: start afresh
            failed = self._pool
            self._pool = self._new_pool(self._dsn, failed.max_size)
            failed.close()
            raise
        self._opened = True

    def _new_pool(self, dsn: str, size: int) -> ConnectionPool[Any]:
        # check=: see Durable._new_pool
        return ConnectionPool(
            dsn, min_size=1, max_size=size, kwargs=conn_kwargs(dsn, self.pooler), open=False,
            configure=configure(self.pooler), name="pgdurable-client", check=check_connection,
        )

    def close(self) -> None:
        """Close the pool; later calls raise ProviderClosed."""
        self._closed = True
        self._pool.close()

    def with_idempotency(
        self,
        key: str,
        fn: Callable[[], Any],
        *,
        ttl: timedelta | float = DEFAULT_IDEMPOTENCY_TTL,
        lease: timedelta | float = DEFAULT_IDEMPOTENCY_LEASE,
        wait_timeout: timedelta | float | None = None,
        reconcile: Callable[[], Any] | None = None,
    ) -> Any:
        """Sync twin of :meth:`Durable.with_idempotency` (``fn`` and ``reconcile``
        are sync) on this client's pool."""
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
        self.open()
        return with_idempotency_sync(
            self._pool, key, fn, ttl=ttl, lease=lease, wait_timeout=wait_timeout,
            reconcile=reconcile,
        )

    def __enter__(self) -> DurableClient:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetchall(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
        self.open()
        with translated(), self._pool.connection() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(sql, params, prepare=True).fetchall()
            return rows

    def _fetchone(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        rows = self._fetchall(sql, params)
        return rows[0] if rows else None

    def start(
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
        conn: psycopg.Connection[Any] | None = None,
        key: str | None = None,
        at: datetime | None = None,
        delay: timedelta | None = None,
        affinity_of: str | uuid.UUID | None = None,
        cancel_on: Iterable[tuple[str, str, Any]] | None = None,
    ) -> str:
        """Start a run (see :meth:`Durable.start`); ``conn=`` for a transactional start."""
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
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
                row = conn.execute(sql, params).fetchone()
        else:
            row = self._fetchone(sql, params)
        metrics.run_started(task)
        return str(one(row))

    def start_many(
        self, starts: Iterable[Start | dict[str, Any]], *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[str]:
        """Sync twin of :meth:`Durable.start_many`; ``conn=`` for a transactional start."""
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
        return start_many_sync(self, self._registry, starts, conn)

    def list_runs(self, **filters: Any) -> Page:
        """Sync twin of :meth:`Durable.list_runs`."""
        sql, params = list_runs_query(**filters)
        limit = int(params[-1]) - 1
        return make_page(self._fetchall(sql, params), limit)

    def set_queue(
        self, name: str, *, concurrency: int | None = None, per_key_concurrency: int | None = None,
        rate: flow.Rate | None = None, burst: float | None = None,
    ) -> None:
        """Set a queue's flow limits (see :meth:`Durable.set_queue`)."""
        self._fetchone(
            flow.SET_QUEUE, flow.queue_params(name, concurrency, per_key_concurrency, rate, burst)
        )

    def set_bucket(self, name: str, *, rate: flow.Rate, burst: float | None = None) -> None:
        """Create or change a shared token bucket (see :meth:`Durable.set_bucket`)."""
        self._fetchone(flow.SET_BUCKET, flow.bucket_params(name, rate, burst))

    def get_run(self, run_id: Any) -> RunInfo:
        """The run as :class:`RunInfo` (:class:`RunNotFound` if none)."""
        rid = q.check_run_id(run_id)
        return q.parse_run(self._fetchone(q.GET_RUN, (rid,)), rid)

    def result(self, run_id: Any, timeout: timedelta | float | None = None) -> Any:
        """Sync twin of :meth:`Durable.result` (a connection of its own while it waits)."""
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
        return result_sync(self._dsn, run_id, timeout, pooler=self.pooler,
                           listen_to=self._listen_to)

    def run_tree(self, run_id: Any) -> list[TreeNode]:
        """Sync twin of :meth:`Durable.run_tree`."""
        rid = q.check_run_id(run_id)
        rows = self._fetchall(RUN_TREE, (rid,))
        if not rows:
            raise RunNotFound(f"no run {rid}")
        return parse_tree(rows)

    def cancel(self, run_id: Any) -> str:
        """Cancel a run; returns the resulting status (see :meth:`Durable.cancel`)."""
        return str(one(self._fetchone(q.CANCEL, (q.check_run_id(run_id),))))

    def retry(self, run_id: Any) -> str:
        """Retry a failed or cancelled run (see :meth:`Durable.retry`); its new status."""
        return str(one(self._fetchone(RETRY, (q.check_run_id(run_id),))))

    def fork(self, run_id: Any, from_step: int | None = None, state: Any = None, *,
             state_mode: Literal["merge", "replace"] = "merge",
             revision: str | None = None, force: bool = False) -> str:
        """Sync twin of :meth:`Durable.fork`."""
        return fork_sync(self, run_id, from_step, state, state_mode=state_mode,
                         revision=revision, force=force)

    def fork_failed(self, task: str, *, error: str | None, since: datetime,
                    revision: str | None = None, force: bool = False,
                    limit: int = 1000) -> list[ForkedRun]:
        """Sync twin of :meth:`Durable.fork_failed`."""
        return fork_failed_sync(self, task, error=error, since=since, revision=revision,
                                force=force, limit=limit)

    def rewind(self, run_id: Any, to_step: int, state: Any = None, *,
               state_mode: Literal["merge", "replace"] = "merge",
               revision: str | None = None, force: bool = False) -> str:
        """Sync twin of :meth:`Durable.rewind`."""
        return rewind_sync(self, run_id, to_step, state, state_mode=state_mode,
                           revision=revision, force=force)

    def mark_incompatible(self, task: str, revision: str, reason: str | None = None) -> int:
        """Sync twin of :meth:`Durable.mark_incompatible`; how many runs were ended."""
        params = mark_incompatible_params(task, revision, reason)
        return int(one(self._fetchone(q.MARK_INCOMPATIBLE, params)))

    def signal(
        self,
        kind: str,
        ref: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    ) -> list[str]:
        """Send a signal (see :meth:`Durable.signal`); returns the woken run ids."""
        params = signal_params(kind, ref, payload, signal_id, ttl, self.max_signal_payload)
        return ids(self._fetchall(q.SIGNAL, params))

    def send_event(
        self, name: str, data: dict[str, Any] | None = None, *, id: str | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> SentEvent:
        """Send an event (see :meth:`Durable.send_event`); ``conn=`` inside your transaction."""
        if self._closed:
            raise ProviderClosed("this DurableClient is closed")
        return send_event_sync(self, name, data, id, conn=conn, max_bytes=self.max_event_data)

    def signal_run(
        self,
        run_id: Any,
        kind: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    ) -> list[str]:
        """Signal one run (see :meth:`Durable.signal_run`); ``[run_id]`` if it woke."""
        params = signal_run_params(run_id, kind, payload, signal_id, ttl, self.max_signal_payload)
        return ids(self._fetchall(q.SIGNAL_RUN, params))

    def thread_task(
        self,
        prefix: str,
        task: str,
        *,
        queue: str = "default",
        priority: int = 0,
        idle_ttl: timedelta | None = None,
        revision: str | None = None,
    ) -> ThreadRoute:
        """Route threads by key prefix to a task (see :meth:`Durable.thread_task`).

        A client without ``app=`` does not know the task: pass ``revision=``.
        """
        return routes_of(self._registry).add(prefix, task, queue, priority, idle_ttl, revision)

    def send(
        self,
        thread_key: str,
        message: Any,
        *,
        message_id: str | None = None,
        sender: str | None = None,
        state: Any = None,
    ) -> Delivery:
        """Sync twin of :meth:`Durable.send` (for web handlers)."""
        params, mid = send_params(self._registry, thread_key, message, message_id, sender, state)
        return parse_delivery(self._fetchall(SEND_V2, params)[0], mid)
