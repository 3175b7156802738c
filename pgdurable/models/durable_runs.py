"""Durable task definitions run by leased workers, and the effect replay policies.

Register a :class:`~pgdurable.models.durable_tasks.DurableTask` with the app and start it
like any task::

    app.register(task, context=my_app_object)
    run_id = await app.start(task.id, state={"count": 0})

The run is an ordinary run of ``pgdurable.runs`` and keeps the semantics of
``task.run`` (see :mod:`pgdurable.models.durable_tasks`), mapped onto the run engine:

* **checkpoint** -- ``runs.task``/``runs.revision`` are the definition id and
  revision (a worker claims only the revisions it has registered);
  ``runs.step`` is ``next_step_index``; ``runs.state`` is the state. Each step
  is one worker step: its new state is checkpointed (fenced) before the next
  step; the last step completes the run with the final state as its
  ``result``.
* **is_state** -- checked before every step (so on every claim): a state that
  fails it, a step index past the end or an in-flight mark that does not name
  the next ``reconcile`` step ends the run ``failed`` with
  :class:`~pgdurable.foundation.errors.CorruptCheckpoint` recorded in ``runs.error``.
  Nothing is repaired and no step runs.
* **authorize** -- re-checked on the first step of every claim (the first
  run and every resume: after a retry, a crash, a lease window that ended),
  with a :class:`~pgdurable.models.durable_tasks.DurableCheckpoint` built from the run. A
  denial (``False`` or any exception) ends the run ``failed`` with that error
  recorded (``PermissionError`` for ``False``); it is not retried and no step
  runs.
* **max_attempts / deadline** -- become the run's ``max_attempts`` and
  ``deadline`` (``now + deadline`` on the database clock at ``app.start``).
  A step that raises is a failed attempt: retried with backoff until
  ``max_attempts`` (``runs.attempts`` counts failed attempts and crashes, not
  successful resumes, unlike ``task.run``'s ``attempt_count``).
* **reconcile steps** -- before ``run()`` the step is *marked in flight*
  (``pgdurable.durable_step_mark``, fenced, committed first). A later claim
  that finds the mark at ``runs.step`` (the run was started and never
  confirmed: crash, lost lease, or ``run()`` raised) calls ``reconcile()``
  instead of ``run()``. If ``reconcile`` raises, the run ends ``failed`` with
  :class:`~pgdurable.foundation.errors.ReconcileFailed` recorded and the mark left in
  place (``pgdurable.durable_steps``): it is never re-run blindly; the
  application inspects and decides (e.g. starts a new run).

Cost: a ``safe`` step of a definition without ``authorize`` costs what a plain
task step costs (one fenced checkpoint). Otherwise one more round trip
(``pgdurable.durable_step_enter``) per step, and one for the mark before a
``reconcile`` step's ``run()``.

Steps receive ``(state, context)`` where ``context`` is a
:class:`DurableRunContext`: ``context.app`` (what was given to
``register(context=...)``), ``context.run`` (the :class:`~pgdurable.runs.steps.RunContext`)
and ``await context.effect(key, fn, reconcile=None)``. Sync step functions run
in a thread (they cannot block heartbeats).

Effects (``ctx.effect(key, fn, reconcile=None)``, in any task): a recorded
success returns its stored result; a recorded failure raises
:class:`~pgdurable.foundation.errors.EffectFailed`. An effect found *started* by an
earlier attempt (crashed between ``effect_begin`` and ``effect_finish``, so
its outcome is unknown) follows its replay policy: without ``reconcile``
("safe") ``fn`` runs again; with ``reconcile`` that callable is called instead
of ``fn`` and must return the real outcome (recorded like a result of ``fn``),
or :data:`NOT_PERFORMED` when the effect provably never happened: ``fn`` then
runs once under the current lease token; if it raises, the run ends ``failed``
with :class:`ReconcileFailed` and the effect stays ``started``.

Errors that must end a run at once (never retried) carry the attribute
``pgdurable_terminal = True`` (see :func:`mark_terminal`); the worker honours it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..engine.step_effects import NOT_PERFORMED, NotPerformed, call_effect, reconcile_effect
from ..foundation.errors import CorruptCheckpoint, ReconcileFailed, is_terminal, mark_terminal
from ..foundation.queries import durable_runs as dq
from ..foundation.queries.core import one
from ..foundation.registry import Task
from ..runs.steps import Continue, Done, EffectFn, RunContext, in_thread
from .durable_tasks import (
    CHECKPOINT_VERSION,
    CancelSignal,
    DurableCheckpoint,
    DurableStep,
    DurableTask,
    call_step,
    check_checkpoint,
)

if TYPE_CHECKING:
    from ..foundation.ports import App

__all__ = [
    "NOT_PERFORMED",
    "DurableRunContext",
    "NotPerformed",
    "call_effect",
    "durable_task_spec",
    "is_terminal",
    "mark_terminal",
    "reconcile_effect",
]



@dataclass(frozen=True)
class DurableRunContext:
    """The ``context`` a durable step receives when it runs under a leased worker.

    ``app`` is the object given to ``Durable.register(task, context=...)``;
    ``run`` is the step's :class:`~pgdurable.runs.steps.RunContext`; ``signal`` is a
    :class:`~pgdurable.models.durable_tasks.CancelSignal` that is never aborted (a step written
    for ``task.run`` may look at ``ctx.signal.aborted``; here a cancel stops the
    step itself, by ``asyncio.CancelledError``).
    """

    app: Any
    run: RunContext
    signal: Any = field(default_factory=CancelSignal)

    async def effect(self, key: str, fn: EffectFn, *, reconcile: EffectFn | None = None) -> Any:
        """``self.run.effect(key, fn, reconcile=reconcile)``: an effect recorded with the run."""
        return await self.run.effect(key, fn, reconcile=reconcile)


def _threaded(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``fn`` as an async function: a sync one runs in a thread."""
    if inspect.iscoroutinefunction(fn):
        return fn

    async def call(state: Any, context: Any) -> Any:
        value = await in_thread(fn, state, context)
        if inspect.isawaitable(value):
            value = await value
        return value

    return call


