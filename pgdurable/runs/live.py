"""Live readers of a run's or a thread's stream: stored events plus the live tail.

What the HTTP endpoints (:mod:`pgdurable.ops.http`) send a browser. A reader
reads the stored events after its cursor (``run_events``, through the app's
pool) and, between two stored text rows, the live tail of the text the step
is writing (``NOTIFY pgdurable_text``, :mod:`pgdurable.runs.text`), from the
process's one LISTEN connection (:mod:`pgdurable.foundation.notifier`):
ONE subscription per process for every tail (:class:`TailRouter`), handed
to the readers of each run; a reader is woken by its run's
``pgdurable_events`` (keyed by run id) and, for a thread, by
``pgdurable_threads`` (keyed by ``md5`` of its stored key: a new run).

**Cursors** say what a reader has delivered: ``"<seq>"`` (every stored
event up to ``seq``) or ``"<seq>+<n>"`` (and ``n`` code points of the text
that follows it: live tail, or the start of the next text rows); for a thread
``"<thread_no>:<seq>"`` and ``"<thread_no>:<seq>+<n>"``. Resuming from a
cursor skips those ``n`` code points of the next stored text rows, so a
reader that showed a tail which was then stored gets the rest of it, once. A
tail that was lost with its worker (SIGKILL) is written again by the step's
next attempt (a replay), and the skip lands on it; a tail that is never
stored again (a non-text event comes first) is dropped from the count.

Items are :class:`Item`: ``kind`` ``"text"`` (``text``: a delta) or
``"event"`` (``event``: any other stored event, markers and the final
``{"type": "end"}`` included); the reader of a run ends after its final
event.

**One message's answer** (``until=message_id``). Every event of a thread
belongs to the answer of ONE message, its *owner*: the latest message the
step that wrote it had taken (``ctx.inbox()``: ``thread_messages.taken_step``,
then ``consumed_step`` once its checkpoint committed); an event of a step
that took none belongs to the latest message the run took before (a tool
step, the run's final ``end``; none before the run took any: no message's).
A step stopped by an interrupt or a rollback
names its generation's owner in its marker (``"answering"``: the message's
thread seq): the step's next attempt takes the newer message too, so what it
writes belongs to the newer one. The reader of ``until`` delivers the events
it owns, from where that message was sent, and ends: after a marker that
stops its answer (``interrupted``, ``rollback``); at the first event of a
later message's answer; or once it is consumed and every event is read, when
a later message has been taken or the thread is idle (parked on its inbox,
or finished). So with ``enqueue`` an earlier message's stream ends with the
step(s) that answered it and the next starts at the step that took it (in
the same run, or in the follow-up run a lease transfer started); with
``interrupt`` the earlier one ends at its ``interrupted`` marker and the
step's re-run (answering both) is the later one's; messages taken together
by one step are answered by it, in the stream of the latest of them (the
others' streams are empty). While the run's current step has taken nothing
and messages wait for it (before its ``ctx.inbox()``, or a new attempt
after a crash, before it takes again), whose answer its events are is not
known: the reader waits for the take. A step that takes a newer message itself
mid-answer (a second ``ctx.inbox()``) makes its whole generation the newer
message's: a live reader of the older one has shown part of it, a replay
does not.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import weakref
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from ..foundation import run_queries as q
from ..foundation.errors import RunNotFound
from ..foundation.notifier import Notifier, Wakeup
from ..foundation.queries import live as lq
from ..foundation.queries.core import first, many
from .text import CHANNEL as TAIL_CHANNEL
from .threads import encode_thread_key

if TYPE_CHECKING:
    from ..foundation.ports import App

__all__ = ["Item", "TailRouter", "follow_run", "follow_thread", "parse_cursor"]

BATCH = 500
THREADS_CHANNEL = "pgdurable_threads"

_CURSOR = re.compile(r"(?:(\d+):)?(\d+)(?:\+(\d+))?")


@dataclass(frozen=True)
class Item:
    """One thing a live reader delivers (see the module docstring)."""

    kind: str  # "text" | "event"
    cursor: str
    run_id: str
    text: str = ""
    event: Any = None
    seq: int = 0
    final: bool = False


def parse_cursor(cursor: object, *, thread: bool) -> tuple[int, int, int]:
    """``(thread_no, seq, n)`` of a cursor string (``None``/``""``: the start)."""
    if cursor is None or cursor == "":
        return (0, 0, 0)
    m = _CURSOR.fullmatch(cursor) if isinstance(cursor, str) else None
    if m is None or (m[1] is not None) != thread:
        form = "thread_no:seq[+n]" if thread else "seq[+n]"
        raise ValueError(f"not a stream cursor ({form}): {cursor!r}")
    return (int(m[1] or 0), int(m[2]), int(m[3] or 0))


def _cursor(no: int | None, seq: int, n: int) -> str:
    base = str(seq) if no is None else f"{no}:{seq}"
    return f"{base}+{n}" if n else base


class TailRouter:
    """ONE ``pgdurable_text`` subscription of a notifier, handed out by run id."""

    def __init__(self, notifier: Notifier) -> None:
        self._readers: dict[str, set[_Tail]] = {}
        self._sub = notifier.subscribe((TAIL_CHANNEL,), self._notified)

    def _notified(self, n: psycopg.Notify) -> None:
        rid, _, rest = n.payload.partition(" ")
        readers = self._readers.get(rid)
        if not readers:
            return
        seq, _, rest = rest.partition(" ")
        at, _, text = rest.partition(" ")
        if not (seq.isdigit() and at.isdigit()):
            return
        for r in tuple(readers):
            r.push(int(seq), int(at), text)

    def add(self, rid: str, tail: _Tail) -> None:
        self._readers.setdefault(rid, set()).add(tail)

    def remove(self, rid: str, tail: _Tail) -> None:
        readers = self._readers.get(rid)
        if readers is not None:
            readers.discard(tail)
            if not readers:
                del self._readers[rid]


_routers: weakref.WeakKeyDictionary[Notifier, TailRouter] = weakref.WeakKeyDictionary()


def _router(app: App) -> TailRouter | None:
    notifier = app.notifier()
    if notifier is None:
        return None
    r = _routers.get(notifier)
    if r is None or r._sub.closed:
        r = _routers[notifier] = TailRouter(notifier)
    return r


class _Tail:
    """A reader's queue of tail chunks (bounded: a slow reader reads the database)."""

    def __init__(self, wake: asyncio.Event) -> None:
        self.chunks: deque[tuple[int, int, str]] = deque(maxlen=1000)
        self._wake = wake

    def push(self, seq: int, at: int, text: str) -> None:
        self.chunks.append((seq, at, text))
        self._wake.set()


