"""History partitions: make daily partitions ahead, see them, retention by partition.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/history_partitions.py

The same from a shell:  pgdurable maintain --days-ahead 3 --older-than 30d
(docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

import pgdurable
from pgdurable import Continue, Done, RunContext
from pgdurable.partitions import maintain
from pgdurable.retention import prune

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("agent", revision="1")
async def agent(ctx: RunContext, state: dict[str, Any]) -> Any:
    await ctx.emit({"thought": f"step {ctx.step}"})
    return Continue({"n": state["n"] + 1}) if state["n"] < 2 else Done(state["n"])


async def main() -> None:
    dsn = os.environ["PGDURABLE_DSN"]
    # what the workers' leader (pgdurable worker --maintain) does every hour
    made = await maintain(app, days_ahead=5)
    print(f"created {made.created} partition(s) ahead")
    rid = await app.start("agent", {"n": 0})
    worker = app.worker(concurrency=2, poll_interval=0.5)
    running = asyncio.create_task(worker.run())
    print("result:", await app.result(rid, timeout=60))
    await worker.stop(grace=5)
    await running
    with psycopg.connect(dsn) as c:
        # checkpoints, run_events and signal_history (consumed signals, moved out of
        # pgdurable.signals an hour after they were consumed) share the daily ranges
        for table, n in c.execute("SELECT history_table, count(*) FROM pgdurable.history_partitions"
                                  " GROUP BY 1 ORDER BY 1"):
            print(f"{table}: {n} partition(s)")
        for part, n in c.execute("SELECT tableoid::regclass::text, count(*)"
                                 " FROM pgdurable.checkpoints WHERE run_id = %s GROUP BY 1",
                                 (rid,)):
            print(f"run {rid}: {n} checkpoint(s) in {part}")
    # retention: whole daily partitions older than 30 days go first, then old runs
    result = await prune(app, "30d")
    print(f"pruned {result.partitions} partition(s) and {result.runs} run(s)")
    await app.close()


if __name__ == "__main__":
    asyncio.run(main())
