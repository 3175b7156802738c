"""History partitions: daily partitions made ahead of time, old ones dropped whole.

``pgdurable.checkpoints`` and ``pgdurable.run_events`` are range-partitioned by
``created_at``, and ``pgdurable.signal_history`` (consumed signals) by
``consumed_at``: one partition per UTC day, plus a DEFAULT partition that catches
rows outside every daily range (docs/scaling.md). Consumed signals wait an hour
in ``pgdurable.signals`` and are then moved to ``signal_history`` by
``pgdurable.move_consumed_signals`` (each maintenance turn). Two SQL functions do the work,
each one short transaction, serialised by ``pgdurable.history_lock_key()``:

* ``pgdurable.create_history_partitions(days_ahead, days_back)`` creates the
  missing daily partitions (rows of those days that had landed in the default
  partition move into them);
* ``pgdurable.drop_history_partitions(older_than)`` drops every daily partition
  whose range ended before ``now() - older_than``. **Rule:** rows are dropped
  only when retention would delete their run too (a terminal run finished
  before the cut-off); rows of every other run -- still running, waiting, or
  finished inside the window -- are moved to the default partition first, so
  no live run loses history. :func:`pgdurable.ops.retention.prune` calls it before
  its row-by-row batches.

This module runs them:

* :func:`maintain` (async) / :func:`maintain_sync` -- once: create partitions
  ``days_ahead`` days ahead and, given ``older_than``, drop old ones
  (``pgdurable maintain`` on the command line).
* :func:`run_maintenance` (async) / :func:`run_maintenance_sync` -- every
  ``every`` seconds next to a worker (``pgdurable worker --maintain``). Any
  number of processes may run it: a turn first takes the lease
  :data:`MAINTENANCE_LEASE` (``pgdurable.acquire_lease``, TTL three turns) and
  only its holder, the leader, does the work; when the leader dies its lease
  expires and another process takes over.

From psql::

    SELECT pgdurable.create_history_partitions(7);          -- the week ahead
    SELECT pgdurable.move_consumed_signals('1 hour');        -- one batch (10,000)
    SELECT * FROM pgdurable.drop_history_partitions('30 days');
    SELECT * FROM pgdurable.history_partitions ORDER BY range_from;
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from ..app.durable import Durable
from ..foundation.aio import wait_set
from ..foundation.cells import aon_coordinator, on_coordinator
from ..foundation.db import translated, validate_dsn
from ..foundation.errors import InvalidInput, PgDurableError
from ..foundation.migrations import acheck_schema, check_schema
from ..foundation.pooler import aconnect
from ..foundation.pooler import connect as pooler_connect
from ..foundation.queries import events as eq
from ..foundation.queries import partitions as pq
from ..foundation.queries.core import first, first_sync, many, many_sync
from ..foundation.queries.partitions import DroppedPartition
from .retention import parse_age

__all__ = [
    "MAINTENANCE_LEASE",
    "DroppedPartition",
    "MaintainResult",
    "maintain",
    "maintain_sync",
    "run_maintenance",
    "run_maintenance_sync",
]

log = logging.getLogger("pgdurable.partitions")

#: Daily partitions kept ready ahead of today (UTC).
DEFAULT_DAYS_AHEAD = 3
#: The largest ``days_ahead`` accepted (as the SQL function).
MAX_DAYS_AHEAD = 366
#: Consumed signals stay in ``pgdurable.signals`` this long before they move to
#: ``pgdurable.signal_history`` (see sql/0022_partitioned_signals.sql).
SIGNAL_MIN_AGE = timedelta(hours=1)
#: Signals moved per statement (each its own short transaction).
SIGNAL_BATCH = 10_000
#: The lease key whose holder is the maintenance leader.
MAINTENANCE_LEASE = "pgdurable:history-maintenance"

# The statements (CREATE, DROP, MOVE_SIGNALS, LEAD) and their typed rows:
# pgdurable.foundation.queries.partitions (imported as ``pq``).


@dataclass(frozen=True)
class MaintainResult:
    """What one maintenance turn did.

    ``created`` counts new history partitions, ``events_created`` new partitions of
    ``pgdurable.events`` (docs/events.md); ``dropped`` lists the dropped ones, of
    both (``history_table`` ``'events'`` for the latter);
    ``signals_moved`` counts consumed signals moved into ``signal_history``;
    ``skipped`` is True when another process holds the maintenance lease.
    """

    created: int = 0
    dropped: tuple[DroppedPartition, ...] = ()
    skipped: bool = False
    signals_moved: int = 0
    events_created: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The result as a JSON-ready dict."""
        return {
            "created": self.created, "skipped": self.skipped,
            "dropped": [vars(d) for d in self.dropped], "signals_moved": self.signals_moved,
            "events_created": self.events_created,
        }


