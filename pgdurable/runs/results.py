"""Awaiting a run's result from any process: ``await app.result(run_id, timeout)``
and the sync twin ``DurableClient.result``.

A run that becomes terminal NOTIFYs ``pgdurable_done`` (payload = its id) in
the transaction that ends it (``sql/0010_children.sql``), while a listener is
present (``sql/0023_listener_presence.sql``, :mod:`pgdurable.foundation.presence`). A
waiter first LISTENs and announces itself, then reads the run (so a run
already finished returns at once, and a run that finishes between the read and
the wait is not missed: its notification arrives after the LISTEN), then sleeps
until a notification for its run or a slow safety poll (``poll`` seconds) and
reads again; after its first announcement it also reads again at each
:data:`~pgdurable.foundation.presence.RECHECK` delay, and after every reconnect
of the LISTEN connection.

Outcome: a ``completed`` run's result is returned; ``failed`` (or
``incompatible``) raises :class:`~pgdurable.RunFailed` carrying the recorded
error; ``cancelled`` raises :class:`~pgdurable.RunCancelled`; no end within
``timeout`` raises :class:`~pgdurable.ResultTimeout` (the run goes on). The
async form subscribes to the app's notifier (the process's one LISTEN
connection, :mod:`pgdurable.foundation.notifier`); the sync form has no event
loop to share it in, and keeps its own path: a connection of its own per call
(and one to LISTEN on when the reads go through a transaction pooler and a
``listen_dsn`` is set), made again when it is lost (a failover: docs/scaling.md).
Either form reads again after a connection lost under a read, for at most
:data:`RECONNECT` seconds after the loss (the async one on the pool's next
connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..foundation import presence
from ..foundation import run_queries as q
from ..foundation.db import connect, translated
from ..foundation.errors import (
    DatabaseUnavailable,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunNotFound,
)
from ..foundation.notifier import Wakeup
from ..foundation.pooler import Pooler
from ..foundation.queries import runs as rq
from ..foundation.retry import backoff

if TYPE_CHECKING:
    from ..foundation.ports import App

__all__ = ["CHANNEL", "await_result", "outcome", "result_sync"]

#: NOTIFY channel of terminal transitions (payload = run id).
CHANNEL = "pgdurable_done"
#: Longest wait between two reads when no notification comes (a missed NOTIFY).
POLL = 5.0
#: Seconds a waiter keeps reading again after its connection was lost under a read.
RECONNECT = 60.0


def _timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        secs = timeout.total_seconds()
    elif isinstance(timeout, int | float) and not isinstance(timeout, bool):
        secs = float(timeout)
    else:
        raise TypeError("timeout must be a number of seconds, a timedelta or None")
    if not math.isfinite(secs) or secs < 0:
        raise ValueError(f"timeout must be finite and >= 0, not {timeout!r}")
    return secs


def outcome(found: rq.Outcome | None, run_id: uuid.UUID) -> tuple[bool, Any]:
    """``(True, result)`` for a completed run, ``(False, None)`` for a live one;
    raises RunFailed / RunCancelled / RunNotFound."""
    if found is None:
        raise RunNotFound(f"no run {run_id}")
    status, result, error = found.status, found.result, found.error
    if status == "completed":
        return True, result
    if status == "cancelled":
        msg = (error or {}).get("message") or "run was cancelled"
        raise RunCancelled(f"run {run_id} was cancelled: {msg}")
    if status in ("failed", "incompatible"):
        err = error or {}
        raise RunFailed(f"run {run_id} {status}: {err.get('type')}: {err.get('message')}",
                        error, str(run_id))
    return False, None


def _expired(run_id: uuid.UUID, timeout: float | None) -> ResultTimeout:
    return ResultTimeout(f"run {run_id} did not finish within {timeout} s")


async def await_result(app: App, run_id: object, timeout: object = None) -> Any:  # noqa: ASYNC109
    """``await app.result(run_id, timeout)``: see the module docstring."""
    rid = q.check_run_id(run_id)
    limit = _timeout(timeout)
    end = None if limit is None else time.monotonic() + limit
    wake = Wakeup(app.notifier(), CHANNEL, str(rid))
    try:
        # the LISTEN must be in place before the first read (no lost wake-up);
        # if the notifier cannot connect, the reads below still poll
        await wake.listening(POLL if limit is None else min(POLL, limit))
        read = False  # a read answered: a later DatabaseUnavailable is a lost connection
        lost_at = -math.inf
        delays = backoff(0.2, 2.0)
        while True:
            try:
                row = await app.fetchone(rq.OUTCOME.sql, (rid,))
            except DatabaseUnavailable:
                # the connection was lost under the read (a restart, a failover to a
                # standby: the pool connects again, a multi-host DSN to the new
                # primary): read again, as result_sync does, for at most RECONNECT
                # seconds after the loss and never past the timeout. A first read
                # that fails is raised.
                now = time.monotonic()
                if not read:
                    raise
                if lost_at == -math.inf:
                    lost_at, delays = now, backoff(0.2, 2.0)
                if now - lost_at > RECONNECT or (end is not None and now >= end):
                    raise
                await asyncio.sleep(next(delays))
                continue
            read, lost_at = True, -math.inf
            done, result = outcome(rq.OUTCOME.first(row), rid)
            if done:
                return result
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise _expired(rid, limit)
            await wake.wait(POLL if left is None else min(POLL, left))
    finally:
        await wake.close()


def result_sync(conninfo: str, run_id: object, timeout: object = None, *,
                pooler: Pooler | None = None, listen_to: str | None = None,
                schema: str | None = None) -> Any:
    """Sync twin of :func:`await_result`: reads on a connection of its own
    (through ``pooler``) and LISTENs on ``listen_to`` (the same connection when
    it is ``conninfo`` and no transaction pooler is in between; None: poll).

    A connection lost after it was made (a restart, a failover: a multi-host
    DSN with ``target_session_attrs=read-write`` finds the new primary) is made
    again, and the run read again, for up to :data:`RECONNECT` seconds after
    the loss (and never past ``timeout``); past that, or when the first
    connection fails, :class:`~pgdurable.DatabaseUnavailable` is raised.
    """
    rid = q.check_run_id(run_id)
    limit = _timeout(timeout)
    end = None if limit is None else time.monotonic() + limit
    connected_at: list[float] = []  # when each connection was made (monotonic)
    delays = backoff(0.2, 2.0)
    lost_at = -math.inf
    while True:
        try:
            return _wait_sync(conninfo, rid, limit, end, pooler, listen_to, connected_at, schema)
        except DatabaseUnavailable:
            # lost after it was connected (a restart, a failover to a standby: a
            # multi-host DSN finds the new primary): connect again and read again,
            # for at most RECONNECT seconds after the loss and never past the
            # timeout. A first connection that fails is raised as before.
            now = time.monotonic()
            if not connected_at:
                raise
            if connected_at[-1] > lost_at:  # a new loss (it was connected since)
                lost_at, delays = now, backoff(0.2, 2.0)
            if now - lost_at > RECONNECT or (end is not None and now >= end):
                raise
            time.sleep(next(delays))
            if end is not None and time.monotonic() >= end:
                raise _expired(rid, limit) from None


def _wait_sync(conninfo: str, rid: uuid.UUID, limit: float | None, end: float | None,
               pooler: Pooler | None, listen_to: str | None, connected_at: list[float],
               schema: str | None) -> Any:
    """One connection's worth of :func:`result_sync` (noting in ``connected_at`` when
    it was connected and listening)."""
    with contextlib.ExitStack() as stack, translated():
        conn = stack.enter_context(connect(conninfo, pooler=pooler, schema=schema))
        listener = None
        rechecks: list[float] = []  # monotonic times of the reads after the announcement
        announced = -math.inf
        if listen_to is not None:
            listener = conn if listen_to == conninfo and pooler != "transaction" else (
                stack.enter_context(connect(listen_to, schema=schema)))
            listener.execute(f"LISTEN {CHANNEL}")
        connected_at.append(time.monotonic())
        while True:
            if listener is not None and time.monotonic() - announced >= presence.RENEW:
                if announced == -math.inf:
                    rechecks = [time.monotonic() + d for d in presence.RECHECK]
                announced = time.monotonic()
                presence.announce_sync(listener, CHANNEL)
            done, result = outcome(
                rq.OUTCOME.first(conn.execute(rq.OUTCOME.sql, (rid,)).fetchone()), rid)
            if done:
                return result
            now = time.monotonic()
            left = None if end is None else end - now
            if left is not None and left <= 0:
                raise _expired(rid, limit)
            rechecks = [t for t in rechecks if t > now]
            wait = min([POLL, *(t - now for t in rechecks[:1])])
            wait = wait if left is None else min(wait, left)
            if listener is None:
                time.sleep(wait)  # no LISTEN possible (transaction pooler): poll
                continue
            for n in listener.notifies(timeout=wait):
                if n.payload == str(rid):
                    break
