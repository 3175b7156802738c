"""A Durable app for real-process crash tests (tests/test_crash.py).

Run by the tests as ``python -m pgdurable.worker _crash_app:app ...`` with
``PYTHONPATH=tests`` and ``PGDURABLE_DSN`` set to the test database. Every
step execution is recorded durably BEFORE the step does anything else, in the
scratch table ``test_step_log(run_id, step, token, pid, event)`` that the
test creates, so the test can see from the database which process ran which
step under which fencing token (and wait for "worker is mid-step").

The behaviour is chosen by the run's state (a dict):

* ``n`` -- the run completes after ``n`` steps (``Done({"i": n})``);
* ``hang_at`` -- at that step, on the run's first claim (token 1), the step
  hangs (awaits forever): SIGKILL / cancel / lease tests;
* ``stall_at`` + ``stall_key`` -- at that step, on token 1, the step BLOCKS
  THE EVENT LOOP on ``pg_advisory_lock(stall_key)`` through a separate sync
  connection (a stalled process: no heartbeat runs), then returns Continue
  straight into the fenced checkpoint;
* ``gate_at`` + ``gate_key`` -- at that step, on token 1, the step awaits
  ``pg_advisory_lock(gate_key)`` (without blocking the loop), then goes on;
* ``kill_at`` -- at that step the process SIGKILLs itself (every attempt);
* ``sleep`` -- seconds every step sleeps (async).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import psycopg

import pgdurable
from pgdurable import Continue, Done, RunContext
from pgdurable.foundation.db import resolve_dsn

app = pgdurable.Durable(pool_size=int(os.environ.get("CRASH_POOL_SIZE", "10")))

LOG = "INSERT INTO test_step_log (run_id, step, token, pid, event) VALUES (%s, %s, %s, %s, %s)"


async def _log(ctx: RunContext, event: str) -> None:
    async with app.pool.connection() as conn:
        await conn.execute(LOG, (ctx.run_id, ctx.step, ctx.token, os.getpid(), event))


async def _steps(ctx: RunContext, state: dict[str, Any]) -> Any:
    await _log(ctx, "start")
    step, first = ctx.step, ctx.token == 1
    if state.get("kill_at") == step:
        os.kill(os.getpid(), signal.SIGKILL)
    if first and state.get("hang_at") == step:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.shield(_log(ctx, "cancelled"))
            raise
    if first and state.get("stall_at") == step:
        dsn = resolve_dsn() or ""
        with psycopg.connect(dsn, autocommit=True) as c:  # blocks the whole loop
            c.execute("SELECT pg_advisory_lock(%s)", (state["stall_key"],))
            c.execute("SELECT pg_advisory_unlock(%s)", (state["stall_key"],))
    if first and state.get("gate_at") == step:
        async with app.pool.connection() as conn:
            await conn.execute("SELECT pg_advisory_lock(%s)", (state["gate_key"],))
            await conn.execute("SELECT pg_advisory_unlock(%s)", (state["gate_key"],))
    if state.get("sleep"):
        await asyncio.sleep(float(state["sleep"]))
    i = int(state.get("i", 0)) + 1
    new = {**state, "i": i, "by": os.getpid()}
    if i >= int(state.get("n", 1)):
        return Done({"i": i}, state=new)
    return Continue(new)


@app.task("steps", revision="1")
async def steps(ctx: RunContext, state: dict[str, Any]) -> Any:
    """The configurable step (see the module docstring)."""
    return await _steps(ctx, state)


@app.task("poison", revision="1", max_reclaims=1)
async def poison(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Same as ``steps`` but fails as PoisonRun after one reclaim in a row."""
    return await _steps(ctx, state)
