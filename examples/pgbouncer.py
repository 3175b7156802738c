"""A worker behind PgBouncer in transaction mode, waking on NOTIFY through a direct connection.

    PGDURABLE_DSN=postgresql://app@db:5432/app \\
    PGBOUNCER_DSN=postgresql://app@pgbouncer:6432/app python examples/pgbouncer.py

Runs, claims, checkpoints and signals go through ``PGBOUNCER_DSN`` (a PgBouncer with
``pool_mode = transaction``): ``pooler="transaction"`` turns prepared statements and
session settings off. LISTEN cannot work through it, so workers listen on the direct
``PGDURABLE_DSN`` (``listen_dsn=``). Without ``PGBOUNCER_DSN`` the same code runs on
the direct DSN alone (nothing in transaction mode needs a pooler). See docs/pgbouncer.md.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Wait

direct = os.environ["PGDURABLE_DSN"]
app = pgdurable.Durable(
    os.environ.get("PGBOUNCER_DSN") or direct,  # the pooled DSN
    pooler="transaction",
    listen_dsn=direct,  # LISTEN needs a direct connection
)


@app.task("review", revision="1")
async def review(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Park until a reviewer signals, then complete with the verdict."""
    if ctx.wake is None:
        return Wait(signal=("review", state["pr"]))
    return Done({"pr": state["pr"], "verdict": ctx.wake["payload"]["verdict"]})


async def reached(run_id: str, status: str) -> pgdurable.RunInfo:
    """Poll the run until it has ``status`` (a demo; real code reacts to events)."""
    for _ in range(1200):
        info = await app.get_run(run_id)
        if info.status == status:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(f"run {run_id} never became {status}")


async def main() -> None:
    async with app:
        worker = app.worker(poll_interval=3600)  # only a NOTIFY wakes it early
        running = asyncio.create_task(worker.run())
        run_id = await app.start("review", {"pr": "42"})
        await reached(run_id, "waiting")
        await app.signal("review", "42", {"verdict": "approved"})  # NOTIFY at commit
        info = await reached(run_id, "completed")
        print("run", run_id, "->", info.result)
        await worker.stop()
        await running


if __name__ == "__main__":
    asyncio.run(main())
