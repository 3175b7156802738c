"""Durable task definitions: :func:`define_durable_task`.

A durable task is a fixed list of steps over a JSON state, run or resumed by
``await task.run(task_id=..., context=...)``. Its progress lives in a
*checkpoint record* (:class:`DurableCheckpoint`) kept by a store
(:class:`DurableStore`): :class:`PostgresDurableStore` across processes,
:class:`MemoryDurableStore` in one process (tests, demos).

One ``run`` call, exactly:

1. take the store's exclusive lock on the task id (for the whole call);
2. load the record; none means a fresh record from the definition
   (status ``ready``);
3. a record of another definition id or revision raises
   :class:`~pgdurable.foundation.errors.IncompatibleCheckpoint`; a malformed record, or a
   state that fails ``is_state``, raises :class:`~pgdurable.foundation.errors.CorruptCheckpoint`.
   Nothing is repaired and nothing is written;
4. a ``completed`` record returns its state and runs nothing; a ``failed``
   record raises its stored failure again;
5. ``authorize(checkpoint, context)`` (if given) on every call that would run
   steps (an explicit resume, including the first run): its exception
   propagates, nothing runs, nothing is saved. Returning ``False`` is a
   denial too (``PermissionError``);
6. the attempt is counted and saved; past ``max_attempts`` the record is
   saved ``failed`` and :class:`~pgdurable.foundation.errors.AttemptsExhausted` raised;
7. past ``deadline_at_ms`` the record is saved ``failed`` and
   :class:`~pgdurable.foundation.errors.DeadlineExceeded` raised;
8. the remaining steps run in order, the record saved after each one.

Replay policies. A ``safe`` step may simply run again after a crash. A
``reconcile`` step is first *marked in flight* (``in_flight_step`` = its id,
saved) and only then run; its completion clears the mark. A resume that finds
the mark calls the step's ``reconcile(state, context)`` instead of ``run``: it
must find out the real outcome (ask the other system) and return the state. If
``reconcile`` raises, the call stops with
:class:`~pgdurable.foundation.errors.ReconcileFailed` (chaining the cause) and the record
stays in flight: the step is never re-run blindly; the application decides.

A step that raises leaves the record where it was (its error saved in
``error``); the next ``run`` call is a new attempt.

Cancellation: the context's ``signal`` (an attribute, or a ``"signal"`` key of
a mapping context, like the kit's ``{app, signal}``) is looked at before every
step. It is aborted when it has ``aborted`` true (the kit's AbortSignal shape:
:class:`CancelSignal`, or any object with ``.aborted`` and optionally
``.reason``) or ``is_set()`` true (``asyncio.Event``, ``threading.Event``).
Then the call stops before the next step with
:class:`~pgdurable.foundation.errors.RunCancelled` (``exc.reason`` is the signal's
``reason``, also its cause when it is an exception); the record is resumable.

Record formats. A store may hold pgdurable's record (:data:`CHECKPOINT_VERSION`,
snake_case, with ``in_flight_step`` and ``error``) or the kit's own
(:data:`KIT_CHECKPOINT_VERSION`, camelCase: ``version, definitionId, revision,
nextStepIndex, attemptCount, maxAttempts, deadlineAtMs, status, state``).
``run`` reads both; it writes the one ``record_format=`` names
(``define_durable_task``; default ``"pgdurable"``), so a store shared with the
kit resumes there too. The kit's record has no in-flight field: a
``reconcile`` step started but not confirmed is saved ``status: "running"``
at its index (a step between two others is saved ``"ready"``), and a kit
record found ``running`` at a ``reconcile`` step is read as that step in
flight (the safe reading: reconcile, never re-run blindly). The kit's record
has no ``error`` either, and no deadline leaves ``deadlineAtMs`` out.

The per-step transitions are module-level functions (:func:`new_checkpoint`,
:func:`check_checkpoint`, :func:`begin_attempt`, :func:`deadline_failure`,
:func:`mark_in_flight`, :func:`call_step`, :func:`complete_step`) so that the
run engine can drive a :class:`DurableTask` under its own leases with the same
semantics.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..foundation import jsonb as _json
from ..foundation.db import acheck_connection, connect_timeout, translated, validate_dsn
from ..foundation.errors import (
    AttemptsExhausted,
    CorruptCheckpoint,
    DeadlineExceeded,
    IncompatibleCheckpoint,
    InvalidInput,
    PgDurableError,
    ProviderClosed,
    ReconcileFailed,
    RunCancelled,
)
from ..foundation.migrations import acheck_schema
from ..foundation.pooler import Pooler, aconfigure, check_pooler, connect_kwargs
from ..foundation.queries import tasks as tq
from ..foundation.queries.core import Query, one
from ..foundation.run_queries import check_size

__all__ = [
    "CHECKPOINT_VERSION",
    "KIT_CHECKPOINT_VERSION",
    "CancelSignal",
    "DurableCheckpoint",
    "DurableContext",
    "DurableStep",
    "DurableStore",
    "DurableTask",
    "MemoryDurableStore",
    "PostgresDurableStore",
    "begin_attempt",
    "call_step",
    "check_checkpoint",
    "complete_step",
    "deadline_failure",
    "define_durable_task",
    "mark_in_flight",
    "new_checkpoint",
    "signal_aborted",
]

T = TypeVar("T")
R = TypeVar("R")
App = TypeVar("App")

#: Format version of :class:`DurableCheckpoint` records written by this library.
CHECKPOINT_VERSION = 1
#: Format version of the kit's own checkpoint record (camelCase fields).
KIT_CHECKPOINT_VERSION = 2

RecordFormat = Literal["pgdurable", "kit"]
_FORMATS = ("pgdurable", "kit")
ReplayPolicy = Literal["safe", "reconcile"]
Status = Literal["ready", "running", "completed", "failed"]
_STATUSES = ("ready", "running", "completed", "failed")
StepFn = Callable[[Any, Any], Any]
"""``(state, context) -> new state``, sync or async."""


def _check_name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL character (\\x00)")
    check_size(value, what)
    return value


@dataclass(frozen=True)
class DurableStep:
    """One step: ``run(state, context) -> state`` (sync or async).

    ``replay="safe"`` may re-run after a crash. ``replay="reconcile"`` needs a
    ``reconcile(state, context) -> state`` that finds the real outcome of a
    started-but-unconfirmed ``run``; the step is never blindly re-run.
    """

    id: str
    run: StepFn
    replay: ReplayPolicy = "safe"
    reconcile: StepFn | None = None

    def __post_init__(self) -> None:
        _check_name(self.id, "step id")
        if not callable(self.run):
            raise TypeError(f"step {self.id!r}: run must be callable")
        if self.replay not in ("safe", "reconcile"):
            raise ValueError(f"step {self.id!r}: replay must be 'safe' or 'reconcile'")
        if self.replay == "reconcile" and not callable(self.reconcile):
            raise TypeError(f"step {self.id!r}: replay='reconcile' needs a callable reconcile")
        if self.replay == "safe" and self.reconcile is not None:
            raise ValueError(f"step {self.id!r}: reconcile is only used with replay='reconcile'")


@dataclass(frozen=True)
class DurableCheckpoint:
    """The checkpoint record of one task id (stored as a JSON object).

    ``in_flight_step`` is the id of a ``reconcile`` step that was started but
    not confirmed (``None`` otherwise); ``error`` is the last failure
    (``{"type", "message", "step"?}``), ``None`` if none. ``deadline_at_ms``
    (epoch milliseconds) is ``None`` for no deadline.
    """

    version: int
    definition_id: str
    revision: str
    next_step_index: int
    attempt_count: int
    max_attempts: int
    deadline_at_ms: int | None
    status: Status
    state: Any
    in_flight_step: str | None = None
    error: dict[str, Any] | None = None

    def to_json(self, record_format: RecordFormat = "pgdurable") -> dict[str, Any]:
        """The record as a JSON object, in pgdurable's format or the kit's
        (validated: a non-JSON state raises here). See the module docstring
        for what the kit's format cannot hold."""
        if record_format == "kit":
            obj: dict[str, Any] = {
                "version": KIT_CHECKPOINT_VERSION,
                "definitionId": self.definition_id,
                "revision": self.revision,
                "nextStepIndex": self.next_step_index,
                "attemptCount": self.attempt_count,
                "maxAttempts": self.max_attempts,
            }
            if self.deadline_at_ms is not None:
                obj["deadlineAtMs"] = self.deadline_at_ms
            obj["status"] = ("running" if self.in_flight_step is not None
                             else "ready" if self.status == "running" else self.status)
            obj["state"] = self.state
        elif record_format == "pgdurable":
            obj = {
                "version": self.version,
                "definition_id": self.definition_id,
                "revision": self.revision,
                "next_step_index": self.next_step_index,
                "attempt_count": self.attempt_count,
                "max_attempts": self.max_attempts,
                "deadline_at_ms": self.deadline_at_ms,
                "status": self.status,
                "state": self.state,
                "in_flight_step": self.in_flight_step,
                "error": self.error,
            }
        else:
            raise ValueError(f"record_format must be 'pgdurable' or 'kit', not {record_format!r}")
        _json.validate(obj["state"], "state")
        _json.validate(obj, "record")
        return obj

    @classmethod
    def from_json(cls, obj: object, *, steps: Sequence[DurableStep] = ()) -> DurableCheckpoint:
        """Parse a stored record, pgdurable's or the kit's (told apart by
        ``definition_id`` / ``definitionId``); :class:`CorruptCheckpoint` if it is
        malformed, :class:`IncompatibleCheckpoint` for a kit record of another
        version. ``steps`` (the definition's) lets a kit record left
        ``running`` at a ``reconcile`` step be read as that step in flight."""
        if not isinstance(obj, Mapping):
            raise CorruptCheckpoint(f"checkpoint record is a {type(obj).__name__}, not an object")
        if "definition_id" not in obj and "definitionId" in obj:
            return cls._from_kit(obj, steps)
        if "definition_id" not in obj:
            raise CorruptCheckpoint(
                "checkpoint record has no 'definition_id' (pgdurable's format) and no "
                "'definitionId' (the kit's)")
        rec = cls(
            version=_field(obj, "version", (int,)),
            definition_id=_field(obj, "definition_id", (str,)),
            revision=_field(obj, "revision", (str,)),
            next_step_index=_field(obj, "next_step_index", (int,)),
            attempt_count=_field(obj, "attempt_count", (int,)),
            max_attempts=_field(obj, "max_attempts", (int,)),
            deadline_at_ms=_field(obj, "deadline_at_ms", (int,), optional=True),
            status=_field(obj, "status", (str,)),
            state=obj.get("state"),
            in_flight_step=_field(obj, "in_flight_step", (str,), optional=True),
            error=_field(obj, "error", (dict,), optional=True),
        )
        return rec._checked(obj)

    @classmethod
    def _from_kit(cls, obj: Mapping[str, Any], steps: Sequence[DurableStep]) -> DurableCheckpoint:
        version = _field(obj, "version", (int,))
        if version != KIT_CHECKPOINT_VERSION:
            raise IncompatibleCheckpoint(
                f"the kit's checkpoint record version {version} is not {KIT_CHECKPOINT_VERSION}")
        deadline = _field(obj, "deadlineAtMs", (int, float), optional=True)
        if isinstance(deadline, float):
            if not math.isfinite(deadline):
                raise CorruptCheckpoint(f"checkpoint record field 'deadlineAtMs' is {deadline!r}")
            deadline = int(deadline)
        index = _field(obj, "nextStepIndex", (int,))
        status = _field(obj, "status", (str,))
        step = steps[index] if 0 <= index < len(steps) else None
        in_flight = (step.id if status == "running" and step is not None
                     and step.replay == "reconcile" else None)
        rec = cls(
            version=CHECKPOINT_VERSION,
            definition_id=_field(obj, "definitionId", (str,)),
            revision=_field(obj, "revision", (str,)),
            next_step_index=index,
            attempt_count=_field(obj, "attemptCount", (int,)),
            max_attempts=_field(obj, "maxAttempts", (int,)),
            deadline_at_ms=deadline,
            status=status,
            state=obj.get("state"),
            in_flight_step=in_flight,
        )
        return rec._checked(obj)

    def _checked(self, obj: Mapping[str, Any]) -> DurableCheckpoint:
        if "state" not in obj:
            raise CorruptCheckpoint("checkpoint record has no 'state'")
        if self.status not in _STATUSES:
            raise CorruptCheckpoint(f"checkpoint record has unknown status {self.status!r}")
        if self.next_step_index < 0 or self.attempt_count < 0 or self.max_attempts < 1:
            raise CorruptCheckpoint("checkpoint record has a negative index or count")
        return self


