"""Start many runs in one statement: a nightly fan-out of 200 customer reports.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/start_many.py

``app.start_many([...])`` validates every start like ``app.start`` and inserts
them all with ONE statement (one commit, one NOTIFY per queue): all or nothing.
Idempotency keys make the batch safe to send again after a timeout: the runs
that exist already are not started twice.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Start

app = pgdurable.Durable(os.environ["PGDURABLE_DSN"])


@app.task("report", revision="1")
async def report(ctx: RunContext, state: dict[str, Any]) -> Done:
    return Done({"customer": state["customer"], "pages": 3})


async def main() -> None:
    async with app:
        starts = [
            Start("report", {"customer": f"c-{i}"},
                  idempotency_key=f"report:2026-11-30:c-{i}",   # one run per customer per night
                  metadata={"tenant": f"t{i % 4}"},
                  key=f"t{i % 4}",                              # flow-control key (per tenant)
                  deadline=timedelta(hours=6))
            for i in range(200)
        ]
        ids = await app.start_many(starts)
        again = await app.start_many(starts)               # a retry after a timeout: no new runs
        assert again == ids and len(set(ids)) == 200
        print(f"started {len(ids)} runs in one statement; the retry started none")

        try:  # bad input anywhere: a typed error, and nothing is written
            await app.start_many([Start("report", {"customer": "x"}),
                                  Start("report", {"customer": "y"}, priority="high")])  # type: ignore[arg-type]
        except TypeError as exc:
            print("refused:", exc, exc.__notes__)

        worker = app.worker(concurrency=32)
        task = asyncio.create_task(worker.run())
        results = [await app.result(rid, timeout=60) for rid in ids[:3]]
        print("first results:", results)
        await worker.stop()
        await task
        page = await app.list_runs(metadata={"tenant": "t1"}, limit=1000)
        print("runs of tenant t1:", len(page.items))


if __name__ == "__main__":
    asyncio.run(main())
