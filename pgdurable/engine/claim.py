"""The claim loop: when to claim, how many runs, and starting their tasks.

:meth:`ClaimLoop._claim_loop` claims up to the number of free slots with ONE
``pgdurable.claim_runs`` call (``run_queries.CLAIM``), when woken by a NOTIFY on
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
frees its slot (``_finishing_now``): at full concurrency the next claim overlaps
that write instead of waiting for it. Queue
limits, buckets and reclaim bounds are applied by the claim statement itself
(``sql/``); the loop passes the task names, revisions and ``max_reclaims`` it serves.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import timedelta
from typing import Any

from ..foundation import metrics
from ..foundation import run_queries as q
from ..foundation.aio import wait_set
from .base import _DB_ERRORS, _Active, log
from .execute import StepExecution

__all__ = ["ClaimLoop"]


class ClaimLoop(StepExecution):
    """Claiming runs and giving them a task each (part of :class:`~pgdurable.engine.worker.Worker`)."""

    async def _hand_off(self) -> None:
        """On a graceful stop, if this worker was waiting for a timer or retry
        (possibly one it set itself, which no NOTIFY announced), notify its
        queues so that idle workers re-read ``next_wakeup`` now instead of at
        their next poll. One statement; a failure is only logged."""
        if self._due_at is None:
            return
        try:
            await self.app.fetchall(q.NOTIFY_QUEUES, (self.queues,))
        except _DB_ERRORS as exc:
            log.warning("hand-off notify failed: %s", exc)

    def _task_arrays(self) -> tuple[list[str], list[str]]:
        return [t.name for t in self._tasks], [t.revision for t in self._tasks]

    def _reclaim_bounds(self) -> list[int]:
        return [getattr(t, "max_reclaims", 5) for t in self._tasks]

    async def _next_wakeup(self, min_delay: float = 0.0) -> None:
        """Ask the database when work may appear next (sets ``_due_at``).

        ``min_delay`` keeps a just-finished claim from spinning on rows that
        other workers hold locked (they show as due but are skipped); it
        applies only to work that is already due: a timer due in the future
        is claimed on time (Sleep overshoot), not ``min_delay`` late."""
        names, revs = self._task_arrays()
        try:
            row = await self.app.fetchone(
                q.NEXT_WAKEUP, (self.queues, names, revs, self.worker_id, self.queues))
        except _DB_ERRORS as exc:
            log.warning("next_wakeup failed: %s", exc)
            self._due_at = None
            return
        self._asked_at = time.monotonic()
        self._ticker.note(None if row is None or row[1] is None else float(row[1]))
        secs = None if row is None or row[0] is None else float(row[0])
        if secs is None:
            self._due_at = None
        else:
            # +1 ms: the database computed secs before we got the answer, so
            # this is never early (an early claim would only cost a re-check)
            delay = secs + 0.001 if secs > 0 else max(0.001, min_delay)
            self._due_at = time.monotonic() + delay

    def _recheck(self, at: float) -> None:
        """Claim again at ``at`` (monotonic) unless a known due time comes first."""
        if self._due_at is None or self._due_at <= time.monotonic() or at < self._due_at:
            self._due_at = at

    async def _claim_loop(self) -> None:
        self._wake.set()
        while not self._stopping:
            timeout = self.poll_interval * random.uniform(0.8, 1.2)
            if self._due_at is not None and self._busy() < self.concurrency:
                # with no free slot, a finishing run sets the event instead
                timeout = min(timeout, max(0.0, self._due_at - time.monotonic()))
            timeout = self._ticker.timeout(timeout)
            woke = True
            if not self._wake.is_set():
                woke = await wait_set(self._wake, timeout)
            if self._stopping:
                break
            self._wake.clear()
            await self._ticker.fire_if_due()
            free = self.concurrency - self._busy()
            if free <= 0:
                continue
            if woke and free < self._claim_batch and self._active:
                # most slots busy (a run just finished): let a few more finish
                # first so that one claim takes several runs (claim batching)
                await asyncio.sleep(self.claim_delay)
                free = self.concurrency - self._busy()
            elif woke and (cooldown := self._found_at + self.claim_delay - time.monotonic()) > 0:
                # a trickle of starts: the last claim found runs (fewer than it
                # had room for) moments ago; wait out claim_delay after it, so
                # that one claim (and then one write per step) takes every run
                # started meanwhile
                await asyncio.sleep(cooldown)
                free = self.concurrency - self._busy()
            if not woke:
                due = self._due_at is not None and time.monotonic() >= self._due_at
                if not due:
                    # plain poll: one query tells whether anything is due
                    await self._next_wakeup()
                    if self._due_at is None or time.monotonic() < self._due_at:
                        continue
            claimed = await self._claim(free)
            if claimed:
                self.wake_limit.refund(claimed)  # real work: a token back per run found
            if 0 < claimed < free:
                # runs found, and room for more: a trickle, not a backlog (a
                # backlog fills every slot, and its next claim finds plenty)
                self._found_at = time.monotonic()
            self._pending = claimed == free
            if claimed < free:
                now = time.monotonic()
                if claimed and now - self._asked_at < self.recheck_interval:
                    # a trickle of starts: every claim a NOTIFY triggers takes the
                    # due timers too, so next_wakeup (a query per run) is asked at
                    # most every recheck_interval; look again 50 ms after the
                    # last claim, when the trickle has stopped
                    self._recheck(now + 0.05)
                else:
                    await self._next_wakeup(min_delay=0.05)

    async def _claim(self, n: int) -> int:
        names, revs = self._task_arrays()
        params = (
            self.worker_id, self.queues, names, revs, n, timedelta(seconds=self.ttl),
            self._reclaim_bounds(),
        )
        start = time.monotonic()
        try:
            self.claim_count += 1
            rows = await self.app.fetchall(q.CLAIM, params)
            metrics.claim_done(time.monotonic() - start)
        except _DB_ERRORS as exc:
            log.warning("claim failed: %s", exc)
            await asyncio.sleep(min(1.0, self.poll_interval))
            return 0
        for row in map(q.ClaimedRun._make, rows):
            if row.status != "leased":
                continue  # a poison or cancelled reclaim, settled by the claim itself
            rid: uuid.UUID = row.id
            active = _Active(rid, row.lease_token, row.queue, start + self.ttl - self.safety_margin)
            self._active[rid] = active
            active.task = asyncio.create_task(self._execute(active, row, start))
            active.task.add_done_callback(self._make_done_callback(active))
        return len(rows)

    def _make_done_callback(self, a: _Active) -> Any:
        def done(_t: asyncio.Task[None]) -> None:
            self._finished(a)

        return done

    def _finished(self, a: _Active) -> None:
        if self._active.get(a.run_id) is a:
            del self._active[a.run_id]
            if a.finishing:
                self._finishing -= 1
        self._slot_freed()

    async def _drain(self) -> None:
        tasks = [a.task for a in self._active.values() if a.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, self._grace))
        for a in list(self._active.values()):
            self._stop_run(a, "shutdown")
        tasks = [a.task for a in self._active.values() if a.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.settle_limit)
            if pending:
                # a step that swallows cancellation, or a write stuck on a dead
                # socket: do not hang the shutdown; those leases lapse (TTL)
                # and the runs are recovered like a crashed worker's
                log.warning("worker %s: %d run(s) did not settle within %.0f s of being "
                            "stopped; leaving their leases to lapse", self.worker_id,
                            len(pending), self.settle_limit)
