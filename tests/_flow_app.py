"""A Durable app for the flow-control process tests (tests/test_flow_control.py).

Run as ``python -m pgdurable.worker _flow_app:app --queues ...`` with
``PYTHONPATH=tests`` and ``PGDURABLE_DSN`` set to the test database.

* ``work`` -- sleeps ``state["sleep"]`` seconds (default 0.005), then Done;
* ``metered`` -- ``await ctx.acquire(state["bucket"], 1)``, then records the
  acquisition in the test's scratch table ``flow_acq(run_id, at)`` and Done.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import Done, RunContext

app = pgdurable.Durable(pool_size=4)


@app.task("work", revision="1")
async def work(ctx: RunContext, state: dict[str, Any]) -> Any:
    await asyncio.sleep(float(state.get("sleep", 0.005)))
    return Done(None)


@app.task("metered", revision="1")
async def metered(ctx: RunContext, state: dict[str, Any]) -> Any:
    await ctx.acquire(str(state["bucket"]), 1)
    async with app.pool.connection() as conn:
        await conn.execute("INSERT INTO flow_acq (run_id) VALUES (%s)", (ctx.run_id,))
    return Done(None)