class _Reader:
    """The shared part of a run and a thread reader: cursor, skip, tails."""

    def __init__(self, app: App, no: int | None, seq: int, n: int) -> None:
        self.app = app
        self.no, self.seq, self.n = no, seq, n
        self.rid: str | None = None
        self.woken = asyncio.Event()
        self.tail = _Tail(self.woken)
        self.router = _router(app)

    def follow_tail(self, rid: str) -> None:
        if rid == self.rid:
            return
        if self.router is not None:
            if self.rid is not None:
                self.router.remove(self.rid, self.tail)
            self.router.add(rid, self.tail)
        self.rid = rid
        self.tail.chunks.clear()

    def close_tail(self) -> None:
        if self.router is not None and self.rid is not None:
            self.router.remove(self.rid, self.tail)

    def row(self, rid: str, no: int | None, seq: int, event: Any,
            final: bool = False) -> Item | None:
        """A stored event after the cursor: the item to deliver (None: skipped)."""
        if no is not None and no != self.no:
            self.n = 0  # another run of the thread: its text is its own
        self.no, self.seq = no, seq
        if isinstance(event, dict) and event.get("type") == "text":
            text = str(event.get("text", ""))
            cut = min(self.n, len(text))
            self.n -= cut
            text = text[cut:]
            if not text:
                return None
            return Item("text", _cursor(no, seq, self.n), rid, text=text, seq=seq)
        self.n = 0
        return Item("event", _cursor(no, seq, 0), rid, event=event, seq=seq, final=final)

    def tails(self, rid: str) -> list[Item]:
        """The tail chunks that continue the cursor, as text items."""
        out: list[Item] = []
        while self.tail.chunks:
            seq, at, text = self.tail.chunks.popleft()
            if seq != self.seq or not (at <= self.n < at + len(text)):
                continue  # stale, or ahead of us: the stored rows will tell
            piece = text[self.n - at:]
            self.n += len(piece)
            out.append(Item("text", _cursor(self.no, self.seq, self.n), rid, text=piece,
                            seq=self.seq))
        return out

    async def wait(self, *wakers: Wakeup | None, poll: float) -> bool:
        """Until a notification, a tail chunk or ``poll`` seconds; whether to read
        the database again (anything but tail chunks alone)."""
        db = [asyncio.ensure_future(w.wait(poll)) for w in wakers if w is not None]
        tail = asyncio.ensure_future(self.woken.wait())
        try:
            done, _ = await asyncio.wait({*db, tail}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for f in (*db, tail):
                if not f.done():
                    f.cancel()
            self.woken.clear()
        return not self.tail.chunks or any(f in done for f in db)


def _stops(event: Any) -> bool:
    """Whether an event is a marker that stops a step's answer (an interrupt, a rollback)."""
    return isinstance(event, dict) and event.get("type") in ("interrupted", "rollback")


async def follow_run(app: App, run_id: Any, after: str | None = None, *,
                     poll: float = 1.0) -> AsyncIterator[Item]:
    """Items of ``run_id`` after the cursor ``after``, live, until its final event."""
    rid = str(q.check_run_id(run_id))
    _, seq, n = parse_cursor(after, thread=False)
    r = _Reader(app, None, seq, n)
    r.follow_tail(rid)
    waker = Wakeup(app.notifier(), "pgdurable_events", rid)
    try:
        await waker.listening(poll)
        read = True
        while True:
            if read:
                rows = await many(app, lq.LIVE_RUN, (r.seq, BATCH, rid))
                if not rows:
                    raise RunNotFound(f"no run {rid}")
                got = False
                for ev in rows:
                    if ev.seq is None:
                        continue
                    got = True
                    item = r.row(rid, None, int(ev.seq), ev.event, bool(ev.final))
                    if item is not None:
                        yield item
                    if ev.final:
                        return
                if got:
                    continue
                if rows[0].status in q.TERMINAL:
                    yield Item("event", _cursor(None, r.seq, 0), rid, final=True, seq=r.seq,
                               event={"type": "end", "status": rows[0].status})
                    return
            for item in r.tails(rid):
                yield item
            read = await r.wait(waker, poll=poll)
    finally:
        r.close_tail()
        await waker.close()


async def follow_thread(app: App, thread_key: str, after: str | None = None, *,
                        until: str | None = None, poll: float = 1.0,
                        end_on_rollback: bool = True) -> AsyncIterator[Item]:
    """Items of every run of ``thread_key`` after ``after``, live (see the module
    docstring); with ``until`` (a message id) only that message's answer: from
    where it starts (when ``after`` is None) until it is answered.
    ``end_on_rollback`` is kept for callers of earlier releases: a message's
    stream now always ends at the marker that stops its answer."""
    del end_on_rollback
    stored = encode_thread_key(thread_key)
    no, seq, n = parse_cursor(after, thread=True)
    me = 0
    if until is not None:
        found = await first(app, lq.MESSAGE_STATE, (stored, until))
        if found is None:
            raise LookupError(f"no message {until!r} in thread {thread_key!r}")
        me = int(found.seq)
        if after is None:
            no, seq = int(found.stream_no or 0), int(found.stream_seq or 0)
    r = _Reader(app, no, seq, n)
    # with until: whether the last event read was this message's (a resumed cursor is)
    mine = after is not None
    notifier = app.notifier()
    threads = Wakeup(notifier, THREADS_CHANNEL, hashlib.md5(stored.encode()).hexdigest())
    events: Wakeup | None = None
    try:
        await threads.listening(poll)
        head: lq.ThreadHead | None = None
        read = True
        while True:
            if not read:
                if head is not None and (until is None or mine):
                    for item in r.tails(str(head.run_id)):
                        yield item
                read = await r.wait(threads, events, poll=poll)
                continue
            head = await first(app, lq.THREAD_HEAD, (stored,))
            if head is not None:
                rid = str(head.run_id)
                if rid != r.rid:
                    r.follow_tail(rid)
                    if events is not None:
                        await events.close()
                    events = Wakeup(notifier, "pgdurable_events", rid)
                    await events.listening(poll)
            # read before the events: what it says holds for every event read after it
            m = None if until is None else await first(app, lq.MESSAGE_STATE, (stored, until))
            rows = await many(app, lq.THREAD_ANSWERS, (stored, r.no or 0, r.seq, BATCH,
                                                      stored, stored, stored))
            waiting = False
            for ev in rows:
                owner, event = ev.owner, ev.event
                if until is not None and ev.unknown:
                    waiting = True  # its step has not taken its messages yet: whose is it?
                    break
                if until is not None and owner is not None and int(owner) > me:
                    return  # a later message's answer: this one's is over
                got = r.row(str(ev.run_id), int(ev.thread_no), int(ev.seq), event)
                mine = until is None or (owner is not None and int(owner) == me)
                if got is not None and mine:
                    yield got
                if until is not None and mine and _stops(event):
                    return  # interrupted or rolled back: what follows answers a later one
            if rows and not waiting:
                continue
            if until is not None and not waiting and (m is None or (m.answered and (
                    m.later_taken or (head is not None and head.idle)))):
                return  # answered (and the next answer begun, or the thread idle): all read
            read = False
    finally:
        r.close_tail()
        await threads.close()
        if events is not None:
            await events.close()
