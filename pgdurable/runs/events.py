"""Events: rows that wake waits, cancel runs and start triggered runs (docs/events.md).

An event is a row of ``pgdurable.events``: a ``name``, JSON ``data`` (an
object), an optional ``id`` for deduplication (unique per name) and its time
on the database clock. ``pgdurable.send_event`` (``sql/functions/events.sql``)
stores it and, in the same transaction (the caller's with ``conn=``):

* **cancel_on** -- cancels every unfinished run started with
  ``cancel_on=[(name, "data.path", value)]`` that the event matches, through
  ``cancel_run`` (at once when runnable or parked; a leased run's worker stops
  its step). Racing the run's completion, the first commit wins: the run ends
  ``completed`` or ``cancelled``, never both.
* **waits** -- wakes every run parked on a matching ``wait_event`` (by an
  index lookup on ``(wait_kind, wait_ref)``, never a scan of the waiting runs).
* **triggers** -- adds the event to a window of every trigger on its name
  (``@app.on_event``): one run per event, per debounce window or per batch,
  keyed by a path of the data. The database decides (a lock per trigger and
  key, the window row, the run's claim count): one run per window, across any
  number of workers and senders.

Dedup: the same ``(name, id)`` with the same data returns the first event's
number and does nothing again; with other data it raises
:class:`~pgdurable.EventConflict` and changes nothing. Bad input
(``TypeError``/``ValueError``, or :class:`~pgdurable.InvalidInput` from the
database) writes nothing.

**Which events a wait sees.** A ``wait_event(name, match)`` is satisfied by
an event of ``name`` whose every ``match`` path equals its value and whose
time (the sending transaction's ``pgdurable.now()``) is at or after the
wait's *since*: the run's creation for its first event wait, afterwards the
time of the event that ended its previous event wait (that event itself and
any other an earlier wait returned are never returned again; a timeout does
not move *since*). So an event sent after the run started, or after the
event that ended its previous wait -- in particular one sent by, or while, a
previous step ran, before the run parked -- is found when it parks, not lost.
The oldest such event is returned first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from ..foundation import jsonb as _json
from ..foundation.db import translated
from ..foundation.events import (
    DEFAULT_MAX_EVENT_DATA,
    check_match,
    check_path,
    check_scalar,
    event_params,
    match_json,
)
from ..foundation.queries import events as eq
from ..foundation.queries.core import AsyncTarget, many, many_sync, one, one_sync
from ..foundation.queries.events import Event, SentEvent
from ..foundation.run_queries import check_name
from .steps import Done, RunContext, Sleep, in_thread

if TYPE_CHECKING:
    from ..foundation.ports import App

__all__ = [
    "DEFAULT_MAX_EVENT_DATA",
    "Event",
    "EventTriggers",
    "EventTrigger",
    "SentEvent",
    "cancel_on_statement",
    "check_match",
    "declare_trigger",
    "declare_triggers",
    "declared_triggers",
    "due_window",
    "event_params",
    "make_trigger",
    "match_json",
    "prune_events",
    "send_event",
    "send_event_sync",
    "take_window",
    "take_window_sync",
    "trigger_step",
]

async def send_event(app: AsyncTarget, name: object, data: object, event_id: object, *,
                     conn: psycopg.AsyncConnection[Any] | None = None,
                     max_bytes: int | None = DEFAULT_MAX_EVENT_DATA) -> SentEvent:
    """Send one event (one statement); ``conn``: inside the caller's transaction."""
    params = event_params(name, data, event_id, max_bytes)
    if conn is not None:
        with translated():
            return await one(conn, eq.SEND_EVENT, params)
    return await one(app, eq.SEND_EVENT, params)


def send_event_sync(db: Any, name: object, data: object, event_id: object, *,
                    conn: psycopg.Connection[Any] | None = None,
                    max_bytes: int | None = DEFAULT_MAX_EVENT_DATA) -> SentEvent:
    """Sync twin of :func:`send_event` (``db``: the sync client)."""
    params = event_params(name, data, event_id, max_bytes)
    if conn is not None:
        with translated():
            return one_sync(conn, eq.SEND_EVENT, params)
    return one_sync(db, eq.SEND_EVENT, params)