def _field(obj: Mapping[str, Any], name: str, kinds: tuple[type, ...],
           optional: bool = False) -> Any:
    """``obj[name]`` if it is one of ``kinds`` (``None``/missing allowed when
    ``optional``); :class:`CorruptCheckpoint` otherwise."""
    if name not in obj:
        if optional:
            return None
        raise CorruptCheckpoint(f"checkpoint record has no {name!r}")
    v = obj[name]
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, kinds):
        raise CorruptCheckpoint(f"checkpoint record field {name!r} is {v!r}")
    return v


class CancelSignal:
    """A durable task's cancel signal, shaped like the kit's AbortSignal
    (``aborted``, ``reason``, ``throw_if_aborted()``) and like an event
    (``is_set()``, ``set()``). :meth:`abort` may be called from any thread.

    ``task.run`` stops before its next step once it is aborted, with
    :class:`~pgdurable.foundation.errors.RunCancelled` carrying ``reason``. Steps may look
    at ``ctx.signal.aborted`` themselves to stop early inside a long step.
    """

    __slots__ = ("_aborted", "_reason")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: Any = None

    @property
    def aborted(self) -> bool:
        """Whether :meth:`abort` (or :meth:`set`) was called."""
        return self._aborted

    @property
    def reason(self) -> Any:
        """What :meth:`abort` was given: by default a
        :class:`~pgdurable.foundation.errors.RunCancelled`; ``None`` until aborted."""
        return self._reason

    def abort(self, reason: Any = None) -> None:
        """Abort (once: a later call changes nothing), with ``reason``."""
        if self._aborted:
            return
        self._reason = RunCancelled("the operation was aborted") if reason is None else reason
        self._aborted = True

    def set(self) -> None:
        """:meth:`abort` without a reason (the ``asyncio.Event`` spelling)."""
        self.abort()

    def is_set(self) -> bool:
        """Same as :attr:`aborted` (the ``asyncio.Event`` spelling)."""
        return self._aborted

    def throw_if_aborted(self) -> None:
        """Raise ``reason`` if aborted (an exception as it is, anything else in
        a :class:`~pgdurable.foundation.errors.RunCancelled`)."""
        if not self._aborted:
            return
        if isinstance(self._reason, BaseException):
            raise self._reason
        exc = RunCancelled(f"the operation was aborted: {self._reason!r}")
        exc.reason = self._reason
        raise exc

    def __repr__(self) -> str:
        return f"CancelSignal(aborted={self._aborted}, reason={self._reason!r})"


