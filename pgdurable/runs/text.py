"""Token streams from a step: ``await ctx.emit_text(delta)``.

A row per token is too expensive and a NOTIFY per token hits PostgreSQL's
one notification lock at every commit (PITFALLS #1). So the tokens of a step
are buffered in the worker process, and ONE writer per process and event
loop (:class:`TextWriter`) sends, every :data:`TICK` seconds while any step
has new text, ONE statement (``pgdurable.stream_tick``) for every stream of
the process, in one transaction (one notifying commit):

* the **live tail** of each stream: the text emitted since its last tail, as
  small ``NOTIFY pgdurable_text`` payloads (``"<run id> <seq> <offset>
  <text>"``, each under 8000 bytes), fenced by the lease; not stored;
* a **durable flush** of each stream whose pending text is older than
  :data:`FLUSH_EVERY` seconds or larger than :data:`FLUSH_BYTES`: ONE
  ``run_events`` row ``{"type": "text", "text": ...}`` with all of it,
  fenced by the lease, NOTIFYing ``pgdurable_events`` like ``ctx.emit``.

The step's pending text is also flushed (and awaited) **before every
checkpoint**: when the step function returns (before its ``Continue``,
``Done``, ``Wait`` or ``Sleep`` is written), before each workflow step's
checkpoint, and before every ``ctx.emit(event)`` (events and text keep
their order). The first ``emit_text`` of a step attempt is flushed at once
(the first token is durable and the writer learns where the step's text
stands).

**What a crash can lose.** A worker killed with SIGKILL loses at most the
text emitted since its stream's last durable flush (the unflushed tail: at
most :data:`FLUSH_EVERY` seconds or :data:`FLUSH_BYTES` of text). A flushed
token is never lost and never written twice: the next attempt of the step
*replays* its text, and what an earlier attempt of the step flushed is
skipped (the offsets of a step's text are counted in code points from the
step's start), so a step that produces the same text again continues exactly
where the durable text ends. A live reader that had already shown some of
the lost tail continues after it (:mod:`pgdurable.runs.live` counts what it
showed): with the same text again, no gap and no duplicate. A step whose
text differs on a retry (an LLM sampling again) should call
:meth:`~pgdurable.RunContext.text_so_far` and continue from it instead.

**Interrupts and rollbacks** (double-texting, :mod:`pgdurable.runs.threads`)
stop a step at a *safe point*: an ``emit_text`` or ``emit`` call after a
durable flush found, for the step's thread, a newer message sent with
``double_text="interrupt"`` or ``"rollback"`` while the step was answering an
older one. Then ONE fenced ``pgdurable.stop_step`` keeps (interrupt) or
discards (rollback) the step's answer, writes a marker event
(``{"type": "interrupted"}`` / ``{"type": "rollback", "discard_after": seq}``,
each with ``"answering"``: the thread seq of the latest message the step took,
whose answer the marker ends; :mod:`pgdurable.runs.live`) and releases the run, and the step's call raises
:class:`~pgdurable.runs.steps.RunSettled` (the worker writes nothing more);
the run's next attempt takes the messages again (:func:`stop_step`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import weakref
from typing import TYPE_CHECKING, Any

from ..foundation import run_queries as q
from ..foundation.errors import InvalidInput, LeaseLost
from ..foundation.queries import text_stream as tq
from ..foundation.queries.core import first, many
from .settled import RunSettled

if TYPE_CHECKING:
    from ..foundation.ports import App, StepContext

__all__ = ["FLUSH_BYTES", "FLUSH_EVERY", "TAIL_BYTES", "TICK", "StepText", "TextWriter",
           "emit_text", "finish", "settle"]

log = logging.getLogger("pgdurable.stream")

#: Seconds between two ticks of a process's writer (while some step has new text).
TICK = 0.02
#: A stream's pending text is written as a row when it is this many seconds old ...
FLUSH_EVERY = 0.1
#: ... or this many bytes (UTF-8) long, whichever comes first.
FLUSH_BYTES = 2048
#: Largest text (UTF-8 bytes) of one live-tail NOTIFY payload (the limit is 8000).
TAIL_BYTES = 7000
#: A step whose pending text reaches this many bytes waits for its flush.
BACKPRESSURE = 8 * FLUSH_BYTES

CHANNEL = "pgdurable_text"

def check_delta(delta: object) -> str:
    """A text delta: a ``str`` without NUL or lone surrogates (JSONB holds neither)."""
    if not isinstance(delta, str):
        raise TypeError(f"emit_text(delta) needs a str, not {type(delta).__name__}")
    if "\x00" in delta:
        raise ValueError("emit_text(delta): text cannot contain NUL")
    try:
        delta.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("emit_text(delta): text contains a lone surrogate") from None
    return delta


def _utf8_cut(text: str, limit: int) -> int:
    """How many code points of ``text`` fit in ``limit`` bytes of UTF-8 (at least one)."""
    size = 0
    for i, ch in enumerate(text):
        size += len(ch.encode("utf-8"))
        if size > limit:
            return max(1, i)
    return len(text)


class StepText:
    """The text stream of one attempt of one step (``ctx._text``).

    Offsets are code points from the start of the step's text generation.
    ``emitted``: what this attempt emitted; ``durable``: what is stored (as
    the last flush said); ``buf`` the text from ``base`` on that is not
    stored yet, of which ``tail`` code points went out as live tail after
    the run's event ``seq``.
    """

    def __init__(self, run_id: uuid.UUID, token: int, owner: str, step: int) -> None:
        self.run_id = run_id
        self.token = token
        self.owner = owner
        self.step = step
        self.emitted = 0
        self.durable = 0
        self.base = 0
        self.buf = ""
        self.tail = 0
        self.seq: int | None = None  # the run's last event seq, as our last flush left it
        self.known = False  # a durable flush answered: durable and seq are the database's
        self.since = 0.0  # monotonic time of the oldest pending text
        self.force = False  # flush at the next tick whatever its age
        self.interrupt: str | None = None
        self.error: BaseException | None = None
        self.closed = False
        self.waiters: list[asyncio.Future[None]] = []

    def add(self, delta: str) -> None:
        """Buffer ``delta`` (the part beyond what is stored already)."""
        start = self.emitted
        self.emitted += len(delta)
        if self.emitted <= self.durable:
            return  # a replay of text an earlier attempt flushed
        if start < self.durable:
            delta = delta[self.durable - start:]
        if not self.buf:
            self.since = time.monotonic()
        self.buf += delta

    def flushed(self, sent: int, seq: int, have: int) -> None:
        """A durable flush of the first ``sent`` code points of ``buf`` succeeded."""
        self.buf = self.buf[sent:]
        self.tail = max(0, self.tail - sent)
        self.base += sent
        self.seq, self.durable, self.known = seq, have, True
        if self.durable > self.base:  # the database had more (an earlier attempt's)
            cut = self.durable - self.base
            self.buf, self.base = self.buf[cut:], self.durable
            self.tail = max(0, self.tail - cut)
        if self.buf:
            self.since = time.monotonic()
        else:
            self._wake_waiters()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


class TextWriter:
    """The process's (event loop's) writer of text streams for one app: see the
    module docstring. Get it with :func:`writer_for`."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.streams: set[StepText] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: asyncio.Future[None] | None = None
        self.ticks = 0  # statements sent (benchmarks, tests)

    def open(self, s: StepText) -> None:
        self.streams.add(s)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="pgdurable-text-writer")

    def poke(self) -> None:
        self._wake.set()

    async def quiet(self) -> None:
        """Wait for the statement in flight (if any) to be answered."""
        if self._inflight is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._inflight)

    def close(self, s: StepText) -> None:
        s.closed = True
        self.streams.discard(s)
        s._wake_waiters()
        self._wake.set()  # the loop ends when no stream is left

    async def _run(self) -> None:
        while self.streams:
            await self._wake.wait()
            self._wake.clear()
            started = time.monotonic()
            batch = self._batch()
            if batch:
                await self._send(batch)
            # the next tick: at most one statement per TICK (coalescing), sooner if idle
            if any(s.buf or s.force for s in self.streams):
                self._wake.set()
                await asyncio.sleep(max(0.0, TICK - (time.monotonic() - started)))
        self._task = None

    def _batch(self) -> list[tuple[StepText, bool, int, str]]:
        """(stream, durable, code points sent, text) for every stream with news."""
        now = time.monotonic()
        out: list[tuple[StepText, bool, int, str]] = []
        for s in self.streams:
            if s.error is not None or s.closed:
                continue
            if s.buf and (s.force or not s.known or now - s.since >= FLUSH_EVERY
                          or len(s.buf.encode("utf-8")) >= FLUSH_BYTES):
                out.append((s, True, len(s.buf), s.buf))
            elif s.force and not s.buf:
                s.force = False
                s._wake_waiters()
            elif s.known and len(s.buf) > s.tail:
                new = s.buf[s.tail:]
                at = s.tail
                while new:
                    n = _utf8_cut(new, TAIL_BYTES)
                    out.append((s, False, at, new[:n]))
                    at += n
                    new = new[n:]
        return out

    async def _send(self, batch: list[tuple[StepText, bool, int, str]]) -> None:
        params = (
            [s.run_id for s, *_ in batch], [s.token for s, *_ in batch],
            [s.owner for s, *_ in batch], [s.step for s, *_ in batch],
            [s.base if durable else at for s, durable, at, _ in batch],
            [text for *_, text in batch], [durable for _, durable, _, _ in batch],
            [None if durable and not s.known else s.seq for s, durable, _, _ in batch],
        )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight = done
        self.ticks += 1
        try:
            rows = await many(self.app, tq.TICK, params)
        except Exception as exc:  # the database, not one stream: try again next tick
            log.warning("text streams: tick failed (%s); retrying", exc)
            await asyncio.sleep(TICK)
            self._wake.set()
            return
        finally:
            done.set_result(None)
            self._inflight = None
        for (s, durable, count, text), row in zip(batch, rows, strict=True):
            status = row.status
            if status == "lost":
                s.fail(LeaseLost(f"lease lost on run {s.run_id} (text stream)"))
            elif status == "gap":
                s.fail(InvalidInput(f"run {s.run_id} step {s.step}: text offset beyond the "
                                    "stored text (a bug: please report it)"))
            elif status == "busy":
                self._wake.set()
            elif durable:
                assert row.seq is not None and row.have is not None  # a durable flush's
                s.flushed(count, row.seq, row.have)
                s.force = False
                if row.interrupt is not None:
                    s.interrupt = row.interrupt
            else:
                s.tail = max(s.tail, count + len(text))


