"""Parking, and the other ways a run gives its lease back between steps.

A run that waits (``Wait``: a signal, children, its inbox), sleeps
(``Sleep``) or is rate-limited (``RateLimited``) is parked by ONE fenced
``pgdurable.park_run`` (``pgdurable.park_children`` for children): it holds
nothing while it waits (no task, thread, connection or lease). A failed
attempt is recorded by ``pgdurable.fail_run`` with the task's backoff; a
stopped run is released (shutdown) or its cancel acknowledged. Timers and
retries this worker sets itself wake its claim loop directly (no NOTIFY is
sent for a future time).
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.errors import InvalidInput, recorded_checkpoint
from ..foundation.jsonb import dumps
from ..foundation.jsonb import exc_message as _exc_message
from ..foundation.jsonb import jsonb_str as _jsonb_str
from ..foundation.queries import cancel as cancel_q
from ..foundation.queries import events as event_q
from ..foundation.queries import run_end as end_q
from ..foundation.queries import signals as signal_q
from ..foundation.queries.core import Database, one
from ..foundation.retry import retry_while
from ..runs.children import park_children
from ..runs.steps import Wait
from .settings import as_timedelta
from .state import Held, WorkerState, fenced, log

if TYPE_CHECKING:
    from ..foundation.registry import Task

__all__ = ["Parking"]


class Parking:
    """Parks, fails and settles runs between steps (a part of
    :class:`~pgdurable.engine.worker.Worker`): each is the last write of a lease, so
    each frees the run's slot first (``WorkerState.finishing_now``)."""

    def __init__(self, db: Database, owner: str, state: WorkerState) -> None:
        self.db, self.owner, self.state = db, owner, state

    async def settle_stopped(self, a: Held, spend: float) -> None:
        """A stopped run: acknowledge its cancel, or give it back (shutdown); a lost
        lease is dropped, no further writes."""
        if a.stop_reason == "cancel":
            await self.ack_cancel(a, spend)
        elif a.stop_reason == "shutdown":
            await self.release(a)

    async def release(self, a: Held) -> Any:
        """Give the run back runnable (the lease window is over, or a shutdown); its
        status."""
        return await fenced(self.db, a, end_q.RELEASE, a.ident(self.owner))

    async def ack_cancel(self, a: Held, spend: float) -> None:
        """Record the run cancelled (its cancel request was seen)."""
        await fenced(self.db, a, cancel_q.ACK_CANCEL, (*a.ident(self.owner), spend))

    async def park(
        self,
        a: Held,
        state_json: str,
        spend: float,
        kind: str | None,
        ref: str | None,
        until: datetime | None,
        wake_in: timedelta | None,
    ) -> None:
        """ONE fenced ``park_run``: wait for a signal ``(kind, ref)`` and/or a timer."""
        self.state.finishing_now(a)  # this lease's last write: the slot is free (claim.py)
        parked = await fenced(
            self.db, a, signal_q.PARK,
            (*a.ident(self.owner), state_json, spend, kind, ref, until, wake_in))
        self._timer(parked)

    def _timer(self, parked: signal_q.Parked | None) -> None:
        if parked is not None and parked.status == "waiting" and parked.wake_at is not None \
                and parked.wake_in is not None:
            # our own timer: wake for it without waiting for the poll
            self.state.note_due(parked.wake_in)

    async def park_children(
        self, a: Held, task: Task, attempts: int, state_json: str, spend: float, wait: Wait,
    ) -> None:
        """Wait.children: the fenced park of pgdurable.children (sent again after a
        transient error while the lease is trusted, like :func:`fenced`); ids that
        are not this run's children fail the run (InvalidInput, nothing written)."""
        self.state.finishing_now(a)
        try:
            parked = await retry_while(
                lambda: park_children(self.db, a.ident(self.owner), state_json, spend,
                                      wait.child_ids, wait.need, as_timedelta(wait.timeout)),
                a.trusted,
            )
        except InvalidInput as exc:
            await self.fail(a, task, attempts, exc, spend, True)
            return
        self._timer(parked)

    async def park_event(
        self, a: Held, task: Task, attempts: int, state_json: str, spend: float, wait: Wait,
    ) -> None:
        """Wait.for_event: the fenced park of pgdurable.park_event (sent again after a
        transient error while the lease is trusted); a match the database refuses
        fails the run (InvalidInput, nothing written)."""
        self.state.finishing_now(a)
        params = (*a.ident(self.owner), state_json, spend, wait.event_name, wait.event_match,
                  as_timedelta(wait.timeout))
        try:
            parked = await retry_while(lambda: one(self.db, event_q.PARK_EVENT, params),
                                       a.trusted)
        except InvalidInput as exc:
            await self.fail(a, task, attempts, exc, spend, True)
            return
        self._timer(parked)

    async def fail(
        self, a: Held, task: Task, attempts: int, exc: BaseException, spend: float,
        terminal: bool,
    ) -> None:
        """ONE fenced ``fail_run``: a retry after the task's backoff, or the end."""
        self.state.finishing_now(a)
        delay = min(task.retry_cap, task.retry_base * (2 ** min(attempts, 30)))
        delay *= random.uniform(0.5, 1.5)
        err = _error_json(exc)
        status = await fenced(
            self.db, a, end_q.FAIL,
            (*a.ident(self.owner), err, spend, timedelta(seconds=delay), terminal),
        )
        if status is not None:
            metrics.run_finished(task.name, status)
        if status == "failed":  # for good: no retry follows
            log.info("run %s of task %s failed: %s (attempt %d)", a.run_id, task.name,
                     type(exc).__name__, attempts + 1)
        if status == "runnable":
            # our own backoff (no NOTIFY for a future retry): wake for it ourselves
            self.state.note_due(delay)


def _error_json(exc: BaseException) -> str:
    """The ``runs.error`` JSON of ``exc``; any exception text is storable."""
    record: dict[str, Any]
    try:
        record = q.error_record(exc)
    except Exception:  # a broken __str__ must not lose the error
        record = {"type": type(exc).__name__, "message": _exc_message(exc), "traceback": ""}
        checkpoint = recorded_checkpoint(exc)
        if checkpoint is not None:
            record["checkpoint"] = checkpoint
    return dumps({k: _jsonb_str(v) if isinstance(v, str) else v for k, v in record.items()}, "error")
