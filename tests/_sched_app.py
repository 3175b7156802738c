"""A Durable app for the schedule tests, whose database clock the test moves.

Every pooled connection, each time it is taken from the pool, sets its
session's ``pgdurable.now`` (the test clock override) to the value in the
scratch table ``test_clock(t)`` (the real clock when ``t`` is NULL). A test
moves time for every process at once with :func:`set_clock` (UPDATE + NOTIFY
on the worker queue, so idle workers look again). No sleeping.

Worker processes run it as ``python -m pgdurable.worker _sched_app:app`` with
``PYTHONPATH=tests``; ``SCHED_DECLARE`` (JSON list of keyword dicts for
``app.schedule``, ``every`` in seconds) declares schedules in code.

Tasks: ``tick`` completes at once; ``hold`` sleeps a day (its run stays
``waiting``: "still going" for the overlap policies).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgdurable import Done, Durable, RunContext, Sleep
from pgdurable.foundation.pooler import connect_kwargs

CLOCK_TABLE = "CREATE TABLE IF NOT EXISTS test_clock (t timestamptz); " \
              "INSERT INTO test_clock SELECT NULL WHERE NOT EXISTS (SELECT 1 FROM test_clock)"
_FOLLOW = ("SELECT set_config('pgdurable.now', coalesce((SELECT t::text FROM test_clock), ''), "
           "false)")


async def _follow_clock(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(_FOLLOW)


class ClockedApp(Durable):
    """A Durable app on a pool whose connections follow ``test_clock``."""

    def __init__(self, dsn: str) -> None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn, min_size=1, max_size=10, open=False, check=_follow_clock,
            kwargs=connect_kwargs())
        super().__init__(dsn, pool=pool)

    async def open(self) -> None:
        await self.pool.open(wait=True, timeout=30)
        await super().open()

    async def close(self) -> None:
        await super().close()
        await self._pool.close()


def make_app(dsn: str) -> ClockedApp:
    app = ClockedApp(dsn)

    @app.task("tick", revision="1")
    async def tick(ctx: RunContext, state: Any) -> Any:
        return Done({"ok": True})

    @app.task("hold", revision="1")
    async def hold(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Sleep(timedelta(days=1), state=state)
        return Done({"ok": True})

    for spec in json.loads(os.environ.get("SCHED_DECLARE", "[]")):
        if "every" in spec:
            spec["every"] = timedelta(seconds=spec["every"])
        app.schedule(**spec)
    return app


def set_clock(conn: psycopg.Connection[Any], when: datetime | None, queue: str = "default") -> None:
    """Move every process's database clock to ``when`` and wake the workers of ``queue``."""
    conn.execute("UPDATE test_clock SET t = %s", (when,))
    conn.execute("SELECT set_config('pgdurable.now', coalesce(%s::text, ''), false)",
                 (when.isoformat() if when else None,))
    conn.execute("SELECT pg_notify('pgdurable_wake', %s)", (queue,))


_app: ClockedApp | None = None


def __getattr__(name: str) -> Any:
    global _app
    if name == "app":
        if _app is None:
            _app = make_app(os.environ["PGDURABLE_DSN"])
        return _app
    raise AttributeError(name)