_writers: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, TextWriter]] = weakref.WeakKeyDictionary()


def writer_for(app: App) -> TextWriter:
    """The running loop's :class:`TextWriter` of ``app`` (made on first use)."""
    loop = asyncio.get_running_loop()
    per_app = _writers.get(app)
    if per_app is None:
        per_app = _writers[app] = weakref.WeakKeyDictionary()
    w = per_app.get(loop)
    if w is None:
        w = per_app[loop] = TextWriter(app)
    return w


def _stream(ctx: StepContext) -> StepText:
    s: StepText | None = ctx._text
    if s is None or s.closed:
        app, owner = ctx._attached()
        s = StepText(q.check_run_id(ctx.run_id), ctx.token, owner, ctx.step)
        ctx._text = s
        writer_for(app).open(s)
    return s


async def _until_stored(ctx: StepContext, s: StepText) -> None:
    """Flush ``s`` at the next tick and wait for it (raises its error)."""
    while (s.buf or not s.known) and s.error is None and not s.closed:
        if not s.buf and not s.known:
            return  # nothing emitted past the replay: nothing to store
        s.force = True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        s.waiters.append(fut)
        writer_for(ctx._app).poke()
        await fut
    if s.error is not None:
        raise s.error


async def emit_text(ctx: StepContext, delta: str) -> None:
    """``ctx.emit_text(delta)``: see the module docstring."""
    text = check_delta(delta)
    s = _stream(ctx)
    if s.error is not None:
        raise s.error
    if s.interrupt is not None:
        await stop_step(ctx, s)
    if not text:
        return
    s.add(text)
    if not s.buf:
        return  # replayed
    writer = writer_for(ctx._app)
    writer.poke()
    if not s.known or (len(s.buf) * 4 >= BACKPRESSURE and len(s.buf.encode("utf-8")) >= BACKPRESSURE):
        await _until_stored(ctx, s)  # the first text of the attempt, or a full buffer


