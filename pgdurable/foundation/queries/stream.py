"""A run's output stream (``sql/functions/stream.sql``): append an event, and read a run's
or a thread's events after a cursor (:mod:`pgdurable.runs.stream`,
:mod:`pgdurable.runs.live`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .core import Query, Row, scalar

__all__ = ["EMIT", "RUN_EVENTS", "THREAD_EVENTS", "RunEvent", "ThreadEvent"]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One row of a run's snapshot: the run's status, result and error, and one of its
    events after the cursor (``seq`` None, and the event fields empty, when it has none)."""

    status: str
    result: Any
    error: dict[str, Any] | None
    seq: int | None
    event: Any
    final: bool
    created_at: datetime | None


def _run_event(r: Row) -> RunEvent:
    status, result, error, seq, event, final, created_at = r
    return RunEvent(status, result, error, None if seq is None else int(seq), event,
                    bool(final), created_at)


@dataclass(frozen=True, slots=True)
class ThreadEvent:
    """One event of a thread's stream: its run, the run's place in the thread, and the
    event."""

    run_id: str
    thread_no: int
    seq: int
    event: Any
    final: bool
    created_at: datetime


def _thread_event(r: Row) -> ThreadEvent:
    run_id, thread_no, seq, event, final, created_at = r
    return ThreadEvent(str(run_id), int(thread_no), int(seq), event, bool(final), created_at)


# -- fenced append (or a retried step's overwrite) of the idx-th event of the current
# -- step (id, token, owner, idx, event); its seq
EMIT = scalar(
    "SELECT pgdurable.emit_event(%s::uuid, %s::bigint, %s::text, %s::integer, %s::jsonb)", int)
# -- one snapshot of run (after seq, limit, id): a RunEvent per event after seq, in order
# -- (one with seq None when there is none); no row: no such run
RUN_EVENTS = Query("""
SELECT r.status, r.result, r.error, e.seq, e.event, e.final, e.created_at
  FROM pgdurable.runs r
  LEFT JOIN LATERAL (
    SELECT x.seq, x.event, x.final, x.created_at FROM pgdurable.run_events x
     WHERE x.run_id = r.id AND x.seq > %s ORDER BY x.seq LIMIT %s) e ON true
 WHERE r.id = %s::uuid
 ORDER BY e.seq
""", _run_event)
# -- a thread's events after a (thread_no, seq) cursor (stored key, thread_no, seq, limit),
# -- in thread order: a ThreadEvent each
THREAD_EVENTS = Query("""
SELECT r.id, r.thread_no, e.seq, e.event, e.final, e.created_at
  FROM pgdurable.runs r JOIN pgdurable.run_events e ON e.run_id = r.id
 WHERE r.thread_key = %s::text AND (r.thread_no, e.seq) > (%s, %s)
 ORDER BY r.thread_no, e.seq
 LIMIT %s
""", _thread_event)
