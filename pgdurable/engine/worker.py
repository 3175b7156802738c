"""The worker: claims runs, executes their steps, checkpoints, lets go.

:class:`Worker` is the orchestrator: it holds the parts below as fields (River's
producer is the model), each an object with a narrow interface in a module named for
its job, sharing one small :class:`~pgdurable.engine.state.WorkerState` (the runs held,
the wake-up, the due time, the stopping flag) and the
:class:`~pgdurable.engine.settings.Settings`. It takes a narrow database object (one
statement on the app's pool, errors translated), the task registry and its settings,
never the app: ``Durable.worker()`` (``app/durable.py``) builds it and plugs in the
periodic duties as services (:mod:`~pgdurable.engine.services`: the schedule ticker,
the registration of the task revisions it serves).

Structure (one asyncio event loop, three long-lived tasks plus one task per
run):

* **claimer** (:class:`~pgdurable.engine.claim.Claimer`): claims up to the number of free
  slots with ONE ``pgdurable.claim_runs`` call, when woken by a NOTIFY on
  ``pgdurable_wake`` for one of its queues, a freed slot while work may remain,
  a known due time (timer, retry, lease expiry) or a slow jittered poll. When
  nothing is known to be due, the poll first asks ``pgdurable.next_wakeup``
  (one query) and sleeps until the earliest of: next poll, earliest timer,
  retry or lease expiry in its queues. Idle = one query per poll interval.
* **listener** (:class:`~pgdurable.engine.listener.Listener`): a dedicated autocommit connection
  (not from the pool) LISTENing on ``pgdurable_wake`` and ``pgdurable_cancel``;
  reconnects with backoff and claims after every (re)connect. It connects to
  the app's ``listen_dsn`` if set, else to the app's DSN; behind a
  transaction-mode pooler without ``listen_dsn`` there is none (LISTEN does
  not work through it): the worker polls and says so in a warning at start.
* **heartbeat** (:class:`~pgdurable.engine.heartbeat.Heartbeat`): every ``heartbeat`` (<= TTL/3)
  ONE ``pgdurable.renew_runs`` UPDATE renews all of this worker's leases. A
  run missing from the answer has lost its lease and is stopped locally; a
  run whose lease could not be renewed is no longer trusted after
  ``attempt start + ttl - safety_margin`` (monotonic) and is stopped too.
* **presence** (:class:`~pgdurable.engine.presence.WorkerPresence`): from its start until it
  stops, ONE ``pgdurable.worker_present`` per heartbeat interval says that this
  process is alive (for one lease TTL; ``worker_started`` at start also records
  its host, pid, queues and concurrency, for ``pgdurable.worker_list``); the
  runs pinned here (``ctx.pin``, :mod:`pgdurable.foundation.affinity`) are
  reserved for it only while it is.
* **run tasks** (:class:`~pgdurable.engine.execute.Executor`): one per claimed run;
  step after step within the lease window, then give the run back; one small method
  per step result kind. A ``Continue``/``Done`` goes to the batched, fenced writer
  (:class:`~pgdurable.engine.batch_writer.StepWriter`); ``ctx.effect`` is recorded by
  :class:`~pgdurable.engine.step_effects.StepEffects`; parking, failing and releasing
  a run are :class:`~pgdurable.engine.park.Parking`'s. The state the parts share is in
  :mod:`~pgdurable.engine.state`, the options in :mod:`~pgdurable.engine.settings`.
* **services** (:mod:`~pgdurable.engine.services`): started before the first claim,
  stopped after the runs settle; a loop service (the schedule ticker) rides on the
  claim loop's idle query and wake-ups.

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
import functools
import signal
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from ..foundation.db import asks_writable
from ..foundation.errors import ReadOnlyDatabase
from ..foundation.hints import WakeLimiter
from ..foundation.queries import run_end as end_q
from ..foundation.queries.core import Database, first
from ..foundation.registry import TaskRegistry
from ..foundation.retry import for_seconds, retry_while
from ..foundation.schemas import DEFAULT as DEFAULT_SCHEMA
from ..runs.steps import STEP_EXECUTOR
from .batch_writer import StepWriter
from .claim import Claimer
from .execute import Executor
from .heartbeat import Heartbeat
from .listener import Listener
from .park import Parking
from .presence import WorkerPresence
from .services import LoopService, Service
from .settings import Settings
from .state import WorkerState, log
from .step_effects import StepEffects

__all__ = ["Worker"]


class Worker:
    """Executes runs of an app's tasks from some queues (build it with
    :meth:`pgdurable.Durable.worker`).

    Options: ``queues``, ``concurrency`` (runs executing steps at once; a run
    whose last write of its lease is being sent frees its slot), ``lease_ttl``,
    ``heartbeat`` (default TTL/3, at most TTL/3), ``poll_interval`` (default
    5 s, jittered ±20%), ``lease_window`` (how long a run may continue in one
    lease before it is given back; default ``lease_ttl``), ``safety_margin``
    (default TTL/6), ``worker_id``, ``listen`` (False = poll only, e.g.
    behind PgBouncer in transaction mode). The attribute ``settle_limit``
    (default 10 s) bounds how long :meth:`stop` waits, after the grace
    period, for stopped runs to settle before leaving their leases to lapse.

    What it takes of the layer that builds it: ``db`` (one statement on the app's
    pool, errors translated: :class:`pgdurable.foundation.ports.Database`), the task
    ``registry``, ``open`` (opens the pool and checks the schema; idempotent),
    ``listen_conninfo`` (where to LISTEN; None: poll), ``open_timeout``, ``step_app``
    (handed to each step as ``ctx._app``; the engine never calls it) and ``services``
    (:mod:`~pgdurable.engine.services`). Its parts are fields: :attr:`claimer`,
    :attr:`executor`, :attr:`heartbeat`, :attr:`listener`, :attr:`parking`,
    :attr:`writer`, :attr:`presence`, sharing :attr:`state` and :attr:`settings`.
    ``pooler`` (the app's pooler mode) is only said in the start log line; ``schema``
    is the app's (:mod:`pgdurable.foundation.schemas`: its channels are LISTENed on).
    """

    #: Called once, on the worker's event loop, when a stop is first asked (SIGTERM,
    #: SIGINT or :meth:`stop`), with the grace period in seconds (``pgdurable
    #: worker`` arms its shutdown watchdog with it). It must return at once.
    on_stop: Callable[[float], None] | None = None

    def __init__(
        self,
        db: Database,
        registry: TaskRegistry,
        *,
        open: Callable[[], Awaitable[None]],
        listen_conninfo: Callable[[], str | None],
        open_timeout: float = 30.0,
        step_app: object = None,
        services: Sequence[Service] = (),
        pooler: str | None = None,
        queues: Sequence[str] = ("default",),
        concurrency: int = 16,
        lease_ttl: timedelta | float = timedelta(seconds=60),
        heartbeat: timedelta | float | None = None,
        poll_interval: timedelta | float = 5.0,
        lease_window: timedelta | float | None = None,
        safety_margin: timedelta | float | None = None,
        worker_id: str | None = None,
        listen: bool = True,
        schema: str = DEFAULT_SCHEMA,
    ) -> None:
        s = self.settings = Settings.of(
            queues=queues, concurrency=concurrency, lease_ttl=lease_ttl, heartbeat=heartbeat,
            poll_interval=poll_interval, lease_window=lease_window,
            safety_margin=safety_margin, worker_id=worker_id, listen=listen)
        self.db, self.registry = db, registry
        self._open, self._listen_conninfo, self.open_timeout = open, listen_conninfo, open_timeout
        self.services = list(services)
        self.pooler = pooler
        self.schema = schema  # whose channels it LISTENs on (the app's pool speaks to it)
        state = self.state = WorkerState()
        # heartbeat and step batches both lock many run rows: never at once
        # (one worker's two multi-row UPDATEs could otherwise deadlock)
        write_lock = asyncio.Lock()
        self.writer = StepWriter(db, s.worker_id, write_lock)
        # announced at start, renewed each heartbeat interval (engine/presence.py)
        self.presence = WorkerPresence(db, s.worker_id, s.instance, s.ttl,
                                       s.heartbeat_interval, s.queues, s.concurrency)
        self.parking = Parking(db, s.worker_id, state)
        self.executor = Executor(db, s, state, writer=self.writer, parking=self.parking,
                                 effects=StepEffects(db, s.worker_id), presence=self.presence,
                                 step_app=step_app)
        self.heartbeat = Heartbeat(db, s, state, write_lock)
        self.listener = Listener(db, s, state)
        self.claimer = Claimer(db, s, state, self.executor, self.listener.wake_limit,
                               [svc for svc in self.services if isinstance(svc, LoopService)])
        self._running = False
        self._done = asyncio.Event()
        self._claims: asyncio.Task[None] | None = None  # the claim loop, while run() runs
        self._claims_deadline: asyncio.TimerHandle | None = None  # see _abandon_claims
        # a write refused by a read-only server (presence, claims): run() stops and raises it
        self._read_only: ReadOnlyDatabase | None = None
        self.presence.on_read_only = self.claimer.on_read_only = self._on_read_only

    # -- what tests, metrics and operators read of the parts
    @property
    def worker_id(self) -> str:
        """This worker's id (the owner of its leases)."""
        return self.settings.worker_id

    @property
    def instance(self) -> str:
        """This process's instance (runs pinned here name it)."""
        return self.settings.instance

    @property
    def queues(self) -> list[str]:
        """The queues it claims from."""
        return self.settings.queues

    @property
    def concurrency(self) -> int:
        """How many runs it executes at once."""
        return self.settings.concurrency

    @property
    def settle_limit(self) -> float:
        """After the grace period, how long stopped runs get to settle (seconds)."""
        return self.settings.settle_limit

    @settle_limit.setter
    def settle_limit(self, value: float) -> None:
        self.settings.settle_limit = value

    @property
    def claim_delay(self) -> float:
        """How long a claim under load (or a trickle's) waits for more (seconds)."""
        return self.settings.claim_delay

    @claim_delay.setter
    def claim_delay(self, value: float) -> None:
        self.settings.claim_delay = value

    @property
    def claim_count(self) -> int:
        """claim_runs statements issued."""
        return self.claimer.count

    @property
    def heartbeat_count(self) -> int:
        """renew_runs statements issued."""
        return self.heartbeat.count

    @property
    def write_count(self) -> int:
        """write_steps statements issued (each one batch of steps)."""
        return self.writer.count

    @property
    def cancel_check_count(self) -> int:
        """Cancel checks sent to the database."""
        return self.listener.check_count

    @property
    def wake_limit(self) -> WakeLimiter:
        """The rate limit of claims on wake-up notifications."""
        return self.listener.wake_limit

    @property
    def cancel_limit(self) -> WakeLimiter:
        """The rate limit of cancel checks on cancel notifications."""
        return self.listener.cancel_limit

    @property
    def active_runs(self) -> list[str]:
        """Ids of the runs this worker holds right now."""
        return [str(k) for k in self.state.active]

    async def run(self) -> None:
        """Run until :meth:`stop` (or SIGTERM/SIGINT in the main thread)."""
        if self._running:
            raise RuntimeError("worker is already running")
        s, state = self.settings, self.state
        await self._open()
        tasks = self.registry.tasks
        if not tasks:
            raise ValueError("the app has no registered tasks")
        self.executor.tasks = tasks
        self.claimer.tasks = list(tasks.values())
        # idempotent: asked again if the connection is lost under it (a server or a
        # pooler restarting as the worker starts), as the schema check was
        for svc in self.services:
            await retry_while(functools.partial(svc.start, s.worker_id),
                              for_seconds(self.open_timeout))
        self.presence.reopen()
        await self.presence.start()  # a failure is logged: only a pin needs the row
        self._running = True
        self._done.clear()
        # Not the loop's default executor (min(32, cpus + 4) threads, shared):
        # every slot's sync step must run at once, and a cancelled thread step
        # that keeps running must not hold up the steps of other runs. Threads
        # are started only when none is idle, so the bound is only a backstop.
        executor = ThreadPoolExecutor(
            max_workers=max(64, 4 * s.concurrency), thread_name_prefix="pgdurable-step"
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
        helpers = [asyncio.create_task(self.heartbeat.run(), name="pgdurable-heartbeat")]
        listen_to = self._listen_conninfo() if s.listen else None
        if listen_to is not None:
            helpers.append(asyncio.create_task(self.listener.run(listen_to, self.schema),
                                               name="pgdurable-listener"))
        elif s.listen:
            log.warning("worker %s: no LISTEN: the app's DSN goes through a transaction-mode "
                        "pooler and no listen_dsn is set; finding work by polling every %.1f s",
                        s.worker_id, s.poll_interval)
        log.info("worker %s started: queues %s, concurrency %d, tasks %s, pooler %s, %s",
                 s.worker_id, ",".join(s.queues), s.concurrency,
                 ", ".join(f"{t.name}@{t.revision}" for t in self.claimer.tasks),
                 self.pooler or "none",
                 "LISTEN" if listen_to is not None else f"polling every {s.poll_interval:g} s")
        claims = asyncio.create_task(self.claimer.run(), name="pgdurable-claims")
        self._claims = claims
        try:
            try:
                await claims
            except asyncio.CancelledError:
                if _cancelling():
                    raise  # run() itself was cancelled
                # stop() gave up on a claim statement that did not return (see
                # _abandon_claims); the runs it held are stopped as usual below
            await self.claimer.drain()
            try:  # hand_off logs its own errors; a statement that never returns is let go
                async with asyncio.timeout(s.settle_limit):
                    await self.claimer.hand_off()
            except TimeoutError:
                log.warning("worker %s: the hand-off NOTIFY did not finish within %.0f s",
                            s.worker_id, s.settle_limit)
        except asyncio.CancelledError:
            # run() itself was cancelled (not stop()): stop the runs as well, so
            # that no step goes on without heartbeats (its lease would lapse
            # mid-step and another worker could run the step again)
            state.stopping = True
            for a in list(state.active.values()):
                state.stop_run(a, "shutdown")
            running = state.tasks()
            if running:
                await asyncio.wait(running, timeout=s.settle_limit)
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
            for svc in reversed(self.services):
                await svc.stop(s.worker_id)  # bounded (5 s) and logged by each service
            await self.presence.withdraw()  # bounded (5 s) itself
            STEP_EXECUTOR.reset(executor_token)
            executor.shutdown(wait=False, cancel_futures=True)
            self._running = False
            self._done.set()
        if self._read_only is not None:
            err, self._read_only = self._read_only, None
            raise err

    def _on_read_only(self, exc: ReadOnlyDatabase) -> None:
        """A write of this worker (its presence, a claim) was refused with SQLSTATE
        25006: the server is a standby, or an old primary back read-only after a
        failover. A DSN that lists the hosts with ``target_session_attrs=read-write``
        finds the writable one again (the pool drops a connection whose server
        turned read-only: ``foundation.db.read_only_now``): go on. Any other DSN
        reaches that server again and again: stop (:meth:`run` raises ``exc``)
        instead of retrying forever; its runs' leases lapse on the primary."""
        if asks_writable(self._listen_conninfo()):
            log.warning("worker %s: a write met a read-only server (%s); the DSN's hosts "
                        "are resolved again", self.settings.worker_id, exc)
            return
        if self._read_only is None:
            self._read_only = exc
            log.error("worker %s: stopping: %s", self.settings.worker_id, exc)
            self._request_stop(0.0)

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
        s, state = self.settings, self.state
        if grace is not None:
            s.grace = grace.total_seconds() if isinstance(grace, timedelta) else float(grace)
        first_request = not state.stopping
        if first_request:
            log.info("worker %s stopping: no more claims, %d run(s) get %.1f s to finish",
                     s.worker_id, len(state.active), s.grace)
        state.stopping = True
        if first_request and self.on_stop is not None:
            self.on_stop(s.grace)
        state.wake.set()
        claims = self._claims
        if claims is not None and not claims.done() and self._claims_deadline is None:
            self._claims_deadline = asyncio.get_running_loop().call_later(
                s.settle_limit, self._abandon_claims)

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
        owner = self.settings.worker_id
        for a in list(self.state.active.values()):
            try:
                await first(self.db, end_q.RELEASE, a.ident(owner))
            except Exception as exc:  # lost meanwhile, or no database: its lease lapses
                log.warning("worker %s: run %s not given back (%s); its lease lapses",
                            owner, a.run_id, exc)
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
                        "asked; cancelling it", self.settings.worker_id, self.settings.settle_limit)
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
