"""Claim (``sql/functions/claim.sql``): lease runnable runs to a worker, and how long
an idle worker may sleep (:mod:`pgdurable.engine.claim`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from .core import Query, Row, statement
from .schedules import WAKEUP_PROBE

__all__ = ["CLAIM", "NEXT_WAKEUP", "NOTIFY_QUEUES", "WAKEUP", "ClaimedRun", "Wakeup", "next_wakeup"]


class ClaimedRun(NamedTuple):
    """One row of :data:`CLAIM` (in its column order): a run leased to this worker."""

    id: uuid.UUID
    task: str
    revision: str
    queue: str
    status: str
    state: Any
    step: int
    attempts: int
    max_attempts: int
    lease_token: int
    lease_expires_at: datetime
    wake: dict[str, Any] | None
    deadline_at: datetime | None
    budget: Decimal | None
    spent: Decimal
    db_now: datetime
    #: The run's affinity record (pgdurable.affinity.parse_affinity), None without.
    affinity: dict[str, Any] | None


def _claimed(r: Row) -> ClaimedRun:
    if len(r) != len(ClaimedRun._fields):
        raise AssertionError(f"ClaimedRun: {len(r)} columns, {len(ClaimedRun._fields)} fields")
    return ClaimedRun._make(r)


@dataclass(frozen=True, slots=True)
class Wakeup:
    """The idle query's answer: seconds until work may appear for a worker (None: none
    known) and, in order, the answer of each probe the worker's loop services add
    (:mod:`pgdurable.engine.services`; the schedule ticker's: seconds until the next
    tick of its queues, None: none)."""

    work_in: float | None
    probes: tuple[float | None, ...]


def _seconds(v: Any) -> float | None:
    return None if v is None else float(v)


def _wakeup(r: Row) -> Wakeup:
    return Wakeup(_seconds(r[0]), tuple(_seconds(v) for v in r[1:]))


#: The idle query's first column: seconds until work may appear (NULL: none) for
#: (queues, tasks, revisions) to worker (owner: the runs reserved for it are due at
#: once: docs/affinity.md).
WAKEUP = "pgdurable.next_wakeup(%s::text[], %s::text[], %s::text[], %s::text)"


def next_wakeup(probes: Sequence[str] = ()) -> Query[Wakeup]:
    """The idle query of a worker whose loop services add ``probes`` (SQL expressions of
    one parameter, the worker's queues, answering seconds until the service is due): ONE
    statement answers when work and every service is due next (a :class:`Wakeup`)."""
    return Query("SELECT " + ", ".join([WAKEUP, *probes]), _wakeup)


# -- claim up to n runs for (owner, queues, tasks, revisions, n, ttl, max_reclaims per
# -- task) (see the SQL header): one ClaimedRun per run leased, with a new fencing token
CLAIM = Query(
    "SELECT id, task, revision, queue, status, state, step, attempts, max_attempts, "
    "lease_token, lease_expires_at, wake, deadline_at, budget, spent, db_now, affinity "
    "FROM pgdurable.claim_runs(%s::text, %s::text[], %s::text[], %s::text[], %s::integer, "
    "%s::interval, %s::integer[])", _claimed)
# -- the idle query of a worker with the schedule ticker (Durable.worker()): seconds until
# -- work may appear (NULL: none) and until the next schedule tick in (queues) (NULL:
# -- none; sql/functions/schedules.sql); a Wakeup
NEXT_WAKEUP = next_wakeup([WAKEUP_PROBE])
# -- tell the workers of these queues to look again (a stopping worker's timers); one
# -- row per queue, not read
NOTIFY_QUEUES = statement("SELECT pg_notify('pgdurable_wake', q) FROM unnest(%s::text[]) AS q")