def signal_aborted(context: Any) -> tuple[bool, Any]:
    """``(aborted, reason)`` of ``context``'s cancel signal (its ``signal``
    attribute, or its ``"signal"`` key if it is a mapping): aborted when the
    signal has ``aborted`` true (an AbortSignal shape; ``reason`` is read from
    it) or ``is_set()`` true (an event); ``(False, None)`` without a signal."""
    signal = (context.get("signal") if isinstance(context, Mapping)
              else getattr(context, "signal", None))
    if signal is None:
        return False, None
    aborted = getattr(signal, "aborted", None)
    if callable(aborted):
        aborted = aborted()
    if not aborted:
        is_set = getattr(signal, "is_set", None)
        aborted = bool(is_set()) if callable(is_set) else False
    return (True, getattr(signal, "reason", None)) if aborted else (False, None)


@dataclass(frozen=True)
class DurableContext(Generic[App]):
    """What steps receive besides the state: the application, and a cancel signal.

    ``signal`` (default: a fresh :class:`CancelSignal`, like the kit's
    ``new AbortController().signal``) is anything with ``aborted`` (an
    AbortSignal shape, with ``reason``) or ``is_set()`` (``asyncio.Event``,
    ``threading.Event``); aborted, it stops the task before its next step. Any
    other context object works too (``run`` only looks for a ``signal``
    attribute, or a ``"signal"`` key of a mapping).
    """

    app: App
    signal: Any = field(default_factory=CancelSignal)


