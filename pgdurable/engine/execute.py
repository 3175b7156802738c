"""Executing a run: step after step within the lease window, then let go.

:meth:`StepExecution._execute` runs one claimed run (one asyncio task per
run): it builds the step's :class:`~pgdurable.runs.steps.RunContext`, runs the
step function (:meth:`StepExecution._run_step`: async on the loop, sync in the
worker's thread pool, under the deadline and the task's step/heartbeat
timeouts) and hands its outcome on: ``Continue``/``Done`` to the batched,
fenced writer (:mod:`~pgdurable.engine.batch_writer`), ``Wait``/``Sleep``/
``RateLimited`` to parking and errors to ``fail`` (:mod:`~pgdurable.engine.park`).
A step that failed on a lost connection is run again from the same
checkpoint while the lease is trusted (not an attempt). A stopped run
(cancel, lease lost, shutdown) is settled without a write of its step.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.affinity import PIN, Affinity, parse_affinity
from ..foundation.errors import (
    BudgetExceeded,
    DeadlineExceeded,
    EffectFailed,
    LeaseLost,
    ValueTooLarge,
    is_terminal,
    mark_terminal,
)
from ..foundation.jsonb import dumps
from ..foundation.retry import backoff, is_lost_connection, is_transient
from ..runs import tracing
from ..runs.flow import RateLimited
from ..runs.liveness import step_guard
from ..runs.steps import (
    _UNSET,
    Continue,
    Done,
    EffectFn,
    RunContext,
    RunIO,
    RunSettled,
    Sleep,
    Wait,
    in_thread,
)
from .base import _Active, _as_timedelta, log
from .park import Parking
from .step_effects import StepEffects

if TYPE_CHECKING:
    from ..foundation.registry import Task

__all__ = ["StepExecution"]


class StepExecution(Parking, StepEffects):
    """Running a claimed run's steps (part of :class:`~pgdurable.engine.worker.Worker`)."""

    async def _execute(self, a: _Active, row: q.ClaimedRun, claimed_at: float) -> None:
        task = self.app.tasks[row.task]
        state: Any = row.state
        step: int = row.step
        attempts: int = row.attempts
        wake: dict[str, Any] | None = row.wake
        deadline_at: datetime | None = row.deadline_at
        budget = None if row.budget is None else float(row.budget)
        spent = float(row.spent)
        db_now: datetime = row.db_now
        affinity = parse_affinity(row.affinity)  # kept across the steps of this lease
        window_end = claimed_at + self.lease_window

        def db_clock() -> datetime:
            return db_now + timedelta(seconds=time.monotonic() - claimed_at)

        async def effect(key: str, fn: EffectFn, reconcile: EffectFn | None = None) -> Any:
            with tracing.effect_span(a.run_id, task.name, step, attempts + 1, a.token, key):
                return await self._effect(a, key, fn, reconcile)

        db_delays = backoff()
        run_id = str(a.run_id)

        def trusted() -> bool:
            return self._trusted(a)

        io = RunIO(  # a workflow checkpoints from inside one call; ctx.step follows runs.step
            checkpoint=lambda state_json, spend: self._writer.write(
                a.run_id, a.token, ctx.step, state_json, spend, None, trusted
            ),
            release=lambda: self._fenced(a, q.RELEASE, (a.run_id, a.token, self.worker_id)),
            should_yield=lambda: (self._stopping or a.stop_reason is not None
                                  or time.monotonic() >= window_end),
            pin=lambda mode, wait, info: self._pin(a, mode, wait, info),
        )

        try:
            while True:
                if deadline_at is not None and db_clock() >= deadline_at:
                    await self._fail(a, task, attempts, DeadlineExceeded(
                        f"deadline {deadline_at.isoformat()} passed"), 0.0, terminal=True)
                    return
                ctx = RunContext(
                    run_id=run_id, task=task.name, step=step, attempt=attempts + 1,
                    token=a.token, wake=wake, deadline=deadline_at, budget=budget, spent=spent,
                    _effect=effect, _app=self.app, _owner=self.worker_id, _io=io,
                    affinity=affinity, _instance=self.instance,
                )
                t0 = time.monotonic()
                async with tracing.step_span(
                    self.app, a.run_id, task.name, step, attempts + 1, a.token
                ) as span:
                    outcome = await self._run_step(a, task, ctx, state, deadline_at, db_clock)
                    span.outcome(outcome)
                metrics.step_done(task.name, time.monotonic() - t0)
                affinity = ctx.affinity  # as the step pinned or unpinned it
                if outcome is None:
                    return  # settled (failed, cancelled, lost)
                if isinstance(outcome, BaseException) and is_lost_connection(outcome):
                    # the database, not the step: not an attempt; run it again
                    # from the same checkpoint while the lease is trusted; a
                    # workflow's own checkpoints moved that checkpoint on
                    if ctx.step != step:
                        step, wake, spent = ctx.step, None, ctx.spent
                    if await self._step_again(a, window_end, db_delays):
                        continue
                    return
                if isinstance(outcome, RateLimited):  # flow control, budgets: park, step again
                    kind, ref, wake_in = outcome.parking()
                    await self._park(a, (a.run_id, a.token, self.worker_id), dumps(state, "state"),
                                     ctx._pending_spend, kind, ref, None, wake_in)
                    return
                if isinstance(outcome, BaseException):
                    terminal = isinstance(
                        outcome, BudgetExceeded | DeadlineExceeded | EffectFailed | _StepTypeError
                    ) or is_terminal(outcome)
                    await self._fail(a, task, attempts, outcome, ctx._pending_spend, terminal)
                    return
                result, new_state, state_json = outcome
                step = ctx.step  # a workflow's own checkpoints moved runs.step on
                spend = ctx._pending_spend
                ident = (a.run_id, a.token, self.worker_id)
                if isinstance(result, Continue):
                    st = await self._writer.write(
                        a.run_id, a.token, step, state_json, spend, None, trusted
                    )
                    if st != "leased":
                        metrics.run_finished(task.name, st)
                        return
                    state, step, wake, spent = new_state, step + 1, None, spent + spend
                    if a.stop_reason == "cancel":
                        await self._fenced(a, q.ACK_CANCEL, (*ident, 0))
                        return
                    if self._stopping or a.stop_reason or time.monotonic() >= window_end:
                        await self._fenced(a, q.RELEASE, ident)
                        return
                    continue
                if isinstance(result, Done):
                    try:
                        result_json = dumps(result.result, "result")
                    except (TypeError, ValueError) as exc:
                        # like a non-JSON state: a bug of the step, not retried
                        await self._fail(a, task, attempts, _unstorable(exc), spend, True)
                        return
                    self._finishing_now(a)  # this lease's last write: the slot is free
                    st = await self._writer.write(
                        a.run_id, a.token, step, state_json, spend, result_json, trusted
                    )
                    metrics.run_finished(task.name, st)
                    return
                if isinstance(result, Wait) and result.event_name is not None:
                    await self._park_event(a, task, attempts, ident, state_json, spend, result)
                    return
                if isinstance(result, Wait) and result.child_ids:
                    await self._park_children(a, task, attempts, ident, state_json, spend, result)
                    return
                if isinstance(result, Wait):
                    kind, ref = result.signal
                    wake_in = _as_timedelta(result.timeout)
                    await self._park(a, ident, state_json, spend, kind, ref, None, wake_in)
                    return
                assert isinstance(result, Sleep)
                if result.until is not None:
                    await self._park(a, ident, state_json, spend, None, None, result.until, None)
                else:
                    wake_in = _as_timedelta(result.seconds)
                    await self._park(a, ident, state_json, spend, None, None, None, wake_in)
                return
        except LeaseLost:
            metrics.lease_lost()
            log.info("run %s: lease lost; dropped", a.run_id)
        except Exception as exc:
            if is_transient(exc):
                log.warning("run %s: database error (%s) and the lease no longer "
                            "trusted; the lease will lapse", a.run_id, exc)
                return
            # a bug, or a value the database refused: end this run, do not
            # leave its lease to lapse and its step to be executed again
            log.exception("run %s: unexpected error; the run is failed", a.run_id)
            with contextlib.suppress(Exception):
                await self._fail(a, task, attempts, exc, 0.0, terminal=True)

    async def _pin(self, a: _Active, mode: str | None, wait: timedelta | None,
                   info_json: str | None) -> Affinity | None:
        """``ctx.pin``/``ctx.unpin``: announce this worker's presence first (once:
        a pin to an absent worker would reserve nothing), then ONE fenced
        ``pin_run``."""
        if mode is not None:
            await self._presence.ensure()
        row = await self.app.fetchone(
            PIN, (a.run_id, a.token, self.worker_id, self.instance, mode, wait, info_json))
        return None if row is None else parse_affinity(row[0])

    async def _step_again(self, a: _Active, window_end: float, delays: Iterator[float]) -> bool:
        """After a step failed on a lost connection: True to run it again here;
        False when the lease window is over (the run is given back, attempts
        unchanged) or the lease is no longer trusted (left to lapse)."""
        await asyncio.sleep(next(delays))
        if not self._trusted(a):
            return False
        if a.stop_reason is not None:
            await self._settle_stopped(a, 0.0)
            return False
        if self._stopping or time.monotonic() >= window_end:
            await self._fenced(a, q.RELEASE, (a.run_id, a.token, self.worker_id))
            return False
        return True

    async def _run_step(
        self,
        a: _Active,
        task: Task,
        ctx: RunContext,
        state: Any,
        deadline_at: datetime | None,
        db_clock: Any,
    ) -> tuple[Any, Any, str] | BaseException | None:
        """Run one step. Returns (result, new_state, state_json), an error to
        record, or None when the run was settled here (cancel/lost/shutdown)."""
        a.in_step = True
        timeout_cm: asyncio.Timeout | None = None
        try:
            if a.stop_reason is not None:
                raise asyncio.CancelledError
            if deadline_at is not None:
                remaining = (deadline_at - db_clock()).total_seconds()
                timeout_cm = asyncio.timeout(max(0.0, remaining))
            async with (timeout_cm if timeout_cm is not None else contextlib.nullcontext(),
                        step_guard(task, ctx)):
                if task.is_async:
                    result = await task.fn(ctx, state)
                else:
                    result = await in_thread(task.fn, ctx, state)
                    if inspect.isawaitable(result):
                        result = await result
        except (KeyboardInterrupt, SystemExit):
            raise
        except RunSettled:
            return None  # a workflow's own write ended or gave back the run
        except BaseException as exc:  # any other error of the step is recorded
            current = asyncio.current_task()
            cancelled = current is not None and current.cancelling() > 0
            if a.stop_reason is not None and (
                cancelled or isinstance(exc, asyncio.CancelledError)
            ):
                # stopped (cancel/lost/shutdown), also when the step turned
                # the cancellation into an error of its own: not an attempt
                if current is not None and cancelled:
                    current.uncancel()
                a.in_step = False
                await self._settle_stopped(a, ctx._pending_spend)
                return None
            if isinstance(exc, asyncio.CancelledError) and cancelled:
                raise  # this task is being cancelled from outside (loop shutdown)
            if isinstance(exc, TimeoutError) and timeout_cm is not None and timeout_cm.expired():
                return DeadlineExceeded(f"deadline {deadline_at} passed during step {ctx.step}")
            # includes a CancelledError that the step's own code raised
            # (nobody cancelled this task): a failed attempt like any other
            return exc
        finally:
            a.in_step = False
        if a.stop_reason == "lease_lost":
            return None  # not ours any more: no writes
        # a cancel or shutdown that arrived as the step returned: write its
        # outcome normally; the fenced write sees a pending cancel itself
        if not isinstance(result, Continue | Done | Wait | Sleep):
            return _StepTypeError(
                f"step of task {task.name!r} returned {type(result).__name__}; "
                "expected Continue, Done, Wait or Sleep"
            )
        new_state = state if result.state is _UNSET else result.state
        try:
            state_json = dumps(new_state, "state")
        except (TypeError, ValueError) as exc:
            return _unstorable(exc)
        return result, new_state, state_json


class _StepTypeError(TypeError):
    """A step returned something that cannot be checkpointed (not retried)."""


def _unstorable(exc: TypeError | ValueError) -> BaseException:
    """The error to record (not retried) for a state or result that ``dumps``
    refused: :class:`ValueTooLarge` as itself (its message names the size and
    the limit), anything else as :class:`_StepTypeError`."""
    if isinstance(exc, ValueTooLarge):
        return mark_terminal(exc)
    return _StepTypeError(str(exc))
