"""The app of ``benchmarks/million.py``'s worker processes.

``python -m pgdurable.worker _million_app:app`` with ``PYTHONPATH=benchmarks`` and
``PGDURABLE_DSN`` set. Tasks:

* ``parked``: created parked by the driver (``claim_runs`` + ``park_run`` in one
  statement per batch: the same functions a worker calls), waiting on the signal
  ``("bench", run id)`` or a timer; when woken, its one step completes the run with
  what woke it.
* ``fresh``: one step that completes the run (the timer storm's baseline: the same
  work as a woken ``parked`` run).
* ``noop3``: three no-op steps (the end-to-end latency probe).
* ``fanin``: step 0 starts ``state["n"]`` ``child`` runs (``ctx.start_child``, 16 at a
  time; with ``state["batch"]`` all in one ``ctx.start_children``) and waits for all of them; step 1 completes with how many completed and how
  many times the parent was woken (the wake fan-in).
* ``child``: one step, then done (the fan-in's children, and its baseline of
  independent runs).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pgdurable
from pgdurable import Child, Continue, Done, RunContext, Wait

app = pgdurable.Durable(pool_size=int(os.environ.get("BENCH_POOL_SIZE", "8")))


@app.task("parked", revision="1")
async def parked(ctx: RunContext, state: Any) -> Any:
    """Woken by its signal or its timer: complete with the kind of wake."""
    return Done({"woke": None if ctx.wake is None else ctx.wake.get("type")})


@app.task("fresh", revision="1")
async def fresh(ctx: RunContext, state: Any) -> Any:
    """One step, then done."""
    return Done(True)


@app.task("noop3", revision="1")
async def noop3(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Step i of 3: no work, just the state transition."""
    i = state.get("i", 0) + 1
    return Done(i) if i >= 3 else Continue({"i": i})


@app.task("fanin", revision="1")
async def fanin(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Start ``n`` children, wait for them all, then count their outcomes."""
    if ctx.step == 0:
        keys = [f"k{i}" for i in range(state["n"])]
        ids: list[str] = []
        if state.get("batch"):  # ctx.start_children: one statement for all of them
            ids = await ctx.start_children([Child("child", key=k, revision="1") for k in keys])
            return Wait.children(ids, state={"n": len(ids)})
        for i in range(0, len(keys), 16):
            ids += await asyncio.gather(*(ctx.start_child("child", revision="1", key=k)
                                          for k in keys[i:i + 16]))
        return Wait.children(ids, state={"n": len(ids)})
    kids = (ctx.wake or {}).get("children", {})
    return Done({"completed": sum(v["status"] == "completed" for v in kids.values())})


@app.task("child", revision="1")
async def child(ctx: RunContext, state: Any) -> Any:
    """One step, then done."""
    return Done(None)
