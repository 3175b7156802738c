"""A Durable app for the child-run process tests (tests/test_children_procs.py).

Run as ``python -m pgdurable.worker _children_app:app`` with ``PYTHONPATH=tests``
and ``PGDURABLE_DSN`` set; ``python -m _children_app result RUN_ID`` prints the
run's result as JSON (``DurableClient.result`` from another process).

Every step of ``fan``/``stall`` logs ``(run_id, step, token, pid)`` in the
scratch table ``test_child_log`` that the test creates, before anything else.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Wait

app = pgdurable.Durable()


async def _log(ctx: RunContext, event: str) -> None:
    async with app.pool.connection() as conn:
        await conn.execute("INSERT INTO test_child_log VALUES (%s, %s, %s, %s, %s)",
                           (ctx.run_id, ctx.step, ctx.token, os.getpid(), event))


@app.task("leaf")
async def leaf(ctx: RunContext, state: Any) -> Any:
    await asyncio.sleep(state.get("sleep", 0))
    return Done({"i": state["i"], "pid": os.getpid()})


@app.task("fan", max_attempts=1)
async def fan(ctx: RunContext, state: Any) -> Any:
    await _log(ctx, "step")
    if ctx.step == 0:
        ids = [await ctx.start_child("leaf", {"i": i, "sleep": state["sleep"]}, key=f"k{i}")
               for i in range(state["n"])]
        return Wait.children(ids, state={"ids": ids})
    return Done({"children": ctx.wake["children"] if ctx.wake else None})


@app.task("stall", max_attempts=1)
async def stall(ctx: RunContext, state: Any) -> Any:
    """Step 0 starts 3 children; on the first claim it then waits until another
    attempt has taken the run over (the test SIGSTOPs this worker meanwhile)
    and tries to start a 4th child, which the fence must refuse."""
    await _log(ctx, "step")
    if ctx.step == 0:
        ids = [await ctx.start_child("leaf", {"i": i}, key=f"k{i}") for i in range(3)]
        await _log(ctx, "started")
        if ctx.token == 1:
            while True:
                async with app.pool.connection() as conn:
                    cur = await conn.execute(
                        "SELECT lease_token FROM pgdurable.runs WHERE id = %s", (ctx.run_id,))
                    row = await cur.fetchone()
                if row is not None and row[0] > 1:
                    break
                await asyncio.sleep(0.05)
            try:
                await ctx.start_child("leaf", {"i": 3}, key="k3")
                await _log(ctx, "k3 started")
            except pgdurable.LeaseLost:
                await _log(ctx, "k3 refused")
                raise
        return Wait.children(ids, state={"ids": ids})
    return Done({"children": ctx.wake["children"] if ctx.wake else None})


if __name__ == "__main__" and sys.argv[1:2] == ["result"]:
    with pgdurable.DurableClient() as client:
        print(json.dumps(client.result(sys.argv[2], timeout=float(sys.argv[3]))), flush=True)
