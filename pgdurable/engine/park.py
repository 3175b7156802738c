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
from ..foundation.queries import events as eq
from ..foundation.queries.core import one
from ..foundation.retry import retry_while
from ..runs.children import park_children
from ..runs.steps import Wait
from .base import WorkerBase, _Active, _as_timedelta, log

if TYPE_CHECKING:
    from ..foundation.registry import Task

__all__ = ["Parking"]


class Parking(WorkerBase):
    """Parking, failing and settling a run (part of :class:`~pgdurable.engine.worker.Worker`)."""

    async def _settle_stopped(self, a: _Active, spend: float) -> None:
        ident = (a.run_id, a.token, self.worker_id)
        if a.stop_reason == "cancel":
            await self._fenced(a, q.ACK_CANCEL, (*ident, spend))
        elif a.stop_reason == "shutdown":
            await self._fenced(a, q.RELEASE, ident)
        # lease_lost: drop, no further writes

    async def _park(
        self,
        a: _Active,
        ident: tuple[Any, ...],
        state_json: str,
        spend: float,
        kind: str | None,
        ref: str | None,
        until: datetime | None,
        wake_in: timedelta | None,
    ) -> None:
        self._finishing_now(a)  # this lease's last write: the slot is free (engine/claim.py)
        row = await self._fenced(
            a, q.PARK, (*ident, state_json, spend, kind, ref, until, wake_in)
        )
        if row is not None and row[0] == "waiting" and row[1] is not None:
            # our own timer: wake for it without waiting for the poll
            self._note_due(float(row[2]))

    async def _park_children(
        self, a: _Active, task: Task, attempts: int, ident: tuple[Any, ...], state_json: str,
        spend: float, wait: Wait,
    ) -> None:
        """Wait.children: the fenced park of pgdurable.children (sent again after a
        transient error while the lease is trusted, like :meth:`_fenced`); ids that
        are not this run's children fail the run (InvalidInput, nothing written)."""
        self._finishing_now(a)
        try:
            row = await retry_while(
                lambda: park_children(self.app, ident, state_json, spend, wait.child_ids,
                                      wait.need, _as_timedelta(wait.timeout)),
                lambda: self._trusted(a),
            )
        except InvalidInput as exc:
            await self._fail(a, task, attempts, exc, spend, True)
            return
        if row[0] == "waiting" and row[1] is not None:
            self._note_due(float(row[2]))

    async def _park_event(
        self, a: _Active, task: Task, attempts: int, ident: tuple[Any, ...], state_json: str,
        spend: float, wait: Wait,
    ) -> None:
        """Wait.for_event: the fenced park of pgdurable.park_event (sent again after a
        transient error while the lease is trusted); a match the database refuses
        fails the run (InvalidInput, nothing written)."""
        self._finishing_now(a)
        params = (*ident, state_json, spend, wait.event_name, wait.event_match,
                  _as_timedelta(wait.timeout))
        try:
            parked = await retry_while(lambda: one(self.app, eq.PARK_EVENT, params),
                                       lambda: self._trusted(a))
        except InvalidInput as exc:
            await self._fail(a, task, attempts, exc, spend, True)
            return
        if parked.status == "waiting" and parked.wake_at is not None:
            self._note_due(float(parked.wake_in))

    async def _fail(
        self, a: _Active, task: Task, attempts: int, exc: BaseException, spend: float,
        terminal: bool,
    ) -> None:
        self._finishing_now(a)
        delay = min(task.retry_cap, task.retry_base * (2 ** min(attempts, 30)))
        delay *= random.uniform(0.5, 1.5)
        err = _error_json(exc)
        row = await self._fenced(
            a, q.FAIL,
            (a.run_id, a.token, self.worker_id, err, spend, timedelta(seconds=delay), terminal),
        )
        if row is not None:
            metrics.run_finished(task.name, row[0])
        if row is not None and row[0] == "failed":  # for good: no retry follows
            log.info("run %s of task %s failed: %s (attempt %d)", a.run_id, task.name,
                     type(exc).__name__, attempts + 1)
        if row is not None and row[0] == "runnable":
            # our own backoff (no NOTIFY for a future retry): wake for it ourselves
            self._note_due(delay)


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