def cancel_on_statement(sql: str, params: tuple[Any, ...],
                        cancel_on: Iterable[tuple[str, str, Any]] | None
                        ) -> tuple[str, tuple[Any, ...]]:
    """A start statement wrapped to register ``cancel_on`` in the same statement
    (unchanged without). Each entry is ``(event name, "data.path", scalar value)``;
    bad entries: TypeError/ValueError before any SQL."""
    if cancel_on is None:
        return sql, params
    if isinstance(cancel_on, str | bytes) or not isinstance(cancel_on, Iterable):
        raise TypeError("cancel_on must be a list of (event name, 'data.path', value)")
    names: list[str] = []
    paths: list[str] = []
    values: list[Any] = []
    for entry in cancel_on:
        if not isinstance(entry, tuple | list) or len(entry) != 3:
            raise TypeError("each cancel_on entry must be (event name, 'data.path', value)")
        name, path, value = entry
        check_name(name, "cancel_on event name")
        check_path(path, "cancel_on path")
        check_scalar(value, "cancel_on value")
        names.append(name)
        paths.append(path)
        values.append(value)
    if not names:
        return sql, params
    return (eq.CANCEL_ON.format(start=sql),
            (*params, names, paths, _json.dumps(values, "cancel_on values")))


# -- triggers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class EventTrigger:
    """A trigger (``@app.on_event``): events named ``event`` start runs of ``task``."""

    name: str
    event: str
    task: str
    revision: str
    queue: str
    max_attempts: int
    key: str | None
    debounce: timedelta | None
    max_wait: timedelta | None
    leading: bool
    batch: int | None
    batch_timeout: timedelta | None

    def params(self) -> tuple[Any, ...]:
        """:data:`~pgdurable.foundation.queries.events.UPSERT_TRIGGER`'s parameters."""
        return (self.name, self.event, self.task, self.revision, self.queue, self.max_attempts,
                self.key, self.debounce, self.max_wait, self.leading, self.batch,
                self.batch_timeout)


def _positive(value: object, what: str) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise TypeError(f"{what} must be a timedelta")
    if value <= timedelta(0) or value > timedelta(days=36_500):
        raise ValueError(f"{what} must be positive and at most 100 years")
    return value


def make_trigger(name: str, event: object, task: str, revision: str, queue: str,
                 max_attempts: int, key: object = None, debounce: object = None,
                 max_wait: object = None, leading: object = False, batch: object = None,
                 batch_timeout: object = None) -> EventTrigger:
    """Validate a trigger definition (TypeError/ValueError naming what is wrong)."""
    check_name(event, "event name")
    if key is not None:
        check_path(key, "key")
    d = _positive(debounce, "debounce")
    mw = _positive(max_wait, "max_wait")
    bt = _positive(batch_timeout, "batch_timeout")
    if not isinstance(leading, bool):
        raise TypeError("leading must be a bool")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int)):
        raise TypeError("batch must be an int")
    if batch is not None and not 1 <= batch <= 10_000:
        raise ValueError("batch must be between 1 and 10000")
    if mw is not None and d is None:
        raise ValueError("max_wait needs debounce")
    if leading and d is None:
        raise ValueError("leading needs debounce")
    if bt is not None and batch is None:
        raise ValueError("batch_timeout needs batch")
    if batch is not None and batch > 1 and bt is None and d is None:
        raise ValueError("batch needs batch_timeout (or debounce): a batch that never fills "
                         "would never run")
    assert isinstance(event, str)
    return EventTrigger(name, event, task, revision, queue, max_attempts,
                        key if isinstance(key, str) else None, d, mw, leading,
                        batch if isinstance(batch, int) else None, bt)


_DECLARED: weakref.WeakKeyDictionary[Any, dict[str, EventTrigger]] = weakref.WeakKeyDictionary()


def declared_triggers(app: App) -> dict[str, EventTrigger]:
    """The triggers ``app`` declares in code, by name."""
    return _DECLARED.setdefault(app, {})


