"""Spend control: a tenant's shared budget, a run's own budget shared by its
children (and a child with its own), reservations before each model call (each
settlement written with its step's checkpoint), and a parked run woken by a
raised limit.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/budgets.py

The "model" is a stub that reports its usage; the budget ledger is real: every
reservation, settlement and release is a row of pgdurable.budget_ledger, decided
by the database under the run's lease.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Wait

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


async def fake_model(prompt: str) -> dict[str, int]:
    await asyncio.sleep(0.01)
    return {"tokens_in": 120 + len(prompt), "tokens_out": 80}


@app.task("ask", revision="1")
async def ask(ctx: RunContext, state: dict[str, Any]) -> Any:
    # hold at most 1,000 tokens and 1 call before the call; the actual is settled,
    # priced in USD from the price table, and the rest returned
    async with ctx.reserve(usd=0.05, tokens_in=500, tokens_out=500, calls=1) as r:
        usage = await fake_model(state["prompt"])
        r.settle(model="small-model", **usage)
    return Done(usage)


@app.task("research", revision="1")
async def research(ctx: RunContext, state: dict[str, Any]) -> Any:
    if ctx.wake is None:  # three sub-agents draw from this run's own budget
        ids = [await ctx.start_child("ask", {"prompt": f"part {i}"}, key=f"part-{i}")
               for i in range(3)]
        # and one from a budget of its own (budgets=[...] would name shared ones)
        ids.append(await ctx.start_child("ask", {"prompt": "review"}, key="review",
                                         budget={"usd": 0.1, "calls": 1}))
        return Wait.children(ids)
    return Done(sorted(c["status"] for c in ctx.wake["children"].values()))


async def until_status(rid: str, *statuses: str) -> pgdurable.RunInfo:
    for _ in range(600):
        info = await app.get_run(rid)
        if info.status in statuses:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(f"run {rid} is still {info.status}")


async def main() -> None:
    async with app:
        await app.set_price("small-model", usd_per_token_in=0.000002, usd_per_token_out=0.000008)
        # a tenant may make 2 calls (a day, say); more park until the limit is raised
        await app.budget("tenant:acme", limit={"calls": 2, "usd": 1}, policy="park")
        worker = app.worker(concurrency=4, poll_interval=0.2)
        task = asyncio.create_task(worker.run())
        try:
            tree = await app.start("research", {}, budget={"usd": 0.5, "calls": 3})
            assert (await until_status(tree, "completed")).result == ["completed"] * 4

            for prompt in ("a", "b"):
                rid = await app.start("ask", {"prompt": prompt}, budgets=["tenant:acme"])
                await until_status(rid, "completed")
            third = await app.start("ask", {"prompt": "c"}, budgets=["tenant:acme"])
            parked = await until_status(third, "waiting")
            print("third run:", parked.status, "on", parked.wait_kind, parked.wait_ref)
            await app.budget("tenant:acme", limit={"calls": 3, "usd": 1}, policy="park")
            await until_status(third, "completed")
        finally:
            await worker.stop()
            await task
        for row in await app.fetchall(
                "SELECT budget_key, unit, limit_amount::float8, settled::float8, held::float8 "
                "FROM pgdurable.budget_usage WHERE unit IN ('calls', 'usd') "
                "ORDER BY budget_key LIKE 'run:%%', budget_key, unit", ()):
            key, unit, limit, settled, held = row
            print(f"{key:12.12} {unit:6} limit {limit:<6g} settled {settled:<10g} held {held:g}")


if __name__ == "__main__":
    asyncio.run(main())
