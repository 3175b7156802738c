"""Heartbeat and renew: one statement renews all of a worker's leases.

Every ``heartbeat`` seconds (<= TTL/3) :meth:`Heartbeat.run` sends ONE
``pgdurable.renew_runs`` UPDATE for all the runs the worker holds. A run
missing from the answer has lost its lease and is stopped locally; a run whose
lease could not be renewed is no longer trusted after
``attempt start + ttl - safety_margin`` (monotonic) and is stopped too. The
answer also carries each run's ``cancel_requested`` flag (the backup of the
cancel NOTIFY; the listener asks for a renewal at once after every (re)connect,
when cancel NOTIFYs may have been lost: ``WorkerState.renew_now``). Renewals and
step batches hold the worker's write lock in turn: both lock many run rows, and one
worker's two multi-row UPDATEs could otherwise deadlock.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from ..foundation.aio import wait_set
from ..foundation.queries import steps as sq
from ..foundation.queries.core import Database
from .settings import Settings
from .state import DB_ERRORS, Held, WorkerState, log

__all__ = ["Heartbeat"]


class Heartbeat:
    """Renews the leases of the runs held (a part of :class:`~pgdurable.engine.worker.Worker`)."""

    def __init__(self, db: Database, settings: Settings, state: WorkerState,
                 write_lock: asyncio.Lock) -> None:
        self.db, self.settings, self.state = db, settings, state
        self._write_lock = write_lock  # shared with the batch writer
        self.count = 0  # renew statements issued

    async def run(self) -> None:
        """Renew every heartbeat interval (and when asked), until cancelled."""
        s, state = self.settings, self.state
        ttl = timedelta(seconds=s.ttl)
        next_renew = time.monotonic() + s.heartbeat_interval
        while True:
            # wake for the next renewal, or earlier when a lease stops being trusted
            wake_at = next_renew
            for a in state.active.values():
                if a.stop_reason != "lease_lost":
                    wake_at = min(wake_at, a.trust_until)
            await wait_set(state.renew_now, max(0.0, wake_at - time.monotonic()) + 0.001)
            now = time.monotonic()
            if state.renew_now.is_set():  # asked for (the listener reconnected): renew now
                state.renew_now.clear()
                next_renew = now
            for a in list(state.active.values()):
                if now >= a.trust_until and a.stop_reason != "lease_lost":
                    log.warning("run %s: lease no longer trusted (renewals failed)", a.run_id)
                    state.stop_run(a, "lease_lost")
            if now < next_renew:
                continue
            next_renew = now + s.heartbeat_interval
            live = [a for a in state.active.values() if a.stop_reason != "lease_lost"]
            if not live:
                continue
            sent = time.monotonic()
            try:
                self.count += 1
                async with asyncio.timeout(max(s.heartbeat_interval, 1.0)):
                    renewed = await self.renew(live, ttl)
            except (TimeoutError, *DB_ERRORS) as exc:
                log.warning("heartbeat failed: %s", str(exc) or (
                    f"no answer within {max(s.heartbeat_interval, 1.0):.1f} s"))
                continue
            cancel = {r.run_id: r.cancel_requested for r in renewed}  # by the id's text
            for a in live:
                if not state.held(a):
                    continue
                rid = str(a.run_id)
                if rid in cancel:
                    a.trust_until = sent + s.ttl - s.safety_margin
                    if cancel[rid]:
                        state.stop_run(a, "cancel")
                else:
                    state.stop_run(a, "lease_lost")

    async def renew(self, live: list[Held], ttl: timedelta) -> list[sq.Renewal]:
        """ONE ``renew_runs`` for ``live``: the leases still held."""
        async with self._write_lock:
            rows = await self.db.fetchall(sq.RENEW.sql, (
                self.settings.worker_id, [a.run_id for a in live], [a.token for a in live], ttl))
            return sq.RENEW.all(rows)
