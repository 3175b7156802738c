"""Retention: prune finished runs in batches of short transactions.

Old history goes by partition first: every daily partition of checkpoints and
run_events that ended before the cut-off is dropped whole
(``pgdurable.drop_history_partitions``, :mod:`pgdurable.ops.partitions`), keeping
(moving to the default partition) the rows of runs that are not themselves
old enough to prune. Then finished runs (``completed``, ``failed``,
``cancelled``, ``incompatible``)
older than a cut-off are deleted with their remaining checkpoints, effects, events and
signals, and consumed thread messages (inboxes, :mod:`pgdurable.runs.threads`)
older than the same cut-off, and the events of pubsub topics nobody published
to for as long (clients/mastra's ``PgDurablePubSub``). Each batch is ONE
statement in its own autocommit transaction, calling the SQL functions
``pgdurable.prune_runs``, ``pgdurable.prune_thread_messages`` and
``pgdurable.prune_pubsub``: it deletes at most ``batch`` runs
(default 1,000; at most 100,000) and at most ``batch`` messages, skips rows
someone else holds locked and never touches live runs or pending messages, so
workers claiming and checkpointing are not held up (pitfall 18: unbounded
growth; pitfall 15: no long transactions).

* :func:`prune` (async) / :func:`prune_sync` -- prune everything older than
  ``older_than`` now, batch after batch; ``dry_run=True`` only counts
  (``pgdurable.prune_preview``).
* :func:`run_pruner` (async) / :func:`run_pruner_sync` (e.g. in a thread;
  ``pgdurable worker --prune-older-than 7d`` starts one) -- an automatic
  pruner to run next to a worker, e.g.
  ``asyncio.gather(worker.run(), run_pruner(app, every=3600, older_than="7d"))``.
  Any number of processes may run one: each batch takes
  ``pg_try_advisory_xact_lock(pgdurable.prune_lock_key())`` (transaction
  scoped, so it is safe behind PgBouncer in transaction mode) and a pruner
  that finds the lock taken skips its turn: at most one automatic batch runs
  at a time across the fleet. (A manual :func:`prune` is not exclusive by
  default; concurrent prunes are still safe: they skip each other's rows.)
* :func:`parse_age` -- ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"`` as a
  timedelta (the CLI's ``--older-than``).

From psql::

    SELECT * FROM pgdurable.prune_runs('7 days', 1000);            -- one batch of runs
    SELECT pgdurable.prune_thread_messages('7 days', 1000);        -- one batch of messages
    SELECT pgdurable.prune_pubsub('7 days', 1000);                 -- one batch of pubsub rows
    SELECT * FROM pgdurable.prune_preview('7 days');               -- counts only (runs)
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..app.durable import Durable
from ..foundation.aio import wait_set
from ..foundation.cells import acoordinator_dsn, aon_coordinator, coordinator_dsn
from ..foundation.db import translated, validate_dsn
from ..foundation.errors import InvalidInput, PgDurableError
from ..foundation.migrations import acheck_schema, check_schema
from ..foundation.pooler import aconnect
from ..foundation.pooler import connect as pooler_connect
from ..foundation.queries import budgets as bq
from ..foundation.queries import events as eq
from ..foundation.queries import retention as rq
from ..foundation.queries.core import Query, one, one_sync
from ..foundation.schemas import schema_of

__all__ = ["PruneResult", "parse_age", "prune", "prune_sync", "run_pruner", "run_pruner_sync"]

log = logging.getLogger("pgdurable.retention")

DEFAULT_BATCH = 1000
MAX_BATCH = 100_000

# The statements (PRUNE, DROP_PARTITIONS, PREVIEW) and their typed rows:
# pgdurable.foundation.queries.retention (imported as ``rq``).


def _prune_params(age: timedelta, size: int, exclusive: bool) -> tuple[Any, ...]:
    return (age, size, age, size, size, age, size, exclusive)

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)?\s*$", re.IGNORECASE)
_UNIT = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
#: The largest age accepted (about 1,000 years, as ``MAX_SIGNAL_TTL``).
MAX_AGE = timedelta(days=365_000)


def parse_age(text: str) -> timedelta:
    """``"7d"``/``"12h"``/``"30m"``/``"90s"``/``"2w"`` (bare number = seconds) as a timedelta.

    Anything else, or an age over :data:`MAX_AGE`, raises :class:`InvalidInput`
    naming the accepted forms.
    """
    if not isinstance(text, str):
        raise TypeError(f"age must be a str like '7d', not {type(text).__name__}")
    m = _AGE.match(text)
    if not m:
        raise InvalidInput(f"bad age {text!r}: use a number with s, m, h, d or w (e.g. 7d, 12h)")
    unit = (m.group(2) or "s").lower()
    seconds = float(m.group(1)) * _UNIT[unit]
    if seconds > MAX_AGE.total_seconds():  # also inf: now() - age must stay a timestamp
        raise InvalidInput(f"age {text.strip()!r} is too large: at most {MAX_AGE.days}d")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class PruneResult:
    """What a prune deleted (or, with ``dry_run``, would delete).

    ``batches`` counts the batches (``prune_runs`` calls); ``skipped`` is True
    when an exclusive prune found another pruner at work and did nothing;
    ``messages`` counts consumed thread messages (``prune_thread_messages``);
    ``pubsub`` counts events and topics of abandoned pubsub topics (``prune_pubsub``).
    """

    runs: int = 0
    checkpoints: int = 0
    effects: int = 0
    events: int = 0
    signals: int = 0
    batches: int = 0
    dry_run: bool = False
    skipped: bool = False
    messages: int = 0
    pubsub: int = 0
    #: LangGraph checkpoints beyond their retention policy (pgdurable.contrib.langgraph)
    graph_checkpoints: int = 0
    #: Whole history partitions dropped (their rows are counted in
    #: ``checkpoints``, ``events`` and ``signals``).
    partitions: int = 0
    #: Sent events (``pgdurable.events``, docs/events.md) no unfinished run needs, and
    #: the emptied trigger windows of finished runs (``prune_events``); a dry run counts
    #: the events only.
    sent_events: int = 0
    #: Budget ledger rows of pruned runs that no window counts any more
    #: (``budget_prune_ledger``, docs/budgets.md; their settlements are folded first).
    budget_ledger: int = 0

    @property
    def rows(self) -> int:
        """All rows deleted (runs and their history, thread messages, pubsub rows)."""
        return (self.runs + self.checkpoints + self.effects + self.events + self.signals
                + self.messages + self.pubsub + self.graph_checkpoints + self.sent_events
                + self.budget_ledger)

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        return {
            "runs": self.runs, "checkpoints": self.checkpoints, "effects": self.effects,
            "events": self.events, "signals": self.signals, "messages": self.messages,
            "pubsub": self.pubsub, "graph_checkpoints": self.graph_checkpoints,
            "partitions": self.partitions, "sent_events": self.sent_events,
            "budget_ledger": self.budget_ledger, "batches": self.batches,
            "dry_run": self.dry_run, "skipped": self.skipped,
        }


OnBatch = Callable[[PruneResult], None]


def _check(older_than: object, batch: object) -> tuple[timedelta, int]:
    """Validate prune arguments before any SQL."""
    if isinstance(older_than, str):
        older_than = parse_age(older_than)
    if not isinstance(older_than, timedelta):
        raise TypeError("older_than must be a timedelta or an age string like '7d'")
    if older_than < timedelta(0):
        raise InvalidInput("older_than must not be negative")
    if isinstance(batch, bool) or not isinstance(batch, int):
        raise TypeError("batch must be an int")
    if not 1 <= batch <= MAX_BATCH:
        raise InvalidInput(f"batch must be between 1 and {MAX_BATCH}")
    return older_than, batch


def _add(total: PruneResult, b: rq.PrunedBatch) -> tuple[PruneResult, PruneResult]:
    """Fold one batch into the running total; return (total, this batch)."""
    this = PruneResult(b.runs, b.checkpoints, b.effects, b.events, b.signals, 1,
                       skipped=not b.locked, messages=b.messages, pubsub=b.pubsub,
                       graph_checkpoints=b.graph_checkpoints)
    total = PruneResult(
        total.runs + this.runs, total.checkpoints + this.checkpoints,
        total.effects + this.effects, total.events + this.events,
        total.signals + this.signals, total.batches + 1, skipped=this.skipped,
        messages=total.messages + this.messages, pubsub=total.pubsub + this.pubsub,
        graph_checkpoints=total.graph_checkpoints + this.graph_checkpoints,
        partitions=total.partitions,
    )
    return total, this


def _finished(this: PruneResult, batch: int) -> bool:
    """The loop ends on a short batch (nothing more is old enough) or when skipped."""
    return this.skipped or (this.runs < batch and this.signals < batch and this.messages < batch
                            and this.pubsub < batch and this.graph_checkpoints < batch)


def _preview(c: rq.PruneCounts) -> PruneResult:
    return PruneResult(c.runs, c.checkpoints, c.effects, c.events, c.signals, dry_run=True,
                       messages=c.messages, pubsub=c.pubsub,
                       graph_checkpoints=c.graph_checkpoints)


@dataclass(frozen=True)
class _Statement:
    """The next statement of a prune (``pause_first``: sleep ``pause`` before it); the
    shell sends back its row decoded (``query.one``)."""

    query: Query[Any]
    params: tuple[Any, ...]
    pause_first: bool = False


def _plan(
    age: timedelta, size: int, dry_run: bool, exclusive: bool, on_batch: OnBatch | None
) -> Generator[_Statement, Any, PruneResult]:
    """The prune loop without I/O, shared by :func:`prune` and :func:`prune_sync`.

    Yields each statement to run, receives its decoded row, returns the total.
    """
    if dry_run:
        preview = _preview((yield _Statement(rq.PREVIEW, (age,))))
        return replace(preview, sent_events=(yield _Statement(eq.PRUNABLE_EVENTS, (age,))))
    dropped = yield _Statement(rq.DROP_PARTITIONS, (age,))
    total = PruneResult(checkpoints=dropped.checkpoints, events=dropped.events,
                        signals=dropped.signals, partitions=dropped.partitions)
    params = _prune_params(age, size, exclusive)
    batch = yield _Statement(rq.PRUNE, params)
    while True:
        total, this = _add(total, batch)
        if on_batch is not None:
            on_batch(this)
        if _finished(this, size):
            break
        batch = yield _Statement(rq.PRUNE, params, pause_first=True)
    if total.skipped:
        return total
    # then sent events: whole daily partitions first, then row by row (those of the runs
    # just pruned are no longer needed)
    sent = yield _Statement(eq.DROP_PARTITIONS_TOTAL, (age,))
    n = yield _Statement(eq.PRUNE_EVENTS, (age, size))
    sent += n
    while n >= size:
        n = yield _Statement(eq.PRUNE_EVENTS, (age, size), pause_first=True)
        sent += n
    # then the budget ledger rows of the runs pruned (their settlements folded)
    n = yield _Statement(bq.PRUNE_LEDGER, (size,))
    ledger = n
    while n >= size:
        n = yield _Statement(bq.PRUNE_LEDGER, (size,), pause_first=True)
        ledger += n
    return replace(total, sent_events=sent, budget_ledger=ledger)


async def prune(
    target: str | psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any] | Durable,
    older_than: timedelta | str,
    *,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    exclusive: bool = False,
    pause: float = 0.0,
    on_batch: OnBatch | None = None,
) -> PruneResult:
    """Delete finished runs older than ``older_than`` (and their history), batch by batch.

    ``target`` is a DSN, an autocommit ``AsyncConnection``, an
    ``AsyncConnectionPool`` of autocommit connections or a
    :class:`~pgdurable.Durable` app. Each batch is one short transaction of
    at most ``batch`` runs; ``pause`` seconds are slept between batches.
    ``on_batch`` is called with each batch's counts. ``dry_run`` deletes
    nothing and returns what would be deleted. ``exclusive`` makes every
    batch take the fleet-wide pruner lock and stop (``skipped=True``) if
    another pruner holds it.
    """
    age, size = _check(older_than, batch)
    if isinstance(target, str):
        validate_dsn(target)
        conn = await aconnect(target)
        async with conn:
            with translated():
                await acheck_schema(conn)
            async with aon_coordinator(conn, target) as where:
                return await _aloop(where, None, age, size, dry_run, exclusive, pause, on_batch)
    if isinstance(target, psycopg.AsyncConnection):
        return await _aloop(target, None, age, size, dry_run, exclusive, pause, on_batch)
    if isinstance(target, AsyncConnectionPool | Durable):
        if isinstance(target, Durable):
            await target.open()
        pool = target.pool if isinstance(target, Durable) else target
        dsn = target.conninfo if isinstance(target.conninfo, str) else None
        # in a Citus cell, through the coordinator (foundation/cells.py); else the pool's
        async with pool.connection() as c:
            coordinator = None if dsn is None else await acoordinator_dsn(c, dsn)
            schema = schema_of(c)
        if coordinator is None:
            return await _aloop(None, pool, age, size, dry_run, exclusive, pause, on_batch)
        async with await aconnect(coordinator, schema=schema) as where:
            return await _aloop(where, None, age, size, dry_run, exclusive, pause, on_batch)
    raise TypeError(
        "prune() takes a DSN, an AsyncConnection, an AsyncConnectionPool or a Durable app, "
        f"not {type(target).__name__}"
    )


# async-to-sync: source (aname -> name)
async def _aexec(
    conn: psycopg.AsyncConnection[Any] | None,
    pool: AsyncConnectionPool[Any] | None,
    step: _Statement,
) -> Any:
    with translated():
        if conn is not None:
            return await one(conn, step.query, step.params)
        assert pool is not None
        async with pool.connection() as c:
            return await one(c, step.query, step.params)


async def _aloop(
    conn: psycopg.AsyncConnection[Any] | None,
    pool: AsyncConnectionPool[Any] | None,
    age: timedelta,
    size: int,
    dry_run: bool,
    exclusive: bool,
    pause: float,
    on_batch: OnBatch | None,
) -> PruneResult:
    plan = _plan(age, size, dry_run, exclusive, on_batch)
    step = next(plan)
    while True:
        if step.pause_first and pause > 0:
            await asyncio.sleep(pause)
        try:
            step = plan.send(await _aexec(conn, pool, step))
        except StopIteration as done:
            result: PruneResult = done.value
            return result
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def _exec(
    conn: psycopg.Connection[Any] | None,
    pool: ConnectionPool[Any] | None,
    step: _Statement,
) -> Any:
    with translated():
        if conn is not None:
            return one_sync(conn, step.query, step.params)
        assert pool is not None
        with pool.connection() as c:
            return one_sync(c, step.query, step.params)


def _loop(
    conn: psycopg.Connection[Any] | None,
    pool: ConnectionPool[Any] | None,
    age: timedelta,
    size: int,
    dry_run: bool,
    exclusive: bool,
    pause: float,
    on_batch: OnBatch | None,
) -> PruneResult:
    plan = _plan(age, size, dry_run, exclusive, on_batch)
    step = next(plan)
    while True:
        if step.pause_first and pause > 0:
            time.sleep(pause)
        try:
            step = plan.send(_exec(conn, pool, step))
        except StopIteration as done:
            result: PruneResult = done.value
            return result
# async-to-sync: end


def prune_sync(
    target: str | psycopg.Connection[Any] | ConnectionPool[Any],
    older_than: timedelta | str,
    *,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    exclusive: bool = False,
    pause: float = 0.0,
    on_batch: OnBatch | None = None,
) -> PruneResult:
    """Sync twin of :func:`prune` (a DSN, an autocommit Connection or a ConnectionPool);
    its loop, :func:`_loop`, is generated from :func:`_aloop`."""
    age, size = _check(older_than, batch)
    owned = False
    conn: psycopg.Connection[Any] | None = None
    pool: ConnectionPool[Any] | None = None
    if isinstance(target, str):
        validate_dsn(target)
        conn = pooler_connect(target)
        owned = True
        with translated():
            check_schema(conn)
        # in a Citus cell, through the coordinator (foundation/cells.py)
        coordinator = coordinator_dsn(conn, target)
        if coordinator is not None:
            schema = schema_of(conn)
            conn.close()
            conn = pooler_connect(coordinator, schema=schema)
    elif isinstance(target, psycopg.Connection):
        conn = target
    elif isinstance(target, ConnectionPool):
        pool = target
        with pool.connection() as c:
            coordinator = (coordinator_dsn(c, target.conninfo)
                           if isinstance(target.conninfo, str) else None)
        if coordinator is not None:
            conn, pool, owned = pooler_connect(coordinator, schema=schema_of(c)), None, True
    else:
        raise TypeError(
            "prune_sync() takes a DSN, a Connection or a ConnectionPool, "
            f"not {type(target).__name__}"
        )

    try:
        return _loop(conn, pool, age, size, dry_run, exclusive, pause, on_batch)
    finally:
        if owned and conn is not None:
            conn.close()


def _secs(value: timedelta | float, what: str) -> float:
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not secs > 0:
        raise InvalidInput(f"{what} must be > 0")
    return secs


async def run_pruner(
    target: str | AsyncConnectionPool[Any] | Durable,
    *,
    every: timedelta | float = timedelta(hours=1),
    older_than: timedelta | str = timedelta(days=7),
    batch: int = DEFAULT_BATCH,
    pause: float = 0.05,
    stop: asyncio.Event | None = None,
    on_prune: Callable[[PruneResult], None] | None = None,
) -> None:
    """Prune every ``every`` (±10 % jitter) until cancelled or ``stop`` is set.

    Run it next to a worker in as many processes as you like: batches are
    exclusive across the fleet (``pg_try_advisory_xact_lock``), so one
    pruner works while the others skip their turn. Database errors are
    logged and retried at the next turn; they never stop the pruner.
    ``on_prune`` receives each turn's totals.
    """
    interval = _secs(every, "every")
    _check(older_than, batch)
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            _report(await prune(target, older_than, batch=batch, exclusive=True, pause=pause),
                    on_prune)
        except (PgDurableError, psycopg.Error, OSError) as exc:
            log.warning("prune failed: %s", exc)
        await wait_set(stop, _jittered(interval))


def run_pruner_sync(
    target: str | ConnectionPool[Any],
    *,
    every: timedelta | float = timedelta(hours=1),
    older_than: timedelta | str = timedelta(days=7),
    batch: int = DEFAULT_BATCH,
    pause: float = 0.05,
    stop: threading.Event | None = None,
    on_prune: Callable[[PruneResult], None] | None = None,
) -> None:
    """Sync twin of :func:`run_pruner`, e.g. in a thread next to a worker (until ``stop``)."""
    interval = _secs(every, "every")
    _check(older_than, batch)
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            _report(prune_sync(target, older_than, batch=batch, exclusive=True, pause=pause),
                    on_prune)
        except (PgDurableError, psycopg.Error, OSError) as exc:
            log.warning("prune failed: %s", exc)
        stop.wait(_jittered(interval))


def _jittered(interval: float) -> float:
    return interval * random.uniform(0.9, 1.1)


def _report(result: PruneResult, on_prune: Callable[[PruneResult], None] | None) -> None:
    if (result.runs or result.messages) and not result.skipped:
        log.info("pruned %d runs, %d thread messages (%d rows)", result.runs, result.messages,
                 result.rows)
    if on_prune is not None:
        on_prune(result)