@runtime_checkable
class DurableStore(Protocol):
    """Where checkpoint records live. Bring your own by implementing these three.

    ``exclusive`` runs ``operation`` while holding a lock on ``task_id`` that
    excludes every other ``exclusive`` on the same id (across processes, for a
    durable store). ``load`` returns the stored JSON object or ``None``;
    ``save`` stores the JSON object (replacing the previous one).
    """

    async def exclusive(self, task_id: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` under the task id's exclusive lock."""
        ...

    async def load(self, task_id: str) -> Mapping[str, Any] | None:
        """The stored record of ``task_id``, or ``None``."""
        ...

    async def save(self, task_id: str, record: Mapping[str, Any]) -> None:
        """Store ``record`` as the record of ``task_id``."""
        ...


# --------------------------------------------------------------------------
# transitions (pure, reusable by the run engine)
# --------------------------------------------------------------------------
def new_checkpoint(task: DurableTask[Any, Any], now_ms: int, state: Any) -> DurableCheckpoint:
    """A fresh ``ready`` record for ``task`` starting from ``state``."""
    deadline = None if task.deadline is None else now_ms + _ms(task.deadline)
    return DurableCheckpoint(
        version=CHECKPOINT_VERSION, definition_id=task.id, revision=task.revision,
        next_step_index=0, attempt_count=0, max_attempts=task.max_attempts,
        deadline_at_ms=deadline, status="ready", state=state,
    )


def check_checkpoint(task: DurableTask[Any, Any], record: DurableCheckpoint) -> None:
    """Reject a record this definition must not resume (nothing is repaired).

    :class:`IncompatibleCheckpoint` for another definition id or revision (or
    record version); :class:`CorruptCheckpoint` for a state failing
    ``is_state``, a step index past the end, or an in-flight mark that does not
    name the next step's ``reconcile`` step.
    """
    if record.definition_id != task.id or record.revision != task.revision:
        raise IncompatibleCheckpoint(
            f"checkpoint belongs to definition {record.definition_id!r} revision "
            f"{record.revision!r}, not {task.id!r} revision {task.revision!r}"
        )
    if record.version != CHECKPOINT_VERSION:
        raise IncompatibleCheckpoint(
            f"checkpoint record version {record.version} is not {CHECKPOINT_VERSION}"
        )
    if not task.is_state(record.state):
        raise CorruptCheckpoint(f"checkpoint state of {task.id!r} fails is_state")
    n = len(task.steps)
    if record.next_step_index > n or (record.status == "completed") != (
        record.next_step_index == n
    ):
        raise CorruptCheckpoint(
            f"checkpoint next_step_index {record.next_step_index} does not fit status "
            f"{record.status!r} and {n} steps"
        )
    if record.in_flight_step is not None:
        step = task.steps[record.next_step_index] if record.next_step_index < n else None
        if step is None or step.id != record.in_flight_step or step.replay != "reconcile":
            raise CorruptCheckpoint(
                f"checkpoint marks step {record.in_flight_step!r} in flight, but the next step "
                f"is {step.id if step else None!r}"
            )


def begin_attempt(record: DurableCheckpoint) -> DurableCheckpoint:
    """Count an attempt: ``running``, or ``failed`` when past ``max_attempts``."""
    count = record.attempt_count + 1
    if count > record.max_attempts:
        return replace(record, attempt_count=count, status="failed", error={
            "type": "AttemptsExhausted",
            "message": f"attempt {count} exceeds max_attempts {record.max_attempts}",
        })
    return replace(record, attempt_count=count, status="running")


def deadline_failure(record: DurableCheckpoint, now_ms: int) -> DurableCheckpoint | None:
    """The ``failed`` record if the deadline has passed at ``now_ms``, else ``None``."""
    if record.deadline_at_ms is None or now_ms < record.deadline_at_ms:
        return None
    return replace(record, status="failed", error={
        "type": "DeadlineExceeded",
        "message": f"deadline {record.deadline_at_ms} ms passed (now {now_ms} ms)",
    })


def mark_in_flight(record: DurableCheckpoint, step: DurableStep) -> DurableCheckpoint:
    """The record marking ``step`` (a ``reconcile`` step) started; save it before running."""
    return replace(record, in_flight_step=step.id)


async def call_step(task: DurableTask[Any, Any], record: DurableCheckpoint, context: Any, *,
                    reconcile: bool) -> Any:
    """Execute the next step: its ``reconcile`` when ``reconcile`` is true, else ``run``.

    ``reconcile`` is true when the step was *found* in flight by this call (a
    resume after an unconfirmed start), not when this call just marked it.
    Returns the new state, checked with ``is_state`` (``TypeError`` if it fails)
    and for JSON. A raising ``reconcile`` becomes :class:`ReconcileFailed`.
    """
    step = task.steps[record.next_step_index]
    if reconcile:
        if record.in_flight_step != step.id:
            raise CorruptCheckpoint(f"step {step.id!r} is not in flight; nothing to reconcile")
        assert step.reconcile is not None
        try:
            state = await _maybe_await(step.reconcile(record.state, context))
        except Exception as exc:
            raise ReconcileFailed(
                f"reconcile of step {step.id!r} of task {task.id!r} failed: {exc}; the step "
                "stays in flight for the application to decide"
            ) from exc
    else:
        state = await _maybe_await(step.run(record.state, context))
    if not task.is_state(state):
        raise TypeError(f"step {step.id!r} of task {task.id!r} returned a state failing is_state")
    _json.validate(state, "state")
    return state


def complete_step(task: DurableTask[Any, Any], record: DurableCheckpoint, state: Any
                  ) -> DurableCheckpoint:
    """The record after the next step produced ``state`` (``completed`` after the last)."""
    index = record.next_step_index + 1
    done = index == len(task.steps)
    return replace(record, state=state, next_step_index=index, in_flight_step=None,
                   status="completed" if done else "running", error=None)


# --------------------------------------------------------------------------
# the definition
# --------------------------------------------------------------------------
def _ms(deadline: timedelta | int | float) -> int:
    return int(deadline.total_seconds() * 1000) if isinstance(deadline, timedelta) else int(deadline)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _error(exc: BaseException, step: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc).replace("\x00", "")}
    if step is not None:
        err["step"] = step
    return err


_FAILURES: dict[str, type[PgDurableError]] = {
    "AttemptsExhausted": AttemptsExhausted,
    "DeadlineExceeded": DeadlineExceeded,
}


def _raise_failed(task_id: str, record: DurableCheckpoint) -> None:
    err = record.error or {}
    cls = _FAILURES.get(str(err.get("type")), PgDurableError)
    raise cls(f"durable task {task_id!r} failed: {err.get('message', 'unknown')}")


@dataclass(frozen=True)
class DurableTask(Generic[T, App]):
    """A compiled durable task definition (see :func:`define_durable_task`).

    Its fields are the definition, for whoever drives it (``run`` here, or the
    run engine's leased workers).
    """

    id: str
    revision: str
    steps: tuple[DurableStep, ...]
    is_state: Callable[[Any], bool]
    authorize: Callable[[DurableCheckpoint, Any], Any] | None = None
    max_attempts: int = 3
    deadline: timedelta | int | None = None
    now: Callable[[], float] | None = None
    store: DurableStore | None = None
    initial_state: Any = field(default=None)
    record_format: RecordFormat = "pgdurable"

    def _now_ms(self, store: DurableStore) -> Awaitable[int] | int:
        if self.now is not None:
            return int(self.now())
        clock = getattr(store, "now_ms", None)
        if callable(clock):
            return clock()  # type: ignore[no-any-return]
        return int(time.time() * 1000)

    async def run(self, *, task_id: str, store: DurableStore | None = None,
                  context: Any = None, state: Any = None) -> T:
        """Run or resume the task ``task_id``; return its final state.

        ``state`` is the initial state of a task id that has no record yet
        (default: the definition's ``initial_state``); it is ignored on resume.
        """
        _check_name(task_id, "task_id")
        target = store if store is not None else self.store
        if target is None:
            raise TypeError(f"durable task {self.id!r}: no store given (store= or define-time)")
        first = self.initial_state if state is None else state
        if state is not None:
            if not self.is_state(state):
                raise ValueError(f"durable task {self.id!r}: the given state fails is_state")
            _json.validate(state, "state")

        async def operation() -> T:
            return await self._run_locked(task_id, target, context, first)  # type: ignore[no-any-return]

        return await target.exclusive(task_id, operation)

    async def _run_locked(self, task_id: str, store: DurableStore, context: Any, first: Any) -> Any:
        raw = await store.load(task_id)
        if raw is None:
            if not self.is_state(first):
                raise ValueError(
                    f"durable task {self.id!r}: task id {task_id!r} has no record and no valid "
                    "initial state (pass state= or initial_state=)"
                )
            record = new_checkpoint(self, await _maybe_await(self._now_ms(store)), first)
        else:
            record = DurableCheckpoint.from_json(raw, steps=self.steps)
        check_checkpoint(self, record)
        if record.status == "completed":
            return record.state
        if record.status == "failed":
            _raise_failed(task_id, record)
        if self.authorize is not None:
            verdict = await _maybe_await(self.authorize(record, context))
            if verdict is False:
                raise PermissionError(f"durable task {task_id!r}: authorize denied the resume")
        record = begin_attempt(record)
        await store.save(task_id, record.to_json(self.record_format))
        if record.status == "failed":
            _raise_failed(task_id, record)
        failed = deadline_failure(record, await _maybe_await(self._now_ms(store)))
        if failed is not None:
            await store.save(task_id, failed.to_json(self.record_format))
            _raise_failed(task_id, failed)
        while record.next_step_index < len(self.steps):
            step = self.steps[record.next_step_index]
            aborted, reason = signal_aborted(context)
            if aborted:
                exc = RunCancelled(f"durable task {task_id!r} cancelled before step {step.id!r}"
                                   + ("" if reason is None else f": {reason}"))
                exc.reason = reason
                raise exc from (reason if isinstance(reason, BaseException) else None)
            resuming = record.in_flight_step == step.id
            if step.replay == "reconcile" and not resuming:
                record = mark_in_flight(record, step)
                await store.save(task_id, record.to_json(self.record_format))
            try:
                state = await call_step(self, record, context, reconcile=resuming)
                nxt = complete_step(self, record, state)
                await store.save(task_id, nxt.to_json(self.record_format))
            except Exception as exc:
                failing = replace(record, error=_error(exc, step.id))
                await store.save(task_id, failing.to_json(self.record_format))
                raise
            record = nxt
        return record.state


def define_durable_task(
    *,
    id: str,
    revision: str,
    steps: Sequence[DurableStep],
    is_state: Callable[[Any], bool],
    authorize: Callable[[DurableCheckpoint, Any], Any] | None = None,
    max_attempts: int = 3,
    deadline: timedelta | int | None = None,
    now: Callable[[], float] | None = None,
    store: DurableStore | None = None,
    initial_state: Any = None,
    record_format: RecordFormat = "pgdurable",
) -> DurableTask[Any, Any]:
    """Compile a durable task definition into a resumable runner.

    ``steps`` run in order; the record stores an index into them, with ``id``
    and ``revision`` so that a resume matches its code. ``is_state`` validates
    every loaded state (and every state a step returns). ``authorize`` is
    re-checked on every explicit resume. ``deadline`` (a ``timedelta`` or
    milliseconds) is fixed when the record is created. ``now`` returns epoch
    milliseconds (default: the store's database clock when it has ``now_ms``,
    else the process clock). ``initial_state`` starts a task id with no record.
    ``record_format`` is the format ``run`` saves records in: ``"pgdurable"``
    (default) or ``"kit"`` (the kit's camelCase record, so that the kit can
    resume the store too); either format is read.
    """
    tid = _check_name(id, "definition id")
    rev = _check_name(revision, "revision")
    if isinstance(steps, str | bytes) or not isinstance(steps, Sequence):
        raise TypeError("steps must be a sequence of DurableStep")
    if not steps:
        raise ValueError("a durable task needs at least one step")
    for s in steps:
        if not isinstance(s, DurableStep):
            raise TypeError(f"steps must be DurableStep objects, not {type(s).__name__}")
    ids = [s.id for s in steps]
    if len(set(ids)) != len(ids):
        raise ValueError(f"step ids must be unique: {ids}")
    if not callable(is_state):
        raise TypeError("is_state must be callable")
    if authorize is not None and not callable(authorize):
        raise TypeError("authorize must be callable or None")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError("max_attempts must be an int")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, timedelta | int):
            raise TypeError("deadline must be a timedelta or milliseconds (int)")
        if _ms(deadline) <= 0:
            raise ValueError("deadline must be positive")
    if now is not None and not callable(now):
        raise TypeError("now must be callable or None")
    if store is not None and not isinstance(store, DurableStore):
        raise TypeError("store must implement DurableStore (exclusive, load, save)")
    if record_format not in _FORMATS:
        raise ValueError(f"record_format must be 'pgdurable' or 'kit', not {record_format!r}")
    if initial_state is not None:
        if not is_state(initial_state):
            raise ValueError("initial_state fails is_state")
        _json.validate(initial_state, "initial_state")
    return DurableTask(
        id=tid, revision=rev, steps=tuple(steps), is_state=is_state, authorize=authorize,
        max_attempts=max_attempts, deadline=deadline, now=now, store=store,
        initial_state=initial_state, record_format=record_format,
    )


# --------------------------------------------------------------------------
# stores
# --------------------------------------------------------------------------
class MemoryDurableStore:
    """Records in a dict of JSON text, an ``asyncio.Lock`` per task id.

    For tests and demos in one process and one event loop: it is neither
    durable nor exclusive across processes.
    """

    def __init__(self, records: Mapping[str, Mapping[str, Any] | DurableCheckpoint] | None = None
                 ) -> None:
        self._records: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        for task_id, record in (records or {}).items():
            self.put(task_id, record)

    def put(self, task_id: str, record: Mapping[str, Any] | DurableCheckpoint) -> None:
        """Seed (or overwrite) the record of ``task_id``."""
        obj = record.to_json() if isinstance(record, DurableCheckpoint) else record
        self._records[task_id] = _json.dumps(obj, "record")

    def get(self, task_id: str) -> dict[str, Any] | None:
        """A copy of the stored record of ``task_id``, or ``None``."""
        text = self._records.get(task_id)
        return None if text is None else _json.loads(text)

    async def exclusive(self, task_id: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` holding this task id's in-process lock."""
        lock = self._locks.setdefault(task_id, asyncio.Lock())
        async with lock:
            return await operation()

    async def load(self, task_id: str) -> dict[str, Any] | None:
        """A copy of the stored record, or ``None``."""
        return self.get(task_id)

    async def save(self, task_id: str, record: Mapping[str, Any]) -> None:
        """Store a copy of ``record`` (validated as JSON)."""
        self.put(task_id, record)


# (store, task id, the connection holding that task id's advisory lock)
_HELD: contextvars.ContextVar[tuple[object, str, psycopg.AsyncConnection[Any]] | None] = (
    contextvars.ContextVar("pgdurable_task_lock", default=None)
)

# The store's statements (lock, unlock, load, save, the clock):
# pgdurable.foundation.queries.tasks (imported as ``tq``).


async def _unlock(conn: psycopg.AsyncConnection[Any], task_id: str) -> None:
    """Release the task lock; if that fails, close the session (which releases it).

    A failed unlock never masks the operation's own outcome: the lock is gone
    either way, and the pool discards a closed connection.
    """
    try:
        await conn.execute(tq.UNLOCK.sql, (task_id,))
    except Exception:
        await conn.close()
    except BaseException:
        await conn.close()
        raise


class PostgresDurableStore:
    """Records in ``pgdurable.task_checkpoints``, exclusive across processes.

    ``exclusive`` takes a *session* advisory lock
    (``pg_advisory_lock(pgdurable.task_lock_key(task_id))``) on one connection
    dedicated to the call, held while the operation runs, with no transaction
    open (step code never runs inside a transaction), and unlocks it in
    ``finally`` (a connection whose lock call is interrupted or whose unlock
    fails is closed, which releases it; a connection of a given pool gets its
    ``autocommit`` setting back). ``load``/``save`` inside the operation go
    through that same connection, so a save can only succeed while the lock is
    held: if the connection dies, the lock is gone and so is the ability to
    write.
    A crashed process's lock vanishes with its connection.

    Session advisory locks need a direct connection (or PgBouncer in *session*
    mode): PgBouncer *transaction* pooling hands the backend holding the lock
    to other clients and breaks exclusivity. So ``pooler="transaction"`` is
    refused here at construction (:class:`~pgdurable.InvalidInput`): give this
    store a direct DSN. (``PGDURABLE_POOLER`` describes the app's default DSN,
    not the one given here, so it is not read.)

    Give it a conninfo (it then owns a small pool: ``open``/``close`` or
    ``async with``) or your own ``AsyncConnectionPool`` (not closed by it).
    Each running task uses one pool connection.
    """

    def __init__(self, pool_or_conninfo: AsyncConnectionPool[Any] | str, *, max_size: int = 8,
                 pooler: Pooler | None = None) -> None:
        if check_pooler(pooler) == "transaction":
            raise InvalidInput(
                "PostgresDurableStore.exclusive holds a session advisory lock, which a "
                "transaction-mode pooler hands to other clients: give this store a direct "
                "DSN (or one through a session-mode pooler), not pooler='transaction'")
        if isinstance(pool_or_conninfo, str):
            validate_dsn(pool_or_conninfo)
            self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                pool_or_conninfo, min_size=1, max_size=max_size, open=False,
                kwargs={**connect_kwargs(), **connect_timeout(pool_or_conninfo)},
                configure=aconfigure(), check=acheck_connection,
            )
            self._owned = True
        elif isinstance(pool_or_conninfo, AsyncConnectionPool):
            self._pool = pool_or_conninfo
            self._owned = False
        else:
            raise TypeError("pool_or_conninfo must be an AsyncConnectionPool or a conninfo str")
        self._ready = False
        self._closed = False
        self._opening: asyncio.Lock | None = None

    async def open(self) -> None:
        """Open the owned pool (if any) and check the schema; idempotent."""
        if self._closed:
            raise ProviderClosed("PostgresDurableStore is closed")
        if self._ready:
            return
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._ready:
                return
            if self._owned:
                await self._pool.open(wait=True)
            async with self._pool.connection() as conn, conn.transaction():
                with translated():
                    await acheck_schema(conn)
            self._ready = True

    async def close(self) -> None:
        """Close the owned pool; a given pool is left open."""
        self._closed = True
        if self._owned:
            await self._pool.close()

    async def __aenter__(self) -> PostgresDurableStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exclusive(self, task_id: str, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` holding the task id's session advisory lock."""
        _check_name(task_id, "task_id")
        await self.open()
        async with self._pool.connection() as conn:
            restore = not conn.autocommit  # a caller's pool gets its connection back as lent
            if restore:
                await conn.set_autocommit(True)
            try:
                with translated():
                    await conn.execute(tq.LOCK.sql, (task_id,))
            except BaseException:
                # Interrupted (e.g. cancelled) after the server granted the lock,
                # psycopg still waits for the statement and then raises: the pooled
                # session would keep the lock forever. Closing it releases any lock.
                await conn.close()
                raise
            token = _HELD.set((self, task_id, conn))
            try:
                return await operation()
            finally:
                _HELD.reset(token)
                await _unlock(conn, task_id)
                if restore and not conn.closed:
                    try:
                        await conn.set_autocommit(False)
                    except Exception:
                        await conn.close()  # never mask the outcome; the pool drops it

    def _held(self, task_id: str) -> psycopg.AsyncConnection[Any] | None:
        held = _HELD.get()
        if held is not None and held[0] is self and held[1] == task_id:
            return held[2]
        return None

    async def _one(self, task_id: str | None, query: Query[R], args: tuple[Any, ...]) -> R:
        """``query``'s answer on the connection holding ``task_id``'s lock (if this
        task holds it), else on a pooled one."""
        await self.open()
        conn = self._held(task_id) if task_id is not None else None
        with translated():
            if conn is not None:
                return await one(conn, query, args)
            async with self._pool.connection() as c:
                return await one(c, query, args)

    async def load(self, task_id: str) -> dict[str, Any] | None:
        """The stored record of ``task_id`` or ``None`` (``task_checkpoint_load``)."""
        _check_name(task_id, "task_id")
        record: dict[str, Any] | None = await self._one(task_id, tq.LOAD, (task_id,))
        return record

    async def save(self, task_id: str, record: Mapping[str, Any]) -> None:
        """Upsert the record of ``task_id`` (``task_checkpoint_save``)."""
        _check_name(task_id, "task_id")
        text = _json.dumps(dict(record), "record")
        await self._one(task_id, tq.SAVE, (task_id, text))

    async def now_ms(self) -> int:
        """The database clock (``pgdurable.now()``) in epoch milliseconds."""
        held = _HELD.get()
        return await self._one(held[1] if held and held[0] is self else None, tq.NOW_MS, ())
