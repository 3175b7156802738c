"""The app of tests/test_fork.py, loaded by worker subprocesses
(``python -m pgdurable.worker _fork_app:app``) with ``PGD_FORK_DSN`` set.

Every effect appends a row to the scratch table ``public.ledger(run_id, step)``
through its own connection, so executions are counted by the database. The
step of ``six`` fails before its effect while ``public.switches`` has the row
``('fail', step)`` for that step index.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import psycopg

from pgdurable import Continue, Done, Durable, RunContext

SCRATCH = """
CREATE TABLE public.ledger (id serial PRIMARY KEY, run_id text NOT NULL, step int NOT NULL);
CREATE TABLE public.switches (name text NOT NULL, step int NOT NULL);
"""


def make_app(dsn: str) -> Durable:
    app = Durable(dsn)

    def book(run_id: str, step: int) -> int:
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute("INSERT INTO public.ledger (run_id, step) VALUES (%s, %s) RETURNING id",
                            (run_id, step)).fetchone()
            assert row is not None
            return int(row[0])

    def failing(step: int) -> bool:
        with psycopg.connect(dsn, autocommit=True) as c:
            return c.execute("SELECT FROM public.switches WHERE name = 'fail' AND step = %s",
                             (step,)).fetchone() is not None

    @app.task("six", max_attempts=1, retry_base=0.01)
    async def six(ctx: RunContext, state: Any) -> Any:
        n = ctx.step + 1  # steps 1..6
        if await asyncio.to_thread(failing, ctx.step):
            raise ValueError(f"step {n} failed on purpose")
        entry = await ctx.effect(f"e{n}", lambda: book(ctx.run_id, n))
        state = {**state, "entries": [*state.get("entries", []), entry]}
        return Done(state) if n == 6 else Continue(state)

    @app.task("slow", max_attempts=3, retry_base=0.01, retry_cap=0.05,
              step_timeout=timedelta(seconds=0.5))
    async def slow(ctx: RunContext, state: Any) -> Any:
        await asyncio.sleep(3600)
        return Done()

    @app.task("slow_sync", max_attempts=2, retry_base=0.01, retry_cap=0.05, step_timeout=0.3)
    def slow_sync(ctx: RunContext, state: Any) -> Any:
        time.sleep(2)  # a thread cannot be interrupted: left to finish, result refused
        return Done("late")

    @app.task("hangs", max_attempts=2, retry_base=0.01, retry_cap=0.05, heartbeat_timeout=0.5)
    async def hangs(ctx: RunContext, state: Any) -> Any:
        ctx.heartbeat({"phase": "started", "attempt": ctx.attempt})
        await asyncio.sleep(0.05)
        ctx.heartbeat({"phase": "wedged", "attempt": ctx.attempt})
        await asyncio.Event().wait()  # stops heartbeating for good
        return Done()

    @app.task("beats", max_attempts=1, heartbeat_timeout=0.3)
    async def beats(ctx: RunContext, state: Any) -> Any:
        # heartbeats for 5x the timeout (30 x 0.05 s = 1.5 s) and completes
        for i in range(30):
            ctx.heartbeat({"i": i})
            await asyncio.sleep(0.05)
        return Done("done")

    @app.task("beats_sync", max_attempts=1, heartbeat_timeout=0.3)
    def beats_sync(ctx: RunContext, state: Any) -> Any:
        for i in range(30):
            ctx.heartbeat({"i": i})
            time.sleep(0.05)
        return Done("done")

    return app


app = make_app(os.environ["PGD_FORK_DSN"]) if "PGD_FORK_DSN" in os.environ else None
