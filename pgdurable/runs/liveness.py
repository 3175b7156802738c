"""Step-level liveness: step timeouts, hung-step detection and progress heartbeats.

Two per-task limits (``@app.task(..., step_timeout=, heartbeat_timeout=)``):

* ``step_timeout``: a step that runs longer is cancelled and the attempt
  fails with :class:`~pgdurable.StepTimeout` (retried with the task's backoff;
  the run fails at ``max_attempts`` like for any other step error).
* ``heartbeat_timeout``: once set, a step must call ``ctx.heartbeat()`` at
  least that often (the clock starts when the step starts); a step that stops
  heartbeating is treated as hung: cancelled, the attempt fails with
  :class:`~pgdurable.StepHung` and is retried. A step that heartbeats keeps
  running as long as it likes (up to ``step_timeout`` if that is set too).

``ctx.heartbeat(progress)`` also records ``progress`` (any JSON value) and the
time in ``pgdurable.runs.progress`` / ``heartbeat_at`` (fenced by the lease;
writes are coalesced: at most one in flight per step, the latest progress
wins). This is step liveness only: the worker's lease renewal (its own
heartbeat loop, ``renew_runs``) is separate and goes on whatever a step does,
so a hung step is found by this module, not by an expiring lease.

Sync steps run in a thread, which Python cannot interrupt. On a timeout the
worker stops waiting for the thread, records the failed attempt (which gives
the lease up: the run is ``runnable`` again) and goes on; the thread is left
to finish on its own. Whatever it does later under the old lease is refused
by the fence: ``ctx.effect`` and ``ctx.heartbeat`` writes raise/are dropped
with :class:`~pgdurable.LeaseLost`, and its return value is ignored. Make
sync steps that may hang honour a timeout of their own (HTTP client timeouts)
so that their threads do not pile up.

Timeouts are measured on the worker's monotonic clock (the step runs there);
``heartbeat_at`` is the database clock, for operators.

The worker hooks in at one place: the step call runs inside
``async with step_guard(task, ctx):``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..foundation.errors import InvalidInput, StepHung, StepTimeout
from ..foundation.jsonb import dumps
from ..foundation.queries.core import one
from ..foundation.queries.liveness import HEARTBEAT
from .text import finish as finish_text
from .text import settle as settle_text

if TYPE_CHECKING:
    from types import TracebackType

    from ..foundation.ports import StepContext
    from ..foundation.registry import Task

__all__ = ["StepGuard", "check_timeout", "heartbeat", "step_guard"]

log = logging.getLogger("pgdurable.liveness")

# heartbeat writes in flight (kept referenced until done)
_writes: set[asyncio.Task[None]] = set()


def check_timeout(value: timedelta | float | int | None, what: str) -> float | None:
    """``value`` in seconds (``None`` stays ``None``); InvalidInput unless > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | float | int):
        raise TypeError(f"{what} must be a timedelta or seconds, not {type(value).__name__}")
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not secs > 0 or secs == float("inf"):
        raise InvalidInput(f"{what} must be a finite duration > 0, not {value!r}")
    return secs


class StepGuard:
    """Bounds one step by its task's ``step_timeout`` and ``heartbeat_timeout``
    and records its heartbeats. Use as ``async with`` around the step call."""

    def __init__(self, ctx: StepContext, step_timeout: float | None,
                 heartbeat_timeout: float | None) -> None:
        self._ctx = ctx
        self._step_timeout = step_timeout
        self._hb_timeout = heartbeat_timeout
        self._loop = asyncio.get_running_loop()
        self._step_deadline: float | None = None
        self._last_beat = 0.0
        self._timeout: asyncio.Timeout | None = None
        self._pending: tuple[str | None] | None = None  # progress to write next
        self._writing = False

    def _deadline(self) -> tuple[float | None, str]:
        hb = None if self._hb_timeout is None else self._last_beat + self._hb_timeout
        sd = self._step_deadline
        if hb is None:
            return sd, "step"
        if sd is None or hb < sd:
            return hb, "heartbeat"
        return sd, "step"

    async def __aenter__(self) -> StepGuard:
        now = self._loop.time()
        self._last_beat = now
        if self._step_timeout is not None:
            self._step_deadline = now + self._step_timeout
        if self._step_timeout is not None or self._hb_timeout is not None:
            self._timeout = asyncio.timeout_at(self._deadline()[0])
            await self._timeout.__aenter__()
        self._ctx._liveness = self  # heartbeats still record progress without limits
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._ctx._liveness = None
        if self._ctx._text is not None:  # the step streamed text
            try:
                if exc_type is None:
                    await finish_text(self._ctx)  # stored before the step's checkpoint
            finally:
                settle_text(self._ctx)
        if self._timeout is None:
            return
        kind = self._deadline()[1]
        try:
            await self._timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            if not self._timeout.expired():
                raise
            step = self._ctx.step
            if kind == "heartbeat":
                raise StepHung(f"step {step} sent no heartbeat for {self._hb_timeout:g} s "
                               "(heartbeat_timeout): cancelled as hung") from None
            raise StepTimeout(f"step {step} ran longer than its step_timeout of "
                              f"{self._step_timeout:g} s: cancelled") from None

    # -- heartbeats (on the worker's loop) ------------------------------------

    def beat(self, progress_json: str | None, record: bool) -> None:
        """A heartbeat: push the hung-step deadline back, queue the progress write."""
        self._last_beat = self._loop.time()
        t = self._timeout
        if t is not None and self._ctx._liveness is self and not t.expired():
            try:
                t.reschedule(self._deadline()[0])
            except RuntimeError:  # expiring or exited meanwhile: the step is over
                pass
        if record:
            self._pending = (progress_json,)
            if not self._writing:
                self._writing = True
                w = self._loop.create_task(self._write())
                _writes.add(w)
                w.add_done_callback(_writes.discard)

    async def _write(self) -> None:
        ctx = self._ctx
        try:
            while self._pending is not None:
                (progress,) = self._pending
                self._pending = None
                try:
                    await one(ctx._app, HEARTBEAT, (ctx.run_id, ctx.token, ctx._owner, progress))
                except Exception as exc:  # lease lost, database down: progress only
                    log.info("run %s: heartbeat not recorded (%s)", ctx.run_id, exc)
                    return
        finally:
            self._writing = False


def step_guard(task: Task, ctx: StepContext) -> StepGuard:
    """The guard of one step of ``task`` (its limits may both be ``None``)."""
    return StepGuard(ctx, task.step_timeout, task.heartbeat_timeout)


def heartbeat(ctx: StepContext, progress: Any = None) -> None:
    """``ctx.heartbeat(progress)``: see the module docstring. Callable from an
    async step (on the worker's loop) or a sync step (its thread)."""
    try:
        text = None if progress is None else dumps(progress, "heartbeat progress")
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"heartbeat progress is not JSON: {exc}") from None
    guard = ctx._liveness
    if guard is None:
        return  # not inside a worker's step (e.g. a unit test calling the step)
    record = ctx._app is not None and ctx._owner is not None
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is guard._loop:
        guard.beat(text, record)
    else:
        guard._loop.call_soon_threadsafe(guard.beat, text, record)
