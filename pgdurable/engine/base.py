"""A worker's options and shared state, and the small operations every part uses.

:class:`WorkerBase` holds what the claim loop, the listener, the heartbeat,
step execution and parking share: the settings, the runs held
(:class:`_Active`), the wake-up event, the fence (:meth:`WorkerBase._trusted`,
:meth:`WorkerBase._fenced`) and stopping a run's step
(:meth:`WorkerBase._stop_run`). Each part is a class in a module named for
its job; :class:`pgdurable.engine.worker.Worker` composes them. The engine
takes the :class:`pgdurable.foundation.ports.App` protocol, never the app object.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.affinity import new_instance
from ..foundation.errors import PgDurableError
from ..foundation.hints import WakeLimiter
from ..foundation.retry import retry_while
from ..runs.schedules import Ticker
from .batch_writer import StepWriter
from .presence import WorkerPresence

if TYPE_CHECKING:
    from ..foundation.ports import App
    from ..foundation.registry import Task

__all__ = ["WorkerBase"]

log = logging.getLogger("pgdurable.worker")

_DB_ERRORS = (PgDurableError, psycopg.Error, OSError)


@dataclass
class _Active:
    """Book-keeping of one claimed run."""

    run_id: uuid.UUID
    token: int
    queue: str
    trust_until: float
    task: asyncio.Task[None] | None = None
    in_step: bool = False
    stop_reason: str | None = None  # "cancel" | "lease_lost" | "shutdown"
    finishing: bool = False  # its lease's last write is being sent: its slot is free


def _seconds(value: timedelta | float | int, what: str) -> float:
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not secs > 0:
        raise ValueError(f"{what} must be > 0")
    return secs


def _as_timedelta(value: timedelta | float | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


class WorkerBase:
    """The options and state of a :class:`~pgdurable.engine.worker.Worker` (see there)."""

    def __init__(
        self,
        app: App,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 16,
        lease_ttl: timedelta | float = timedelta(seconds=60),
        heartbeat: timedelta | float | None = None,
        poll_interval: timedelta | float = 5.0,
        lease_window: timedelta | float | None = None,
        safety_margin: timedelta | float | None = None,
        worker_id: str | None = None,
        listen: bool = True,
    ) -> None:
        if isinstance(queues, str) or not isinstance(queues, Sequence) or not queues:
            raise TypeError("queues must be a non-empty list of queue names")
        for name in queues:
            q.check_name(name, "queue")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError("concurrency must be an int >= 1")
        self.app = app
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.ttl = _seconds(lease_ttl, "lease_ttl")
        hb = self.ttl / 3 if heartbeat is None else _seconds(heartbeat, "heartbeat")
        self.heartbeat_interval = min(hb, self.ttl / 3)
        self.poll_interval = _seconds(poll_interval, "poll_interval")
        self.lease_window = self.ttl if lease_window is None else _seconds(lease_window, "lease_window")
        margin = self.ttl / 6 if safety_margin is None else _seconds(safety_margin, "safety_margin")
        self.safety_margin = min(margin, self.ttl / 2)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # this process's instance (pgdurable/foundation/affinity.py): runs pinned here name it, and
        # a restart under the same worker_id is another instance
        self.instance = new_instance()
        self.listen = listen
        self._active: dict[uuid.UUID, _Active] = {}
        self._finishing = 0  # of _active, the runs whose last write is being sent
        self._wake = asyncio.Event()
        self._renew_now = asyncio.Event()  # the heartbeat renews (and reads cancels) at once
        self._pending = True
        self._due_at: float | None = None
        self._asked_at = -math.inf  # when next_wakeup last answered (monotonic)
        self._found_at = -math.inf  # when a claim last found some runs, not a full batch
        # how long a trickle of claims may skip next_wakeup (see engine/claim.py)
        self.recheck_interval = 0.5
        self._stopping = False
        self._grace = 30.0
        self._running = False
        self._done = asyncio.Event()
        self._claims: asyncio.Task[None] | None = None  # the claim loop, while run() runs
        self._claims_deadline: asyncio.TimerHandle | None = None  # see Worker._abandon_claims
        self._tasks: list[Task] = []
        self.claim_count = 0  # claim statements issued (tests, metrics)
        # when fewer than _claim_batch slots are free, a claim waits claim_delay
        # seconds for more to free up (under load: fewer, larger claims); a
        # wake-up within claim_delay of a claim that found runs (fewer than
        # its free slots) waits for the rest of it (a trickle: engine/claim.py)
        self._claim_batch = max(1, concurrency // 8)
        self.claim_delay = 0.005
        # after the grace period, how long stopped runs get to settle (release,
        # acknowledge a cancel) before stop() gives up on them
        self.settle_limit = 10.0
        self.heartbeat_count = 0  # renew statements issued
        # heartbeat and step batches both lock many run rows: never at once
        # (one worker's two multi-row UPDATEs could otherwise deadlock)
        self._write_lock = asyncio.Lock()
        # NOTIFYs are hints anyone can send: wake-up claims are rate-limited,
        # cancels checked against the database first (pgdurable/foundation/hints.py)
        self.wake_limit = WakeLimiter()
        self._deferred_wake: asyncio.TimerHandle | None = None
        # cancel checks: coalesced (one asks about every run named since the last)
        # and rate-limited; a check over the limit waits at most 1 / rate seconds
        self.cancel_limit = WakeLimiter(rate=5.0, burst=5)
        self._cancel_pending: dict[uuid.UUID, _Active] = {}  # named, not checked yet
        self._cancel_checker: asyncio.Task[None] | None = None
        self.cancel_check_count = 0  # cancel checks sent to the database (tests)
        self._writer = StepWriter(app, self.worker_id, self._write_lock)
        self._ticker = Ticker(app, self.queues)  # fires due schedule ticks (schedules.py)
        # announced at start, renewed each heartbeat interval (engine/presence.py)
        self._presence = WorkerPresence(app, self.worker_id, self.instance, self.ttl,
                                        self.heartbeat_interval, self.queues, concurrency)

    @property
    def _cancel_checks(self) -> bool:
        """Whether a cancel check is pending or in flight (tests)."""
        return bool(self._cancel_pending) or (
            self._cancel_checker is not None and not self._cancel_checker.done())

    def _busy(self) -> int:
        """Slots in use: the runs held, less those whose last write is being sent."""
        return len(self._active) - self._finishing

    def _finishing_now(self, a: _Active) -> None:
        """``a``'s last write of this lease (completion, park, failure) is about to
        be sent: its slot is free now, so the next claim overlaps that write
        instead of waiting for its commit."""
        if not a.finishing:
            a.finishing = True
            self._finishing += 1
            self._slot_freed()

    def _slot_freed(self) -> None:
        """A slot is free: claim again if work may remain (or to stop, or a due time)."""
        due = self._due_at is not None and time.monotonic() >= self._due_at
        if self._pending or self._stopping or due:
            self._wake.set()

    def _poke(self) -> None:
        self._pending = True
        self._wake.set()

    def _note_due(self, seconds: float) -> None:
        """Wake the claim loop in ``seconds`` (a timer or retry this worker set)."""
        due = time.monotonic() + max(0.0, seconds) + 0.001
        if self._due_at is None or due < self._due_at:
            self._due_at = due
            self._wake.set()

    def _stop_run(self, a: _Active, reason: str) -> None:
        """Stop a run's step (if one is running) for ``reason``."""
        if reason == "lease_lost" and a.stop_reason != reason:
            metrics.lease_lost()
        if a.stop_reason is None or reason == "lease_lost":
            a.stop_reason = reason
        if a.in_step and a.task is not None:
            a.task.cancel()

    def _trusted(self, a: _Active) -> bool:
        """Whether ``a``'s lease is still ours to act on (see the heartbeat)."""
        return a.stop_reason != "lease_lost" and time.monotonic() < a.trust_until

    async def _fenced(self, a: _Active, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """One fenced statement of run ``a``, sent again after a lost connection
        while its lease is trusted (they are idempotent for their token)."""
        return await retry_while(lambda: self.app.fetchone(sql, params), lambda: self._trusted(a))
