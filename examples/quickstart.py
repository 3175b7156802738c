"""Quickstart: a durable run that checkpoints each step, parks for an approval, and ends.

Run it on a migrated database (`pgdurable migrate` first):
    PGDURABLE_DSN=postgresql://... python examples/quickstart.py
"""

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext, Wait

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("research", revision="1", max_attempts=5)
async def research(ctx: RunContext, state: dict[str, Any]) -> Continue | Done | Wait:
    if ctx.step < 2:  # one call = one step; the state it returns is checkpointed
        return Continue({**state, "notes": [*state.get("notes", []), f"finding {ctx.step}"]})
    if ctx.wake is None:  # park: the run holds no worker until a signal or the timeout
        return Wait.approval(state["topic"], timeout=timedelta(hours=1))
    return Done({**state, "approved": ctx.wake["type"] == "signal"})


async def main() -> None:
    async with app:
        worker = app.worker(queues=["default"], concurrency=4)
        running = asyncio.create_task(worker.run())  # or a process: pgdurable worker mod:app
        run_id = await app.start("research", {"topic": "pg"}, deadline=timedelta(hours=2))
        await app.signal("approval", "pg", {"ok": True})  # kept until the run parks on it
        print(await app.result(run_id, timeout=60))  # waits with LISTEN, from any process
        await worker.stop(grace=5)
        await running


if __name__ == "__main__":
    asyncio.run(main())
