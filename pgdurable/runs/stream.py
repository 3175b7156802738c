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
``app.stream_thread``) are async iterators: they subscribe to the app's one
shared LISTEN connection (dedicated, autocommit, never used for work; opened
with the first stream of an event loop, closed with the last), then replay
from the cursor, then follow live; a missed notification is covered by a slow
poll (``poll`` seconds) and by a re-read after every reconnect of the
listener. The listener connects to the app's ``listen_dsn``, else its DSN;
behind a transaction-mode pooler without ``listen_dsn`` there is none and
streams follow by polling every ``poll`` seconds (a warning says so once).
Reads go through the app's pool. They read the database, not a worker,
so they continue across worker changes and crashes. ``stream_run`` ends after
the run's final event (for a run that never emitted and has no thread, a
synthesized final event with ``seq`` equal to the cursor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from ..foundation import run_queries as q
from ..foundation.aio import wait_set
from ..foundation.errors import DatabaseUnavailable, RunNotFound
from ..foundation.jsonb import dumps
from ..foundation.notifications import receive
from ..foundation.pooler import aconnect
from ..foundation.presence import CHANNELS as PRESENCE_CHANNELS
from ..foundation.presence import RECHECK, RENEW, announce
from .threads import encode_thread_key

if TYPE_CHECKING:
    from ..foundation.ports import App, StepContext

__all__ = ["StreamEvent", "emit", "stream_run", "stream_thread"]

log = logging.getLogger("pgdurable.stream")

CHANNEL = "pgdurable_events"
BATCH = 500

# -- fenced append/overwrite of the idx-th event of the current step; returns seq
EMIT = "SELECT pgdurable.emit_event(%s::uuid, %s::bigint, %s::text, %s::integer, %s::jsonb)"
# -- one snapshot: the run's status/result/error and its events after a cursor
READ_RUN = """
SELECT r.status, r.result, r.error, e.seq, e.event, e.final, e.created_at
  FROM pgdurable.runs r
  LEFT JOIN LATERAL (
    SELECT x.seq, x.event, x.final, x.created_at FROM pgdurable.run_events x
     WHERE x.run_id = r.id AND x.seq > %s ORDER BY x.seq LIMIT %s) e ON true
 WHERE r.id = %s::uuid
 ORDER BY e.seq
"""
# -- a thread's events after a (thread_no, seq) cursor, in thread order
READ_THREAD = """
SELECT r.id, r.thread_no, e.seq, e.event, e.final, e.created_at
  FROM pgdurable.runs r JOIN pgdurable.run_events e ON e.run_id = r.id
 WHERE r.thread_key = %s::text AND (r.thread_no, e.seq) > (%s, %s)
 ORDER BY r.thread_no, e.seq
 LIMIT %s
"""


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
    row = await app.fetchone(EMIT, (q.check_run_id(ctx.run_id), ctx.token, owner, idx, text))
    assert row is not None
    return int(row[0])


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


class _Hub:
    """One LISTEN connection per app (and event loop), shared by all its streams.

    A background task LISTENs on ``pgdurable_events`` (autocommit, never used
    for work) and sets the :class:`asyncio.Event` of every subscriber of the
    notified run id (and of every ``None`` subscriber: thread streams). After
    every (re)connect it sets all events (notifications may have been lost
    meanwhile), then reconnects with backoff on failure. The task and its
    connection end when the last subscriber leaves.

    On a watch-only channel (``pgdurable_done``) the hub also announces itself
    after its LISTEN and every :data:`~pgdurable.foundation.presence.RENEW` seconds (see
    :mod:`pgdurable.foundation.presence`), and sets all events again at each
    :data:`~pgdurable.foundation.presence.RECHECK` delay after the first announcement of
    a connection.
    """

    def __init__(self, conninfo: str | None, channel: str = CHANNEL) -> None:
        self.conninfo = conninfo  # None: no LISTEN possible (transaction pooler): poll
        self.channel = channel
        self.subs: dict[str | None, set[asyncio.Event]] = {}
        self.listening = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def subscribe(self, key: str | None) -> asyncio.Event:
        ev = asyncio.Event()
        self.subs.setdefault(key, set()).add(ev)
        if self.conninfo is None:
            self.listening.set()  # nothing to wait for: followers poll
            return ev
        if self.task is None or self.task.done():
            self.listening.clear()
            self.task = asyncio.create_task(self._run(), name="pgdurable-stream-listener")
        return ev

    async def unsubscribe(self, key: str | None, ev: asyncio.Event) -> None:
        group = self.subs.get(key)
        if group is not None:
            group.discard(ev)
            if not group:
                del self.subs[key]
        if not self.subs and self.task is not None:
            task, self.task = self.task, None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _recheck(self) -> None:
        """After a first announcement: every subscriber reads again soon, a few times."""
        loop = asyncio.get_running_loop()
        for delay in RECHECK:
            loop.call_later(delay, self._wake_all)

    def _wake_all(self) -> None:
        for group in self.subs.values():
            for ev in group:
                ev.set()

    def _notified(self, n: psycopg.Notify) -> None:
        for ev in self.subs.get(n.payload, ()):
            ev.set()
        for ev in self.subs.get(None, ()):
            ev.set()

    async def _run(self) -> None:
        assert self.conninfo is not None
        backoff = 0.1
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await aconnect(self.conninfo)
                conn.add_notify_handler(self._notified)  # also while a statement runs
                await conn.execute(f"LISTEN {self.channel}")
                presence = self.channel in PRESENCE_CHANNELS
                if presence:
                    await announce(conn, self.channel)
                    self._recheck()
                backoff = 0.1
                self.listening.set()
                self._wake_all()  # re-read: notifications may have been missed
                while True:
                    got = await receive(conn, RENEW if presence else 60.0)
                    if presence:  # also the health check of a quiet socket
                        await announce(conn, self.channel)
                    elif not got:
                        await conn.execute("SELECT 1")  # health check of a quiet socket
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError, DatabaseUnavailable) as exc:
                log.warning("stream listener lost: %s; reconnecting", exc)
                self.listening.clear()
                self._wake_all()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()


