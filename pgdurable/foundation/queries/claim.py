"""Claim (``sql/functions/claim.sql``): lease runnable runs to a worker, and how long
an idle worker may sleep (:mod:`pgdurable.engine.claim`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from .core import Query, Row, statement

__all__ = ["CLAIM", "NEXT_WAKEUP", "NOTIFY_QUEUES", "ClaimedRun", "Wakeups"]


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
class Wakeups:
    """Seconds until work may appear for a worker (None: none known), and until the next
    schedule tick of its queues (None: none)."""

    work_in: float | None
    schedule_in: float | None


def _wakeups(r: Row) -> Wakeups:
    work, schedule = r
    return Wakeups(None if work is None else float(work),
                   None if schedule is None else float(schedule))


# -- claim up to n runs for (owner, queues, tasks, revisions, n, ttl, max_reclaims per
# -- task) (see the SQL header): one ClaimedRun per run leased, with a new fencing token
CLAIM = Query(
    "SELECT id, task, revision, queue, status, state, step, attempts, max_attempts, "
    "lease_token, lease_expires_at, wake, deadline_at, budget, spent, db_now, affinity "
    "FROM pgdurable.claim_runs(%s::text, %s::text[], %s::text[], %s::text[], %s::integer, "
    "%s::interval, %s::integer[])", _claimed)
# -- seconds until work may appear (NULL: none) for (queues, tasks, revisions) to
# -- worker (owner: the runs reserved for it are due at once: docs/affinity.md),
# -- and until the next schedule tick in (queues) (NULL: none; sql/functions/schedules.sql)
NEXT_WAKEUP = Query(
    "SELECT pgdurable.next_wakeup(%s::text[], %s::text[], %s::text[], %s::text), "
    "pgdurable.schedule_wakeup(%s::text[])", _wakeups)
# -- tell the workers of these queues to look again (a stopping worker's timers); one
# -- row per queue, not read
NOTIFY_QUEUES = statement("SELECT pg_notify('pgdurable_wake', q) FROM unnest(%s::text[]) AS q")
