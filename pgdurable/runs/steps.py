"""Step results and the step context.

A task's step function is called once per step with ``(ctx, state)`` and
returns one of:

* :class:`Continue` ``(state)`` -- checkpoint ``state`` and run the next step
  (in the same lease while its window lasts, else another worker continues);
* :class:`Done` ``(result, state=None)`` -- the final checkpoint and completion,
  in one statement;
* :class:`Wait` ``(signal=(kind, ref), timeout=None, state=None)`` -- checkpoint
  and park until a signal on ``(kind, ref)`` (or the timeout);
* :class:`Sleep` ``(seconds=... | until=..., state=None)`` -- checkpoint and
  park until a time.

A parked run holds nothing: no worker slot, task, thread or connection. On the
next step ``ctx.wake`` says what woke it: ``{"type": "signal", "kind", "ref",
"payload", "at", "signal"}`` or ``{"type": "timeout", "kind", "ref", "at"}``
(``kind``/``ref`` are ``None`` after a :class:`Sleep`). The outcome is stored
on the run before the step runs, so a replay after a crash sees the same one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ..foundation.affinity import Affinity, Mode, pin_params, same_pin
from ..foundation.errors import BudgetExceeded, InvalidInput
from ..foundation.events import match_json
from ..foundation.run_queries import check_name, check_size
from .budgets import Reservation
from .children import Child, ChildPolicy, _ids, check_children, need_of, start_child, start_children
from .flow import acquire, reserved
from .liveness import heartbeat
from .settled import RunSettled
from .stream import emit
from .text import after_event, before_event, emit_text, text_so_far
from .threads import Message, encode_thread_key, take

__all__ = ["Continue", "Done", "RunContext", "RunSettled", "Sleep", "StepResult", "Wait"]

_UNSET: Any = object()


STEP_EXECUTOR: contextvars.ContextVar[Executor | None] = contextvars.ContextVar(
    "pgdurable_step_executor", default=None
)
"""The executor sync step code runs in: set by :meth:`Worker.run` to the
worker's own thread pool; ``None`` (the loop's default executor) elsewhere."""


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run sync step code in a thread, like ``asyncio.to_thread`` (context
    copied) but on :data:`STEP_EXECUTOR`, so every busy slot of a worker gets a
    thread of its own instead of queueing behind the loop's default executor."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(STEP_EXECUTOR.get(), call)


@dataclass(frozen=True)
class Continue:
    """Checkpoint ``state`` and go on with the next step."""

    state: Any


@dataclass(frozen=True)
class Done:
    """Complete the run with ``result``; ``state`` (default: unchanged) is the final checkpoint."""

    result: Any = None
    state: Any = _UNSET


@dataclass(frozen=True)
class Wait:
    """Park until a signal ``(kind, ref)`` arrives, or ``timeout`` passes.

    ``state`` (default: unchanged) is checkpointed before parking.
    """

    signal: tuple[str, str]
    timeout: timedelta | float | None = None
    state: Any = _UNSET
    #: Child run ids to wait on (:meth:`children`); empty for a signal wait.
    child_ids: tuple[str, ...] = ()
    #: How many of ``child_ids`` must finish before the run wakes.
    need: int = 0
    #: The event name of a wait_event (:meth:`for_event`); None for a signal wait.
    event_name: str | None = None
    #: The wait_event's match as JSON text (``{"data.path": value}``).
    event_match: str | None = None

    def __post_init__(self) -> None:
        sig = self.signal
        if (
            not isinstance(sig, tuple)
            or len(sig) != 2
            or not all(isinstance(p, str) and p and "\x00" not in p for p in sig)
        ):
            raise ValueError("Wait(signal=...) must be a (kind, ref) tuple of non-empty str")
        # the limits every sender checks: a ref no signal could address never
        # wakes. Not for ("inbox", thread key): that one is signalled by
        # send_message, and thread keys have no length limit (threads.py)
        check_name(sig[0], "Wait(signal=...) kind")
        if sig[0] != "inbox":
            check_name(sig[1], "Wait(signal=...) ref")
        if self.timeout is not None:
            _seconds(self.timeout, "Wait(timeout=...)")

    @classmethod
    def children(
        cls,
        ids: Iterable[Any],
        *,
        any: bool = False,
        at_least: int | None = None,
        timeout: timedelta | float | None = None,
        state: Any = _UNSET,
    ) -> Wait:
        """Park until children of this run finish: all of ``ids`` (default), the
        first one (``any=True``) or ``at_least`` of them; or until ``timeout``.

        The next step finds ``ctx.wake["children"]`` = ``{id: {"status",
        "result", "error"}}`` for every id (unfinished ones with their current
        status). A failed child is reported there; it does not fail this run.
        Ids must be distinct run ids (TypeError/ValueError here); that they are
        children of this run (and not the run itself) is checked when the run
        parks: otherwise the run fails with :class:`~pgdurable.InvalidInput` (a
        ``ValueError``) and nothing is written. ``await ctx.wait_children(...)``
        checks that inside the step instead.
        """
        uids = _ids(ids)
        need = need_of(uids, any, at_least)
        return cls(signal=("children", "*"), timeout=timeout, state=state,
                   child_ids=tuple(str(u) for u in uids), need=need)

    @classmethod
    def for_event(
        cls, name: str, match: dict[str, Any], *, timeout: timedelta | float | None = None,
        state: Any = _UNSET,
    ) -> Wait:
        """Park until an event ``name`` whose data matches ``match`` (``{"data.order_id":
        x}``: every path equals its value; values are str, int, float or bool), or
        ``timeout``. The next step finds ``ctx.wake`` = ``{"type": "event", "name",
        "event": {"id", "name", "data", "event_id", "time"}}`` (or a timeout's
        ``{"type": "timeout", ...}``). Which events a wait sees: see
        :mod:`pgdurable.runs.events` (an event sent after the run started or after the
        event that ended its previous event wait, before it parks, is found: not lost).
        Bad input: TypeError/ValueError here, nothing written."""
        check_name(name, "wait_event name")
        return cls(signal=("event", name), timeout=timeout, state=state, event_name=name,
                   event_match=match_json(match))

    @classmethod
    def approval(
        cls, ref: str, *, timeout: timedelta | float | None = None, state: Any = _UNSET
    ) -> Wait:
        """Wait for a human approval: the signal ``("approval", ref)``."""
        return cls(signal=("approval", ref), timeout=timeout, state=state)


@dataclass(frozen=True)
class Sleep:
    """Park for ``seconds`` (or until the datetime ``until``, timezone-aware)."""

    seconds: timedelta | float | None = None
    until: datetime | None = None
    state: Any = _UNSET

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.until is None):
            raise ValueError("Sleep needs exactly one of seconds= or until=")
        if self.seconds is not None:
            _seconds(self.seconds, "Sleep(seconds=...)")
        if self.until is not None and (
            not isinstance(self.until, datetime) or self.until.tzinfo is None
        ):
            raise TypeError("Sleep(until=...) must be a timezone-aware datetime")


StepResult = Continue | Done | Wait | Sleep


#: The longest Wait timeout or Sleep (about 1,000 years): ``now() + it`` must
#: stay a time that PostgreSQL stores and Python's datetime can load.
MAX_WAIT = timedelta(days=365_000)


def _seconds(value: timedelta | float, what: str) -> float:
    """``value`` as seconds in [0, :data:`MAX_WAIT`], else TypeError/ValueError naming ``what``."""
    if isinstance(value, timedelta):
        secs = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        secs = float(value)
    else:
        raise TypeError(f"{what} must be a timedelta or a number of seconds")
    if not math.isfinite(secs) or secs < 0:
        raise ValueError(f"{what} must be finite and >= 0, not {value!r}")
    if secs > MAX_WAIT.total_seconds():
        raise ValueError(f"{what} must be at most {MAX_WAIT.days} days, not {value!r}")
    return secs


EffectFn = Callable[[], Any] | Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class RunIO:
    """The worker's hooks for step code that checkpoints from inside one call.

    ``checkpoint(state_json, spend)`` is the fenced batched write of a
    ``Continue`` (returns the run's status; raises ``LeaseLost``);
    ``release()`` gives the run back (runnable, NOTIFY); ``should_yield()``
    is true once the run should be given back (shutdown, cancel or lost
    lease, or the worker's lease window used up). ``pin(mode, wait,
    info_json)`` is the fenced write of :meth:`RunContext.pin` (mode None:
    unpin), after the worker made sure its presence is announced; it returns
    the run's affinity record.
    """

    checkpoint: Callable[[str, float], Awaitable[str]]
    release: Callable[[], Awaitable[Any]]
    should_yield: Callable[[], bool]
    pin: Callable[[str | None, timedelta | None, str | None], Awaitable[Any]] | None = None


@dataclass
class RunContext:
    """What a step knows about its run. Created by the worker for each step.

    Attributes: ``run_id``, ``task``, ``step`` (0-based index of this step),
    ``attempt`` (1-based), ``token`` (the lease's fencing token), ``wake``
    (what woke the run, or ``None``), ``deadline`` (aware datetime or
    ``None``), ``budget`` and ``spent`` (``float`` or ``None``/``0``),
    ``affinity`` (the :class:`~pgdurable.Affinity` of the run to the worker
    holding its service, or ``None``; see :meth:`pin` and
    :attr:`service_lost`).
    """

    run_id: str
    task: str
    step: int
    attempt: int
    token: int
    wake: dict[str, Any] | None
    deadline: datetime | None
    budget: float | None
    spent: float
    _pending_spend: float = 0.0
    _effect: Callable[..., Awaitable[Any]] | None = field(default=None, repr=False)
    _app: Any = field(default=None, repr=False)  # the Durable app (inbox, emit)
    _owner: str | None = field(default=None, repr=False)  # the worker id (lease fence)
    _emitted: int = field(default=0, repr=False)  # events emitted by this step so far
    _text: Any = field(default=None, repr=False)  # the step's text stream (runs/text.py)
    _loop: Any = field(default=None, repr=False)  # the worker's event loop (sync twins)
    #: The worker's hooks for code that checkpoints from inside one call (workflows).
    _io: Any = field(default=None, repr=False)
    _reservation_used: bool = field(default=False, repr=False)  # acquire's wake consumed
    _liveness: Any = field(default=None, repr=False)  # the step's liveness.StepGuard
    _reserves: dict[int, int] | None = field(default=None, repr=False)  # reserve keys per step
    #: Settlements recorded by this step's reservations (JSON objects), not yet written:
    #: they go with the step's checkpoint, or its next reservation (runs/budgets.py).
    _settles: list[str] | None = field(default=None, repr=False)  # made by the first settle
    #: The run's thread key (thread runs), known after ``await ctx.inbox()``.
    thread_key: str | None = None
    #: The run's affinity (:mod:`pgdurable.foundation.affinity`) as claimed, then as this step
    #: pinned or unpinned it; ``None`` without.
    affinity: Affinity | None = None
    _instance: str | None = field(default=None, repr=False)  # the worker's process instance

    @property
    def service_lost(self) -> bool:
        """True when the run is pinned to a service this process does not hold.

        The worker (or the process instance) named by :attr:`affinity` is not
        the one running this step: the holder stopped, was killed, restarted,
        or was busy past the pin's wait. Rebuild the service (from what the
        state recorded; ``affinity.info`` says what it was) and :meth:`pin`
        again, or :meth:`unpin`. False without affinity and after this step
        pinned the run here.
        """
        return self.affinity is not None and not self.affinity.held_by(self._owner, self._instance)

    async def pin(self, mode: Mode = "soft", *, wait: timedelta | float | None = None,
                  info: dict[str, Any] | None = None) -> Affinity:
        """Pin this run to the worker running this step: it holds the run's service.

        The run's next claims go to this worker while it is present: a ready
        run (made runnable, or its timer due) is reserved for it for ``wait``
        after that moment, then any worker of its queue may take it.
        ``"soft"`` (default): ``wait`` is a preference window (default 5 s), so
        a busy holder does not starve the run; ``"hard"``: ``wait`` is a timeout
        (default 300 s). A holder that stops cleanly frees the run at once, one
        that is killed when its presence lapses (its lease TTL). ``info`` (a
        JSON object, at most 8 KB) says what it holds; the step that finds
        :attr:`service_lost` reads it there. Fenced by the lease
        (:class:`~pgdurable.LeaseLost`); written at once, and not again when
        the run is already pinned here the same way. ``wait`` outside (0, 1 day],
        a bad mode or info: TypeError/ValueError, nothing written. Returns the
        new :attr:`affinity`.
        """
        mode_s, wait_td, info_json = pin_params(mode, wait, info)
        if same_pin(self.affinity, self._owner, self._instance, mode_s, wait_td, info_json):
            assert self.affinity is not None
            return self.affinity
        self.affinity = await self._pin_io()(mode_s, wait_td, info_json)
        assert self.affinity is not None
        return self.affinity

    async def unpin(self) -> None:
        """Clear the run's affinity (its service is closed): any worker may claim it.

        Fenced by the lease; nothing is written when the run has none."""
        if self.affinity is None:
            return
        self.affinity = await self._pin_io()(None, None, None)

    def pin_sync(self, mode: Mode = "soft", *, wait: timedelta | float | None = None,
                 info: dict[str, Any] | None = None) -> Affinity:
        """:meth:`pin` for sync step functions (which the worker runs in a thread)."""
        result: Affinity = self._call_sync(self.pin(mode, wait=wait, info=info))
        return result

    def unpin_sync(self) -> None:
        """:meth:`unpin` for sync step functions (which the worker runs in a thread)."""
        self._call_sync(self.unpin())

    def _pin_io(self) -> Callable[[str | None, timedelta | None, str | None], Awaitable[Any]]:
        pin = None if self._io is None else self._io.pin
        if pin is None:
            raise RuntimeError("this RunContext is not attached to a worker")
        return pin  # type: ignore[no-any-return]

    def spend(self, amount: float | int | Decimal) -> None:
        """Add ``amount`` to the run's spend (saved with the next checkpoint).

        Raises :class:`BudgetExceeded` when the total passes the run's budget;
        the worker then fails the run (recorded in ``runs.error``).
        """
        if isinstance(amount, bool) or not isinstance(amount, int | float | Decimal):
            raise TypeError("spend(amount) needs a number")
        value = float(amount)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"spend(amount) must be finite and >= 0, not {amount!r}")
        self._pending_spend += value
        if self.budget is not None and self.spent + self._pending_spend > self.budget:
            raise BudgetExceeded(
                f"run {self.run_id} spent {self.spent + self._pending_spend:g} "
                f"of budget {self.budget:g}"
            )

    def reserve(self, *, key: str | None = None, **amounts: float | int | Decimal) -> Reservation:
        """Reserve ``amounts`` (``usd=``, ``tokens=``, ``tokens_in=``, ``tokens_out=``,
        ``calls=``) of every budget the run draws from, before a model call::

            async with ctx.reserve(usd=0.40, tokens=30_000) as r:
                reply = await model(...)
                r.settle(usd=reply.cost, tokens=reply.usage.total)

        (``with`` in a sync step.) Entering holds the amounts, fenced by the lease;
        a budget that cannot give them parks the run (policy ``park``) or raises
        :class:`~pgdurable.BudgetExceeded` naming it (``fail``). Leaving settles
        what ``r.settle`` recorded and returns the rest; an exception releases it.
        ``key`` names the reservation within the step (default ``r0``, ``r1``, ...
        in call order): a replayed step finds its settlement and is not charged
        again. Bad amounts or units: :class:`~pgdurable.InvalidInput`, nothing
        written. See :mod:`pgdurable.runs.budgets` and docs/budgets.md.
        """
        if key is None:
            if self._reserves is None:
                self._reserves = {}
            n = self._reserves.get(self.step, 0)
            self._reserves[self.step] = n + 1
            key = f"r{n}"
        elif not isinstance(key, str) or not key or len(key) > 200:
            raise InvalidInput(f"reserve(key=...) must be a str of 1 to 200 characters, not {key!r}")
        return Reservation(self, amounts, key)

    def _take_settles(self) -> str | None:
        """The buffered settlements as one JSON array (and none buffered after), or None."""
        if not self._settles:
            return None
        text = "[" + ",".join(self._settles) + "]"
        self._settles.clear()
        return text

    def heartbeat(self, progress: Any = None) -> None:
        """Report that this step is alive, with optional JSON ``progress``.

        Recorded in ``pgdurable.runs.progress`` / ``heartbeat_at`` (fenced,
        coalesced, in the background) and, with the task's
        ``heartbeat_timeout``, what keeps a long step from being cancelled as
        hung. Works from async and sync steps; does not renew the lease (see
        :mod:`pgdurable.runs.liveness`). Progress that is not JSON: InvalidInput.
        """
        heartbeat(self, progress)

    @property
    def total_spent(self) -> float:
        """Spend so far including this step's unsaved spend."""
        return self.spent + self._pending_spend

    async def effect(self, key: str, fn: EffectFn, *, reconcile: EffectFn | None = None) -> Any:
        """Run the side effect ``fn`` at most once per run and ``key``.

        A recorded success returns its stored result without calling ``fn``; a
        recorded failure raises :class:`~pgdurable.EffectFailed`. Otherwise the
        effect is recorded ``started`` (fenced), ``fn`` (sync, in a thread, or
        async) is called and its JSON result or its error is recorded (fenced).
        An effect ``started`` by a crashed attempt (its outcome never recorded)
        follows its replay policy: without ``reconcile`` ("safe") ``fn`` is
        performed again (make it idempotent on the remote side where you can);
        with ``reconcile`` (a no-argument callable, sync or async) that is
        called instead of ``fn`` and must return the real outcome, recorded as
        the effect's result, or :data:`~pgdurable.NOT_PERFORMED` when the effect
        never happened (``fn`` then runs once, under the current lease token);
        if it raises, the run ends ``failed`` with
        :class:`~pgdurable.ReconcileFailed` (never re-run blindly). Recording the
        outcome survives lost connections (retried while the lease is trusted);
        a result that is not JSON (e.g. a lone surrogate) is recorded as a
        failure and ends the run with :class:`~pgdurable.EffectFailed`: ``fn``
        is never performed again.
        """
        if not isinstance(key, str) or not key or "\x00" in key:
            raise ValueError("effect key must be a non-empty str without NUL")
        check_size(key, "effect key")
        if not callable(fn):
            raise TypeError("effect fn must be callable")
        if self._effect is None:
            raise RuntimeError("this RunContext is not attached to a worker")
        if reconcile is not None:
            if not callable(reconcile):
                raise TypeError("effect reconcile must be callable or None")
            return await self._effect(key, fn, reconcile=reconcile)
        return await self._effect(key, fn)

    def wait_event(self, name: str, match: dict[str, Any], *,
                   timeout: timedelta | float | None = None, state: Any = _UNSET) -> Wait:
        """Return this from a step to park until an event ``name`` matching ``match``
        arrives (or ``timeout``): :meth:`Wait.for_event`. The next step reads it
        with ``ctx.event`` (None after a timeout)."""
        return Wait.for_event(name, match, timeout=timeout, state=state)

    @property
    def event(self) -> dict[str, Any] | None:
        """The event that woke this run from a ``wait_event`` (``{"id", "name", "data",
        "event_id", "time"}``), else None (a timeout, or not woken by an event)."""
        wake = self.wake
        if wake is None or wake.get("type") != "event":
            return None
        event = wake.get("event")
        return dict(event) if isinstance(event, dict) else None

    async def acquire(self, name: str, cost: float = 1) -> None:
        """Take ``cost`` tokens from the shared token bucket ``name``
        (``Durable.set_bucket``), or reserve them and park the run until they
        are due: :class:`~pgdurable.RateLimited` is raised, the worker parks
        the run on a timer (no worker held) and the step runs again then, its
        first ``acquire(name)`` returning at once (already paid). Call it at
        the start of the step, before other side effects. Unknown bucket,
        ``cost`` <= 0 or above the bucket's burst: ``ValueError``."""
        app, _ = self._attached()
        if not self._reservation_used and reserved(self.wake, name):
            self._reservation_used = True  # parked for exactly these tokens
            return
        await acquire(app, name, cost)

    def acquire_sync(self, name: str, cost: float = 1) -> None:
        """:meth:`acquire` from a sync step (run in a worker thread)."""
        self._call_sync(self.acquire(name, cost))

    def __post_init__(self) -> None:
        if self._loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                self._loop = None

    def _attached(self) -> tuple[Any, str]:
        if self._app is None or self._owner is None:
            raise RuntimeError("this RunContext is not attached to a worker")
        return self._app, self._owner

    def _call_sync(self, coro: Any) -> Any:
        """Run ``coro`` on the worker's loop from a sync step's thread and wait for it."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is None or running is self._loop:
            coro.close()
            raise RuntimeError(
                "the *_sync methods are for sync steps (run in a worker thread); "
                "in an async step use await"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def inbox_sync(self) -> list[Message]:
        """:meth:`inbox` for sync step functions (which the worker runs in a thread)."""
        result: list[Message] = self._call_sync(self.inbox())
        return result

    def emit_sync(self, event: Any) -> int:
        """:meth:`emit` for sync step functions (which the worker runs in a thread)."""
        return int(self._call_sync(self.emit(event)))

    async def emit_text(self, delta: str) -> None:
        """Stream ``delta`` (text, e.g. an LLM token) to the run's output stream.

        Buffered: readers get it live within about 20 ms (a NOTIFY of the
        process's writer), and it is stored as a ``{"type": "text"}`` event
        every 100 ms or 2 KB and before the step's checkpoint. A SIGKILL loses
        at most the unflushed tail; a retried step replays its text (what an
        earlier attempt stored is not written again). A safe point of
        double-texting (interrupt, rollback). See :mod:`pgdurable.runs.text`.
        """
        await emit_text(self, delta)

    def emit_text_sync(self, delta: str) -> None:
        """:meth:`emit_text` for sync step functions (which the worker runs in a thread)."""
        self._call_sync(self.emit_text(delta))

    async def text_so_far(self) -> str:
        """The text this step stored so far (by earlier attempts, after a crash or a
        retry; ``""`` on a first attempt). After this call, ``emit_text`` appends
        to it instead of replaying: continue the generation from it."""
        return await text_so_far(self)

    async def inbox(self) -> list[Message]:
        """Drain the thread's messages delivered since the last step, in order.

        Returns :class:`~pgdurable.runs.threads.Message` objects (``[]`` for a run
        without a thread). Consumption is checkpointed with this step: if the
        step is retried the same messages are returned again; once the step is
        checkpointed, never again. Within one attempt each message is returned
        once: a second call returns only what arrived since the first. Raises :class:`~pgdurable.LeaseLost` if
        another run took the thread. See :mod:`pgdurable.runs.threads`.
        """
        return await take(self)

    async def emit(self, event: Any) -> int:
        """Append ``event`` (JSON) to the run's output stream; return its seq.

        Fenced by the lease; a retried step overwrites its earlier events
        instead of duplicating them. See :mod:`pgdurable.runs.stream`.
        """
        await before_event(self)  # the step's text first (order); a safe point
        seq = await emit(self, event)
        after_event(self, seq)
        return seq

    async def start_child(
        self,
        task: str,
        state: Any = None,
        *,
        key: str,
        queue: str = "default",
        priority: int = 0,
        deadline: Any = None,
        budget: float | Mapping[str, float] | None = None,
        revision: str | None = None,
        max_attempts: int | None = None,
        policy: ChildPolicy = "cancel",
        affinity_of: str | None = None,
        budgets: Iterable[str] | None = None,
    ) -> str:
        """Start a child run of ``task`` (once per this run and ``key``); return its id.

        A retried or replayed step calling this again with the same ``key``
        gets the same child, never a second one; the start is fenced by this
        attempt's lease (:class:`~pgdurable.LeaseLost` if it was lost). The
        child's deadline is capped by this run's; ``policy`` says what happens
        to it if this run ends first: ``"cancel"`` (default) or ``"abandon"``.
        Wait for children with :meth:`Wait.children`. See :mod:`pgdurable.runs.children`.
        ``affinity_of`` (a run id, e.g. ``ctx.run_id`` after :meth:`pin`): the
        child starts with that run's affinity, so it runs where that run's
        service is (:mod:`pgdurable.foundation.affinity`). ``budgets`` and ``budget``
        as in :meth:`~pgdurable.Durable.start` (docs/budgets.md): a child given
        neither draws from this run's budgets.
        """
        app, _owner = self._attached()
        return await start_child(
            app, self.run_id, self.token, task, state, key=key, queue=queue, priority=priority,
            deadline=deadline, budget=budget, revision=revision, max_attempts=max_attempts,
            policy=policy, affinity_of=affinity_of, budgets=budgets,
        )

    def start_child_sync(self, task: str, state: Any = None, *, key: str, **options: Any) -> str:
        """:meth:`start_child` for sync step functions (which the worker runs in a thread)."""
        return str(self._call_sync(self.start_child(task, state, key=key, **options)))

    async def start_children(self, children: Iterable[Child | dict[str, Any]]) -> list[str]:
        """Start many children with ONE statement; return their ids in input order.

        Each :class:`~pgdurable.Child` (or dict of its fields) takes the arguments of
        :meth:`start_child`, with the same meaning: once per this run and key (an
        existing key returns its child), fenced by this attempt's lease
        (:class:`~pgdurable.LeaseLost`: nothing started). The parent's row lock is
        taken once and one INSERT starts them all: 10,000 children cost one commit,
        not 10,000 that queue on this run's row. All or nothing: bad input in any
        child raises before any SQL. See :mod:`pgdurable.runs.children`.
        """
        app, _owner = self._attached()
        return await start_children(app, self.run_id, self.token, children)

    def start_children_sync(self, children: Iterable[Child | dict[str, Any]]) -> list[str]:
        """:meth:`start_children` for sync step functions (which the worker runs in a thread)."""
        return list(self._call_sync(self.start_children(children)))

    async def wait_children(
        self,
        ids: Iterable[Any],
        *,
        any: bool = False,
        at_least: int | None = None,
        timeout: timedelta | float | None = None,  # noqa: ASYNC109 (the Wait's timeout)
        state: Any = _UNSET,
    ) -> Wait:
        """:meth:`Wait.children`, checked now: :class:`~pgdurable.InvalidInput`
        (a ``ValueError``) in this step if an id is not a child of this run or
        is this run itself."""
        wait = Wait.children(ids, any=any, at_least=at_least, timeout=timeout, state=state)
        app, _owner = self._attached()
        await check_children(app, self.run_id, wait.child_ids)
        return wait

    def wait_inbox(
        self, *, timeout: timedelta | float | None = None, state: Any = _UNSET
    ) -> Wait:
        """A :class:`Wait` that parks this thread run until its inbox has news.

        Call ``await ctx.inbox()`` first in the step (it learns the thread key).
        A message that arrives before the run parks wakes it at once.
        """
        if self.thread_key is None:
            raise RuntimeError("wait_inbox() needs the thread key: call await ctx.inbox() first")
        # the signal ref is the stored (escaped) key, as send_message signals it
        return Wait(signal=("inbox", encode_thread_key(self.thread_key)), timeout=timeout,
                    state=state)
