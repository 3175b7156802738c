"""A Durable app for the PgBouncer tests (tests/test_pgbouncer.py), run as real workers.

``python -m pgdurable.worker _pgbouncer_app:app`` with ``PYTHONPATH=tests``;
the DSN, the pooler mode and the direct listen DSN come from the
environment (``PGDURABLE_DSN``, ``PGDURABLE_POOLER``, ``PGDURABLE_LISTEN_DSN``),
as a deployed worker would get them.

* ``steps`` -- ``n`` steps of ``sleep`` seconds each, then ``Done({"i": n})``;
* ``approve`` -- parks on the signal ``("approval", ref)``, then ``Done`` with its payload;
* ``nap`` -- sleeps ``seconds`` on a database timer (``Sleep``), then ``Done``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext, Sleep, Wait

app = pgdurable.Durable(pool_size=4)


@app.task("steps", revision="1")
async def steps(ctx: RunContext, state: dict[str, Any]) -> Any:
    """``n`` steps of ``sleep`` seconds."""
    await asyncio.sleep(float(state.get("sleep", 0)))
    i = int(state.get("i", 0)) + 1
    if i >= int(state["n"]):
        return Done({"i": i}, state={**state, "i": i})
    return Continue({**state, "i": i})


@app.task("approve", revision="1")
async def approve(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Wait for ``("approval", ref)``; complete with the signal's payload."""
    if ctx.wake is None:
        return Wait(signal=("approval", str(state["ref"])))
    return Done({"payload": ctx.wake.get("payload")})


@app.task("nap", revision="1")
async def nap(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Sleep ``seconds`` on a timer, then complete."""
    if ctx.wake is None:
        return Sleep(seconds=float(state["seconds"]))
    return Done({"woke": ctx.wake["type"]})
