"""The output stream: what a run emits, replayable from a cursor and followable live.

A step calls ``await ctx.emit(event)`` (any JSON value): ONE fenced call of
``pgdurable.emit_event`` appends it to ``pgdurable.run_events`` with the next
sequence number and NOTIFYs ``pgdurable_events`` (payload = run id). The event
is keyed by (step, index within the step): a step that is retried re-emits
into the same rows (overwritten in place, same ``seq``) instead of appending,
so a retry never duplicates events. (A retry that emits *different* events
replaces them in place; a reader that already passed those ``seq`` keeps the
first version, and events beyond what the retry emits stay as they were.)

When a run that has a thread or emitted events becomes terminal, a final
event ``{"type": "end", "status", "result", "error"}`` (``final=True``) is
written in the same transaction: a reader sees completion after the last event.

:func:`stream_run` / :func:`stream_thread` (``app.stream`` /
``app.stream_thread``) are async iterators: they subscribe to
``pgdurable_events`` on the app's notifier (the process's one LISTEN
connection, :mod:`pgdurable.foundation.notifier`, shared with its workers,
result waiters and dashboard), then replay from the cursor, then follow live;
a missed notification is covered by a slow poll (``poll`` seconds) and by a
re-read after every reconnect of the notifier. It connects to the app's
``listen_dsn``, else its DSN; behind a transaction-mode pooler without
``listen_dsn`` there is none and streams follow by polling every ``poll``
seconds (a warning says so once).
Reads go through the app's pool. They read the database, not a worker,
so they continue across worker changes and crashes. ``stream_run`` ends after
the run's final event (for a run that never emitted and has no thread, a
synthesized final event with ``seq`` equal to the cursor).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..foundation import run_queries as q
from ..foundation.errors import RunNotFound
from ..foundation.jsonb import dumps
from ..foundation.notifier import Wakeup
from ..foundation.queries import stream as sq
from ..foundation.queries.core import many, one
from ..foundation.queries.runs import TERMINAL
from .threads import encode_thread_key

if TYPE_CHECKING:
    from ..foundation.ports import App, StepContext

__all__ = ["StreamEvent", "emit", "stream_run", "stream_thread"]

log = logging.getLogger("pgdurable.stream")

CHANNEL = "pgdurable_events"
BATCH = 500

@dataclass(frozen=True)
class StreamEvent:
    """One event of a run's output stream.

    ``seq`` is its position in the run's stream (1, 2, ...); ``final`` marks
    the run's last event (``{"type": "end", "status", ...}``; the end event
    of an earlier life of a run that ``retry_run`` revived is yielded with
    ``final=False``: the run goes on after it). ``thread_no``
    is the run's position in its thread (``stream_thread`` only). ``cursor``
    resumes after this event: pass it as ``after=``.
    """

    run_id: str
    seq: int
    event: Any
    final: bool
    created_at: datetime | None
    thread_no: int | None = None

    @property
    def cursor(self) -> Any:
        """``seq`` for a run stream, ``"<thread_no>:<seq>"`` for a thread stream."""
        return self.seq if self.thread_no is None else f"{self.thread_no}:{self.seq}"


async def emit(ctx: StepContext, event: Any) -> int:
    """``ctx.emit(event)``: append the step's next event (fenced); return its seq."""
    text = dumps(event, "event")
    app, owner = ctx._attached()
    idx = ctx._emitted
    ctx._emitted += 1
    return await one(app, sq.EMIT, (q.check_run_id(ctx.run_id), ctx.token, owner, idx, text))


def _check_after(after: object) -> int:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError("after must be an int >= 0 (a seq from StreamEvent.cursor)")
    return after


def _check_poll(poll: object) -> float:
    """The slow-poll period in seconds: a finite number > 0 (0 would busy-poll)."""
    if isinstance(poll, bool) or not isinstance(poll, int | float):
        raise TypeError(f"poll must be a number of seconds, not {type(poll).__name__}")
    if not math.isfinite(poll) or poll <= 0:
        raise ValueError(f"poll must be a finite number of seconds > 0, not {poll!r}")
    return float(poll)


