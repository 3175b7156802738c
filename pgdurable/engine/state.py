"""What a worker's parts share: the runs held and the claim loop's wake-up.

:class:`WorkerState` is the one small object every part holds (River's producer keeps
the same things on itself): the runs held (:class:`Held`, by id), how many of them are
sending their last write (their slots are free), the claim loop's wake-up event and its
known due time, the heartbeat's renew-now event, and the stopping flag. Its methods are
the few moves on that state the parts make: a slot freed, a due time noted, a run's step
stopped. :func:`fenced` sends one fenced statement of a held run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from ..foundation import metrics
from ..foundation.errors import PgDurableError
from ..foundation.queries.core import Database, Query, first
from ..foundation.retry import retry_while

__all__ = ["DB_ERRORS", "Held", "WorkerState", "fenced", "log", "on_done"]

R = TypeVar("R")

log = logging.getLogger("pgdurable.worker")

#: What a statement of the engine may raise that the engine logs and survives.
DB_ERRORS = (PgDurableError, psycopg.Error, OSError)


@dataclass(slots=True)
class Held:
    """Book-keeping of one claimed run (one lease of it)."""

    run_id: uuid.UUID
    token: int
    queue: str
    trust_until: float  # monotonic: the lease is not trusted after this
    key: str  # the run id's text, made once (the step context and the batched write use it)
    task: asyncio.Task[None] | None = None
    in_step: bool = False
    stop_reason: str | None = None  # "cancel" | "lease_lost" | "shutdown"
    finishing: bool = False  # its lease's last write is being sent: its slot is free

    def trusted(self) -> bool:
        """Whether this lease is still ours to act on (see the heartbeat)."""
        return self.stop_reason != "lease_lost" and time.monotonic() < self.trust_until

    def ident(self, owner: str) -> tuple[uuid.UUID, int, str]:
        """The (run id, token, owner) that every fenced statement of this lease starts with."""
        return (self.run_id, self.token, owner)


class WorkerState:
    """The state the parts of one worker share (see the module docstring)."""

    def __init__(self) -> None:
        self.active: dict[uuid.UUID, Held] = {}
        self.finishing = 0  # of active, the runs whose last write is being sent
        self.wake = asyncio.Event()  # the claim loop looks now
        self.renew_now = asyncio.Event()  # the heartbeat renews (and reads cancels) at once
        self.pending = True  # work may remain (the last claim filled every free slot)
        self.due_at: float | None = None  # monotonic: when the claim loop must look again
        self.stopping = False

    def busy(self) -> int:
        """Slots in use: the runs held, less those whose last write is being sent."""
        return len(self.active) - self.finishing

    def finishing_now(self, a: Held) -> None:
        """``a``'s last write of this lease (completion, park, failure) is about to
        be sent: its slot is free now, so the next claim overlaps that write
        instead of waiting for its commit."""
        if not a.finishing:
            a.finishing = True
            self.finishing += 1
            self.slot_freed()

    def slot_freed(self) -> None:
        """A slot is free: claim again if work may remain (or to stop, or a due time)."""
        due = self.due_at is not None and time.monotonic() >= self.due_at
        if self.pending or self.stopping or due:
            self.wake.set()

    def poke(self) -> None:
        """Work may be there (a wake-up, a reconnect): claim."""
        self.pending = True
        self.wake.set()

    def note_due(self, seconds: float) -> None:
        """Wake the claim loop in ``seconds`` (a timer or retry this worker set)."""
        due = time.monotonic() + max(0.0, seconds) + 0.001
        if self.due_at is None or due < self.due_at:
            self.due_at = due
            self.wake.set()

    def stop_run(self, a: Held, reason: str) -> None:
        """Stop a run's step (if one is running) for ``reason``."""
        if reason == "lease_lost" and a.stop_reason != reason:
            metrics.lease_lost()
        if a.stop_reason is None or reason == "lease_lost":
            a.stop_reason = reason
        if a.in_step and a.task is not None:
            a.task.cancel()

    def held(self, a: Held) -> bool:
        """Whether ``a`` is still the lease held for its run."""
        return self.active.get(a.run_id) is a

    def released(self, a: Held) -> None:
        """``a``'s task ended: its slot is free."""
        if self.active.get(a.run_id) is a:
            del self.active[a.run_id]
            if a.finishing:
                self.finishing -= 1
        self.slot_freed()

    def tasks(self) -> list[asyncio.Task[None]]:
        """The tasks of the runs held."""
        return [a.task for a in self.active.values() if a.task is not None]


async def fenced(db: Database, a: Held, query: Query[R], params: tuple[Any, ...]) -> R | None:
    """One fenced statement of run ``a``, sent again after a lost connection while its
    lease is trusted (they are idempotent for their token); its record, None for no row."""
    return await retry_while(lambda: first(db, query, params), a.trusted)


def on_done(state: WorkerState, a: Held) -> Callable[[asyncio.Task[None]], None]:
    """The done-callback of ``a``'s task: its slot is free."""

    def done(_t: asyncio.Task[None]) -> None:
        state.released(a)

    return done
