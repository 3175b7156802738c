"""Worker presence: the database's word that a worker process is alive.

A run pinned to a worker (:mod:`pgdurable.foundation.affinity`) is reserved for it only
while its presence row (``pgdurable.worker_presence``: worker id, process
instance, until) is current; operators see the rows as the live workers
(``pgdurable.worker_list``, the dashboard's workers page). The worker
announces itself when it starts (:meth:`WorkerPresence.start`: ONE
``pgdurable.worker_started``, with its host, pid, queues and concurrency),
renews the row every heartbeat interval for one lease TTL (ONE
``pgdurable.worker_present`` statement, from its own task: a slow renewal
never delays the lease heartbeat), and removes it on a clean stop
(``pgdurable.worker_absent``, which wakes its queues: the runs reserved for
it, which it claimed there, are anybody's now). A killed worker's row lapses a lease TTL after its last renewal at most.
Failures are logged: a missing row only means that the worker's runs are not
reserved for it (any worker may take them), never that one is lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta

import psycopg

from ..foundation.affinity import ABSENT, PRESENT, STARTED
from ..foundation.errors import PgDurableError, ReadOnlyDatabase
from ..foundation.queries.core import Database

__all__ = ["WorkerPresence"]

log = logging.getLogger("pgdurable.worker")

_DB_ERRORS = (PgDurableError, psycopg.Error, OSError)


class WorkerPresence:
    """A worker's presence row (see the module docstring): :meth:`start` when
    the worker starts (:meth:`ensure` again before a pin, in case that failed),
    renewed every ``every`` seconds for ``ttl`` seconds, :meth:`withdraw` on a
    clean stop."""

    def __init__(self, db: Database, worker_id: str, instance: str, ttl: float,
                 every: float, queues: list[str], concurrency: int = 1) -> None:
        self.db, self.worker_id, self.instance = db, worker_id, instance
        self.queues, self.concurrency = queues, concurrency
        self.ttl, self.every = timedelta(seconds=ttl), every
        self.count = 0  # worker_started / worker_present statements issued
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._withdrawn = False  # a stopped worker announces nothing more
        self._introduced = False  # its row has its host, pid, queues and concurrency
        #: Told when a renewal is refused by a read-only server (the worker's).
        self.on_read_only: Callable[[ReadOnlyDatabase], None] | None = None

    async def _announce(self) -> bool:
        try:
            self.count += 1
            async with asyncio.timeout(max(self.every, 1.0)):
                if self._introduced:
                    await self.db.fetchone(PRESENT, (self.worker_id, self.instance, self.ttl))
                else:
                    await self.db.fetchone(STARTED, (
                        self.worker_id, self.instance, self.ttl, socket.gethostname(),
                        os.getpid(), self.queues, self.concurrency))
                    self._introduced = True
            return True
        except (TimeoutError, *_DB_ERRORS) as exc:
            if isinstance(exc, ReadOnlyDatabase) and self.on_read_only is not None:
                self.on_read_only(exc)  # a standby: the worker decides (engine/worker.py)
            log.warning("worker %s: presence not renewed (%s); its pinned runs are not "
                        "reserved for it until it is", self.worker_id,
                        str(exc) or f"no answer within {max(self.every, 1.0):.1f} s")
            return False

    async def start(self) -> None:
        """The worker starts: announce it (with its details) and keep renewing."""
        await self.ensure()

    async def ensure(self) -> None:
        """Announce the worker (once) and start renewing: at start, and before a
        pin is written (a no-op when it is announced already)."""
        if self._task is not None or self._withdrawn:
            return
        async with self._lock:
            if self._task is None and not self._withdrawn:
                await self._announce()
                self._task = asyncio.create_task(self.keep(), name="pgdurable-presence")

    def reopen(self) -> None:
        """The worker runs (again): :meth:`start` announces it afresh."""
        self._withdrawn = False
        self._introduced = False

    async def keep(self) -> None:
        """Renew every ``every`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.every)
            await self._announce()

    async def withdraw(self) -> None:
        """Stop renewing and remove the row (bounded: 5 s), if it was ever written."""
        self._withdrawn = True
        async with self._lock:  # an announcement under way ends first
            task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            async with asyncio.timeout(5.0):
                await self.db.fetchone(ABSENT, (self.worker_id, self.instance, self.queues))
        except (TimeoutError, *_DB_ERRORS) as exc:
            log.warning("worker %s: presence not withdrawn (%s); it lapses within %.0f s",
                        self.worker_id, exc, self.ttl.total_seconds())