def parse_thread_cursor(after: object) -> tuple[int, int]:
    """A thread cursor (``None``, ``"no:seq"`` or ``(no, seq)``) as a tuple."""
    if after is None:
        return (0, 0)
    if isinstance(after, str):
        no, sep, seq = after.partition(":")
        if sep and no.isdigit() and seq.isdigit():
            return (int(no), int(seq))
    elif (
        isinstance(after, tuple)
        and len(after) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in after)
    ):
        return (after[0], after[1])
    raise ValueError(f"thread cursor must be None, 'thread_no:seq' or a tuple, not {after!r}")


_warned: weakref.WeakSet[Any] = weakref.WeakSet()  # apps told once that they poll


def _wakeup(app: App, key: str | None) -> Wakeup:
    """A follower's subscription to ``pgdurable_events`` on the app's notifier
    (for run ``key``; None: every run, a thread stream)."""
    notifier = app.notifier()
    if notifier is None and app not in _warned:
        _warned.add(app)
        log.warning("streams: no LISTEN: the app's DSN goes through a transaction-mode "
                    "pooler and no listen_dsn is set; following runs by polling")
    return Wakeup(notifier, CHANNEL, key)


async def stream_run(
    app: App, run_id: Any, after: int = 0, *, poll: float = 1.0
) -> AsyncIterator[StreamEvent]:
    """Events of ``run_id`` with ``seq > after``, then live, until its final event."""
    rid = q.check_run_id(run_id)
    cursor = _check_after(after)
    poll = _check_poll(poll)
    follower = _wakeup(app, str(rid))
    try:
        await follower.listening(poll)
        while True:
            rows = await many(app, sq.RUN_EVENTS, (cursor, BATCH, rid))
            if not rows:
                raise RunNotFound(f"no run {rid}")
            status, result, error = rows[0].status, rows[0].result, rows[0].error
            got = False
            for row in rows:
                if row.seq is None:
                    continue
                got = True
                ev = StreamEvent(str(rid), row.seq, row.event, row.final, row.created_at)
                cursor = ev.seq
                yield ev
                if ev.final:
                    return
            if got:
                continue
            if status in TERMINAL:
                if cursor == 0:  # a run that never emitted (no final row written)
                    # as run_end.sql's end event: a completed run ended without error
                    err = None if error is None or status == "completed" else {
                        k: v for k, v in error.items() if k != "traceback"}
                    yield StreamEvent(
                        str(rid), 0, {"type": "end", "status": status, "result": result,
                                      "error": err}, True, None)
                return
            await follower.wait(poll)
    finally:
        await follower.close()


async def stream_thread(
    app: App, thread_key: str, after: Any = None, *, follow: bool = True, poll: float = 1.0
) -> AsyncIterator[StreamEvent]:
    """Events of every run of ``thread_key`` (any str key) after the cursor, in thread order.

    With ``follow`` (default) it never ends by itself (stop iterating, or
    ``aclose()``); with ``follow=False`` it ends after the replay.
    """
    stored_key = encode_thread_key(thread_key)  # the runs.thread_key form
    no, seq = parse_thread_cursor(after)
    poll = _check_poll(poll)
    follower = _wakeup(app, None) if follow else None
    try:
        if follower is not None:
            await follower.listening(poll)
        while True:
            rows = await many(app, sq.THREAD_EVENTS, (stored_key, no, seq, BATCH))
            for row in rows:
                ev = StreamEvent(row.run_id, row.seq, row.event, row.final, row.created_at,
                                 row.thread_no)
                no, seq = ev.thread_no or 0, ev.seq
                yield ev
            if rows:
                continue
            if follower is None:
                return
            await follower.wait(poll)
    finally:
        if follower is not None:
            await follower.close()