def _check(days_ahead: object, older_than: object) -> tuple[int, timedelta | None]:
    """Validate maintenance arguments before any SQL."""
    if isinstance(days_ahead, bool) or not isinstance(days_ahead, int):
        raise TypeError("days_ahead must be an int")
    if not 0 <= days_ahead <= MAX_DAYS_AHEAD:
        raise InvalidInput(f"days_ahead must be between 0 and {MAX_DAYS_AHEAD}")
    if older_than is None:
        return days_ahead, None
    if isinstance(older_than, str):
        older_than = parse_age(older_than)
    if not isinstance(older_than, timedelta):
        raise TypeError("older_than must be a timedelta, an age string like '30d' or None")
    if older_than < timedelta(0):
        raise InvalidInput("older_than must not be negative")
    return days_ahead, older_than


def _owner() -> str:
    return f"maintenance:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _ttl_ms(every: float) -> int:
    return max(1000, min(86_400_000, int(every * 3000)))


def _every(value: timedelta | float) -> float:
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not secs > 0:
        raise InvalidInput("every must be > 0")
    return secs


# async-to-sync: source (aname -> name)
async def _aturn(
    conn: psycopg.AsyncConnection[Any], days: int, age: timedelta | None,
    lead: tuple[str, int] | None,
) -> MaintainResult:
    with translated():
        if lead is not None and not await first(conn, pq.LEAD, (MAINTENANCE_LEASE, *lead)):
            return MaintainResult(skipped=True)
        created = await first(conn, pq.CREATE, (days,))
        events_created = await first(conn, eq.CREATE_PARTITIONS, (days,))
        moved = 0
        while True:
            batch = await first(conn, pq.MOVE_SIGNALS, (SIGNAL_MIN_AGE, SIGNAL_BATCH))
            moved += batch or 0
            if batch is None or batch < SIGNAL_BATCH:
                break
        dropped = [*await many(conn, pq.DROP, (age,)),
                   *await many(conn, eq.DROP_PARTITIONS, (age,))] if age is not None else []
    return MaintainResult(created or 0, tuple(dropped), signals_moved=moved,
                          events_created=events_created or 0)
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def _turn(
    conn: psycopg.Connection[Any], days: int, age: timedelta | None,
    lead: tuple[str, int] | None,
) -> MaintainResult:
    with translated():
        if lead is not None and not first_sync(conn, pq.LEAD, (MAINTENANCE_LEASE, *lead)):
            return MaintainResult(skipped=True)
        created = first_sync(conn, pq.CREATE, (days,))
        events_created = first_sync(conn, eq.CREATE_PARTITIONS, (days,))
        moved = 0
        while True:
            batch = first_sync(conn, pq.MOVE_SIGNALS, (SIGNAL_MIN_AGE, SIGNAL_BATCH))
            moved += batch or 0
            if batch is None or batch < SIGNAL_BATCH:
                break
        dropped = [*many_sync(conn, pq.DROP, (age,)),
                   *many_sync(conn, eq.DROP_PARTITIONS, (age,))] if age is not None else []
    return MaintainResult(created or 0, tuple(dropped), signals_moved=moved,
                          events_created=events_created or 0)
# async-to-sync: end


