"""The claim loop: when to claim, how many runs, and starting their tasks.

:meth:`Claimer.run` claims up to the number of free slots with ONE
``pgdurable.claim_runs`` call (``queries.claim.CLAIM``), when woken by a NOTIFY on
``pgdurable_wake`` for one of its queues (:mod:`~pgdurable.engine.listener`),
a freed slot while work may remain, a known due time (timer, retry, lease
expiry) or a slow jittered poll. When nothing is known to be due, the poll
first asks ``pgdurable.next_wakeup`` (one query) and sleeps until the earliest
of: next poll, earliest timer, retry or lease expiry in its queues. Idle = one
query per poll interval. A trickle of NOTIFY-driven claims that find runs
asks ``next_wakeup`` at most every ``recheck_interval`` (0.5 s; the claims take
due timers themselves) and claims again 50 ms after the last one. Under load a
claim waits ``claim_delay`` for more slots to free up (fewer, larger claims), and a
wake-up within ``claim_delay`` of a claim that found runs, but fewer than its free
slots, waits out the rest of that window: a trickle of starts is claimed a few runs
at a time, not a claim and its writes per run, while a start after a quiet spell is
claimed at once and a backlog (claims that fill every slot) is not slowed. A run
whose last write of its lease is being sent (its completion, park or failure)
frees its slot (``WorkerState.finishing_now``): at full concurrency the next claim overlaps
that write instead of waiting for it. Queue
limits, buckets and reclaim bounds are applied by the claim statement itself
(``sql/``); the loop passes the task names, revisions and ``max_reclaims`` it serves.

The claim loop also serves the worker's plug-in loop services
(:mod:`~pgdurable.engine.services`: the schedule ticker): their probes are columns of
its idle query, their due times bound its sleep, and it calls them on every wake-up.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from ..foundation import metrics
from ..foundation.aio import wait_set
from ..foundation.errors import ReadOnlyDatabase
from ..foundation.hints import WakeLimiter
from ..foundation.queries import claim as cq
from ..foundation.queries.core import Database, first, many
from ..foundation.registry import Task
from .execute import Executor
from .services import LoopService
from .settings import Settings
from .state import DB_ERRORS, Held, WorkerState, log, on_done

__all__ = ["Claimer"]


class Claimer:
    """Decides when to claim and how many runs, claims them and gives each a task of
    the executor (a part of :class:`~pgdurable.engine.worker.Worker`)."""

    def __init__(self, db: Database, settings: Settings, state: WorkerState,
                 executor: Executor, wake_limit: WakeLimiter,
                 services: Sequence[LoopService] = ()) -> None:
        self.db, self.settings, self.state = db, settings, state
        self.executor = executor
        self.wake_limit = wake_limit  # the listener's: a token back per run found
        self.services = list(services)
        probes = [svc.probe for svc in self.services if svc.probe is not None]
        self._probed = [svc for svc in self.services if svc.probe is not None]
        self._wakeup = cq.next_wakeup(probes)
        self.tasks: list[Task] = []  # the tasks served, set when the worker runs
        self.count = 0  # claim statements issued (tests, metrics)
        #: Told when a claim is refused by a read-only server (the worker's).
        self.on_read_only: Callable[[ReadOnlyDatabase], None] | None = None
        self._asked_at = -float("inf")  # when next_wakeup last answered (monotonic)
        self._found_at = -float("inf")  # when a claim last found some runs, not a full batch

    async def hand_off(self) -> None:
        """On a graceful stop, if this worker was waiting for a timer or retry
        (possibly one it set itself, which no NOTIFY announced), notify its
        queues so that idle workers re-read ``next_wakeup`` now instead of at
        their next poll. One statement; a failure is only logged."""
        if self.state.due_at is None:
            return
        try:
            await many(self.db, cq.NOTIFY_QUEUES, (self.settings.queues,))
        except DB_ERRORS as exc:
            log.warning("hand-off notify failed: %s", exc)

    def _task_arrays(self) -> tuple[list[str], list[str]]:
        return [t.name for t in self.tasks], [t.revision for t in self.tasks]

    def _reclaim_bounds(self) -> list[int]:
        return [getattr(t, "max_reclaims", 5) for t in self.tasks]

    async def next_wakeup(self, min_delay: float = 0.0) -> None:
        """Ask the database when work may appear next (sets ``state.due_at``), and
        tell each probed service when it is due.

        ``min_delay`` keeps a just-finished claim from spinning on rows that
        other workers hold locked (they show as due but are skipped); it
        applies only to work that is already due: a timer due in the future
        is claimed on time (Sleep overshoot), not ``min_delay`` late."""
        s, state = self.settings, self.state
        names, revs = self._task_arrays()
        params = (s.queues, names, revs, s.worker_id, *[s.queues for _ in self._probed])
        try:
            wakeup = await first(self.db, self._wakeup, params)
        except DB_ERRORS as exc:
            log.warning("next_wakeup failed: %s", exc)
            state.due_at = None
            return
        self._asked_at = time.monotonic()
        answers = wakeup.probes if wakeup is not None else (None,) * len(self._probed)
        for svc, seconds in zip(self._probed, answers, strict=True):
            svc.note(seconds)
        secs = None if wakeup is None else wakeup.work_in
        if secs is None:
            state.due_at = None
        else:
            # +1 ms: the database computed secs before we got the answer, so
            # this is never early (an early claim would only cost a re-check)
            delay = secs + 0.001 if secs > 0 else max(0.001, min_delay)
            state.due_at = time.monotonic() + delay

    def _recheck(self, at: float) -> None:
        """Claim again at ``at`` (monotonic) unless a known due time comes first."""
        due_at = self.state.due_at
        if due_at is None or due_at <= time.monotonic() or at < due_at:
            self.state.due_at = at

    def _timeout(self, timeout: float) -> float:
        for svc in self.services:
            timeout = svc.timeout(timeout)
        return timeout

    async def run(self) -> None:
        """The claim loop, until the worker stops."""
        s, state = self.settings, self.state
        state.wake.set()
        while not state.stopping:
            timeout = s.poll_interval * random.uniform(0.8, 1.2)
            if state.due_at is not None and state.busy() < s.concurrency:
                # with no free slot, a finishing run sets the event instead
                timeout = min(timeout, max(0.0, state.due_at - time.monotonic()))
            timeout = self._timeout(timeout)
            woke = True
            if not state.wake.is_set():
                woke = await wait_set(state.wake, timeout)
            if state.stopping:
                break
            state.wake.clear()
            for svc in self.services:
                await svc.on_wake()
            free = s.concurrency - state.busy()
            if free <= 0:
                continue
            if woke and free < s.claim_batch and state.active:
                # most slots busy (a run just finished): let a few more finish
                # first so that one claim takes several runs (claim batching)
                await asyncio.sleep(s.claim_delay)
                free = s.concurrency - state.busy()
            elif woke and (cooldown := self._found_at + s.claim_delay - time.monotonic()) > 0:
                # a trickle of starts: the last claim found runs (fewer than it
                # had room for) moments ago; wait out claim_delay after it, so
                # that one claim (and then one write per step) takes every run
                # started meanwhile
                await asyncio.sleep(cooldown)
                free = s.concurrency - state.busy()
            if not woke:
                due = state.due_at is not None and time.monotonic() >= state.due_at
                if not due:
                    # plain poll: one query tells whether anything is due
                    await self.next_wakeup()
                    if state.due_at is None or time.monotonic() < state.due_at:
                        continue
            claimed = await self.claim(free)
            if claimed:
                self.wake_limit.refund(claimed)  # real work: a token back per run found
            if 0 < claimed < free:
                # runs found, and room for more: a trickle, not a backlog (a
                # backlog fills every slot, and its next claim finds plenty)
                self._found_at = time.monotonic()
            state.pending = claimed == free
            if claimed < free:
                now = time.monotonic()
                if claimed and now - self._asked_at < s.recheck_interval:
                    # a trickle of starts: every claim a NOTIFY triggers takes the
                    # due timers too, so next_wakeup (a query per run) is asked at
                    # most every recheck_interval; look again 50 ms after the
                    # last claim, when the trickle has stopped
                    self._recheck(now + 0.05)
                else:
                    await self.next_wakeup(min_delay=0.05)

    async def claim(self, n: int) -> int:
        """ONE claim of up to ``n`` runs; each leased run gets a task. How many rows came."""
        s, state = self.settings, self.state
        names, revs = self._task_arrays()
        params = (
            s.worker_id, s.queues, names, revs, n, timedelta(seconds=s.ttl),
            self._reclaim_bounds(),
        )
        start = time.monotonic()
        try:
            self.count += 1
            rows = await self.db.fetchall(cq.CLAIM.sql, params)
            metrics.claim_done(time.monotonic() - start)
        except DB_ERRORS as exc:
            if isinstance(exc, ReadOnlyDatabase) and self.on_read_only is not None:
                self.on_read_only(exc)  # a standby: the worker decides (engine/worker.py)
            log.warning("claim failed: %s", exc)
            await asyncio.sleep(min(1.0, s.poll_interval))
            return 0
        for run in cq.CLAIM.all(rows):
            if run.status != "leased":
                continue  # a poison or cancelled reclaim, settled by the claim itself
            held = Held(run.id, run.lease_token, run.queue, start + s.ttl - s.safety_margin,
                        str(run.id))
            state.active[run.id] = held
            held.task = asyncio.create_task(self.executor.execute(held, run, start))
            held.task.add_done_callback(on_done(state, held))
        return len(rows)

    async def drain(self) -> None:
        """On a stop: let running steps finish within the grace period, then stop the
        rest and give them ``settle_limit`` seconds to settle."""
        s, state = self.settings, self.state
        tasks = state.tasks()
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, s.grace))
        for a in list(state.active.values()):
            state.stop_run(a, "shutdown")
        tasks = state.tasks()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=s.settle_limit)
            if pending:
                # a step that swallows cancellation, or a write stuck on a dead
                # socket: do not hang the shutdown; those leases lapse (TTL)
                # and the runs are recovered like a crashed worker's
                log.warning("worker %s: %d run(s) did not settle within %.0f s of being "
                            "stopped; leaving their leases to lapse", s.worker_id,
                            len(pending), s.settle_limit)
