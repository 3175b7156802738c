"""Quickstart: a three-step durable run, a wait for approval, and a worker.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/quickstart.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Continue, Done, RunContext, Wait

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("research", revision="1", max_attempts=5)
async def research(ctx: RunContext, state: dict[str, Any]) -> Any:
    """One call = one step; the state is checkpointed after each."""
    if ctx.step < 2:
        notes = [*state.get("notes", []), f"finding {ctx.step}"]
        return Continue({**state, "notes": notes})
    if ctx.wake is None:
        return Wait.approval(state["topic"], timeout=timedelta(hours=1))
    approved = ctx.wake.get("type") == "signal" and (ctx.wake.get("payload") or {}).get("ok")
    return Done({"topic": state["topic"], "notes": state["notes"], "approved": bool(approved)})


async def poll_until(pred: Callable[[pgdurable.RunInfo], bool], run_id: str) -> pgdurable.RunInfo:
    """Poll the run until ``pred`` holds (a demo; real code reacts to events)."""
    for _ in range(600):
        info = await app.get_run(run_id)
        if pred(info):
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(run_id)


async def main() -> None:
    async with app:
        worker = app.worker(queues=["default"], concurrency=4)
        worker_task = asyncio.create_task(worker.run())
        run_id = await app.start("research", {"topic": "pg"}, deadline=timedelta(hours=2))
        await poll_until(lambda i: i.status == "waiting", run_id)
        await app.signal("approval", "pg", {"ok": True})
        info = await poll_until(lambda i: i.terminal, run_id)
        print(info.status, info.result)
        await worker.stop(grace=5)
        await worker_task


if __name__ == "__main__":
    asyncio.run(main())
