"""Operations: inspect runs with SQL, retry a failed run, prune old ones, run a pruner.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/operations.py

Retention deletes every finished run older than its cut-off, whoever started it
(``prune`` has no per-queue filter). So this example prunes for real (a cut-off
of 0 s, and a pruner next to the worker) only on a database whose finished runs
are all its own; on a database that holds other finished runs it only shows
what a prune would delete (``dry_run=True``), and those runs survive.

The same things from a shell:  pgdurable stats / runs --status failed / run ID /
retry ID / prune --older-than 7d --dry-run.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

import psycopg

import pgdurable
from pgdurable import Continue, Done, RunContext
from pgdurable.retention import prune, run_pruner

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
tool_is_down = True  # the outage we fix before retrying


@app.task("report", revision="1", max_attempts=1)
async def report(ctx: RunContext, state: dict[str, Any]) -> Any:
    if ctx.step == 0:
        return Continue({**state, "drafted": True})
    if state["topic"] == "flaky" and tool_is_down:
        raise ConnectionError("search API unavailable")
    return Done({"topic": state["topic"], "pages": 3})


async def wait_terminal(run_ids: list[str]) -> None:
    for _ in range(400):
        infos = [await app.get_run(r) for r in run_ids]
        if all(i.terminal for i in infos):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(run_ids)


def others_finished(dsn: str, ours: list[str]) -> int:
    """Finished runs in the database that this example did not start."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgdurable.runs WHERE status IN "
                           "('completed', 'failed', 'cancelled', 'incompatible') "
                           "AND NOT id = ANY(%s::uuid[])", (ours,)).fetchone()
    return int(row[0]) if row else 0


def show(conn: psycopg.Connection[Any], title: str, sql: str,
         params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    rows = conn.execute(sql, params).fetchall()
    print(f"-- {title}")
    for row in rows:
        print("  ", row)
    return rows


async def main() -> None:
    global tool_is_down
    dsn = os.environ["PGDURABLE_DSN"]
    shared = others_finished(dsn, []) > 0  # finished runs of others: not ours to prune
    async with app:
        worker = app.worker(concurrency=4, lease_ttl=timedelta(seconds=10), poll_interval=0.5)
        stop_pruner = asyncio.Event()
        tasks = [asyncio.create_task(worker.run())]
        if not shared:
            # Automatic retention next to the worker: one pruner at a time across the fleet.
            tasks.append(asyncio.create_task(
                run_pruner(app, every=timedelta(hours=1), older_than="7d", stop=stop_pruner)))
        ids = [await app.start("report", {"topic": t}) for t in ("pg", "flaky", "leases")]
        await wait_terminal(ids)

        with psycopg.connect(dsn, autocommit=True) as conn:
            show(conn, "per queue (pgdurable.queue_stats)",
                 "SELECT queue, runnable, leased, waiting, completed, failed FROM pgdurable.queue_stats")
            # this example's runs only: the database may hold others' (a shared one)
            failed = show(conn, "what failed and why (pgdurable.run_overview)",
                          """SELECT id, task, error_type, error_message FROM pgdurable.run_overview
                              WHERE status = 'failed' AND id = ANY(%s::uuid[])""", (ids,))
            assert len(failed) == 1 and failed[0][2] == "ConnectionError"

            tool_is_down = False  # the outage is over: retry from the last checkpoint
            conn.execute("SELECT pgdurable.retry_run(%s)", (failed[0][0],))
            await wait_terminal(ids)
            info = await app.get_run(str(failed[0][0]))
            print("retried:", info.status, info.result)
            assert info.status == "completed"

        # Retention: what a prune of everything finished more than 0 s ago (7d in real
        # life) would delete; a dry run changes nothing.
        preview = await prune(app, timedelta(0), dry_run=True)
        print(f"a prune would delete {preview.runs} runs, {preview.checkpoints} checkpoints")
        assert preview.runs >= 3
        others = others_finished(dsn, ids)
        if shared or others:
            print(f"not pruning: the database holds {others} finished run(s) of others, and "
                  "prune() would delete them too")
        else:  # every finished run here is ours: prune for real, in batches
            result = await prune(app, timedelta(0), batch=2)
            print(f"pruned {result.runs} runs, {result.checkpoints} checkpoints in "
                  f"{result.batches} batches")
            for rid in ids:  # ours are gone
                try:
                    await app.get_run(rid)
                    raise AssertionError(f"run {rid} was not pruned")
                except pgdurable.RunNotFound:
                    pass

        stop_pruner.set()
        await worker.stop(grace=5)
        await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main())
