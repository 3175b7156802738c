"""What every start statement answers (``start_run``, ``start_child``, ``start_run_flow``
and the statements wrapping them: metadata, affinity): the run's id, and whether this
call created it."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, Row

__all__ = ["START", "Started", "started"]


@dataclass(frozen=True, slots=True)
class Started:
    """A start's answer: the run's id, and False when an earlier start made it (same
    idempotency key, same child key)."""

    run_id: str
    created: bool


def _started(r: Row) -> Started:
    run_id, created = r
    return Started(str(run_id), bool(created))


def started(sql: str) -> Query[Started]:
    """A start statement (columns: run id, created) as a named query."""
    return Query(sql, _started)


# -- start a run (task, revision, state, queue, priority, max_attempts, idempotency key,
# -- deadline in, deadline at, budget): Started (created False: an earlier start with the
# -- same idempotency key made it)
START = started(
    "SELECT run_id, created FROM pgdurable.start_run(%s::text, %s::text, %s::jsonb, %s::text, "
    "%s::integer, %s::integer, %s::text, %s::interval, %s::timestamptz, %s::numeric)")
