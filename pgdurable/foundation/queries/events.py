"""Events (``sql/functions/events.sql``): send, park on a wait_event, cancel_on,
triggers and their windows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .children import Parked
from .core import Listing, Query, Row, record, scalar
from .partitions import DroppedPartition

__all__ = ["CANCEL_ON", "CREATE_PARTITIONS", "DROP_PARTITIONS", "DROP_PARTITIONS_TOTAL",
           "LIST_EVENTS", "PARK_EVENT", "PRUNABLE_EVENTS", "PRUNE_EVENTS", "SEND_EVENT",
           "TAKE_DUE_WINDOW", "TAKE_WINDOW", "UPSERT_TRIGGER", "DueWindow", "Event", "SentEvent",
           "WindowEvent"]


@dataclass(frozen=True)
class SentEvent:
    """What :func:`~pgdurable.runs.events.send_event` answers: the event's number and
    whether this call stored it (False: a duplicate id, nothing done again)."""

    id: int
    created: bool


@dataclass(frozen=True)
class Event:
    """An event as a trigger's handler gets it (oldest first)."""

    id: int
    name: str
    data: dict[str, Any]
    event_id: str | None
    time: datetime


@dataclass(frozen=True)
class WindowEvent:
    """One row of :data:`TAKE_WINDOW`: the window and one of its events."""

    window_id: int
    trigger: str
    key: str
    event: Event


@dataclass(frozen=True)
class DueWindow:
    """One row of :data:`TAKE_DUE_WINDOW`: the window's due time and one of its events
    (``event`` None: the window is not due yet, read it again at ``due_at``)."""

    due_at: datetime
    window_id: int
    event: Event | None


def _due_window(r: Row) -> DueWindow:
    event = None if r[4] is None else Event(int(r[4]), r[5], r[6], r[7], r[8])
    return DueWindow(r[0], int(r[1]), event)


def _window_event(r: Row) -> WindowEvent:
    return WindowEvent(int(r[0]), r[1], r[2], Event(int(r[3]), r[4], r[5], r[6], r[7]))


def _dropped(r: Row) -> DroppedPartition:
    return DroppedPartition(str(r[0]), str(r[1]), int(r[2]), int(r[3]))


def _parked(r: Row) -> Parked:
    return Parked(r[0], r[1], r[2])


# -- store an event and act on it (dedup by (name, id): PD015 on other data); one SentEvent
SEND_EVENT = record(
    "SELECT event_id, created FROM pgdurable.send_event(%s::text, %s::jsonb, %s::text)",
    SentEvent)
# -- fenced park on a wait_event (or wake at once with a stored event it sees);
# -- (status, wake_at, seconds until wake_at)
PARK_EVENT = Query(
    "SELECT status, wake_at, extract(epoch FROM wake_at - pgdurable.now())::float8 "
    "FROM pgdurable.park_event(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::numeric, "
    "%s::text, %s::jsonb, %s::interval)", _parked)
# -- wrap a start statement (its first column the run id): register its cancel_on
# -- entries in the same statement; the run id
CANCEL_ON = (
    "SELECT s.run_id FROM ({start}) s(run_id), "
    "LATERAL pgdurable.cancel_on_events(s.run_id::uuid, %s::text[], %s::text[], %s::jsonb) c"
)
# -- declare a trigger: 'created' | 'updated' | 'unchanged'
UPSERT_TRIGGER = scalar(
    "SELECT pgdurable.upsert_event_trigger(%s::text, %s::text, %s::text, %s::text, %s::text, "
    "%s::integer, %s::text, %s::interval, %s::interval, %s::boolean, %s::integer, "
    "%s::interval)", str)
# -- retention: one batch of old events no unfinished run needs, and emptied windows;
# -- rows deleted
PRUNE_EVENTS = scalar("SELECT pgdurable.prune_events(%s::interval, %s::integer)", int)
# -- dry run of PRUNE_EVENTS: how many events it would delete (windows not counted): older
# -- than the cut-off and than every unfinished run's horizon, in no unfinished run's window
PRUNABLE_EVENTS = scalar("""
SELECT count(*) FROM pgdurable.events e
 WHERE e.created_at < pgdurable.now() - %s::interval
   AND e.created_at < coalesce((
     SELECT min(coalesce(w.since, r.created_at)) FROM pgdurable.runs r
       LEFT JOIN pgdurable.event_waits w ON w.run_id = r.id
      WHERE r.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible')), 'infinity')
   AND NOT EXISTS (
     SELECT 1 FROM pgdurable.event_window_events we
       JOIN pgdurable.event_windows w ON w.id = we.window_id
       JOIN pgdurable.runs r ON r.id = w.run_id
      WHERE we.event_id = e.id AND we.event_at = e.created_at
        AND r.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible'))""", int)
# -- create the missing daily partitions of events from today to today + n days; how many
# -- params: (days_ahead)
CREATE_PARTITIONS = scalar("SELECT pgdurable.create_event_partitions(%s::integer, 0)", int)
# -- drop the daily partitions of events older than the cut-off (keeping what unfinished runs
# -- may read); one DroppedPartition per partition (history_table 'events')
# -- params: (older_than)
DROP_PARTITIONS = Query(
    "SELECT 'events', partition_name, rows_dropped, rows_kept "
    "FROM pgdurable.drop_event_partitions(%s::interval)", _dropped)
# -- the same, for retention: how many events the dropped partitions took with them
# -- params: (older_than)
DROP_PARTITIONS_TOTAL = scalar(
    "SELECT coalesce(sum(rows_dropped), 0)::bigint "
    "FROM pgdurable.drop_event_partitions(%s::interval)", int)
# -- the events of the window that started a run, oldest first; one WindowEvent per row
TAKE_WINDOW = Query(
    "SELECT window_id, trigger, key, id, name, data, event_id, created_at "
    "FROM pgdurable.take_event_window(%s::uuid)", _window_event)
# -- the events of the window that started a run once it is due (closing it), oldest first;
# -- else one row with its due time and no event; one DueWindow per row
TAKE_DUE_WINDOW = Query(
    "SELECT due_at, window_id, trigger, key, id, name, data, event_id, created_at "
    "FROM pgdurable.take_due_event_window(%s::uuid)", _due_window)
# -- the newest events (of one name, or all: NULL), with what each triggered (the view
# -- event_list, which the read-only role may read)
LIST_EVENTS = Listing("""
SELECT id, name, event_key, created_at, data, triggered FROM pgdurable.event_list
 WHERE %(name)s::text IS NULL OR name = %(name)s::text
 ORDER BY id DESC LIMIT %(limit)s::integer
""")
