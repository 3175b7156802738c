"""Workflows: agents written as ordinary async code, on the run engine.

::

    @app.workflow("research", revision="1")
    async def research(ctx: WorkflowContext, topic: str) -> dict:
        sources = await ctx.step("search", web_search, topic)    # runs once, checkpointed
        ci = await ctx.wait_signal("ci", sources[0], timeout=timedelta(minutes=30))
        await ctx.sleep(timedelta(minutes=5))                     # parks: no worker held
        ok = await ctx.approval(f"report:{topic}")
        return {"ci": ci, "ok": ok}

    run_id = await app.start("research", "durable agents")       # the input is the start state

A workflow is NOT a second engine. It is registered as an ordinary task
(:class:`~pgdurable.app.durable.Task`) whose step function drives the coroutine, so
claims, leases, heartbeats, fencing, cancel, deadlines, budgets, retries of
the run, revisions and the operator views are the ones of ``@app.task``:

* **History = checkpoints.** Every recorded step, wait, sleep and patch marker
  is one row of ``pgdurable.checkpoints`` written by the worker's fenced,
  batched ``write_steps`` (``park_run`` for waits), exactly as a task's
  ``Continue`` (or ``Wait``/``Sleep``). Its ``state`` is
  ``{"workflow": {"kind", "name", "result" | "error" | ...}}`` (the first row
  also holds ``"input"``), so ``pgdurable run ID`` and SQL show the step names.
  ``runs.step`` is the number of rows. A stale worker's write is refused
  (``LeaseLost``): a zombie never records a step.
* **Replay only when needed.** While the lease is held the coroutine runs from
  step to step with no replay: one call of the step function runs until the
  workflow returns, parks or gives the run back (the lease window, a
  shutdown). A later claim (after a park, a crash, a lapse) loads the whole
  history in ONE query and runs the function again from the top; recorded
  steps return their recorded result (or raise their recorded
  :class:`StepFailed`) without calling ``fn``, recorded waits their recorded
  outcome (the ``wake`` column the engine stores with the next checkpoint).
* **Wait = exit.** ``sleep``, ``wait_signal``, ``approval`` and
  ``wait_inbox`` return the engine's :class:`~pgdurable.Wait` /
  :class:`~pgdurable.Sleep` from the step function: the run is checkpointed
  and parked through ``park_run`` (a signal sent before the wait is kept and
  consumed at once) and the coroutine is abandoned.
* **Determinism guard.** Each entry has a position and a name; code that asks
  for another entry than the one recorded at that position (or returns before
  the recorded history is used up) fails the run with
  :class:`NonDeterministicWorkflow` naming both. :meth:`WorkflowContext.patched`
  lets new runs take a new path while old runs keep the old one.
* **A returned step is durable.** ``ctx.step`` returns only after its
  checkpoint committed, so the code after it never runs on an unrecorded
  result; ``step`` then ``return`` is two fenced writes (the checkpoint, then
  the completion). :meth:`WorkflowContext.finish` ends the workflow with a
  last step whose checkpoint IS the completion: one write, as a task's
  ``Done``.
* **Steps** (:meth:`WorkflowContext.step`) are retried in place with backoff
  up to ``StepPolicy.max_attempts``; the last error is recorded and raised as
  :class:`StepFailed`. ``replay="safe"`` steps may run again if a crash came
  between the call and its checkpoint; ``replay="reconcile"`` steps go
  through the run's effect records (``effect_begin``/``effect_finish``,
  :meth:`~pgdurable.RunContext.effect`): one found started and never
  finished calls ``reconcile`` instead of ``fn`` (never re-run blindly).

Errors that replay would only repeat (non-determinism, a recorded
``StepFailed`` or ``WaitTimeout`` escaping the function, bad step input) end
the run ``failed`` at once; any other exception of the workflow's own code is
a failed attempt of the run, retried from the top like a task step.

Recovering a failed run (``app.retry``, ``app.fork`` at its default step,
``fork_failed``; docs/fork.md): a step error the workflow caught is history
and replays as recorded. An uncaught one fails the run with an error that
names its checkpoint (``runs.error.checkpoint``, see
:func:`~pgdurable.foundation.errors.mark_recorded`): the retry drops that record and the
step runs again (a ``reconcile`` step through its reconcile first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any, Literal, NoReturn, TypeVar

from ..foundation import run_queries as q
from ..foundation.errors import (
    CorruptCheckpoint,
    EffectFailed,
    LeaseLost,
    PgDurableError,
    mark_recorded,
)
from ..foundation.jsonb import dumps
from ..foundation.jsonb import exc_message as _exc_message
from ..foundation.jsonb import jsonb_str as _jsonb_str
from ..foundation.ports import App
from ..foundation.queries.core import first
from ..foundation.queries.workflows import LOAD_HISTORY, Checkpoint
from ..foundation.registry import Task, TaskRegistry
from ..runs.budgets import BudgetExhausted, Reservation
from ..runs.children import Child
from ..runs.steps import (
    Done,
    RunContext,
    RunIO,
    RunSettled,
    Sleep,
    StepResult,
    Wait,
    _seconds,
    in_thread,
)
from ..runs.text import finish as finish_text
from ..runs.threads import Message, encode_thread_key
from .durable_runs import mark_terminal

__all__ = [
    "NonDeterministicWorkflow",
    "StepFailed",
    "StepPolicy",
    "WaitTimeout",
    "Workflow",
    "WorkflowContext",
    "workflow_spec",
]

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("pgdurable.workflows")



class NonDeterministicWorkflow(PgDurableError):
    """A resumed run's code asked for another entry than its history records."""


