"""Flow control across all workers: a capped, fair, rate-limited queue, a
shared token bucket, and a delayed start.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/flow_control.py

The limits live in Postgres and are enforced inside the claim, so they hold
for any number of worker processes: here two workers of 8 slots each never
run more than 3 "llm" runs at once, at most 1 per tenant, and the tenants
take turns. Each step takes tokens from the shared bucket "provider"; a run
that finds it short parks (no worker slot held) until its tokens are due.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Done, RateLimited, RunContext

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
peak: dict[str, int] = {"now": 0, "max": 0}


@app.task("agent", revision="1")
async def agent(ctx: RunContext, state: dict[str, Any]) -> Any:
    await ctx.acquire("provider", cost=1)  # parks the run if the bucket is short
    peak["now"] += 1
    peak["max"] = max(peak["max"], peak["now"])
    try:
        await asyncio.sleep(0.05)  # the "LLM call"
        if state.get("simulate_429") and ctx.wake is None:
            # a provider's 429 with a reset time becomes the same kind of park
            raise RateLimited.from_headers({"retry-after": "0.2"})
    finally:
        peak["now"] -= 1
    return Done({"tenant": state["tenant"]})


async def main() -> None:
    async with app:
        await app.set_queue("llm", concurrency=3, per_key_concurrency=1,
                            rate=(600, timedelta(minutes=1)))
        await app.set_bucket("provider", rate=(1200, timedelta(minutes=1)), burst=5)
        ids = [await app.start("agent", {"tenant": t}, queue="llm", key=f"tenant:{t}")
               for t in ("acme", "acme", "acme", "acme", "globex", "initech")]
        ids.append(await app.start("agent", {"tenant": "acme", "simulate_429": True},
                                   queue="llm", key="tenant:acme"))
        later = await app.start("agent", {"tenant": "umbrella"}, queue="llm",
                                key="tenant:umbrella", delay=timedelta(seconds=0.5))
        rows = await app.fetchall("SELECT id::text, key FROM pgdurable.delayed_runs", ())
        print("delayed:", rows)
        assert [r[0] for r in rows] == [later]
        print("limits:", await app.fetchall(
            "SELECT queue, concurrency, per_key_concurrency, rate_per_second, keys_queued "
            "FROM pgdurable.queue_limits", ()))
        workers = [app.worker(queues=["llm"], concurrency=8, poll_interval=0.5) for _ in range(2)]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        try:
            for rid in [*ids, later]:
                for _ in range(1200):
                    info = await app.get_run(rid)
                    if info.status in ("completed", "failed"):
                        break
                    await asyncio.sleep(0.05)
                assert info.status == "completed", (rid, info.status, info.error)
        finally:
            for w in workers:
                await w.stop()
            await asyncio.gather(*tasks)
        print("most runs at once:", peak["max"])
        assert peak["max"] <= 3
        print("bucket:", await app.fetchall(
            "SELECT name, rate_per_second, burst FROM pgdurable.bucket_levels", ()))


if __name__ == "__main__":
    asyncio.run(main())
