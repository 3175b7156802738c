"""The worker: claims runs, executes their steps, checkpoints, lets go.

Structure (one asyncio event loop, three long-lived tasks plus one task per
run):

* **claim loop** (:meth:`Worker._claim_loop`): claims up to the number of free
  slots with ONE ``pgdurable.claim_runs`` call, when woken by a NOTIFY on
  ``pgdurable_wake`` for one of its queues, a freed slot while work may remain,
  a known due time (timer, retry, lease expiry) or a slow jittered poll. When
  nothing is known to be due, the poll first asks ``pgdurable.next_wakeup``
  (one query) and sleeps until the earliest of: next poll, earliest timer,
  retry or lease expiry in its queues. Idle = one query per poll interval.
* **listener** (:meth:`Worker._listen`): a dedicated autocommit connection
  (not from the pool) LISTENing on ``pgdurable_wake`` and ``pgdurable_cancel``;
  reconnects with backoff and claims after every (re)connect. It connects to
  the app's ``listen_dsn`` if set, else to the app's DSN; behind a
  transaction-mode pooler without ``listen_dsn`` there is none (LISTEN does
  not work through it): the worker polls and says so in a warning at start.
* **heartbeat** (:meth:`Worker._heartbeat`): every ``heartbeat`` (<= TTL/3)
  ONE ``pgdurable.renew_runs`` UPDATE renews all of this worker's leases. A
  run missing from the answer has lost its lease and is stopped locally; a
  run whose lease could not be renewed is no longer trusted after
  ``attempt start + ttl - safety_margin`` (monotonic) and is stopped too.
* **run tasks** (:meth:`Worker._execute`): one per claimed run; step after
  step within the lease window, then give the run back.

Step code: sync step functions run in a thread (the worker's own pool: one per
busy slot, never queued behind the loop's default executor) and so
cannot block heartbeats; **async step functions must not block the event
loop** with CPU-bound work (offload it with ``asyncio.to_thread``), or
heartbeats starve. A cancelled thread step keeps running to its end, but its
results are never written (every write is fenced).

Cancel: ``pgdurable_cancel`` NOTIFY -- only a hint: the worker first checks
that the run's ``cancel_requested_at`` is set (``_hints``) -- (and, as a backup,
the heartbeat's ``cancel_requested`` flag) cancels the step task if a step is
running; the run
is recorded ``cancelled`` by ``ack_cancel``. Between steps nothing needs to be
done: the next fenced write sees the request and ends the run ``cancelled``.

Shutdown: SIGTERM/SIGINT (when :meth:`run` runs in the main thread) or
:meth:`stop`: stop claiming, let running steps finish within ``grace``
seconds, checkpoint them, give their leases back (runnable + NOTIFY); steps
still running after the grace period are cancelled and their runs given back
at their last checkpoint.

Command line (used by crash tests and ``pgdurable worker``)::

    python -m pgdurable.worker module:app [--queues a,b] [--concurrency N]
        [--lease-ttl SECONDS] [--poll SECONDS] [--grace SECONDS] [--worker-id ID]
        [--no-listen]

``--no-listen`` is ``Worker(listen=False)``: no LISTEN connection, work is
found by polling (every ``--poll`` seconds, jittered). Behind PgBouncer in
transaction mode configure the app instead (``pooler="transaction"`` and a
direct ``listen_dsn``, or ``PGDURABLE_POOLER`` / ``PGDURABLE_LISTEN_DSN``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import random
import signal
import socket
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from . import _runs_sql as q
from . import metrics, tracing
from ._batch_writer import StepWriter
from ._hints import WakeLimiter, cancel_requested
from ._json import dumps
from ._json import exc_message as _exc_message
from ._json import jsonb_str as _jsonb_str
from ._retry import backoff, is_lost_connection, is_transient, retry_while
from .children import park_children
from .durable_runs import call_effect, is_terminal, mark_terminal, reconcile_effect
from .errors import (
    BudgetExceeded,
    DatabaseUnavailable,
    DeadlineExceeded,
    EffectFailed,
    InvalidInput,
    LeaseLost,
    PgDurableError,
)
from .flow import ACQUIRE_KIND, RateLimited
from .fork import register_worker, unregister_worker
from .liveness import step_guard
from .pooler import aconnect
from .schedules import Ticker
from .steps import (
    _UNSET,
    STEP_EXECUTOR,
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

if TYPE_CHECKING:
    from ._ports import App
    from .registry import Task
    from .runs import Durable

__all__ = ["Worker", "main"]

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


def _seconds(value: timedelta | float | int, what: str) -> float:
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not secs > 0:
        raise ValueError(f"{what} must be > 0")
    return secs


class Worker:
    """Executes runs of an app's tasks from some queues.

    Options: ``queues``, ``concurrency`` (runs at once), ``lease_ttl``,
    ``heartbeat`` (default TTL/3, at most TTL/3), ``poll_interval`` (default
    5 s, jittered ±20%), ``lease_window`` (how long a run may continue in one
    lease before it is given back; default ``lease_ttl``), ``safety_margin``
    (default TTL/6), ``worker_id``, ``listen`` (False = poll only, e.g.
    behind PgBouncer in transaction mode). The attribute ``settle_limit``
    (default 10 s) bounds how long :meth:`stop` waits, after the grace
    period, for stopped runs to settle before leaving their leases to lapse.
    """

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
        self.listen = listen
        self._active: dict[uuid.UUID, _Active] = {}
        self._wake = asyncio.Event()
        self._pending = True
        self._due_at: float | None = None
        self._stopping = False
        self._grace = 30.0
        self._running = False
        self._done = asyncio.Event()
        self._tasks: list[Task] = []
        self.claim_count = 0  # claim statements issued (tests, metrics)
        # when fewer than _claim_batch slots are free, a claim waits claim_delay
        # seconds for more to free up (under load: fewer, larger claims)
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
        # cancels checked against the database first (pgdurable/_hints.py)
        self.wake_limit = WakeLimiter()
        self._deferred_wake: asyncio.TimerHandle | None = None
        self._cancel_checks: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._writer = StepWriter(app, self.worker_id, self._write_lock)
        self._ticker = Ticker(app, self.queues)  # fires due schedule ticks (schedules.py)

    @property
    def write_count(self) -> int:
        """write_steps statements issued (each one batch of steps)."""
        return self._writer.count

    # -- public --------------------------------------------------------------

    @property
    def active_runs(self) -> list[str]:
        """Ids of the runs this worker holds right now."""
        return [str(k) for k in self._active]

    async def run(self) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT in the main thread)."""
        if self._running:
            raise RuntimeError("worker is already running")
        await self.app.open()
        self._tasks = list(self.app.tasks.values())
        if not self._tasks:
            raise ValueError("the app has no registered tasks")
        await self._ticker.declare()
        await register_worker(self.app, self.worker_id, self.app.tasks)
        self._running = True
        self._done.clear()
        # Not the loop's default executor (min(32, cpus + 4) threads, shared):
        # every slot's sync step must run at once, and a cancelled thread step
        # that keeps running must not hold up the steps of other runs. Threads
        # are started only when none is idle, so the bound is only a backstop.
        executor = ThreadPoolExecutor(
            max_workers=max(64, 4 * self.concurrency), thread_name_prefix="pgdurable-step"
        )
        executor_token = STEP_EXECUTOR.set(executor)  # inherited by the run tasks
        loop = asyncio.get_running_loop()
        handled: list[signal.Signals] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._request_stop, None)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        helpers = [asyncio.create_task(self._heartbeat(), name="pgdurable-heartbeat")]
        listen_to = self.app.listen_conninfo() if self.listen else None
        if listen_to is not None:
            helpers.append(asyncio.create_task(self._listen(listen_to), name="pgdurable-listener"))
        elif self.listen:
            log.warning("worker %s: no LISTEN: the app's DSN goes through a transaction-mode "
                        "pooler and no listen_dsn is set; finding work by polling every %.1f s",
                        self.worker_id, self.poll_interval)
        try:
            await self._claim_loop()
            await self._drain()
            await self._hand_off()
        except asyncio.CancelledError:
            # run() itself was cancelled (not stop()): stop the runs as well, so
            # that no step goes on without heartbeats (its lease would lapse
            # mid-step and another worker could run the step again)
            self._stopping = True
            for a in list(self._active.values()):
                self._stop_run(a, "shutdown")
            tasks = [a.task for a in self._active.values() if a.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=self.settle_limit)
            raise
        finally:
            for t in helpers:
                t.cancel()
            for t in helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            for sig in handled:
                loop.remove_signal_handler(sig)
            await unregister_worker(self.app, self.worker_id)
            STEP_EXECUTOR.reset(executor_token)
            executor.shutdown(wait=False, cancel_futures=True)
            self._running = False
            self._done.set()

    async def stop(self, grace: timedelta | float = 30.0) -> None:
        """Stop gracefully: no more claims, steps get ``grace`` seconds, leases go back."""
        self._request_stop(grace)
        if self._running:
            await self._done.wait()

    # -- claim loop ----------------------------------------------------------

    def _request_stop(self, grace: timedelta | float | None) -> None:
        if grace is not None:
            self._grace = grace.total_seconds() if isinstance(grace, timedelta) else float(grace)
        if not self._stopping:
            log.info("worker %s stopping: no more claims, %d run(s) get %.1f s to finish",
                     self.worker_id, len(self._active), self._grace)
        self._stopping = True
        self._wake.set()

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

    def _poke(self) -> None:
        self._pending = True
        self._wake.set()

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
            row = await self.app.fetchone(q.NEXT_WAKEUP, (self.queues, names, revs, self.queues))
        except _DB_ERRORS as exc:
            log.warning("next_wakeup failed: %s", exc)
            self._due_at = None
            return
        self._ticker.note(None if row is None or row[1] is None else float(row[1]))
        secs = None if row is None or row[0] is None else float(row[0])
        if secs is None:
            self._due_at = None
        else:
            # +1 ms: the database computed secs before we got the answer, so
            # this is never early (an early claim would only cost a re-check)
            delay = secs + 0.001 if secs > 0 else max(0.001, min_delay)
            self._due_at = time.monotonic() + delay

    async def _claim_loop(self) -> None:
        self._wake.set()
        while not self._stopping:
            timeout = self.poll_interval * random.uniform(0.8, 1.2)
            if self._due_at is not None and len(self._active) < self.concurrency:
                # with no free slot, a finishing run sets the event instead
                timeout = min(timeout, max(0.0, self._due_at - time.monotonic()))
            timeout = self._ticker.timeout(timeout)
            woke = True
            if not self._wake.is_set():
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    woke = False
            if self._stopping:
                break
            self._wake.clear()
            await self._ticker.fire_if_due()
            free = self.concurrency - len(self._active)
            if free <= 0:
                continue
            if woke and free < self._claim_batch and self._active:
                # most slots busy (a run just finished): let a few more finish
                # first so that one claim takes several runs (claim batching)
                await asyncio.sleep(self.claim_delay)
                free = self.concurrency - len(self._active)
            if not woke:
                due = self._due_at is not None and time.monotonic() >= self._due_at
                if not due:
                    # plain poll: one query tells whether anything is due
                    await self._next_wakeup()
                    if self._due_at is None or time.monotonic() < self._due_at:
                        continue
            claimed = await self._claim(free)
            if claimed:
                self.wake_limit.refund()  # real work: wake-ups that find some are free
            self._pending = claimed == free
            if claimed < free:
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
        for row in rows:
            if row[4] != "leased":
                continue  # a poison or cancelled reclaim, settled by the claim itself
            rid: uuid.UUID = row[0]
            active = _Active(rid, row[9], row[3], start + self.ttl - self.safety_margin)
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
        due = self._due_at is not None and time.monotonic() >= self._due_at
        if self._pending or self._stopping or due:
            self._wake.set()

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

    # -- listener ------------------------------------------------------------

    async def _listen(self, conninfo: str) -> None:
        backoff = 0.2
        while not self._stopping:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await aconnect(conninfo)
                await conn.execute("LISTEN pgdurable_wake")
                await conn.execute("LISTEN pgdurable_cancel")
                backoff = 0.2
                self._poke()  # claim after every (re)connect: wake-ups may be lost
                while not self._stopping:
                    got = False
                    async for n in conn.notifies(timeout=60.0):
                        got = True
                        if n.channel == "pgdurable_wake":
                            if n.payload in self.queues:
                                self._wake_notified()
                        elif n.channel == "pgdurable_cancel":
                            self._cancel_notified(n.payload)
                    if not got:
                        await conn.execute("SELECT 1")  # health check of a quiet socket
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError, DatabaseUnavailable) as exc:
                log.warning("listener connection lost: %s; reconnecting", exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, 5.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    def _wake_notified(self) -> None:
        """A wake-up NOTIFY: claim, at most at the wake limiter's rate (a forged
        flood costs bounded claims); one over the limit is deferred, not lost."""
        if self._wake.is_set() or self._deferred_wake is not None:
            return  # a claim is already coming
        delay = self.wake_limit.take()
        if delay <= 0:
            self._poke()
            return

        def deferred() -> None:
            self._deferred_wake = None
            self._poke()

        self._deferred_wake = asyncio.get_running_loop().call_later(delay, deferred)

    def _cancel_notified(self, payload: str) -> None:
        try:
            rid = uuid.UUID(payload)
        except ValueError:
            return
        a = self._active.get(rid)
        if a is None or a.stop_reason is not None or rid in self._cancel_checks:
            return
        # a hint only: stop the step once the database confirms the request
        check = asyncio.create_task(self._confirm_cancel(a))
        self._cancel_checks[rid] = check
        check.add_done_callback(lambda _t: self._cancel_checks.pop(rid, None))

    async def _confirm_cancel(self, a: _Active) -> None:
        try:
            requested = await cancel_requested(self.app, a.run_id, a.token)
        except _DB_ERRORS as exc:
            log.warning("run %s: cancel check failed (%s); the heartbeat checks again",
                        a.run_id, exc)
            return
        if requested and self._active.get(a.run_id) is a:
            self._stop_run(a, "cancel")

    def _stop_run(self, a: _Active, reason: str) -> None:
        """Stop a run's step (if one is running) for ``reason``."""
        if reason == "lease_lost" and a.stop_reason != reason:
            metrics.lease_lost()
        if a.stop_reason is None or reason == "lease_lost":
            a.stop_reason = reason
        if a.in_step and a.task is not None:
            a.task.cancel()

    # -- heartbeat -----------------------------------------------------------

    async def _heartbeat(self) -> None:
        ttl = timedelta(seconds=self.ttl)
        next_renew = time.monotonic() + self.heartbeat_interval
        while True:
            # wake for the next renewal, or earlier when a lease stops being trusted
            wake_at = next_renew
            for a in self._active.values():
                if a.stop_reason != "lease_lost":
                    wake_at = min(wake_at, a.trust_until)
            await asyncio.sleep(max(0.0, wake_at - time.monotonic()) + 0.001)
            now = time.monotonic()
            for a in list(self._active.values()):
                if now >= a.trust_until and a.stop_reason != "lease_lost":
                    log.warning("run %s: lease no longer trusted (renewals failed)", a.run_id)
                    self._stop_run(a, "lease_lost")
            if now < next_renew:
                continue
            next_renew = now + self.heartbeat_interval
            live = [a for a in self._active.values() if a.stop_reason != "lease_lost"]
            if not live:
                continue
            sent = time.monotonic()
            try:
                self.heartbeat_count += 1
                rows = await asyncio.wait_for(
                    self._renew(live, ttl), timeout=max(self.heartbeat_interval, 1.0)
                )
            except (TimeoutError, *_DB_ERRORS) as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            renewed = {r[0]: bool(r[2]) for r in rows}
            for a in live:
                if self._active.get(a.run_id) is not a:
                    continue
                if a.run_id in renewed:
                    a.trust_until = sent + self.ttl - self.safety_margin
                    if renewed[a.run_id]:
                        self._stop_run(a, "cancel")
                else:
                    self._stop_run(a, "lease_lost")

    async def _renew(self, live: list[_Active], ttl: timedelta) -> list[tuple[Any, ...]]:
        async with self._write_lock:
            return await self.app.fetchall(
                q.RENEW, (self.worker_id, [a.run_id for a in live], [a.token for a in live], ttl)
            )

    # -- executing a run -----------------------------------------------------

    async def _execute(self, a: _Active, row: tuple[Any, ...], claimed_at: float) -> None:
        task = self.app.tasks[row[1]]
        state: Any = row[5]
        step: int = row[6]
        attempts: int = row[7]
        wake: dict[str, Any] | None = row[11]
        deadline_at: datetime | None = row[12]
        budget = None if row[13] is None else float(row[13])
        spent = float(row[14])
        db_now: datetime = row[15]
        window_end = claimed_at + self.lease_window

        def db_clock() -> datetime:
            return db_now + timedelta(seconds=time.monotonic() - claimed_at)

        async def effect(key: str, fn: EffectFn, reconcile: EffectFn | None = None) -> Any:
            with tracing.effect_span(a.run_id, task.name, step, attempts + 1, a.token, key):
                return await self._effect(a, key, fn, reconcile)

        db_delays = backoff()

        def trusted() -> bool:
            return self._trusted(a)

        io = RunIO(  # a workflow checkpoints from inside one call; ctx.step follows runs.step
            checkpoint=lambda state_json, spend: self._writer.write(
                a.run_id, a.token, ctx.step, state_json, spend, None, trusted
            ),
            release=lambda: self._fenced(a, q.RELEASE, (a.run_id, a.token, self.worker_id)),
            should_yield=lambda: (self._stopping or a.stop_reason is not None
                                  or time.monotonic() >= window_end),
        )

        try:
            while True:
                if deadline_at is not None and db_clock() >= deadline_at:
                    await self._fail(a, task, attempts, DeadlineExceeded(
                        f"deadline {deadline_at.isoformat()} passed"), 0.0, terminal=True)
                    return
                ctx = RunContext(
                    run_id=str(a.run_id), task=task.name, step=step, attempt=attempts + 1,
                    token=a.token, wake=wake, deadline=deadline_at, budget=budget, spent=spent,
                    _effect=effect, _app=self.app, _owner=self.worker_id, _io=io,
                )
                t0 = time.monotonic()
                async with tracing.step_span(
                    self.app, a.run_id, task.name, step, attempts + 1, a.token
                ) as span:
                    outcome = await self._run_step(a, task, ctx, state, deadline_at, db_clock)
                    span.outcome(outcome)
                metrics.step_done(task.name, time.monotonic() - t0)
                if outcome is None:
                    return  # settled (failed, cancelled, lost)
                if isinstance(outcome, BaseException) and is_lost_connection(outcome):
                    # the database, not the step: not an attempt; run it again
                    # from the same checkpoint while the lease is trusted; a
                    # workflow's own checkpoints moved that checkpoint on
                    if ctx.step != step:
                        step, wake, spent = ctx.step, None, ctx.spent
                    if await self._step_again(a, window_end, db_delays):
                        continue
                    return
                if isinstance(outcome, RateLimited):  # flow control: park, step again later
                    kind = None if outcome.bucket is None else ACQUIRE_KIND
                    await self._park(a, (a.run_id, a.token, self.worker_id), dumps(state, "state"),
                                     ctx._pending_spend, kind, outcome.bucket, None,
                                     timedelta(seconds=outcome.retry_after))
                    return
                if isinstance(outcome, BaseException):
                    terminal = isinstance(
                        outcome, BudgetExceeded | DeadlineExceeded | EffectFailed | _StepTypeError
                    ) or is_terminal(outcome)
                    await self._fail(a, task, attempts, outcome, ctx._pending_spend, terminal)
                    return
                result, new_state, state_json = outcome
                step = ctx.step  # a workflow's own checkpoints moved runs.step on
                spend = ctx._pending_spend
                ident = (a.run_id, a.token, self.worker_id)
                if isinstance(result, Continue):
                    st = await self._writer.write(
                        a.run_id, a.token, step, state_json, spend, None, trusted
                    )
                    if st != "leased":
                        metrics.run_finished(task.name, st)
                        return
                    state, step, wake, spent = new_state, step + 1, None, spent + spend
                    if a.stop_reason == "cancel":
                        await self._fenced(a, q.ACK_CANCEL, (*ident, 0))
                        return
                    if self._stopping or a.stop_reason or time.monotonic() >= window_end:
                        await self._fenced(a, q.RELEASE, ident)
                        return
                    continue
                if isinstance(result, Done):
                    try:
                        result_json = dumps(result.result, "result")
                    except (TypeError, ValueError) as exc:
                        # like a non-JSON state: a bug of the step, not retried
                        await self._fail(a, task, attempts, _StepTypeError(str(exc)), spend, True)
                        return
                    st = await self._writer.write(
                        a.run_id, a.token, step, state_json, spend, result_json, trusted
                    )
                    metrics.run_finished(task.name, st)
                    return
                if isinstance(result, Wait) and result.child_ids:
                    await self._park_children(a, task, attempts, ident, state_json, spend, result)
                    return
                if isinstance(result, Wait):
                    kind, ref = result.signal
                    wake_in = _as_timedelta(result.timeout)
                    await self._park(a, ident, state_json, spend, kind, ref, None, wake_in)
                    return
                assert isinstance(result, Sleep)
                if result.until is not None:
                    await self._park(a, ident, state_json, spend, None, None, result.until, None)
                else:
                    wake_in = _as_timedelta(result.seconds)
                    await self._park(a, ident, state_json, spend, None, None, None, wake_in)
                return
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
                await self._fail(a, task, attempts, exc, 0.0, terminal=True)

    def _trusted(self, a: _Active) -> bool:
        """Whether ``a``'s lease is still ours to act on (see the heartbeat)."""
        return a.stop_reason != "lease_lost" and time.monotonic() < a.trust_until

    async def _fenced(self, a: _Active, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """One fenced statement of run ``a``, sent again after a lost connection
        while its lease is trusted (they are idempotent for their token)."""
        return await retry_while(lambda: self.app.fetchone(sql, params), lambda: self._trusted(a))

    async def _step_again(self, a: _Active, window_end: float, delays: Iterator[float]) -> bool:
        """After a step failed on a lost connection: True to run it again here;
        False when the lease window is over (the run is given back, attempts
        unchanged) or the lease is no longer trusted (left to lapse)."""
        await asyncio.sleep(next(delays))
        if not self._trusted(a):
            return False
        if a.stop_reason is not None:
            await self._settle_stopped(a, 0.0)
            return False
        if self._stopping or time.monotonic() >= window_end:
            await self._fenced(a, q.RELEASE, (a.run_id, a.token, self.worker_id))
            return False
        return True

    async def _run_step(
        self,
        a: _Active,
        task: Task,
        ctx: RunContext,
        state: Any,
        deadline_at: datetime | None,
        db_clock: Any,
    ) -> tuple[Any, Any, str] | BaseException | None:
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
                await self._settle_stopped(a, ctx._pending_spend)
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
            return _StepTypeError(str(exc))
        return result, new_state, state_json

    async def _settle_stopped(self, a: _Active, spend: float) -> None:
        ident = (a.run_id, a.token, self.worker_id)
        if a.stop_reason == "cancel":
            await self._fenced(a, q.ACK_CANCEL, (*ident, spend))
        elif a.stop_reason == "shutdown":
            await self._fenced(a, q.RELEASE, ident)
        # lease_lost: drop, no further writes

    async def _park(
        self,
        a: _Active,
        ident: tuple[Any, ...],
        state_json: str,
        spend: float,
        kind: str | None,
        ref: str | None,
        until: datetime | None,
        wake_in: timedelta | None,
    ) -> None:
        row = await self._fenced(
            a, q.PARK, (*ident, state_json, spend, kind, ref, until, wake_in)
        )
        if row is not None and row[0] == "waiting" and row[1] is not None:
            # our own timer: wake for it without waiting for the poll
            self._note_due(float(row[2]))

    async def _park_children(
        self, a: _Active, task: Task, attempts: int, ident: tuple[Any, ...], state_json: str,
        spend: float, wait: Wait,
    ) -> None:
        """Wait.children: the fenced park of pgdurable.children (sent again after a
        transient error while the lease is trusted, like :meth:`_fenced`); ids that
        are not this run's children fail the run (InvalidInput, nothing written)."""
        try:
            row = await retry_while(
                lambda: park_children(self.app, ident, state_json, spend, wait.child_ids,
                                      wait.need, _as_timedelta(wait.timeout)),
                lambda: self._trusted(a),
            )
        except InvalidInput as exc:
            await self._fail(a, task, attempts, exc, spend, True)
            return
        if row[0] == "waiting" and row[1] is not None:
            self._note_due(float(row[2]))

    def _note_due(self, seconds: float) -> None:
        """Wake the claim loop in ``seconds`` (a timer or retry this worker set)."""
        due = time.monotonic() + max(0.0, seconds) + 0.001
        if self._due_at is None or due < self._due_at:
            self._due_at = due
            self._wake.set()

    async def _fail(
        self, a: _Active, task: Task, attempts: int, exc: BaseException, spend: float,
        terminal: bool,
    ) -> None:
        delay = min(task.retry_cap, task.retry_base * (2 ** min(attempts, 30)))
        delay *= random.uniform(0.5, 1.5)
        err = _error_json(exc)
        row = await self._fenced(
            a, q.FAIL,
            (a.run_id, a.token, self.worker_id, err, spend, timedelta(seconds=delay), terminal),
        )
        if row is not None:
            metrics.run_finished(task.name, row[0])
        if row is not None and row[0] == "runnable":
            # our own backoff (no NOTIFY for a future retry): wake for it ourselves
            self._note_due(delay)

    async def _effect(
        self, a: _Active, key: str, fn: EffectFn, reconcile: EffectFn | None = None
    ) -> Any:
        ident = (a.run_id, a.token, self.worker_id)
        row = await self._fenced(a, q.EFFECT_BEGIN, (*ident, key))
        assert row is not None
        status, result, error, replay = row
        if status == "started" and replay and reconcile is not None:
            # started by an earlier attempt, outcome unknown: policy "reconcile"
            text = await reconcile_effect(key, reconcile)
            if isinstance(text, str):
                await self._fenced(a, q.EFFECT_FINISH, (*ident, key, True, text, None))
                return json.loads(text)
            # NOT_PERFORMED: fn runs now, under this token (effect_begin took the row over)
        elif status == "succeeded":
            return result
        elif status == "failed":
            msg = (error or {}).get("message", "")
            raise EffectFailed(f"effect {key!r} failed earlier: {(error or {}).get('type')}: {msg}")
        # from here on the effect may have happened: its outcome is recorded
        # (retried over lost connections while the lease is trusted), never
        # left 'started' for a replay to perform it again
        try:
            value = await call_effect(fn)
        except Exception as exc:
            await self._fenced(a, q.EFFECT_FINISH, (*ident, key, False, None, _effect_error(exc)))
            raise
        try:
            text = dumps(value, f"effect {key!r} result")
        except (TypeError, ValueError) as exc:
            await self._fenced(a, q.EFFECT_FINISH, (*ident, key, False, None, _effect_error(exc)))
            raise mark_terminal(EffectFailed(
                f"effect {key!r} ran but its result cannot be stored ({exc}); it is recorded "
                "as failed and not performed again"
            )) from exc
        await self._fenced(a, q.EFFECT_FINISH, (*ident, key, True, text, None))
        return json.loads(text)


def _effect_error(exc: BaseException) -> str:
    """The ``effects.error`` JSON of ``exc`` (any exception text is storable)."""
    return dumps({"type": _jsonb_str(type(exc).__name__), "message": _exc_message(exc)})


class _StepTypeError(TypeError):
    """A step returned something that cannot be checkpointed (not retried)."""


def _error_json(exc: BaseException) -> str:
    """The ``runs.error`` JSON of ``exc``; any exception text is storable."""
    try:
        record = q.error_record(exc)
    except Exception:  # a broken __str__ must not lose the error
        record = {"type": type(exc).__name__, "message": _exc_message(exc), "traceback": ""}
    return dumps({k: _jsonb_str(v) if isinstance(v, str) else v for k, v in record.items()}, "error")


def _as_timedelta(value: timedelta | float | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def _load_app(spec: str) -> Durable:
    from .runs import Durable

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"expected module:app, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # the named module itself (not one it imports)
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise
        raise SystemExit(f"cannot import {module_name!r} for {spec}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, Durable):
        raise SystemExit(f"{spec} is not a pgdurable.Durable app")
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m pgdurable.worker module:app [options]``: run one worker until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m pgdurable.worker")
    parser.add_argument("app", help="module:attribute of a pgdurable.Durable app")
    parser.add_argument("--queues", default="default", help="comma-separated queue names")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--lease-ttl", type=float, default=60.0, help="seconds")
    parser.add_argument("--poll", type=float, default=5.0, help="poll interval, seconds")
    parser.add_argument("--grace", type=float, default=30.0, help="shutdown grace, seconds")
    parser.add_argument("--worker-id", default=None)
    parser.add_argument(
        "--no-listen", dest="listen", action="store_false",
        help="poll only, no LISTEN connection (PgBouncer in transaction mode)",
    )
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics on this port (pgdurable[metrics])")
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("PGDURABLE_LOG", "WARNING"))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = _load_app(args.app)
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port, app.conninfo)

    async def _main() -> None:
        worker = app.worker(
            queues=[s for s in args.queues.split(",") if s],
            concurrency=args.concurrency,
            lease_ttl=timedelta(seconds=args.lease_ttl),
            poll_interval=args.poll,
            worker_id=args.worker_id,
            listen=args.listen,
        )
        worker._grace = args.grace
        try:
            await worker.run()
        finally:
            await app.close()

    asyncio.run(_main())


if __name__ == "__main__":
    main()
