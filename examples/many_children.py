"""A wide fan-out: one step starts 1,000 child runs in ONE statement, then joins them.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/many_children.py

``ctx.start_children`` takes a list of :class:`pgdurable.Child` (the arguments of
``ctx.start_child``) and starts them all with one fenced call: the parent's row lock
is taken once and the children are inserted by one INSERT in one commit, where 1,000
``start_child`` calls would each commit while holding that lock, one after the other.
Each key still starts its child once: the step below asks twice (as a retried step
would) and gets the same 1,000 ids back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import Child, Done, RunContext, Wait

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("square", max_attempts=1)
async def square(ctx: RunContext, state: dict[str, Any]) -> Any:
    """A child: one step."""
    return Done(state["x"] ** 2)


@app.task("sum_of_squares")
async def sum_of_squares(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Fan out one child per number (one statement), wait for all, add up."""
    if ctx.step == 0:
        children = [Child("square", {"x": x}, key=f"x{x}") for x in range(state["n"])]
        ids = await ctx.start_children(children)
        assert await ctx.start_children(children) == ids  # once per key: same children
        return Wait.children(ids, timeout=600, state={"ids": ids})
    outcomes = ctx.wake["children"] if ctx.wake else {}
    return Done(sum(outcomes[i]["result"] for i in state["ids"]))


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=32)
        task = asyncio.create_task(worker.run())
        try:
            n = 1000
            run_id = await app.start("sum_of_squares", {"n": n})
            total = await app.result(run_id, timeout=300)
            print(f"sum of the squares below {n}: {total}")
            assert total == sum(x * x for x in range(n))
            info = await app.get_run(run_id)
            print(f"{len(info.children)} children; the parent was claimed {info.claims} times")
            assert len(info.children) == n and info.claims == 2  # started, woken once
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