def _offloaded(task: DurableTask[Any, Any]) -> DurableTask[Any, Any]:
    """The same definition whose sync step functions run in threads."""
    steps = tuple(
        replace(s, run=_threaded(s.run),
                reconcile=None if s.reconcile is None else _threaded(s.reconcile))
        for s in task.steps
    )
    return replace(task, steps=steps)


def _deadline(task: DurableTask[Any, Any]) -> timedelta | None:
    d = task.deadline
    if d is None or isinstance(d, timedelta):
        return d
    return timedelta(milliseconds=d)


def _prepare_state(task: DurableTask[Any, Any]) -> Callable[[Any], Any]:
    def prepare(state: Any) -> Any:
        value = task.initial_state if state is None else state
        if value is None or not task.is_state(value):
            raise ValueError(
                f"durable task {task.id!r}: the start state fails is_state "
                "(pass state= or define initial_state=)"
            )
        return value

    return prepare


def durable_task_spec(
    app: App,
    task: DurableTask[Any, Any],
    *,
    context: Any = None,
    retry_base: float = 1.0,
    retry_cap: float = 300.0,
) -> Task:
    """The engine :class:`~pgdurable.app.durable.Task` that runs ``task`` (used by ``Durable.register``)."""
    if not isinstance(task, DurableTask):
        raise TypeError(f"register() needs a DurableTask, not {type(task).__name__}")
    if retry_base < 0 or retry_cap < 0:
        raise ValueError("retry_base and retry_cap must be >= 0")
    runner = _offloaded(task)
    n = len(task.steps)

    async def step_fn(ctx: RunContext, state: Any) -> Continue | Done:
        index = ctx.step
        if index >= n:
            raise mark_terminal(CorruptCheckpoint(
                f"run {ctx.run_id}: step {index} is past the {n} steps of {task.id!r}"
            ))
        step: DurableStep = task.steps[index]
        first_in_claim, in_flight = False, None
        if task.authorize is not None or step.replay == "reconcile":
            # one round trip, only when its answer is needed (safe steps of a
            # definition without authorize cost what a plain task step costs)
            entered = await one(app, dq.ENTER, (ctx.run_id, ctx.token, index))
            first_in_claim, in_flight = entered.first_in_claim, entered.in_flight
        deadline_ms = None if ctx.deadline is None else int(ctx.deadline.timestamp() * 1000)
        record = DurableCheckpoint(
            version=CHECKPOINT_VERSION, definition_id=task.id, revision=task.revision,
            next_step_index=index, attempt_count=ctx.attempt - 1, max_attempts=task.max_attempts,
            deadline_at_ms=deadline_ms, status="running", state=state, in_flight_step=in_flight,
        )
        try:
            check_checkpoint(task, record)
        except Exception as exc:
            raise mark_terminal(exc) from None
        context = DurableRunContext(app=context_app, run=ctx)
        if first_in_claim and task.authorize is not None:
            try:
                verdict = task.authorize(record, context)
                if inspect.isawaitable(verdict):
                    verdict = await verdict
            except Exception as exc:
                raise mark_terminal(exc) from None
            if verdict is False:
                raise mark_terminal(PermissionError(
                    f"durable task {task.id!r}: authorize denied the resume of run {ctx.run_id}"
                ))
        resuming = in_flight == step.id
        if step.replay == "reconcile" and not resuming:
            await one(app, dq.MARK, (ctx.run_id, ctx.token, index, step.id))
        try:
            new_state = await call_step(runner, record, context, reconcile=resuming)
        except ReconcileFailed as exc:
            raise mark_terminal(exc) from None
        if index + 1 == n:
            return Done(result=new_state, state=new_state)
        return Continue(new_state)

    context_app = context
    return Task(
        name=task.id, revision=task.revision, fn=step_fn, max_attempts=task.max_attempts,
        retry_base=float(retry_base), retry_cap=float(retry_cap),
        deadline=_deadline(task), prepare_state=_prepare_state(task),
    )