_hubs: dict[str, weakref.WeakKeyDictionary[
    Any, weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub]
]] = {}


def _hub(app: App, channel: str = CHANNEL) -> _Hub:
    """The app's shared listener on ``channel`` for the running event loop
    (``pgdurable_events`` for streams, ``pgdurable_done`` for results)."""
    by_app = _hubs.setdefault(channel, weakref.WeakKeyDictionary())
    per_loop = by_app.setdefault(app, weakref.WeakKeyDictionary())
    loop = asyncio.get_running_loop()
    hub = per_loop.get(loop)
    if hub is None:
        conninfo = app.listen_conninfo()
        if conninfo is None:
            log.warning("streams: no LISTEN: the app's DSN goes through a transaction-mode "
                        "pooler and no listen_dsn is set; following runs by polling")
        hub = per_loop[loop] = _Hub(conninfo, channel)
    return hub


class _Follower:
    """A subscription: ``start`` waits (at most ``poll``) for the LISTEN to be
    in place; ``wait`` returns on a notification for ``key`` or after ``poll``."""

    def __init__(self, app: App, key: str | None, poll: float) -> None:
        self.hub = _hub(app)
        self.key = key
        self.poll = poll
        self.event = self.hub.subscribe(key)

    async def start(self) -> None:
        await wait_set(self.hub.listening, self.poll)
        self.event.clear()

    async def wait(self) -> None:
        await wait_set(self.event, self.poll)
        self.event.clear()  # before the re-read: a later notification sets it again

    async def close(self) -> None:
        await self.hub.unsubscribe(self.key, self.event)


async def stream_run(
    app: App, run_id: Any, after: int = 0, *, poll: float = 1.0
) -> AsyncIterator[StreamEvent]:
    """Events of ``run_id`` with ``seq > after``, then live, until its final event."""
    rid = q.check_run_id(run_id)
    cursor = _check_after(after)
    poll = _check_poll(poll)
    follower = _Follower(app, str(rid), poll)
    try:
        await follower.start()
        while True:
            rows = await app.fetchall(READ_RUN, (cursor, BATCH, rid))
            if not rows:
                raise RunNotFound(f"no run {rid}")
            status, result, error = rows[0][0], rows[0][1], rows[0][2]
            got = False
            for row in rows:
                if row[3] is None:
                    continue
                got = True
                ev = StreamEvent(str(rid), int(row[3]), row[4], bool(row[5]), row[6])
                cursor = ev.seq
                yield ev
                if ev.final:
                    return
            if got:
                continue
            if status in q.TERMINAL:
                if cursor == 0:  # a run that never emitted (no final row written)
                    # as run_end.sql's end event: a completed run ended without error
                    err = None if error is None or status == "completed" else {
                        k: v for k, v in error.items() if k != "traceback"}
                    yield StreamEvent(
                        str(rid), 0, {"type": "end", "status": status, "result": result,
                                      "error": err}, True, None)
                return
            await follower.wait()
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
    follower = _Follower(app, None, poll) if follow else None
    try:
        if follower is not None:
            await follower.start()
        while True:
            rows = await app.fetchall(READ_THREAD, (stored_key, no, seq, BATCH))
            for row in rows:
                ev = StreamEvent(str(row[0]), int(row[2]), row[3], bool(row[4]), row[5],
                                 int(row[1]))
                no, seq = ev.thread_no or 0, ev.seq
                yield ev
            if rows:
                continue
            if follower is None:
                return
            await follower.wait()
    finally:
        if follower is not None:
            await follower.close()