class StepFailed(PgDurableError):
    """A step's last attempt raised; its error is recorded and raised again on replay.

    ``step`` is the step's name, ``error_type`` and ``message`` the error's,
    ``checkpoint`` the number of the checkpoint that records the error (None
    for one made elsewhere). Caught by the workflow, it is part of the run's
    history: a replay raises it again. Uncaught, it fails the run, and a
    retry or fork of that run runs the step again (see :mod:`pgdurable.runs.fork`).
    """

    def __init__(self, step: str, error_type: str, message: str,
                 checkpoint: int | None = None) -> None:
        super().__init__(f"step {step!r} failed: {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.message = message
        self.checkpoint = checkpoint


class WaitTimeout(PgDurableError, TimeoutError):
    """A ``wait_signal``/``approval`` timed out (recorded: replay times out again)."""


@dataclass(frozen=True)
class StepPolicy:
    """How a step is retried and replayed.

    ``max_attempts`` attempts in place, ``min(retry_cap, retry_base *
    2**(n-1))`` seconds times a jitter in [0.5, 1.5) apart. ``replay``:
    ``"safe"`` (default; may run again if a crash comes between the call
    and its checkpoint) or ``"reconcile"`` (never re-run blindly: an attempt
    found started and unfinished calls ``reconcile(*args, **kwargs)``, which
    must return the real outcome).
    """

    max_attempts: int = 3
    retry_base: float = 0.5
    retry_cap: float = 30.0
    replay: Literal["safe", "reconcile"] = "safe"
    reconcile: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        n = self.max_attempts
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError("StepPolicy.max_attempts must be an int >= 1")
        if self.retry_base < 0 or self.retry_cap < 0:
            raise ValueError("StepPolicy retry_base and retry_cap must be >= 0")
        if self.replay not in ("safe", "reconcile"):
            raise ValueError("StepPolicy.replay must be 'safe' or 'reconcile'")
        if (self.replay == "reconcile") != (self.reconcile is not None):
            raise ValueError("StepPolicy: replay='reconcile' needs reconcile=, and only it")
        if self.reconcile is not None and not callable(self.reconcile):
            raise TypeError("StepPolicy.reconcile must be callable")


DEFAULT_POLICY = StepPolicy()


class _Park(BaseException):
    """Raised to abandon the coroutine with an engine result: a wait's
    Wait/Sleep, or a final step's Done (:meth:`WorkflowContext.finish`)."""

    def __init__(self, result: StepResult) -> None:
        super().__init__("workflow parks")
        self.result = result


@dataclass
class _Entry:
    """One logical history entry (a checkpoint row) and, for a wait, its outcome."""

    kind: str
    name: str
    body: dict[str, Any]
    outcome: dict[str, Any] | None = None
    row: int = 0  # its checkpoint's number (runs.step when it was recorded)


def _history(history: list[Checkpoint], wake: dict[str, Any] | None,
             run_id: str) -> tuple[Any, list[_Entry]]:
    """(input, entries) from the checkpoints; a wait's outcome is the wake
    recorded with the checkpoint after it (or the run's current wake for the last)."""
    first = history[0].state
    if not isinstance(first, dict) or "input" not in first:
        raise CorruptCheckpoint(f"run {run_id}: checkpoint 1 is not a workflow checkpoint")
    entries: list[_Entry] = []
    at_row: list[int] = []
    for i, checkpoint in enumerate(history):
        state = checkpoint.state
        body = state.get("workflow") if isinstance(state, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            raise CorruptCheckpoint(f"run {run_id}: checkpoint {i + 1} is not a workflow entry")
        entry = _Entry(body["kind"], str(body.get("name")), body, row=i + 1)
        if entry.kind == "return":
            continue  # a completion whose run was failed by its verdict, then retried
        if (body.get("repark") and entries and entries[-1].kind == entry.kind
                and entries[-1].name == entry.name):
            entries[-1], at_row[-1] = entry, i  # parked again on the same wait (no wake came)
        else:
            entries.append(entry)
            at_row.append(i)
    for entry, i in zip(entries, at_row, strict=True):
        if entry.kind in ("wait", "sleep"):
            entry.outcome = history[i + 1].wake if i + 1 < len(history) else wake
    return first["input"], entries


def _error_body(exc: BaseException) -> dict[str, str]:
    return {"type": _jsonb_str(type(exc).__name__), "message": _exc_message(exc)}


#: The name of the wait a step records when a budget parks it (``budget#1``, ...).
_BUDGET_WAIT = "budget"


class WorkflowContext:
    """What a workflow function gets: recorded steps, waits and the run's facilities.

    Attributes: ``run_id``, ``task``, ``attempt``, ``deadline``, ``budget``,
    ``input`` (the start state), ``run`` (the underlying
    :class:`~pgdurable.RunContext`), ``replaying`` (true while recorded
    history is being replayed), ``position`` (entries so far).
    """

    def __init__(self, run: RunContext, spec: Workflow, input: Any,
                 entries: list[_Entry], rows: int) -> None:
        self.run = run
        self.input = input
        self._spec = spec
        self._entries = entries
        self._pos = 0
        self._rows = rows  # physical checkpoint rows (== runs.step)
        self._names: dict[str, int] = {}
        self._busy = False
        self._counts: dict[str, int] = {}  # waits and drains per base name

    # -- facts --------------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run.run_id

    @property
    def task(self) -> str:
        """The workflow's name."""
        return self.run.task

    @property
    def attempt(self) -> int:
        """The run's attempt (1-based; failed attempts of the whole run)."""
        return self.run.attempt

    @property
    def deadline(self) -> datetime | None:
        """The run's deadline (aware datetime) or None."""
        return self.run.deadline

    @property
    def budget(self) -> float | None:
        """The run's budget or None."""
        return self.run.budget

    @property
    def replaying(self) -> bool:
        """True while the code is replaying recorded history."""
        return self._pos < len(self._entries)

    @property
    def position(self) -> int:
        """How many history entries the code has passed so far."""
        return self._pos

    # -- the run's facilities ----------------------------------------------

    def spend(self, amount: float) -> None:
        """Add to the run's spend (saved with the next checkpoint); see RunContext.spend.

        Replayed code does not spend again: during replay this is a no-op.
        """
        if self.replaying:
            return
        self.run.spend(amount)

    def reserve(self, *, key: str | None = None, **amounts: float | int | Decimal) -> Reservation:
        """Reserve budget before a model call, inside a step's function: see
        :meth:`RunContext.reserve`. The reservation is keyed by the step being
        recorded, so an attempt that crashed before its checkpoint finds its
        settlement and is not charged again; a recorded step is not run again."""
        return self.run.reserve(key=key, **amounts)

    async def emit(self, event: Any) -> int:
        """Append ``event`` to the run's output stream (fenced); its seq.

        During replay the event was emitted when that code first ran: nothing
        is written and 0 is returned.
        """
        if self.replaying:
            dumps(event, "event")
            return 0
        return await self.run.emit(event)

    # -- recorded steps ------------------------------------------------------

    def _claim_name(self, name: object, repeat: bool, what: str) -> str:
        q.check_name(name, f"{what} name")
        assert isinstance(name, str)
        seen = self._names.get(name, 0)
        if seen and not repeat:
            raise mark_terminal(ValueError(
                f"workflow {self.task!r}: {what} name {name!r} is already used in this run; "
                "give each step its own name or pass repeat=True"
            ))
        self._names[name] = seen + 1
        return name if seen == 0 else f"{name}#{seen + 1}"

    def _next(self, kind: str, name: str) -> _Entry | None:
        """The recorded entry at this position (checked), or None past the history."""
        if self._pos >= len(self._entries):
            return None
        entry = self._entries[self._pos]
        if entry.kind != kind or entry.name != name:
            raise mark_terminal(NonDeterministicWorkflow(
                f"workflow {self.task!r} run {self.run_id}: at position {self._pos} the code "
                f"asks for {kind} {name!r} but the history records {entry.kind} {entry.name!r} "
                f"(revision {self._spec.revision}); the code changed under a running "
                "revision: use a new revision or ctx.patched()"
            ))
        return entry

    async def _record(self, body: dict[str, Any], body_json: str | None = None) -> None:
        """Checkpoint one entry (fenced, batched); give the run back if it should go.

        ``body_json``: ``body`` already serialised (a step's result is
        validated and encoded once, not twice).
        """
        io: RunIO | None = self.run._io
        if io is None:
            raise RuntimeError("this WorkflowContext is not attached to a worker")
        text = dumps(body, "workflow checkpoint") if body_json is None else body_json
        if self._rows == 0:
            text = '{"input":' + dumps(self.input, "input") + ',"workflow":' + text + "}"
        else:
            text = '{"workflow":' + text + "}"
        spend = self.run._pending_spend
        await finish_text(self.run)  # the step's streamed text is stored before its checkpoint
        try:
            status = await io.checkpoint(text, spend)
        except LeaseLost:
            raise RunSettled from None  # not ours any more: no further writes
        self._rows += 1
        self._pos += 1
        self._entries.append(_Entry(body["kind"], body["name"], body, row=self._rows))
        self.run.spent += spend
        self.run._pending_spend = 0.0
        self.run.step = self._rows
        self.run._emitted = 0
        if status != "leased":
            raise RunSettled  # cancelled, or failed by the budget/deadline verdict
        if io.should_yield():
            # lease window used up, shutdown: give the run back at this
            # boundary; the next claim replays the history (one query)
            try:
                await io.release()
            except LeaseLost:
                pass
            raise RunSettled

    def _numbered(self, base: str) -> str:
        n = self._counts.get(base, 0) + 1
        self._counts[base] = n
        return f"{base}#{n}"

    def _enter(self) -> None:
        if self._busy:
            raise mark_terminal(RuntimeError(
                f"workflow {self.task!r}: steps and waits must be awaited one at a time "
                "(their positions are the history's order); run concurrent work inside one step"
            ))
        self._busy = True

    async def step(self, name: str, fn: Callable[..., Any], *args: Any,
                   policy: StepPolicy = DEFAULT_POLICY, repeat: bool = False,
                   **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (sync in a thread, or async) once per run.

        Its JSON result is checkpointed under the lease's fence; a resumed
        run gets it back without calling ``fn``. An error is retried in place
        per ``policy`` (:class:`StepPolicy`); the last one is recorded and
        raised as :class:`StepFailed` (also on every replay). Each name is used
        once per run (``ValueError`` otherwise) unless ``repeat=True``, which
        records the second use as ``"name#2"`` and so on. A result that is not
        JSON raises ``TypeError`` naming the step and the path; nothing is
        checkpointed and the run fails.
        """
        return await self._step(name, fn, args, kwargs, policy, repeat, False)

    async def finish(self, name: str, fn: Callable[..., Any], *args: Any,
                     policy: StepPolicy = DEFAULT_POLICY, repeat: bool = False,
                     **kwargs: Any) -> NoReturn:
        """The last step, whose result is the workflow's result::

            return await ctx.finish("report", write_report, notes)

        The same as ``return await ctx.step(...)`` except that the step's
        checkpoint and the run's completion are ONE fenced write, as a task's
        ``Done`` (``ctx.step`` then ``return`` is two: a step's result is
        made durable before the code after it runs). The workflow function
        ends inside the call: code after it never runs. A step that fails
        raises :class:`StepFailed` as :meth:`step` does (the workflow may
        catch it and go on). Replayed, a recorded step completes the run with
        its recorded result.
        """
        await self._step(name, fn, args, kwargs, policy, repeat, True)
        raise AssertionError("unreachable: a final step ends the workflow")

    async def _step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any], policy: StepPolicy, repeat: bool,
                    final: bool) -> Any:
        """:meth:`step`, or with ``final`` :meth:`finish` (raises :class:`_Park`
        with the engine's ``Done`` instead of returning)."""
        if not callable(fn):
            raise mark_terminal(TypeError(f"step {name!r}: fn must be callable"))
        if not isinstance(policy, StepPolicy):
            raise mark_terminal(TypeError("policy must be a StepPolicy"))
        self._enter()
        try:
            key = self._claim_name(name, repeat, "step")
            self._skip_budget_waits()
            entry = self._next("step", key)
            if entry is not None:
                self._pos += 1
                value = _recorded(entry)
                if final:
                    self._check_ended()
                    raise _Park(Done(value, state=_RETURN))
                return value
            call = functools.partial(fn, *args, **kwargs)
            rec = None if policy.reconcile is None else functools.partial(
                policy.reconcile, *args, **kwargs)
            while True:
                try:
                    ok, value = await self._attempts(key, call, rec, policy,
                                                     inspect.iscoroutinefunction(fn))
                    break
                except BudgetExhausted as exc:
                    # a budget's park: a recorded wait, then the step again (runs/budgets.py)
                    kind, ref, wake_in = exc.parking()
                    assert kind is not None and ref is not None
                    self._busy = False
                    await self.park(_BUDGET_WAIT, Wait(signal=(kind, ref), timeout=wake_in))
                    self._busy = True
            if ok:
                try:
                    result_json = dumps(value, f"step {key!r} result")
                except (TypeError, ValueError) as exc:
                    raise mark_terminal(type(exc)(str(exc))) from None
                body = {"kind": "step", "name": key, "result": value}
                if final:  # the checkpoint is the completion's state: one write
                    raise _Park(Done(value, state={"input": self.input, "workflow": body}
                                     if self._rows == 0 else {"workflow": body}))
                await self._record(body, f'{{"kind":"step","name":{encode_basestring(key)},'
                                         f'"result":{result_json}}}')
                return value
            await self._record({"kind": "step", "name": key, "error": value})
            raise mark_terminal(StepFailed(key, value["type"], value["message"], self._rows))
        finally:
            self._busy = False

    def _skip_budget_waits(self) -> None:
        """Replaying a step: pass the budget waits recorded before it (each one a park
        of the step on an exhausted budget, woken), as :meth:`park` would."""
        while self._pos < len(self._entries):
            e = self._entries[self._pos]
            if (e.kind != "wait" or not e.name.startswith(_BUDGET_WAIT + "#")
                    or e.outcome is None):
                return
            self._numbered(_BUDGET_WAIT)
            self._pos += 1

    def _check_ended(self) -> None:
        """The code ends here: NonDeterministicWorkflow if the history goes on."""
        if self._pos < len(self._entries):
            e = self._entries[self._pos]
            raise mark_terminal(NonDeterministicWorkflow(
                f"workflow {self.task!r} run {self.run_id}: the code returned at position "
                f"{self._pos} but the history records {e.kind} {e.name!r} there"))

    async def _attempts(self, key: str, call: Callable[[], Any], rec: Callable[[], Any] | None,
                        policy: StepPolicy, is_async: bool) -> tuple[bool, Any]:
        """(True, result) or (False, error body) after up to max_attempts attempts."""
        error: dict[str, str] = {"type": "StepFailed", "message": "no attempt"}
        for n in range(1, policy.max_attempts + 1):
            try:
                if rec is not None:
                    # the run's effect record: started/finished, fenced; a
                    # started-and-unfinished attempt is reconciled, not re-run
                    return True, await self.run.effect(f"workflow:{key}#{n}", call,
                                                       reconcile=rec)
                return True, await (call() if is_async else _call(call))
            except EffectFailed as exc:
                error = {"type": "EffectFailed", "message": str(exc)}
                continue  # an earlier claim's attempt n failed: not called again
            except BudgetExhausted:
                raise  # a budget's park: the run waits, the step runs again on waking
            except Exception as exc:
                if getattr(exc, "pgdurable_terminal", False):
                    raise  # e.g. ReconcileFailed: never retried
                error = _error_body(exc)
            if n < policy.max_attempts:
                delay = min(policy.retry_cap, policy.retry_base * 2 ** (n - 1))
                delay *= random.uniform(0.5, 1.5)
                log.warning("run %s: step %r attempt %d failed (%s: %s); retrying in %.2f s",
                            self.run_id, key, n, error["type"], error["message"], delay)
                await asyncio.sleep(delay)
        return False, error

    async def patched(self, change_id: str) -> bool:
        """True if this run takes the code path of ``change_id``.

        New runs (and old runs past their recorded history) record a marker
        and get True; an old run whose history has another entry at this
        position gets False and keeps its old path::

            if await ctx.patched("use-v2-search"):
                hits = await ctx.step("search-v2", search_v2, topic)
            else:
                hits = await ctx.step("search", search, topic)
        """
        q.check_name(change_id, "change id")
        self._enter()
        try:
            if self._pos < len(self._entries):
                entry = self._entries[self._pos]
                if entry.kind == "patch" and entry.name == change_id:
                    self._pos += 1
                    return True
                return False
            await self._record({"kind": "patch", "name": change_id})
            return True
        finally:
            self._busy = False

    # -- waits: park through the engine -------------------------------------

    async def park(self, name: str, wait: Wait | Sleep) -> dict[str, Any]:
        """Park on any engine :class:`~pgdurable.Wait`/:class:`~pgdurable.Sleep`;
        return the recorded wake (``ctx.wake`` of a task step).

        The building block of the waits below (and of waits on children):
        past the history, the run is checkpointed with a wait entry named
        ``name`` and parked (the coroutine is abandoned; no worker is held).
        Replayed, the outcome recorded for that entry is returned at once.
        """
        kind = "sleep" if isinstance(wait, Sleep) else "wait"
        self._enter()
        try:
            key = self._numbered(name)
            entry = self._next(kind, key)
            if entry is not None and entry.outcome is not None:
                self._pos += 1
                return entry.outcome
            body: dict[str, Any] = {"kind": kind, "name": key}
            signal = getattr(wait, "signal", None)
            if signal is not None:
                body["signal"] = list(signal)
            if entry is not None:
                if self._pos != len(self._entries) - 1:
                    raise CorruptCheckpoint(
                        f"run {self.run_id}: the wait {key!r} at position {self._pos} "
                        "has no recorded outcome but later entries exist")
                body["repark"] = True  # woken without an outcome (e.g. retried): park again
            state: dict[str, Any] = {"workflow": body}
            if self._rows == 0:
                state = {"input": self.input, "workflow": body}
            dumps(state, "workflow checkpoint")
            # the same engine result with the entry as its checkpoint state
            # (any extra fields it has, e.g. a wait on children, are kept)
            raise _Park(dataclasses.replace(wait, state=state))
        finally:
            self._busy = False

    async def start_child(self, task: str, state: Any = None, *, key: str | None = None,
                          **options: Any) -> str:
        """Start a child run of ``task`` (a sub-agent) as a recorded step; its id.

        The step is named ``child:<key>``; ``key`` defaults to the call's
        position among this run's children (``"1"``, ``"2"``, ...). The start
        is once per this run and key (:meth:`RunContext.start_child
        <pgdurable.RunContext.start_child>`): a crash before the step's
        checkpoint finds the same child again, never a second one.
        ``options``: ``queue``, ``priority``, ``deadline`` (capped by this
        run's), ``budget``, ``revision``, ``max_attempts``, ``policy``
        (``"cancel"``, the default, or ``"abandon"`` when this run ends first).
        """
        n = self._counts.get(" child-keys", 0) + 1
        self._counts[" child-keys"] = n
        key = str(n) if key is None else key
        start = functools.partial(self.run.start_child, task, state, key=key, **options)
        return str(await self.step(f"child:{key}", start))

    async def start_children(self, children: Iterable[Child | dict[str, Any]]) -> list[str]:
        """Start many child runs as ONE recorded step; their ids in input order.

        :meth:`RunContext.start_children <pgdurable.RunContext.start_children>` (one
        statement, one lock of this run, one commit) as a step named
        ``start-children:<n>`` (``n``: this call's position among this run's
        ``start_children`` calls). Each :class:`~pgdurable.Child` names its ``key``;
        the start is once per this run and key, so a crash before the step's
        checkpoint finds the same children again, never second ones.
        """
        items = list(children)
        n = self._counts.get(" children-calls", 0) + 1
        self._counts[" children-calls"] = n
        start = functools.partial(self.run.start_children, items)
        return [str(i) for i in await self.step(f"start-children:{n}", start)]

    async def gather(self, ids: list[str], *, any: bool = False, at_least: int | None = None,
                     timeout: timedelta | float | None = None,  # noqa: ASYNC109
                     ) -> list[dict[str, Any]]:
        """Park until children of this run finish (all of ``ids``, the first with
        ``any=True``, or ``at_least`` of them, or ``timeout``); their outcomes.

        One ``{"status", "result", "error"}`` per id, in the order of ``ids``
        (unfinished ones with their current status). A failed child is reported,
        not raised: the workflow decides. Recorded: a replay gets the same list.
        The fan-in wakes this run once, however many children there are.
        """
        wake = await self.park(
            "children", Wait.children(ids, any=any, at_least=at_least, timeout=timeout))
        outcomes: dict[str, dict[str, Any]] = wake.get("children") or {}
        return [outcomes[str(i)] for i in ids]

    async def sleep(self, duration: timedelta | float) -> None:
        """Park for ``duration`` (a timedelta or seconds); no worker is held meanwhile."""
        _seconds(duration, "sleep duration")
        await self.park("sleep", Sleep(seconds=duration))

    async def sleep_until(self, until: datetime) -> None:
        """Park until the aware datetime ``until`` (database clock)."""
        await self.park("sleep", Sleep(until=until))

    async def wait_signal(self, kind: str, ref: str, *,
                          timeout: timedelta | float | None = None,  # noqa: ASYNC109
                          ) -> Any:
        """Park until the signal ``(kind, ref)``; return its payload.

        A signal sent before the wait is kept and returned at once. On
        timeout raises :class:`WaitTimeout` (recorded: a replay raises it
        again; unhandled, it fails the run).
        """
        wake = await self.park(f"signal:{kind}", Wait(signal=(kind, ref), timeout=timeout))
        if wake.get("type") == "signal":
            return wake.get("payload")
        raise mark_terminal(WaitTimeout(
            f"workflow {self.task!r}: no signal ({kind!r}, {ref!r}) within {timeout}"))

    async def wait_event(self, name: str, match: dict[str, Any], *,
                         timeout: timedelta | float | None = None,  # noqa: ASYNC109
                         ) -> dict[str, Any] | None:
        """Park until an event ``name`` whose data matches ``match``
        (``{"data.order_id": x}``); return it (``{"id", "name", "data", "event_id",
        "time"}``), or None after ``timeout``.

        Recorded: a replay returns the same event (or None). An event sent after
        the run started (or after the event that ended its previous wait_event)
        and before it parks is returned at once, not lost (see
        :mod:`pgdurable.runs.events` for exactly which events a wait sees).
        """
        wake = await self.park(f"event:{name}", Wait.for_event(name, match, timeout=timeout))
        if wake.get("type") == "event":
            event = wake.get("event")
            return dict(event) if isinstance(event, dict) else None
        return None

    async def approval(self, ref: str, *,
                       timeout: timedelta | float | None = None,  # noqa: ASYNC109
                       ) -> Any:
        """``wait_signal("approval", ref)``: a human's approval payload."""
        return await self.wait_signal("approval", ref, timeout=timeout)

    async def wait_inbox(self, *,
                         timeout: timedelta | float | None = None,  # noqa: ASYNC109
                         ) -> list[Message]:
        """The thread's next messages (a thread run), parking until there are some.

        Each drain is a recorded entry (its messages are consumed with its
        checkpoint); an empty drain parks on the thread's inbox. After
        ``timeout`` with nothing new, returns ``[]``.
        """
        while True:
            msgs = await self._drain()
            if msgs:
                return msgs
            if self.run.thread_key is None:
                raise mark_terminal(RuntimeError(
                    f"workflow {self.task!r}: wait_inbox() in a run without a thread"))
            wake = await self.park("inbox-wait", Wait(
                signal=("inbox", encode_thread_key(self.run.thread_key)), timeout=timeout))
            if wake.get("type") != "signal":
                return []

    async def _drain(self) -> list[Message]:
        self._enter()
        try:
            if self.replaying and self._entries[self._pos].kind != "inbox":
                return []  # this drain found nothing when it first ran: not recorded
            key = self._numbered("inbox")
            entry = self._next("inbox", key)
            if entry is not None:
                self._pos += 1
                self.run.thread_key = entry.body.get("thread_key")
                return [Message(m["seq"], m["message_id"], m["payload"], m["sender"],
                                datetime.fromisoformat(m["created_at"]), m["thread_key"])
                        for m in entry.body["messages"]]
            msgs = await self.run.inbox()
            if msgs or self.run.thread_key is not None:
                body = {"kind": "inbox", "name": key, "thread_key": self.run.thread_key,
                        "messages": [{"seq": m.seq, "message_id": m.message_id,
                                      "payload": m.payload, "sender": m.sender,
                                      "created_at": m.created_at.isoformat(),
                                      "thread_key": m.thread_key} for m in msgs]}
                if msgs:
                    await self._record(body)
                else:
                    self._counts["inbox"] -= 1  # nothing drained: nothing recorded
            return msgs
        finally:
            self._busy = False


#: the completion's checkpoint state (the first one also holds the input)
_RETURN: dict[str, Any] = {"workflow": {"kind": "return", "name": "return"}}


def _recorded(entry: _Entry) -> Any:
    """A recorded step's result, or its recorded error raised again."""
    if "error" in entry.body:
        err = entry.body["error"]
        raise mark_terminal(StepFailed(entry.name, str(err.get("type")), str(err.get("message")),
                                       entry.row))
    return entry.body.get("result")


async def _call(call: Callable[[], Any]) -> Any:
    if inspect.iscoroutinefunction(call):
        return await call()
    value = await in_thread(call)
    if inspect.isawaitable(value):
        value = await value
    return value


@dataclass
class Workflow:
    """A registered workflow: its function, name and revision (and counters)."""

    name: str
    revision: str
    fn: Callable[..., Awaitable[Any]]
    #: History loads (one per claim of a run with history): tests and metrics.
    history_loads: int = field(default=0)

    async def drive(self, run: RunContext, state: Any) -> StepResult:
        """The task step function: run the coroutine until it returns or parks."""
        history: list[Checkpoint] = []
        if run.step > 0:  # a fresh run has no history: no query
            self.history_loads += 1
            app: App = run._app
            history = await first(app, LOAD_HISTORY, (q.check_run_id(run.run_id),)) or []
        try:
            input_, entries = _history(history, run.wake, run.run_id) if history else (state, [])
        except CorruptCheckpoint as exc:
            raise mark_terminal(exc) from None
        if len(history) != run.step:
            raise mark_terminal(CorruptCheckpoint(
                f"run {run.run_id}: {len(history)} checkpoints for step {run.step}"))
        ctx = WorkflowContext(run, self, input_, entries, len(history))
        try:
            result = await self.fn(ctx, input_)
        except _Park as park:
            return park.result
        except Exception as exc:
            failed = _step_failure(exc)
            if (failed is not None and failed.checkpoint is not None
                    and failed.checkpoint == ctx._rows and ctx._pos == len(ctx._entries)):
                # the last entry's recorded error fails the run (itself, or
                # wrapped by a handler that raised another error from it): the
                # run's error names that checkpoint, so a retry runs the step again
                mark_recorded(exc, failed.checkpoint)
            raise
        ctx._check_ended()
        return Done(result, state=_RETURN if ctx._rows else {"input": input_, **_RETURN})


def _step_failure(exc: BaseException) -> StepFailed | None:
    """The :class:`StepFailed` that ``exc`` is or was raised from (``raise X from
    err``, or ``raise X`` inside ``except StepFailed``), nearest first; None if none.

    A handler that wraps a step's failure in its own error did not handle it: the
    run failed because the step did, so a retry runs that step again (docs/fork.md).
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, StepFailed):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ if cur.__cause__ is not None else cur.__context__
    return None


def workflow_spec(wf: Workflow, *, max_attempts: int, retry_base: float, retry_cap: float,
                  max_reclaims: int) -> Task:
    """The engine :class:`~pgdurable.app.durable.Task` that drives ``wf``."""
    return Task(wf.name, wf.revision, wf.drive, max_attempts, float(retry_base),
                float(retry_cap), max_reclaims)


def workflow_decorator(registry: TaskRegistry, name: str, revision: str, max_attempts: int,
                       retry_base: float, retry_cap: float,
                       max_reclaims: int) -> Callable[[F], F]:
    """``@app.workflow(name, revision=...)``: register an ``async def fn(ctx, input)``."""
    q.check_name(name, "workflow name")
    q.check_name(revision, "revision")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError("max_attempts must be an int >= 1")
    if retry_base < 0 or retry_cap < 0:
        raise ValueError("retry_base and retry_cap must be >= 0")
    if isinstance(max_reclaims, bool) or not isinstance(max_reclaims, int) or max_reclaims < 0:
        raise ValueError("max_reclaims must be an int >= 0")

    def deco(fn: F) -> F:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("@workflow decorates an async def fn(ctx: WorkflowContext, input)")
        wf = Workflow(name, revision, fn)
        registry.register(workflow_spec(wf, max_attempts=max_attempts, retry_base=retry_base,
                                        retry_cap=retry_cap, max_reclaims=max_reclaims))
        fn.workflow = wf  # type: ignore[attr-defined]
        return fn

    return deco

