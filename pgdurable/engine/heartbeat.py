"""Heartbeat and renew: one statement renews all of a worker's leases.

Every ``heartbeat`` seconds (<= TTL/3) :meth:`Heartbeat._heartbeat` sends ONE
``pgdurable.renew_runs`` UPDATE for all the runs the worker holds. A run
missing from the answer has lost its lease and is stopped locally; a run whose
lease could not be renewed is no longer trusted after
``attempt start + ttl - safety_margin`` (monotonic) and is stopped too. The
answer also carries each run's ``cancel_requested`` flag (the backup of the
cancel NOTIFY; the listener asks for a renewal at once after every (re)connect,
when cancel NOTIFYs may have been lost). Renewals and step batches hold ``_write_lock`` in turn: both
lock many run rows, and one worker's two multi-row UPDATEs could otherwise
deadlock.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from ..foundation import run_queries as q
from ..foundation.aio import wait_set
from .base import _DB_ERRORS, WorkerBase, _Active, log

__all__ = ["Heartbeat"]


class Heartbeat(WorkerBase):
    """Renewing the leases of the runs held (part of :class:`~pgdurable.engine.worker.Worker`)."""

    async def _heartbeat(self) -> None:
        ttl = timedelta(seconds=self.ttl)
        next_renew = time.monotonic() + self.heartbeat_interval
        while True:
            # wake for the next renewal, or earlier when a lease stops being trusted
            wake_at = next_renew
            for a in self._active.values():
                if a.stop_reason != "lease_lost":
                    wake_at = min(wake_at, a.trust_until)
            await wait_set(self._renew_now, max(0.0, wake_at - time.monotonic()) + 0.001)
            now = time.monotonic()
            if self._renew_now.is_set():  # asked for (the listener reconnected): renew now
                self._renew_now.clear()
                next_renew = now
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
                async with asyncio.timeout(max(self.heartbeat_interval, 1.0)):
                    rows = await self._renew(live, ttl)
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