async def maintain(
    target: str | psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any] | Durable,
    *,
    days_ahead: int = DEFAULT_DAYS_AHEAD,
    older_than: timedelta | str | None = None,
    _lead: tuple[str, int] | None = None,
) -> MaintainResult:
    """Create the daily history partitions ``days_ahead`` days ahead; drop old ones.

    Also moves signals consumed over :data:`SIGNAL_MIN_AGE` ago from
    ``pgdurable.signals`` into the partitioned ``pgdurable.signal_history``.

    ``target`` is a DSN, an autocommit ``AsyncConnection``, an
    ``AsyncConnectionPool`` or a :class:`~pgdurable.Durable` app. With
    ``older_than`` (a timedelta or ``"30d"``), daily partitions that ended
    before ``now() - older_than`` are dropped, keeping the rows of runs that
    retention keeps (see the module docstring). Each statement is its own
    short transaction.
    """
    days, age = _check(days_ahead, older_than)
    if isinstance(target, str):
        validate_dsn(target)
        conn = await aconnect(target)
        async with conn:
            with translated():
                await acheck_schema(conn)
            async with aon_coordinator(conn, target) as ddl:
                return await _aturn(ddl, days, age, _lead)
    if isinstance(target, psycopg.AsyncConnection):
        return await _aturn(target, days, age, _lead)
    pool: AsyncConnectionPool[Any] | None = None
    dsn: str | None = None
    if isinstance(target, AsyncConnectionPool):
        pool = target
        dsn = pool.conninfo if isinstance(pool.conninfo, str) else None
    else:
        if isinstance(target, Durable):
            await target.open()
            pool, dsn = target.pool, target.conninfo
    if pool is None:
        raise TypeError(
            "maintain() takes a DSN, an AsyncConnection, an AsyncConnectionPool or a Durable "
            f"app, not {type(target).__name__}"
        )
    # (in a Citus cell, DDL goes through the coordinator: foundation/cells.py)
    async with pool.connection() as c, aon_coordinator(c, dsn) as ddl:
        return await _aturn(ddl, days, age, _lead)


def maintain_sync(
    target: str | psycopg.Connection[Any] | ConnectionPool[Any],
    *,
    days_ahead: int = DEFAULT_DAYS_AHEAD,
    older_than: timedelta | str | None = None,
    _lead: tuple[str, int] | None = None,
) -> MaintainResult:
    """Sync twin of :func:`maintain` (a DSN, an autocommit Connection or a ConnectionPool)."""
    days, age = _check(days_ahead, older_than)
    if isinstance(target, str):
        validate_dsn(target)
        with pooler_connect(target) as conn:
            with translated():
                check_schema(conn)
            with on_coordinator(conn, target) as ddl:
                return _turn(ddl, days, age, _lead)
    if isinstance(target, psycopg.Connection):
        return _turn(target, days, age, _lead)
    if isinstance(target, ConnectionPool):
        dsn = target.conninfo if isinstance(target.conninfo, str) else None
        with target.connection() as c, on_coordinator(c, dsn) as ddl:
            return _turn(ddl, days, age, _lead)
    raise TypeError(
        "maintain_sync() takes a DSN, a Connection or a ConnectionPool, "
        f"not {type(target).__name__}"
    )


async def run_maintenance(
    target: str | AsyncConnectionPool[Any] | Durable,
    *,
    every: timedelta | float = timedelta(hours=1),
    days_ahead: int = DEFAULT_DAYS_AHEAD,
    older_than: timedelta | str | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Maintain the history partitions every ``every`` (±10 %) until cancelled or ``stop``.

    Leader-elected: each turn takes (or keeps) the lease
    :data:`MAINTENANCE_LEASE` for three turns; only its holder works, the
    others skip their turn. Database errors are logged and retried next turn.
    """
    interval = _every(every)
    _check(days_ahead, older_than)
    lead = (_owner(), _ttl_ms(interval))
    stop = stop or asyncio.Event()
    while not stop.is_set():
        try:
            _report(await maintain(target, days_ahead=days_ahead, older_than=older_than,
                                   _lead=lead))
        except (PgDurableError, psycopg.Error, OSError) as exc:
            log.warning("history partition maintenance failed: %s", exc)
        await wait_set(stop, interval * random.uniform(0.9, 1.1))


def run_maintenance_sync(
    target: str | ConnectionPool[Any],
    *,
    every: timedelta | float = timedelta(hours=1),
    days_ahead: int = DEFAULT_DAYS_AHEAD,
    older_than: timedelta | str | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Sync twin of :func:`run_maintenance`, e.g. in a thread next to a worker."""
    interval = _every(every)
    _check(days_ahead, older_than)
    lead = (_owner(), _ttl_ms(interval))
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            _report(maintain_sync(target, days_ahead=days_ahead, older_than=older_than,
                                  _lead=lead))
        except (PgDurableError, psycopg.Error, OSError) as exc:
            log.warning("history partition maintenance failed: %s", exc)
        stop.wait(interval * random.uniform(0.9, 1.1))


def _report(result: MaintainResult) -> None:
    if result.created or result.events_created or result.dropped:
        log.info("history partitions: %d created, %d dropped", result.created,
                 len(result.dropped))
