"""The run API of the app and of the sync client, written once.

:class:`~pgdurable.Durable` (async) is an ``AsyncRunAPI``, the class of
``pgdurable/app/run_api.py``, the source; the sync client
:class:`~pgdurable.DurableClient` is a ``RunAPI``, the class of
``pgdurable/app/run_api_sync.py``, which ``tools/async_to_sync.py`` generates from
the source (``await`` dropped, ``async def`` -> ``def``, ``AsyncConnection`` ->
``Connection``, ``fork`` -> ``fork_sync``, ...). A run API method is added to the
source, once, and the twin regenerated (``python tools/async_to_sync.py``);
``tests/test_sync_twin.py`` fails if the committed twin is stale or if the two
classes offer different methods.

Every method validates its arguments in Python first (bad input changes nothing)
and then makes one round trip, through :meth:`fetchone` / :meth:`fetchall` (the
app's or the client's pool) or the capability modules of :mod:`pgdurable.runs`.
What an app or a client has besides (the pool, opening and closing, workers,
streams, waiting for a result) stays in :mod:`pgdurable.app.durable` and
:mod:`pgdurable.app.client`.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.db import translated
from ..foundation.effects import DEFAULT_LEASE as DEFAULT_IDEMPOTENCY_LEASE
from ..foundation.effects import DEFAULT_TTL as DEFAULT_IDEMPOTENCY_TTL
from ..foundation.effects import with_idempotency
from ..foundation.errors import ProviderClosed
from ..foundation.queries import budgets as bq
from ..foundation.queries import signals as sq
from ..foundation.registry import TaskRegistry, start_params
from ..foundation.schemas import caller_schema
from ..foundation.signals import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_SIGNAL_TTL,
    signal_params,
    signal_run_params,
    signals_params,
)
from ..runs import flow
from ..runs.batch_start import Start, start_many
from ..runs.budgets import budget_params, budget_statement, price_params, split_budget
from ..runs.children import TreeNode, run_tree
from ..runs.events import DEFAULT_MAX_EVENT_DATA, SentEvent, cancel_on_statement, send_event
from ..runs.fork import ForkedRun, fork, fork_failed, rewind
from ..runs.metadata import start_statement
from ..runs.search import Page, list_runs_query, make_page
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
from . import common

__all__ = ["AsyncRunAPI"]


class AsyncRunAPI(ABC):
    """The run API: start, inspect, cancel, retry, fork, signal and send to runs.

    A subclass owns the connections: it runs one statement with :meth:`fetchone`
    and :meth:`fetchall`, hands out its opened pool with :meth:`_ready`, and sets
    ``_registry`` (its tasks) and ``_closed``.
    """

    #: Largest signal payload (bytes of JSON) :meth:`signal` accepts; set it on the app.
    max_signal_payload: int = DEFAULT_MAX_PAYLOAD
    #: Largest event data (bytes of JSON) :meth:`send_event` accepts; set it on the app.
    max_event_data: int = DEFAULT_MAX_EVENT_DATA
    #: What a call after ``close()`` says is closed.
    _what: str = "app"
    #: The schema the runs live in (:mod:`pgdurable.foundation.schemas`).
    schema: str
    _registry: TaskRegistry
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderClosed(f"this {self._what} is closed")

    @abstractmethod
    async def fetchone(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> tuple[Any, ...] | None:
        """Run one statement on a pooled connection; one row or None (errors translated)."""

    @abstractmethod
    async def fetchall(
        self, sql: str, params: tuple[Any, ...], *, prepare: bool | None = True
    ) -> list[tuple[Any, ...]]:
        """Run one statement on a pooled connection; all rows (errors translated)."""

    @abstractmethod
    async def _ready(self) -> AsyncConnectionPool[Any]:
        """The pool, opened (and the schema checked) on first use."""

    async def start(
        self,
        task: str,
        state: Any = None,
        *,
        queue: str = "default",
        priority: int = 0,
        idempotency_key: str | None = None,
        deadline: Any = None,
        budget: float | Mapping[str, float] | None = None,
        revision: str | None = None,
        max_attempts: int | None = None,
        metadata: dict[str, Any] | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
        key: str | None = None,
        at: datetime | None = None,
        delay: timedelta | None = None,
        affinity_of: str | uuid.UUID | None = None,
        budgets: Iterable[str] | None = None,
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
        :class:`RunNotFound`, nothing started). Spend control (docs/budgets.md):
        ``budget`` is the run's own limit, a number (the old spend limit) or
        ``{unit: amount}`` (a budget of the run and its tree); ``budgets`` names the
        shared budgets it draws from too (:meth:`budget`). ``cancel_on`` (a list of
        ``(event name, "data.path", value)``): an event of that name whose path equals the
        value, sent after the start, cancels the run (:meth:`cancel`; also while it is
        parked; see docs/events.md), registered in the same statement.
        """
        self._check_open()
        spend_limit, own_budget = split_budget(budget)
        params = start_params(
            self._registry, task, state, queue, priority, idempotency_key, deadline, spend_limit,
            revision, max_attempts,
        )
        sql, params = flow.start_sql(params, key, at, delay)
        # metadata, trace context and affinity
        sql, params = start_statement(sql, params, metadata, affinity_of)
        sql, params = budget_statement(sql, params, budgets, own_budget)  # runs/budgets.py
        sql, params = cancel_on_statement(sql, params, cancel_on)  # runs/events.py
        if conn is not None:
            with translated(), caller_schema(conn, self.schema):
                cur = await conn.execute(sql, params)
                row = await cur.fetchone()
        else:
            row = await self.fetchone(sql, params)
        metrics.run_started(task)
        return str(common.one(row))

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
        self._check_open()
        with caller_schema(conn, self.schema):
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

    async def budget(self, key: str, *, limit: Mapping[str, float],
                     window: timedelta | float | None = None, calendar: bool = False,
                     policy: Literal["park", "fail"] = "fail") -> None:
        """Create or change the named budget ``key`` (spend control, docs/budgets.md).

        ``limit``: ``{unit: amount}`` for units ``usd``, ``tokens``, ``tokens_in``,
        ``tokens_out``, ``calls``. ``window``: None (for all time), or a timedelta
        (or seconds): the last ``window`` (rolling), or calendar buckets of it from
        2000-01-01 UTC with ``calendar=True``. ``policy``: when a reservation cannot
        be had, ``park`` the run until the window refills or the limit is raised
        (this call wakes the runs parked on the budget), or ``fail`` it with
        :class:`~pgdurable.BudgetExceeded`. Runs draw from it when started with
        ``budgets=[key]``. Bad input: :class:`~pgdurable.InvalidInput`, nothing written.
        """
        await self.fetchone(bq.SET.sql, budget_params(key, limit, window, calendar, policy))

    async def set_price(self, model: str, *, usd_per_token_in: float,
                        usd_per_token_out: float) -> None:
        """Set ``model``'s price: a settlement naming it with ``tokens_in`` /
        ``tokens_out`` and no ``usd`` is charged in USD from it (docs/budgets.md)."""
        await self.fetchone(bq.PRICE_SET.sql, price_params(model, usd_per_token_in,
                                                           usd_per_token_out))

    async def set_bucket(self, name: str, *, rate: flow.Rate, burst: float | None = None) -> None:
        """Create or change the shared token bucket ``name`` (for ``ctx.acquire``)."""
        await self.fetchone(flow.SET_BUCKET, flow.bucket_params(name, rate, burst))

    async def get_run(self, run_id: Any) -> q.RunInfo:
        """The run's current row as :class:`RunInfo` (:class:`RunNotFound` if none)."""
        rid = q.check_run_id(run_id)
        return q.parse_run(await self.fetchone(q.GET_RUN, (rid,)), rid)

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
        return str(common.one(await self.fetchone(q.CANCEL, (q.check_run_id(run_id),))))

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
        return str(common.one(await self.fetchone(common.RETRY, (q.check_run_id(run_id),))))

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
        params = common.mark_incompatible_params(task, revision, reason)
        return int(common.one(await self.fetchone(q.MARK_INCOMPATIBLE, params)))

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
        return common.ids(await self.fetchall(q.SIGNAL, params))

    async def signal_many(
        self,
        signals: Iterable[tuple[Any, ...]],
        *,
        ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    ) -> list[list[str]]:
        """Send many signals in ONE statement and transaction; per signal, in order, the
        ids of the runs it woke.

        Each signal is ``(kind, ref)``, ``(kind, ref, payload)`` or ``(kind, ref,
        payload, signal_id)`` and behaves exactly as :meth:`signal` with those arguments
        (wakes, pending signals kept until ``ttl``, deduplication), as if sent one after
        the other; the queues are notified once each. Why: PostgreSQL serialises the
        commits of transactions that NOTIFY, so signals sent one per transaction are
        bounded by one commit each (docs/performance.md, "Storms"). Bad input, or a
        ``signal_id`` that conflicts (:class:`~pgdurable.SignalConflict`), sends none of
        them. At most 10,000 signals per call.
        """
        params = signals_params(signals, ttl, self.max_signal_payload)
        if params is None:
            return []
        out: list[list[str]] = [[] for _ in params[0]]
        for w in sq.SIGNALS.all(await self.fetchall(sq.SIGNALS.sql, params)):
            out[w.index].append(w.run_id)
        return [sorted(ids) for ids in out]

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
        return common.ids(await self.fetchall(q.SIGNAL_RUN, params))

    async def send_event(
        self, name: str, data: dict[str, Any] | None = None, *, id: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> SentEvent:
        """Send an event: ``name``, ``data`` (a JSON object), ``id`` for deduplication.

        ONE statement (``pgdurable.send_event``; with ``conn=``, inside the caller's
        transaction: nothing happens unless it commits) stores the event, cancels the
        runs whose ``cancel_on`` it matches, wakes the runs parked on a matching
        ``wait_event`` and adds it to the windows of the triggers on ``name``
        (``on_event``). The same ``id`` again with the same data does nothing and
        answers the first event's number with ``created=False``; with other data it
        raises :class:`~pgdurable.EventConflict`. Bad input (empty name, data that is
        not a dict or not JSON, over :attr:`max_event_data` bytes): TypeError/
        ValueError, nothing written. See docs/events.md.
        """
        self._check_open()
        with caller_schema(conn, self.schema):
            return await send_event(self, name, data, id, conn=conn,
                                    max_bytes=self.max_event_data)

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
        self._check_open()
        return await with_idempotency(
            await self._ready(), key, fn, ttl=ttl, lease=lease, wait_timeout=wait_timeout,
            reconcile=reconcile,
        )

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
        self._check_open()
        params, mid = send_params(self._registry, thread_key, message, message_id, sender, state,
                                  double_text)
        return parse_delivery(await self.fetchone(SEND_V2, params), mid)

    async def set_double_text(self, thread_key: str, strategy: DoubleText | None) -> None:
        """Set a thread's double-texting strategy (None: its route's default); see :meth:`send`."""
        check_double_text(strategy, "strategy")
        await self.fetchone(SET_DOUBLE_TEXT, (encode_thread_key(thread_key), strategy))