async def finish(ctx: StepContext) -> None:
    """Store the step's pending text and close its stream (before its checkpoint)."""
    s: StepText | None = ctx._text
    if s is None or s.closed:
        return
    try:
        await _until_stored(ctx, s)
    finally:
        writer_for(ctx._app).close(s)
        ctx._text = None


def settle(ctx: StepContext) -> None:
    """Close the step's stream without storing its pending text (a failed step)."""
    s: StepText | None = ctx._text
    if s is not None:
        writer_for(ctx._app).close(s)
        ctx._text = None


async def before_event(ctx: StepContext) -> None:
    """Before ``ctx.emit``: store the pending text (order), and stop here on an interrupt."""
    s: StepText | None = ctx._text
    if s is None or s.closed:
        return
    await _until_stored(ctx, s)
    if s.interrupt is not None:
        await stop_step(ctx, s)


def after_event(ctx: StepContext, seq: int) -> None:
    """After ``ctx.emit`` wrote event ``seq``: the live tail follows it."""
    s: StepText | None = ctx._text
    if s is not None and not s.closed and s.known and not s.buf:
        s.seq = seq


async def stop_step(ctx: StepContext, s: StepText) -> None:
    """The safe point of an interrupt or rollback: ONE fenced ``stop_step``,
    then :class:`~pgdurable.runs.settled.RunSettled` (the worker writes nothing more)."""
    mode = s.interrupt
    assert mode is not None
    writer = writer_for(ctx._app)
    writer.close(s)
    await writer.quiet()  # no tick of this stream in flight
    ctx._text = None
    app, owner = ctx._attached()
    try:
        await first(app, tq.STOP, (s.run_id, s.token, owner, s.step, mode, s.base,
                                      s.buf if mode == "interrupt" else ""))
    except LeaseLost:
        pass  # not ours any more: nothing to write either way
    log.info("run %s: step %s stopped by a %s (double-texting)", s.run_id, s.step, mode)
    raise RunSettled


async def text_so_far(ctx: StepContext) -> str:
    """The step's stored text (what earlier attempts flushed), for a step that
    continues it; from then on this attempt's ``emit_text`` appends (no replay)."""
    s = _stream(ctx)
    app, _ = ctx._attached()
    await _until_stored(ctx, s)
    stored = await first(app, tq.TEXT_SO_FAR, (s.run_id, s.step, s.step)) or ""
    if s.emitted < len(stored):
        s.emitted = len(stored)
    s.durable = max(s.durable, len(stored))
    s.base = max(s.base, s.durable)
    return stored
