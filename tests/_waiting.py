"""Waiting helpers shared by the tests: poll until a condition holds, with a
generous bound for "eventually" (a hang fails the test; not a timing assertion)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg

from pgdurable import Durable, RunInfo, Worker

WAIT_LIMIT = 60.0
#: How many of this database's backends LISTEN on ``pgdurable_cancel`` (a worker's
#: listener, once connected: its last LISTEN is that one).
WORKERS_LISTENING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                     "AND query = 'LISTEN pgdurable_cancel'")
#: This database's LISTEN connections (a process's notifier, pgdurable/foundation/notifier.py),
#: told apart by what such a connection alone runs: LISTEN, UNLISTEN, presence announcements.
LISTENING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND (query LIKE 'LISTEN pgdurable%%' OR query LIKE 'UNLISTEN pgdurable%%' "
             "OR query LIKE 'SELECT pgdurable.listen_presence%%')")


async def until(pred: Callable[[], Awaitable[Any]], what: str = "condition") -> None:
    """Await ``pred()`` every 20 ms until it is truthy (fail after WAIT_LIMIT)."""
    end = time.monotonic() + WAIT_LIMIT
    while not await pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def worker_listening(conn: psycopg.Connection[Any]) -> None:
    """Wait until a worker's listener LISTENs in ``conn``'s database (``conn``:
    autocommit, outside the worker)."""

    async def listening() -> bool:
        row = conn.execute(WORKERS_LISTENING).fetchone()
        return bool(row and row[0])

    await until(listening, "the worker's listener")


def until_sync(pred: Callable[[], Any], what: str = "condition",
               timeout: float = WAIT_LIMIT) -> None:
    """Sync twin of :func:`until` (``timeout``: a longer bound for slow setups)."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def finished(app: Durable, rid: str) -> RunInfo:
    """The run's info once it is terminal."""
    info: RunInfo | None = None

    async def done() -> bool:
        nonlocal info
        info = await app.get_run(rid)
        return info.terminal

    await until(done, f"run {rid} to finish")
    assert info is not None
    return info


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    """Run ``worker`` in this event loop for the block; stop it gracefully after."""
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop(grace=2)
        await task


def app_running(app: Durable, **options: Any) -> AbstractAsyncContextManager[Worker]:
    """:func:`running` for a worker of ``app`` with test-friendly defaults
    (lease TTL 10 s, poll 0.2 s; ``options`` go to ``app.worker``)."""
    options.setdefault("lease_ttl", timedelta(seconds=10))
    options.setdefault("poll_interval", 0.2)
    return running(app.worker(**options))
