"""Executing a run: step after step within the lease window, then let go.

:meth:`Executor.execute` runs one claimed run (one asyncio task per
run): it builds the step's :class:`~pgdurable.runs.steps.RunContext`, runs the
step function (:meth:`Executor._run_step`: async on the loop, sync in the
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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..foundation import metrics
from ..foundation.affinity import Affinity, parse_affinity
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
from ..foundation.queries import affinity as aq
from ..foundation.queries.claim import ClaimedRun
from ..foundation.queries.core import Database, first
from ..foundation.retry import backoff, is_lost_connection, is_transient
from ..runs import tracing
from ..runs.budgets import settle_buffered
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
from .batch_writer import StepWriter
from .park import Parking
from .presence import WorkerPresence
from .settings import Settings, as_timedelta
from .state import Held, WorkerState, log
from .step_effects import StepEffects

if TYPE_CHECKING:
    from ..foundation.registry import Task

__all__ = ["Executor"]

#: What a step returned that can be checkpointed: (result, new state, its JSON text).
Stepped = tuple[Continue | Done | Wait | Sleep, Any, str]


@dataclass(slots=True)
class _Lease:
    """One run's course through one lease: where it stands between its steps."""

    a: Held
    task: Task
    state: Any
    step: int
    attempts: int
    wake: dict[str, Any] | None
    deadline_at: datetime | None
    budget: float | None
    spent: float
    db_now: datetime
    claimed_at: float
    window_end: float
    affinity: Affinity | None  # kept across the steps of this lease
    ctx: RunContext | None = None  # the step's context (a workflow checkpoints through it)
    effect: Callable[..., Awaitable[Any]] | None = None  # ctx.effect's hook (made by _io)
    db_delays: Iterator[float] | None = None  # made on the first lost connection (hot path)

    def db_clock(self) -> datetime:
        """The database's clock, from its answer to the claim."""
        return self.db_now + timedelta(seconds=time.monotonic() - self.claimed_at)


