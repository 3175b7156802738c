"""The worker: claims runs, executes their steps, checkpoints, lets go.

:class:`Worker` is the orchestrator: it starts and stops the parts below,
each a class in a module named for its job, and holds little else.

Structure (one asyncio event loop, three long-lived tasks plus one task per
run):

* **claim loop** (:mod:`~pgdurable.engine.claim`): claims up to the number of free
  slots with ONE ``pgdurable.claim_runs`` call, when woken by a NOTIFY on
  ``pgdurable_wake`` for one of its queues, a freed slot while work may remain,
  a known due time (timer, retry, lease expiry) or a slow jittered poll. When
  nothing is known to be due, the poll first asks ``pgdurable.next_wakeup``
  (one query) and sleeps until the earliest of: next poll, earliest timer,
  retry or lease expiry in its queues. Idle = one query per poll interval.
* **listener** (:mod:`~pgdurable.engine.listener`): a dedicated autocommit connection
  (not from the pool) LISTENing on ``pgdurable_wake`` and ``pgdurable_cancel``;
  reconnects with backoff and claims after every (re)connect. It connects to
  the app's ``listen_dsn`` if set, else to the app's DSN; behind a
  transaction-mode pooler without ``listen_dsn`` there is none (LISTEN does
  not work through it): the worker polls and says so in a warning at start.
* **heartbeat** (:mod:`~pgdurable.engine.heartbeat`): every ``heartbeat`` (<= TTL/3)
  ONE ``pgdurable.renew_runs`` UPDATE renews all of this worker's leases. A
  run missing from the answer has lost its lease and is stopped locally; a
  run whose lease could not be renewed is no longer trusted after
  ``attempt start + ttl - safety_margin`` (monotonic) and is stopped too.
* **presence** (:mod:`~pgdurable.engine.presence`): from its start until it
  stops, ONE ``pgdurable.worker_present`` per heartbeat interval says that this
  process is alive (for one lease TTL; ``worker_started`` at start also records
  its host, pid, queues and concurrency, for ``pgdurable.worker_list``); the
  runs pinned here (``ctx.pin``, :mod:`pgdurable.foundation.affinity`) are
  reserved for it only while it is.
* **run tasks** (:mod:`~pgdurable.engine.execute`): one per claimed run; step after
  step within the lease window, then give the run back.
  A ``Continue``/``Done`` goes to the batched, fenced writer
  (:mod:`~pgdurable.engine.batch_writer`); ``ctx.effect`` is recorded by
  :mod:`~pgdurable.engine.step_effects`; parking, failing and releasing a run
  are in :mod:`~pgdurable.engine.park`. The options and the state the parts
  share (the runs held, the fence) are in :mod:`~pgdurable.engine.base`.

Step code: sync step functions run in a thread (the worker's own pool: one per
busy slot, never queued behind the loop's default executor) and so
cannot block heartbeats; **async step functions must not block the event
loop** with CPU-bound work (offload it with ``asyncio.to_thread``), or
heartbeats starve. A cancelled thread step keeps running to its end, but its
results are never written (every write is fenced).

Cancel: ``pgdurable_cancel`` NOTIFY -- only a hint: the worker first checks
that the run's ``cancel_requested_at`` is set (``hints``) -- (and, as a backup,
the heartbeat's ``cancel_requested`` flag) cancels the step task if a step is
running; the run
is recorded ``cancelled`` by ``ack_cancel``. Between steps nothing needs to be
done: the next fenced write sees the request and ends the run ``cancelled``.

Shutdown: SIGTERM/SIGINT (when :meth:`run` runs in the main thread) or
:meth:`stop`: stop claiming, let running steps finish within ``grace``
seconds, checkpoint them, give their leases back (runnable + NOTIFY); steps
still running after the grace period are cancelled and their runs given back
at their last checkpoint. Every wait of a stop is bounded: a claim statement
that has not returned ``settle_limit`` seconds after the request (a lock it
waits for, a socket gone quiet) is cancelled, and a run that does not settle
is left to its lease's TTL, so that :meth:`Worker.stop` always returns.
A process that ends after :meth:`run` (``pgdurable worker``) gives those leases
back with :meth:`Worker.abandon` first; it is told of the stop request by
:attr:`Worker.on_stop` (its shutdown watchdog, :mod:`pgdurable.ops.worker_process`).

Logs (logger ``pgdurable.worker``, INFO): one line when the worker starts (its
id, queues, concurrency, tasks and revisions, pooler mode, LISTEN or polling)
and one per run that fails for good (run, task, error type; engine/park.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from ..foundation import run_queries as q
from ..foundation.retry import for_seconds, retry_while
from ..runs.events import declare_triggers
from ..runs.fork import register_worker, unregister_worker
from ..runs.steps import STEP_EXECUTOR
from .base import log
from .claim import ClaimLoop
from .heartbeat import Heartbeat
from .listener import Listener

__all__ = ["Worker"]


class Worker(ClaimLoop, Listener, Heartbeat):
    """Executes runs of an app's tasks from some queues.

    Options: ``queues``, ``concurrency`` (runs executing steps at once; a run
    whose last write of its lease is being sent frees its slot), ``lease_ttl``,
    ``heartbeat`` (default TTL/3, at most TTL/3), ``poll_interval`` (default
    5 s, jittered ±20%), ``lease_window`` (how long a run may continue in one
    lease before it is given back; default ``lease_ttl``), ``safety_margin``
    (default TTL/6), ``worker_id``, ``listen`` (False = poll only, e.g.
    behind PgBouncer in transaction mode). The attribute ``settle_limit``
    (default 10 s) bounds how long :meth:`stop` waits, after the grace
    period, for stopped runs to settle before leaving their leases to lapse.

    The worker runs its parts and holds little else: the claim loop
    (:class:`~pgdurable.engine.claim.ClaimLoop`, which runs each claimed run
    with :class:`~pgdurable.engine.execute.StepExecution`), the listener
    (:class:`~pgdurable.engine.listener.Listener`) and the heartbeat
    (:class:`~pgdurable.engine.heartbeat.Heartbeat`); its options and shared
    state are :class:`~pgdurable.engine.base.WorkerBase`'s. It takes any
    :class:`pgdurable.foundation.ports.App` (:class:`pgdurable.Durable` is one).
    """

    #: Called once, on the worker's event loop, when a stop is first asked (SIGTERM,
    #: SIGINT or :meth:`stop`), with the grace period in seconds (``pgdurable
    #: worker`` arms its shutdown watchdog with it). It must return at once.
    on_stop: Callable[[float], None] | None = None

    @property
    def write_count(self) -> int:
        """write_steps statements issued (each one batch of steps)."""
        return self._writer.count

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
        # idempotent: asked again if the connection is lost under it (a server or a
        # pooler restarting as the worker starts), as the schema check was
        await retry_while(self._ticker.declare, for_seconds(self.app.open_timeout))
        await retry_while(lambda: declare_triggers(self.app), for_seconds(self.app.open_timeout))
        await register_worker(self.app, self.worker_id, self.app.tasks)
        self._presence.reopen()
        await self._presence.start()  # a failure is logged: only a pin needs the row
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
        log.info("worker %s started: queues %s, concurrency %d, tasks %s, pooler %s, %s",
                 self.worker_id, ",".join(self.queues), self.concurrency,
                 ", ".join(f"{t.name}@{t.revision}" for t in self._tasks),
                 getattr(self.app, "pooler", None) or "none",
                 "LISTEN" if listen_to is not None
                 else f"polling every {self.poll_interval:g} s")
        claims = asyncio.create_task(self._claim_loop(), name="pgdurable-claims")
        self._claims = claims
        try:
            try:
                await claims
            except asyncio.CancelledError:
                if _cancelling():
                    raise  # run() itself was cancelled
                # stop() gave up on a claim statement that did not return (see
                # _abandon_claims); the runs it held are stopped as usual below
            await self._drain()
            try:  # _hand_off logs its own errors; a statement that never returns is let go
                async with asyncio.timeout(self.settle_limit):
                    await self._hand_off()
            except TimeoutError:
                log.warning("worker %s: the hand-off NOTIFY did not finish within %.0f s",
                            self.worker_id, self.settle_limit)
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
            with contextlib.suppress(asyncio.CancelledError):
                await _end_helpers(helpers)
            for sig in handled:
                loop.remove_signal_handler(sig)
            if self._claims_deadline is not None:
                self._claims_deadline.cancel()
                self._claims_deadline = None
            self._claims = None
            await unregister_worker(self.app, self.worker_id)  # bounded (5 s) itself
            await self._presence.withdraw()  # bounded (5 s) itself
            STEP_EXECUTOR.reset(executor_token)
            executor.shutdown(wait=False, cancel_futures=True)
            self._running = False
            self._done.set()

    async def stop(self, grace: timedelta | float = 30.0) -> None:
        """Stop gracefully: no more claims, steps get ``grace`` seconds, leases go back.

        Returns within about ``grace`` + 2 * ``settle_limit`` seconds, whatever the
        database does: a claim statement still waiting ``settle_limit`` seconds
        after the request is cancelled, stopped runs get ``settle_limit`` seconds
        to settle, and the leases of those that do not are left to lapse."""
        self._request_stop(grace)
        if self._running:
            await self._done.wait()

    def _request_stop(self, grace: timedelta | float | None) -> None:
        if grace is not None:
            self._grace = grace.total_seconds() if isinstance(grace, timedelta) else float(grace)
        first = not self._stopping
        if first:
            log.info("worker %s stopping: no more claims, %d run(s) get %.1f s to finish",
                     self.worker_id, len(self._active), self._grace)
        self._stopping = True
        if first and self.on_stop is not None:
            self.on_stop(self._grace)
        self._wake.set()
        claims = self._claims
        if claims is not None and not claims.done() and self._claims_deadline is None:
            self._claims_deadline = asyncio.get_running_loop().call_later(
                self.settle_limit, self._abandon_claims)

    async def abandon(self) -> list[str]:
        """Give back the leases of the runs still held after :meth:`run` returned.

        They are the runs whose step did not settle after the grace period (a
        step that swallows its cancellation): :meth:`run` leaves their leases to
        lapse, because their step code still runs in this process. A process about
        to end (``pgdurable worker`` after SIGTERM) calls this first, so that another
        worker takes them now from their last checkpoint instead of after the
        lease's TTL. Each release is fenced (one that lost its lease changes
        nothing); returns the ids of the runs given back. Called while :meth:`run`
        still runs (a watchdog ending the process), the step code of those runs
        must not go on either."""
        released: list[str] = []
        for a in list(self._active.values()):
            try:
                await self.app.fetchone(q.RELEASE, (a.run_id, a.token, self.worker_id))
            except Exception as exc:  # lost meanwhile, or no database: its lease lapses
                log.warning("worker %s: run %s not given back (%s); its lease lapses",
                            self.worker_id, a.run_id, exc)
            else:
                released.append(str(a.run_id))
        return released

    def _abandon_claims(self) -> None:
        """``settle_limit`` seconds after a stop request the claim loop has not
        ended: one of its statements has not returned (a lock it waits for, a
        socket that went quiet). Cancel it, so that :meth:`stop` returns; psycopg
        cancels the statement on the server, and runs that a claim committed
        anyway are recovered when their leases lapse, like a crashed worker's."""
        self._claims_deadline = None
        claims = self._claims
        if claims is not None and not claims.done():
            log.warning("worker %s: a claim statement has not returned %.0f s after stop was "
                        "asked; cancelling it", self.worker_id, self.settle_limit)
            claims.cancel()


def _cancelling() -> bool:
    """Whether the current task has been asked to cancel (not merely seen a
    cancelled task it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _end_helpers(helpers: list[asyncio.Task[None]]) -> None:
    """Cancel the heartbeat and the listener and wait for them to end, cancelling
    again each second while one goes on. On Python 3.11 a cancel can be lost
    inside a library's ``asyncio.wait_for`` (psycopg_pool's connection checkout:
    CPython gh-86296): the heartbeat would then finish its renewal, wait out its
    interval and renew again, forever, and ``stop()`` would never return."""
    pending = set(helpers)
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for t in helpers:
        if not t.cancelled() and t.exception() is not None:
            log.debug("worker helper %s ended with %r", t.get_name(), t.exception())
