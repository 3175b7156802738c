"""The waiting boundary: a CI wait with a timeout, a human approval, a timer.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/signals.py

A run that waits records what it waits for and leaves the worker: it holds no
worker slot, thread or connection while parked. A signal (from code, the CLI
``pgdurable signal ci build-7 --payload '{...}'`` or a webhook) or its timer
makes it runnable again, and the next step sees what woke it in ``ctx.wake``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Sleep, Wait

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("release", revision="1")
async def release(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Wait for CI (at most an hour), then for a human, then cool down 0.2 s."""
    stage = state.get("stage", "ci")
    if stage == "ci":
        if ctx.wake is None:
            return Wait(signal=("ci", state["build"]), timeout=timedelta(hours=1))
        if ctx.wake["type"] == "timeout":  # recorded, so a replay sees the same outcome
            return Done({"released": False, "why": "CI timed out"})
        return Wait.approval(state["build"], state={**state, "stage": "approval",
                                                    "ci": ctx.wake["payload"]})
    if stage == "approval":
        approved = bool((ctx.wake or {}).get("payload", {}).get("approved"))
        if not approved:
            return Done({"released": False, "why": "rejected"})
        return Sleep(seconds=0.2, state={**state, "stage": "cooldown"})
    return Done({"released": True, "ci": state["ci"], "woken_by": ctx.wake})


async def until_status(run_id: str, *statuses: str) -> pgdurable.RunInfo:
    for _ in range(600):
        info = await app.get_run(run_id)
        if info.status in statuses:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(run_id)


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=4)
        task = asyncio.create_task(worker.run())
        try:
            # CI reports before the run even parks: the signal is kept, not lost
            assert await app.signal("ci", "build-7", {"conclusion": "success"},
                                    signal_id="gh-delivery-1") == []
            run_id = await app.start("release", {"build": "build-7"})
            # ... and the run goes straight on to wait for the approval
            for _ in range(600):
                if (await app.get_run(run_id)).wait_kind == "approval":
                    break
                await asyncio.sleep(0.05)
            rows = await app.fetchall(
                "SELECT run_id::text, waits_for, kind, ref FROM pgdurable.waiting_runs", ())
            print("waiting:", rows)
            # a retried webhook delivery with the same id changes nothing
            assert await app.signal("ci", "build-7", {"conclusion": "success"},
                                    signal_id="gh-delivery-1") == []
            # a human approves this very run (signal_run addresses one run)
            assert await app.signal_run(run_id, "approval", {"approved": True}) == [run_id]
            # a CI system reporting many builds at once: one statement and one commit
            # (nobody waits on these yet: both are kept for the runs that will park on them)
            assert await app.signal_many([("ci", "build-8", {"conclusion": "success"}),
                                          ("ci", "build-9", {"conclusion": "failure"})]) == [[], []]
            done = await until_status(run_id, "completed", "failed")
            print("result:", done.result)
            assert done.result["released"] is True and done.result["woken_by"]["type"] == "timeout"
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
