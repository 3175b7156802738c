"""Pipelined lease calls: concurrent callers share round trips and commits.

With ``pipeline=True`` a lease provider does not give each call its own pooled
connection. Calls are queued; a *lane* (one pooled connection in psycopg's
pipeline mode) sends everything queued as one batch: every call's statement,
then one Sync. The server runs the batch as ONE implicit transaction, so the
batch costs one round trip, one commit and one client wake-up instead of one
each per call. A lone call is sent at once (no added delay when quiet); calls
that arrive while every lane is busy wait for the next free lane and go
together.

Guarantees, the same as one call per transaction:

* A caller gets its answer only after the batch committed: it never acts on a
  grant that was not durable.
* Calls of one batch run one after another in one transaction, so the answers
  are those of some serial order of the concurrent calls. The batch is sorted
  by key (stable: calls on one key keep their arrival order), so two batches
  lock their keys in the same order and cannot deadlock on each other.
* The database clock of a batch is its transaction's start
  (``pgdurable.now()`` is ``now()``): an expiry is judged, and a new one
  computed, at most the batch's duration early, which errs on the side of
  the holder losing the lease sooner, never later.
* A batch that the server refuses (any error that is not a lost connection:
  a deadlock with an outside transaction, a timeout, ...) committed nothing;
  its calls are then sent again one batch each, so a call gets only its own
  error, never a neighbour's.
* A lost connection fails every call of the batch with that error; the
  provider's rules apply per call (:func:`pgdurable.foundation.lease_core.failure`):
  the idempotent calls are retried once on a fresh connection, a transfer
  raises :class:`~pgdurable.foundation.errors.DatabaseUnavailable`.

The price: one slow call (waiting for a row lock an outside transaction
holds) delays the other calls of its batch, and the locks a batch takes are
held until its last call ran.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from . import lease_core as core
from .schemas import araw_cursor, raw_cursor

__all__ = ["AsyncLanes", "SyncLanes"]

MAX_BATCH = 64
"""Most calls sent in one batch (one transaction)."""

Row = tuple[Any, ...] | None


def _ordered(calls: Sequence[core.Call[Any]]) -> list[int]:
    """Indexes of ``calls`` in key order (stable): every batch locks keys alike."""
    return sorted(range(len(calls)), key=lambda i: calls[i].params[0])


# ---------------------------------------------------------------- async


async def _apipelined(conn: psycopg.AsyncConnection[Any], calls: Sequence[core.Call[Any]],
                      prepare: bool) -> list[Row]:
    """Run ``calls`` on ``conn`` as one pipeline and one transaction; a row per call."""
    order = _ordered(calls)
    cursors: list[psycopg.AsyncRawCursor[Any]] = []
    async with conn.pipeline():
        for i in order:
            cur = araw_cursor(conn)
            await cur.execute(calls[i].sql, calls[i].params, prepare=prepare, binary=True)
            cursors.append(cur)
    if not conn.autocommit:
        await conn.commit()
    rows: list[Row] = [None] * len(calls)
    for i, cur in zip(order, cursors, strict=True):
        rows[i] = await cur.fetchone()
    return rows


@dataclass(eq=False)
class _AItem:
    call: core.Call[Any]
    done: asyncio.Future[Row]


class AsyncLanes:
    """The async provider's pipelined path: queue, up to ``lanes`` batches in flight."""

    def __init__(self, pool: Any, prepare: bool, lanes: int) -> None:
        self._pool = pool
        self._prepare = prepare
        self._lanes = lanes
        self._queue: list[_AItem] = []
        self._senders = 0  # lanes running; decremented in the same step that sees no work
        self._tasks: set[asyncio.Task[None]] = set()  # strong references
        self.batches = 0  # batches sent (tests check the sharing)

    async def execute(self, call: core.Call[Any]) -> Row:
        """The row of ``call``, run in a shared batch; its own error if it failed."""
        fut: asyncio.Future[Row] = asyncio.get_running_loop().create_future()
        self._queue.append(_AItem(call, fut))
        if self._senders < self._lanes:
            self._senders += 1
            task = asyncio.create_task(self._lane(), name="pgdurable-lease-lane")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await fut

    async def _lane(self) -> None:
        try:
            while self._queue:
                batch = [b for b in self._queue[:MAX_BATCH] if not b.done.done()]
                del self._queue[:MAX_BATCH]
                if batch:
                    await self._send(batch)
                    # the answered callers run first: their next calls join the next batch
                    await asyncio.sleep(0)
        except BaseException as exc:  # cancelled (loop shut down): nobody waits forever
            _asettle(self._queue, exc)
            raise
        finally:
            self._senders -= 1

    async def _send(self, batch: list[_AItem]) -> None:
        try:
            conn = await self._pool.getconn()
        except Exception as exc:
            _asettle(batch, exc)
            return
        try:
            try:
                self.batches += 1
                rows = await _apipelined(conn, [b.call for b in batch], self._prepare)
            except Exception as exc:
                if len(batch) == 1 or core.connection_broke(exc):
                    _asettle(batch, exc)
                    return
                for b in batch:  # nothing committed: each alone gets its own answer
                    try:
                        self.batches += 1
                        rows = await _apipelined(conn, [b.call], self._prepare)
                    except Exception as exc1:
                        _asettle([b], exc1)
                        if core.connection_broke(exc1):
                            _asettle(batch, exc1)
                            return
                    else:
                        _aanswer([b], rows)
                return
            _aanswer(batch, rows)
        except BaseException as exc:
            _asettle(batch, exc)
            raise
        finally:
            await self._pool.putconn(conn)


