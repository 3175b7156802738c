"""Schedules (``sql/functions/schedules.sql``): declare, plan, fire, pause, list.

The cadence arithmetic is Python's (:mod:`pgdurable.runs.schedules`); who fires a
tick, once, is the database's: these are the statements between the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .core import Listing, Query, Row, nullable, record, scalar, statement

__all__ = ["CADENCE_FOR_UPDATE", "DECLARE_LOCK", "DECLARE_LOCK_KEY", "DELETE", "DISABLE", "DUE",
           "FIRE", "LIST", "MARK_UNDECLARED", "PAUSE", "RESUME", "RUNS", "TRIGGER", "UPSERT", "WAKEUP",
           "WAKEUP_PROBE",
           "DueSchedule", "FiredTick", "ScheduleInfo", "StoredCadence"]


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule as stored (``list_schedules``)."""

    name: str
    cron: str | None
    every: timedelta | None
    timezone: str
    task: str
    revision: str
    queue: str
    overlap: str
    catchup: str
    catchup_limit: int
    paused: bool
    next_fire_at: datetime
    last_tick: datetime | None
    last_run_id: str | None
    last_run_status: str | None
    fired: int
    skipped: int
    last_error: str | None
    declared_by: str | None
    last_declared_at: datetime | None
    undeclared_at: datetime | None
    state: Any

    @property
    def undeclared(self) -> bool:
        """Declared in code once, but the code no longer declares it."""
        return self.undeclared_at is not None


def _info(row: Row) -> ScheduleInfo:
    v = list(row)
    v[13] = None if v[13] is None else str(v[13])  # last_run_id: a uuid
    return ScheduleInfo(*v)


@dataclass(frozen=True, slots=True)
class StoredCadence:
    """A schedule's cadence as stored, and the database clock when it was read."""

    cron: str | None
    every: timedelta | None
    timezone: str
    now: datetime


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A schedule whose next tick is due (what a worker plans from)."""

    name: str
    cron: str | None
    every: timedelta | None
    timezone: str
    catchup: str
    catchup_limit: int
    next_fire_at: datetime
    db_now: datetime


@dataclass(frozen=True, slots=True)
class FiredTick:
    """One tick :data:`FIRE` handled: the run it started (None: none) and how
    (``started``, ``skipped``, ...)."""

    tick: datetime
    run_id: Any
    outcome: str


# -- create or update; returns 'created' | 'updated' | 'unchanged' (PD000 bad input)
UPSERT = scalar(
    "SELECT pgdurable.upsert_schedule(%s::text, %s::text, %s::interval, %s::text, %s::text, "
    "%s::text, %s::jsonb, %s::text, %s::integer, %s::text, %s::text, %s::integer, "
    "%s::timestamptz, %s::text)", str)
# -- after declaring: mark this declarer's schedules of these tasks not in names
MARK_UNDECLARED = statement("SELECT pgdurable.mark_undeclared(%s::text, %s::text[], %s::text[])")
# -- one declaring worker at a time (two deploys declaring different sets would otherwise
# -- lock each other's rows in opposite orders: upserts vs mark_undeclared); key DECLARE_LOCK_KEY
DECLARE_LOCK = statement("SELECT pg_advisory_xact_lock(%s::bigint)")
DECLARE_LOCK_KEY = 0x7067647363686564  # "pgdsched"
# -- one schedule's cadence, locked (resume plans from it); no row: unknown (PD160 from
# -- the caller). Locked by pgdurable._schedule (SECURITY DEFINER): the app role may not
# -- lock rows itself
CADENCE_FOR_UPDATE = record(
    "SELECT s.cron, s.every, s.timezone, pgdurable.now() FROM pgdurable._schedule(%s::text) s",
    StoredCadence)
# -- pause: true if it was running (PD160 unknown)
PAUSE = scalar("SELECT pgdurable.pause_schedule(%s::text)", bool)
# -- resume from a next tick: true if it was paused (PD160 unknown)
RESUME = scalar("SELECT pgdurable.resume_schedule(%s::text, %s::timestamptz)", bool)
# -- delete: false if there was none
DELETE = scalar("SELECT pgdurable.delete_schedule(%s::text)", bool)
# -- start a run now, outside the cadence; the run id (PD160 unknown)
TRIGGER = scalar("SELECT pgdurable.trigger_schedule(%s::text)", str)
# -- due schedules of these queues (no locks); one DueSchedule per row
DUE = record(
    "SELECT name, cron, every, timezone, catchup, catchup_limit, next_fire_at, db_now "
    "FROM pgdurable.due_schedules(%s::text[], %s::integer)", DueSchedule)
# -- fire ticks of one schedule under the next_fire_at fence; one FiredTick per tick
FIRE = record(
    "SELECT tick, run_id, outcome FROM pgdurable.fire_schedule(%s::text, %s::timestamptz, "
    "%s::timestamptz[], %s::timestamptz)", FiredTick)
# -- pause a schedule that cannot be planned (fenced like FIRE)
DISABLE = statement("SELECT pgdurable.disable_schedule(%s::text, %s::timestamptz, %s::text)")
#: The same as a probe of a worker's idle query (engine/services.py: one parameter, the
#: worker's queues; seconds until the next tick, NULL: none).
WAKEUP_PROBE = "pgdurable.schedule_wakeup(%s::text[])"
# -- seconds until the next tick in these queues (NULL: none)
WAKEUP = nullable("SELECT " + WAKEUP_PROBE, float)
# -- every schedule (or the one named), for listings; one ScheduleInfo per row
LIST = Query("""
SELECT s.name, s.cron, s.every, s.timezone, s.task, s.revision, s.queue, s.overlap, s.catchup,
       s.catchup_limit, s.paused, s.next_fire_at, s.last_tick, s.last_run_id,
       (SELECT r.status FROM pgdurable.runs r WHERE r.id = s.last_run_id) AS last_run_status,
       s.fired, s.skipped, s.last_error, s.declared_by, s.last_declared_at, s.undeclared_at,
       s.state
  FROM pgdurable.schedules s
 WHERE %s::text IS NULL OR s.name = %s::text
 ORDER BY s.name
""", _info)
# -- a schedule's runs, newest tick first (the CLI prints them)
RUNS = Listing("""
SELECT sr.run_id, sr.tick, sr.triggered, r.status, r.created_at, r.finished_at
  FROM pgdurable.schedule_runs sr JOIN pgdurable.runs r ON r.id = sr.run_id
 WHERE sr.schedule = %s::text
 ORDER BY sr.tick DESC
 LIMIT %s
""")
