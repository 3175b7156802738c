"""Listen and wake: what a worker does with ``pgdurable_wake`` and ``pgdurable_cancel``.

:meth:`Listener.run` subscribes to both channels on the process's notifier
(:mod:`pgdurable.foundation.notifier`: one dedicated autocommit connection, not
from the pool, shared with the process's streams, result waiters and
dashboard; it reconnects with backoff and health-checks a quiet socket). After
every (re)connect the notifier calls :meth:`Listener.listening_again`: the
worker claims and checks the runs it holds for cancel requests (wake-ups and
cancels sent meanwhile are lost). It connects to the app's ``listen_dsn`` if
set, else to the app's DSN; behind a transaction-mode pooler without
``listen_dsn`` there is none (LISTEN does not work through it) and the worker
polls.

NOTIFYs are hints anyone can send: wake-up claims are rate-limited
(``hints.WakeLimiter``; one over the limit is deferred, not lost) and a
cancel is acted on only once the database confirms the run's
``cancel_requested_at`` (``hints.cancels_requested``). Those checks are
coalesced and rate-limited too (``cancel_limit``): the runs named by cancel
notifications wait in ``Listener.pending`` for one checker task, whose every
statement asks about all of them; a check over the limit waits for the next
token (at most ``1 / rate`` seconds), so a burst of forged cancels costs a
bounded number of statements, and a real cancel is never dropped (a
notification that arrives during a check is checked again after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import psycopg

from ..foundation.hints import WakeLimiter, cancels_requested
from ..foundation.notifier import notifier_for
from ..foundation.queries.core import Database
from .settings import Settings
from .state import DB_ERRORS, Held, WorkerState, log

__all__ = ["CHANNELS", "Listener"]

#: What a worker listens to (in this order: the last LISTEN is the cancel channel's).
CHANNELS = ("pgdurable_wake", "pgdurable_cancel")


class Listener:
    """What a worker does with its notifications (a part of
    :class:`~pgdurable.engine.worker.Worker`)."""

    def __init__(self, db: Database, settings: Settings, state: WorkerState) -> None:
        self.db, self.settings, self.state = db, settings, state
        # NOTIFYs are hints anyone can send: wake-up claims are rate-limited,
        # cancels checked against the database first (pgdurable/foundation/hints.py)
        self.wake_limit = WakeLimiter()
        self._deferred_wake: asyncio.TimerHandle | None = None
        # cancel checks: coalesced (one asks about every run named since the last)
        # and rate-limited; a check over the limit waits at most 1 / rate seconds
        self.cancel_limit = WakeLimiter(rate=5.0, burst=5)
        self.pending: dict[uuid.UUID, Held] = {}  # named, not checked yet
        self._checker: asyncio.Task[None] | None = None
        self.check_count = 0  # cancel checks sent to the database (tests)

    @property
    def checks_pending(self) -> bool:
        """Whether a cancel check is pending or in flight (tests)."""
        return bool(self.pending) or (self._checker is not None and not self._checker.done())

    async def run(self, conninfo: str, schema: str) -> None:
        """Subscribe to the wake-up and cancel channels on the process's notifier
        for ``conninfo`` and ``schema`` until cancelled (the worker ends its helpers so)."""
        sub = notifier_for(conninfo, schema).subscribe(CHANNELS, self.notified, self.listening_again)
        try:
            await asyncio.Event().wait()  # notifications come through the callbacks
        finally:
            checker, self._checker = self._checker, None
            if checker is not None:
                checker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checker
            await sub.close()

    def listening_again(self) -> None:
        """The notifier listens (first connection or a reconnect): claim, since
        wake-ups may have been lost, and so may cancels: the renewal reads them,
        one statement."""
        self.state.poke()
        self.state.renew_now.set()

    def notified(self, n: psycopg.Notify) -> None:
        """One notification (the notifier's callback)."""
        if n.channel == "pgdurable_wake":
            if n.payload in self.settings.queues:
                self._wake_notified()
        elif n.channel == "pgdurable_cancel":
            self._cancel_notified(n.payload)

    def _wake_notified(self) -> None:
        """A wake-up NOTIFY: claim, at most at the wake limiter's rate (a forged
        flood costs bounded claims); one over the limit is deferred, not lost."""
        if self.state.wake.is_set() or self._deferred_wake is not None:
            return  # a claim is already coming
        delay = self.wake_limit.take()
        if delay <= 0:
            self.state.poke()
            return

        def deferred() -> None:
            self._deferred_wake = None
            self.state.poke()

        self._deferred_wake = asyncio.get_running_loop().call_later(delay, deferred)

    def _cancel_notified(self, payload: str) -> None:
        try:
            rid = uuid.UUID(payload)
        except ValueError:
            return
        a = self.state.active.get(rid)
        if a is None or a.stop_reason is not None:
            return
        # a hint only: stop the step once the database confirms the request
        self.pending[rid] = a
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._check_cancels(),
                                                name="pgdurable-cancel-checks")

    async def _check_cancels(self) -> None:
        """Check the pending runs, one statement for all of them, at the cancel
        limiter's rate, until no run is pending."""
        state = self.state
        while True:
            for rid, a in list(self.pending.items()):
                if not state.held(a) or a.stop_reason is not None:
                    del self.pending[rid]  # gone or stopping: nothing to check
            if not self.pending:
                return
            delay = self.cancel_limit.take()
            if delay > 0:
                await asyncio.sleep(delay)  # what is named meanwhile joins this check
            batch, self.pending = self.pending, {}
            self.check_count += 1
            try:
                requested = await cancels_requested(
                    self.db, [(a.run_id, a.token) for a in batch.values()])
            except DB_ERRORS as exc:
                log.warning("cancel check of %d run(s) failed (%s); the heartbeat checks again",
                            len(batch), exc)
                continue
            for rid in requested:
                a = batch[rid]
                if state.held(a):
                    state.stop_run(a, "cancel")