def _aanswer(batch: list[_AItem], rows: list[Row]) -> None:
    for b, row in zip(batch, rows, strict=True):
        if not b.done.done():
            b.done.set_result(row)


def _asettle(batch: list[_AItem], exc: BaseException) -> None:
    """Fail the unanswered calls with ``exc`` (cancel them when it is no ``Exception``)."""
    for b in batch:
        if not b.done.done():
            if isinstance(exc, Exception):
                b.done.set_exception(exc)
            else:
                b.done.cancel()


# ---------------------------------------------------------------- sync (threads)


def _pipelined(conn: psycopg.Connection[Any], calls: Sequence[core.Call[Any]],
               prepare: bool) -> list[Row]:
    """Sync twin of :func:`_apipelined`."""
    order = _ordered(calls)
    cursors: list[psycopg.RawCursor[Any]] = []
    with conn.pipeline():
        for i in order:
            cur = raw_cursor(conn)
            cur.execute(calls[i].sql, calls[i].params, prepare=prepare, binary=True)
            cursors.append(cur)
    if not conn.autocommit:
        conn.commit()
    rows: list[Row] = [None] * len(calls)
    for i, cur in zip(order, cursors, strict=True):
        rows[i] = cur.fetchone()
    return rows


@dataclass(eq=False)
class _SItem:
    call: core.Call[Any]
    wake: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to send the queue (set under the mutex)
    done: bool = False  # answered: ``row`` or ``error`` is final
    row: Row = None
    error: BaseException | None = None


class SyncLanes:
    """The sync provider's pipelined path: the calling threads take turns as senders.

    A call made while fewer than ``lanes`` batches are in flight sends the
    queue itself (itself included); otherwise it waits. A sender that finishes
    while calls are still queued wakes the oldest queued caller to send them.
    """

    def __init__(self, pool: Any, prepare: bool, lanes: int) -> None:
        self._pool = pool
        self._prepare = prepare
        self._lanes = lanes
        self._mutex = threading.Lock()
        self._queue: list[_SItem] = []
        self._senders = 0
        self.batches = 0

    def execute(self, call: core.Call[Any]) -> Row:
        """The row of ``call``, run in a shared batch; its own error if it failed."""
        item = _SItem(call)
        with self._mutex:
            self._queue.append(item)
            lead = self._senders < self._lanes
            if lead:
                self._senders += 1
        if lead:
            self._lead()
        while not item.done:
            item.wake.wait()
            with self._mutex:
                item.wake.clear()
                lead, item.lead = item.lead, False
            if lead:
                self._lead()
        if item.error is not None:
            raise item.error
        return item.row

    def _lead(self) -> None:
        """Send one batch from the queue; then hand the turn on (or give it up)."""
        with self._mutex:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        try:
            if batch:
                self._send(batch)
        finally:
            with self._mutex:
                if self._queue:  # the turn goes to the oldest queued caller
                    nxt = self._queue[0]
                    nxt.lead = True
                    nxt.wake.set()
                else:
                    self._senders -= 1

    def _send(self, batch: list[_SItem]) -> None:
        try:
            conn = self._pool.getconn()
        except Exception as exc:
            _ssettle(batch, exc)
            return
        try:
            try:
                self.batches += 1
                rows = _pipelined(conn, [b.call for b in batch], self._prepare)
            except Exception as exc:
                if len(batch) == 1 or core.connection_broke(exc):
                    _ssettle(batch, exc)
                    return
                for b in batch:  # nothing committed: each alone gets its own answer
                    try:
                        self.batches += 1
                        rows = _pipelined(conn, [b.call], self._prepare)
                    except Exception as exc1:
                        _ssettle([b], exc1)
                        if core.connection_broke(exc1):
                            _ssettle(batch, exc1)
                            return
                    else:
                        _sanswer([b], rows)
                return
            _sanswer(batch, rows)
        except BaseException as exc:
            _ssettle(batch, exc)
            raise
        finally:
            self._pool.putconn(conn)


def _sanswer(batch: list[_SItem], rows: list[Row]) -> None:
    for b, row in zip(batch, rows, strict=True):
        if not b.done:
            b.row, b.done = row, True
            b.wake.set()


def _ssettle(batch: list[_SItem], exc: BaseException) -> None:
    for b in batch:
        if not b.done:
            b.error, b.done = exc, True
            b.wake.set()