def declare_trigger(app: App, trigger: EventTrigger) -> EventTrigger:
    """Remember ``trigger`` (written when a worker of the app starts, or by
    :func:`declare_triggers`)."""
    mine = declared_triggers(app)
    if trigger.name in mine and mine[trigger.name] != trigger:
        raise ValueError(f"event trigger {trigger.name!r} is already declared differently")
    mine[trigger.name] = trigger
    return trigger


async def declare_triggers(app: App) -> list[str]:
    """Upsert ``app``'s declared triggers (idempotent); what each upsert answered."""
    mine = sorted(declared_triggers(app).values(), key=lambda t: t.name)
    if not mine:
        return []
    await app.open()
    return [await one(app, eq.UPSERT_TRIGGER, t.params()) for t in mine]


class EventTriggers:
    """A worker service (:class:`pgdurable.engine.services.Service`): the app's declared
    triggers (:meth:`~pgdurable.Durable.on_event`) are written when a worker starts
    (:func:`declare_triggers`; a failure keeps the worker from starting). Plugged in by
    ``Durable.worker()``."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def start(self, worker_id: str) -> None:
        """Write the triggers (idempotent)."""
        await declare_triggers(self.app)

    async def stop(self, worker_id: str) -> None:
        """Nothing to undo: the triggers stay declared."""


async def prune_events(app: App, older_than: timedelta, batch: int = 1000) -> int:
    """Delete events older than ``older_than`` that no unfinished run needs (and the
    emptied windows of finished runs), in batches of short transactions; how many rows."""
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise ValueError("older_than must be a timedelta >= 0")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 100_000:
        raise ValueError("batch must be an int between 1 and 100000")
    total = 0
    while True:
        n = await one(app, eq.PRUNE_EVENTS, (older_than, batch))
        total += n
        if n < batch:
            return total


async def take_window(app: App, run_id: str) -> list[Event]:
    """The events of the window that started run ``run_id``, oldest first."""
    rows = await many(app, eq.TAKE_WINDOW, (run_id,))
    return [r.event for r in rows]


def take_window_sync(db: Any, run_id: str) -> list[Event]:
    """Sync twin of :func:`take_window`."""
    return [r.event for r in many_sync(db, eq.TAKE_WINDOW, (run_id,))]


Handler = Callable[[RunContext, list[Event]], Any]


def _state_events(state: Any) -> list[Event] | None:
    """The events a window of one event handed its run in the run's state (None: the
    run reads its window)."""
    raw = state.get("events") if isinstance(state, dict) else None
    if not isinstance(raw, list):
        return None
    return [Event(int(e["id"]), e["name"], e["data"], e["event_id"],
                  datetime.fromisoformat(e["time"])) for e in raw]


async def due_window(app: App, run_id: str) -> list[Event] | datetime:
    """The events of run ``run_id``'s window, oldest first, once it is due (reading
    closes it); else the time it is due (events came since the run was started)."""
    rows = await many(app, eq.TAKE_DUE_WINDOW, (run_id,))
    if rows and rows[0].event is None:
        return rows[0].due_at
    return [r.event for r in rows if r.event is not None]


def trigger_step(handler: Handler) -> Callable[[RunContext, Any], Awaitable[Done | Sleep]]:
    """The step function of a trigger's task: read the run's window, call
    ``handler(ctx, events)`` (async, or sync in a thread), complete the run with
    its return value. A window of one event comes in the run's state (no read); a
    window that is not due yet (a debounce moved on by later events) is read again
    when it is (the run sleeps until then). A retried step gets the same events."""
    is_async = asyncio.iscoroutinefunction(handler)

    async def step(ctx: RunContext, state: Any) -> Done | Sleep:
        app = ctx._app
        if app is None:
            raise RuntimeError("this RunContext is not attached to a worker")
        events = _state_events(state)
        if events is None:
            got = await due_window(app, ctx.run_id)
            if isinstance(got, datetime):
                return Sleep(until=got)
            events = got
        if is_async:
            result = await handler(ctx, events)
        else:
            result = await in_thread(handler, ctx, events)
        return Done(result)

    step.__name__ = getattr(handler, "__name__", "on_event")
    step.__doc__ = handler.__doc__
    return step