class Executor:
    """Runs claimed runs' steps (a part of :class:`~pgdurable.engine.worker.Worker`):
    :meth:`execute` is one run's task; each step result kind has its own small method
    (``_on_continue``, ``_on_done``, ``_on_wait``, ``_on_sleep``, ``_on_rate_limited``,
    ``_on_error``, ``_on_lost_connection``), which answers whether the run goes on to
    its next step in this lease."""

    def __init__(
        self, db: Database, settings: Settings, state: WorkerState, *,
        writer: StepWriter, parking: Parking, effects: StepEffects, presence: WorkerPresence,
        step_app: object,
    ) -> None:
        self.db, self.settings, self.state = db, settings, state
        self.writer, self.parking, self.effects = writer, parking, effects
        self.presence = presence
        #: handed to each step's context as ``ctx._app`` (step code starts children,
        #: streams, ... through it); the engine itself never calls it
        self.step_app = step_app
        self.tasks: dict[str, Task] = {}  # the app's tasks, set when the worker runs

    def _lease(self, a: Held, row: ClaimedRun, claimed_at: float) -> _Lease:
        return _Lease(
            a=a, task=self.tasks[row.task], state=row.state, step=row.step,
            attempts=row.attempts, wake=row.wake, deadline_at=row.deadline_at,
            budget=None if row.budget is None else float(row.budget), spent=float(row.spent),
            db_now=row.db_now, claimed_at=claimed_at,
            window_end=claimed_at + self.settings.lease_window,
            affinity=parse_affinity(row.affinity))

    def _io(self, run: _Lease) -> RunIO:
        """The hooks of a workflow's own checkpoints (ctx.step follows runs.step), and
        ``ctx.effect``'s (``run.effect``): made once per lease, not per step."""
        a = run.a

        async def effect(key: str, fn: EffectFn, reconcile: EffectFn | None = None) -> Any:
            ctx = run.ctx
            assert ctx is not None
            with tracing.effect_span(a.run_id, ctx.task, ctx.step, ctx.attempt, a.token, key):
                return await self.effects.effect(a, key, fn, reconcile)

        run.effect = effect

        def checkpoint(state_json: str, spend: float) -> Any:
            assert run.ctx is not None
            return self.writer.write(a.key, a.token, run.ctx.step, state_json, spend, None,
                                     a.trusted, run.ctx._take_settles())

        def should_yield() -> bool:
            return (self.state.stopping or a.stop_reason is not None
                    or time.monotonic() >= run.window_end)

        def pin(mode: str | None, wait: timedelta | None, info: str | None) -> Any:
            return self._pin(a, mode, wait, info)

        async def release() -> Any:
            if run.ctx is not None:
                await self._settle_buffered(a, run.ctx)
            return await self.parking.release(a)

        return RunIO(checkpoint=checkpoint, release=release,
                     should_yield=should_yield, pin=pin)

    async def execute(self, a: Held, row: ClaimedRun, claimed_at: float) -> None:
        """Run one claimed run: step after step within the lease window, then let go."""
        run = self._lease(a, row, claimed_at)
        io = self._io(run)
        try:
            while await self._step(run, io):
                pass
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
                await self.parking.fail(a, run.task, run.attempts, exc, 0.0, terminal=True)

    async def _step(self, run: _Lease, io: RunIO) -> bool:
        """One step of ``run`` and what follows from its outcome; True to go on."""
        a, task = run.a, run.task
        if run.deadline_at is not None and run.db_clock() >= run.deadline_at:
            await self.parking.fail(a, task, run.attempts, DeadlineExceeded(
                f"deadline {run.deadline_at.isoformat()} passed"), 0.0, terminal=True)
            return False
        step, attempt = run.step, run.attempts + 1
        ctx = run.ctx = RunContext(
            run_id=a.key, task=task.name, step=step, attempt=attempt,
            token=a.token, wake=run.wake, deadline=run.deadline_at, budget=run.budget,
            spent=run.spent, _effect=run.effect, _app=self.step_app, _owner=self.settings.worker_id,
            _io=io, affinity=run.affinity, _instance=self.settings.instance,
        )
        t0 = time.monotonic()
        async with tracing.step_span(self.db, a.run_id, task.name, step, attempt,
                                     a.token) as span:
            outcome = await self._run_step(a, task, ctx, run.state, run.deadline_at,
                                           run.db_clock)
            span.outcome(outcome)
        metrics.step_done(task.name, time.monotonic() - t0)
        run.affinity = ctx.affinity  # as the step pinned or unpinned it
        if outcome is None:
            return False  # settled (failed, cancelled, lost)
        if ctx._settles and (isinstance(outcome, BaseException)
                             or not isinstance(outcome[0], Continue | Done)):
            # budget settlements buffered by a step that ends otherwise than by a
            # checkpoint (a park, a failure): the spend happened, written now (a
            # Continue or Done carries them with its write)
            if isinstance(outcome, BaseException) and is_lost_connection(outcome):
                with contextlib.suppress(Exception):  # record it if we can
                    await self._settle_buffered(a, ctx)
            else:
                await self._settle_buffered(a, ctx)
        if isinstance(outcome, BaseException):
            if is_lost_connection(outcome):
                return await self._on_lost_connection(run, ctx)
            if isinstance(outcome, RateLimited):
                return await self._on_rate_limited(run, ctx, outcome)
            return await self._on_error(run, ctx, outcome)
        result, new_state, state_json = outcome
        run.step = ctx.step  # a workflow's own checkpoints moved runs.step on
        if isinstance(result, Continue):
            return await self._on_continue(run, ctx, new_state, state_json)
        if isinstance(result, Done):
            return await self._on_done(run, ctx, result, state_json)
        if isinstance(result, Wait):
            return await self._on_wait(run, ctx, result, state_json)
        return await self._on_sleep(run, ctx, result, state_json)

    async def _on_lost_connection(self, run: _Lease, ctx: RunContext) -> bool:
        """The step failed on the database, not on its own: not an attempt; run it again
        from the same checkpoint while the lease is trusted (a workflow's own
        checkpoints moved that checkpoint on)."""
        if ctx.step != run.step:
            run.step, run.wake, run.spent = ctx.step, None, ctx.spent
        return await self._step_again(run)

    async def _on_rate_limited(self, run: _Lease, ctx: RunContext, limited: RateLimited) -> bool:
        """Flow control, budgets: park the run, run the same step again later (what it
        waits for, as ``RateLimited.parking()`` says, or the retry timer wakes it)."""
        kind, ref, wake_in = limited.parking()
        await self.parking.park(run.a, dumps(run.state, "state"), ctx._pending_spend, kind,
                                ref, None, wake_in)
        return False

    async def _on_error(self, run: _Lease, ctx: RunContext, exc: BaseException) -> bool:
        """A failed attempt: retried after the task's backoff unless it is terminal."""
        terminal = isinstance(
            exc, BudgetExceeded | DeadlineExceeded | EffectFailed | _StepTypeError
        ) or is_terminal(exc)
        await self.parking.fail(run.a, run.task, run.attempts, exc, ctx._pending_spend, terminal)
        return False

    async def _on_continue(self, run: _Lease, ctx: RunContext, new_state: Any,
                           state_json: str) -> bool:
        """A checkpoint (batched, fenced); the next step follows in this lease unless the
        run is cancelled, stopped or its lease window is over."""
        a, spend = run.a, ctx._pending_spend
        status = await self.writer.write(a.key, a.token, run.step, state_json, spend, None,
                                         a.trusted, ctx._take_settles())
        if status != "leased":
            metrics.run_finished(run.task.name, status)
            return False
        run.state, run.step, run.wake, run.spent = new_state, run.step + 1, None, run.spent + spend
        if a.stop_reason == "cancel":
            await self.parking.ack_cancel(a, 0)
            return False
        if self.state.stopping or a.stop_reason or time.monotonic() >= run.window_end:
            await self.parking.release(a)
            return False
        return True

    async def _on_done(self, run: _Lease, ctx: RunContext, done: Done, state_json: str) -> bool:
        """The run's completion (batched, fenced): the lease's last write."""
        a, spend = run.a, ctx._pending_spend
        try:
            result_json = dumps(done.result, "result")
        except (TypeError, ValueError) as exc:
            # like a non-JSON state: a bug of the step, not retried
            await self.parking.fail(a, run.task, run.attempts, _unstorable(exc), spend, True)
            return False
        self.state.finishing_now(a)  # this lease's last write: the slot is free
        status = await self.writer.write(a.key, a.token, run.step, state_json, spend,
                                         result_json, a.trusted, ctx._take_settles())
        metrics.run_finished(run.task.name, status)
        return False

    async def _on_wait(self, run: _Lease, ctx: RunContext, wait: Wait, state_json: str) -> bool:
        """Park until a signal (or an event, or its children, or a timeout)."""
        if wait.event_name is not None:
            await self.parking.park_event(run.a, run.task, run.attempts, state_json,
                                          ctx._pending_spend, wait)
            return False
        if wait.child_ids:
            await self.parking.park_children(run.a, run.task, run.attempts, state_json,
                                             ctx._pending_spend, wait)
            return False
        kind, ref = wait.signal
        await self.parking.park(run.a, state_json, ctx._pending_spend, kind, ref, None,
                                as_timedelta(wait.timeout))
        return False

    async def _on_sleep(self, run: _Lease, ctx: RunContext, sleep: Sleep,
                        state_json: str) -> bool:
        """Park until a time (``until``) or for a while (``seconds``)."""
        if sleep.until is not None:
            await self.parking.park(run.a, state_json, ctx._pending_spend, None, None,
                                    sleep.until, None)
        else:
            await self.parking.park(run.a, state_json, ctx._pending_spend, None, None, None,
                                    as_timedelta(sleep.seconds))
        return False

    async def _settle_buffered(self, a: Held, ctx: RunContext) -> None:
        """The step's buffered budget settlements, written now (fenced) when it ends
        otherwise than by a checkpoint (a park, a failure, a stop)."""
        await settle_buffered(self.db, ctx, self.settings.worker_id)

    async def _pin(self, a: Held, mode: str | None, wait: timedelta | None,
                   info_json: str | None) -> Affinity | None:
        """``ctx.pin``/``ctx.unpin``: announce this worker's presence first (once:
        a pin to an absent worker would reserve nothing), then ONE fenced
        ``pin_run``."""
        if mode is not None:
            await self.presence.ensure()
        s = self.settings
        return parse_affinity(await first(
            self.db, aq.PIN, (a.run_id, a.token, s.worker_id, s.instance, mode, wait, info_json)))

    async def _step_again(self, run: _Lease) -> bool:
        """After a step failed on a lost connection: True to run it again here;
        False when the lease window is over (the run is given back, attempts
        unchanged) or the lease is no longer trusted (left to lapse)."""
        a = run.a
        if run.db_delays is None:
            run.db_delays = backoff()
        await asyncio.sleep(next(run.db_delays))
        if not a.trusted():
            return False
        if a.stop_reason is not None:
            await self.parking.settle_stopped(a, 0.0)
            return False
        if self.state.stopping or time.monotonic() >= run.window_end:
            await self.parking.release(a)
            return False
        return True

    async def _run_step(
        self,
        a: Held,
        task: Task,
        ctx: RunContext,
        state: Any,
        deadline_at: datetime | None,
        db_clock: Callable[[], datetime],
    ) -> Stepped | BaseException | None:
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
                with contextlib.suppress(LeaseLost):  # the spend happened; lost: not ours
                    await self._settle_buffered(a, ctx)
                await self.parking.settle_stopped(a, ctx._pending_spend)
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
