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
event. A thread reader with ``until=message_id`` ends when that message was
answered: consumed (or discarded) and the thread's owner idle (parked on its
inbox, or finished), with every event read.
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
from ..foundation.queries import stream as sq
from ..foundation.queries import threads as tq
from ..foundation.queries.core import first, many
from ..foundation.queries.runs import TERMINAL
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
                rows = await many(app, sq.LIVE_RUN_EVENTS, (r.seq, BATCH, rid))
                if not rows:
                    raise RunNotFound(f"no run {rid}")
                got = False
                for ev in rows:
                    if ev.seq is None:
                        continue
                    got = True
                    item = r.row(rid, None, ev.seq, ev.event, ev.final)
                    if item is not None:
                        yield item
                    if ev.final:
                        return
                if got:
                    continue
                if rows[0].status in TERMINAL:
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
                        until: str | None = None, poll: float = 1.0) -> AsyncIterator[Item]:
    """Items of every run of ``thread_key`` after ``after``, live (see the module
    docstring); with ``until`` (a message id) from where that message's answer
    starts (when ``after`` is None) until it is answered."""
    stored = encode_thread_key(thread_key)
    no, seq, n = parse_cursor(after, thread=True)
    if until is not None and after is None:
        answer = await first(app, tq.MESSAGE_ANSWER, (stored, until))
        if answer is None:
            raise LookupError(f"no message {until!r} in thread {thread_key!r}")
        no, seq = answer.stream_no, answer.stream_seq
    r = _Reader(app, no, seq, n)
    notifier = app.notifier()
    threads = Wakeup(notifier, THREADS_CHANNEL, hashlib.md5(stored.encode()).hexdigest())
    events: Wakeup | None = None
    try:
        await threads.listening(poll)
        head: tq.Head | None = None
        read = True
        while True:
            if not read:
                if head is not None:
                    for item in r.tails(head.run_id):
                        yield item
                read = await r.wait(threads, events, poll=poll)
                continue
            head = await first(app, tq.THREAD_HEAD, (stored,))
            if head is not None:
                rid = head.run_id
                if rid != r.rid:
                    r.follow_tail(rid)
                    if events is not None:
                        await events.close()
                    events = Wakeup(notifier, "pgdurable_events", rid)
                    await events.listening(poll)
            rows = await many(app, sq.THREAD_EVENTS, (stored, r.no or 0, r.seq, BATCH))
            for ev in rows:
                got = r.row(ev.run_id, ev.thread_no, ev.seq, ev.event)
                if got is not None:
                    yield got
            if rows:
                continue
            if until is not None and head is not None and head.idle:
                m = await first(app, tq.MESSAGE_ANSWER, (stored, until))
                if m is None or m.answered:
                    return  # answered, every event read
            read = False
    finally:
        r.close_tail()
        await threads.close()
        if events is not None:
            await events.close()
