"""Spend control overhead (issue 42): a step with a reserve + settle against the same
step without a budget, in the same run of the benchmark, and reservation throughput on
one hot budget key at 8 and 32 concurrent callers.

One command::

    .venv/bin/python benchmarks/budgets.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--steps 200] [--rounds 3] [--seconds 5] [--async-commit]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards drops)
its scratch database ``pgdurable_bench_budgets`` and migrates it.

1. Per step: one in-process worker runs one run of ``--steps`` steps of task
   ``plain`` (Continue, nothing else) or ``budgeted`` (the same step inside
   ``async with ctx.reserve(usd=0.01, calls=1) as r: r.settle(usd=0.005)``, the run
   drawing from a named budget and its own); rounds alternate. Reported: ms per step
   (database clock, first checkpoint to last) and the extra statements per step: the
   transactions that wrote the run's ledger rows other than its checkpoints' (xmin).
2. Hot key: ``N`` runs (8, then 32) on a worker of concurrency ``N``, each looping
   steps of one reserve + settle on the same budget (limit high enough never to
   refuse) for ``--seconds``; reported: reservations/s from the ledger's settle rows
   (their database-clock times). Baseline, in the same run: ``pgbench`` with ``N``
   clients each committing ``UPDATE`` of ONE row (the same row for all) for
   ``--seconds``: what one hot row allows when each transaction commits while it holds
   the row's lock, which an exact budget must (the database decides; a reservation
   takes its budget's totals rows, and its settlement takes them again in the step's
   checkpoint, so two such commits per reservation).
3. One reservation's cost against the bare lease fence (``pgdurable._fenced``, the
   baseline), each its own autocommit statement on one connection, on a budget whose
   ledger already holds ``--ledger`` settlements of other runs: a reservation must not
   cost more as the ledger grows (medians of ``--calls`` calls, benchmarks/_driver.py
   ``spread``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import psycopg
from _driver import load, spread
from _pgbench import pgbench_tps
from _scratch import drop_scratch, scratch_dsn

import pgdurable
from pgdurable import Continue, Done, RunContext

DB = "pgdurable_bench_budgets"


def build(dsn: str, steps: int) -> pgdurable.Durable:
    app = pgdurable.Durable(dsn, pool_size=40)

    @app.task("plain", revision="1")
    async def plain(ctx: RunContext, state: Any) -> Any:
        return Done(None) if ctx.step >= steps else Continue(state)

    @app.task("budgeted", revision="1")
    async def budgeted(ctx: RunContext, state: Any) -> Any:
        if ctx.step >= steps:
            return Done(None)
        async with ctx.reserve(usd=0.01, calls=1) as r:
            r.settle(usd=0.005)
        return Continue(state)

    @app.task("hot", revision="1")
    async def hot(ctx: RunContext, state: Any) -> Any:
        if state.get("stop"):
            return Done(None)
        async with ctx.reserve(usd=0.01, calls=1) as r:
            r.settle(usd=0.005)
        return Continue(state)

    return app


#: The transactions of a run's ledger rows that are not one of its checkpoints' (the
#: reservations' own statements), per step.
EXTRA = """
SELECT count(DISTINCT l.xmin::text)::float8 / %s FROM pgdurable.budget_ledger l
 WHERE l.run_id = %s AND l.xmin::text NOT IN (
       SELECT c.xmin::text FROM pgdurable.checkpoints c WHERE c.run_id = %s)
"""


async def one_run(app: pgdurable.Durable, conn: psycopg.AsyncConnection[Any], task: str,
                  steps: int, extra: list[float] | None = None, **start: Any) -> float:
    rid = await app.start(task, {}, **start)
    w = app.worker(concurrency=1, poll_interval=0.05)
    running = asyncio.create_task(w.run())
    await app.result(rid)
    await w.stop()
    await running
    cur = await conn.execute("SELECT extract(epoch FROM max(created_at) - min(created_at)) "
                             "FROM pgdurable.checkpoints WHERE run_id = %s", (rid,))
    row = await cur.fetchone()
    assert row is not None
    if extra is not None:
        cur = await conn.execute(EXTRA, (steps, rid, rid))
        got = await cur.fetchone()
        assert got is not None
        extra.append(float(got[0]))
    return float(row[0]) * 1000 / (steps - 1)


async def hot_key(app: pgdurable.Durable, conn: psycopg.AsyncConnection[Any], n: int,
                  seconds: float) -> float:
    await conn.execute("TRUNCATE pgdurable.budget_ledger")
    ids = [await app.start("hot", {}, budgets=["hot"]) for _ in range(n)]
    w = app.worker(concurrency=n, poll_interval=0.05)
    running = asyncio.create_task(w.run())
    await asyncio.sleep(seconds)
    await w.stop()
    await running
    cur = await conn.execute(
        "SELECT count(*), extract(epoch FROM max(at) - min(at)) FROM pgdurable.budget_ledger "
        "WHERE kind = 'settle' AND unit = 'calls'")
    row = await cur.fetchone()
    assert row is not None
    await conn.execute("UPDATE pgdurable.runs SET status = 'cancelled' WHERE id = ANY(%s)", (ids,))
    return float(row[0]) / float(row[1])


async def reserve_cost(conn: psycopg.AsyncConnection[Any], ledger: int, calls: int
                       ) -> tuple[list[float], list[float]]:
    """The ms of each bare fence and of each reservation, on a budget with ``ledger``
    earlier settlements."""
    await conn.execute("SELECT pgdurable.budget_set('big', '{\"usd\": 1e12, \"calls\": 1e12}', "
                       "'none', NULL, 'fail')")
    await conn.execute(
        "INSERT INTO pgdurable.budget_ledger (run_id, step, rkey, budget_key, unit, kind, "
        "amount, token) SELECT gen_random_uuid(), g, 'r0', 'big', u, 'settle', 0.005, 1 "
        "FROM generate_series(1, %s) g, unnest(ARRAY['usd', 'calls']) u", (ledger // 2,))
    await conn.execute("ANALYZE pgdurable.budget_ledger")
    cur = await conn.execute("SELECT run_id FROM pgdurable.start_run('micro', '1', '{}', "
                             "'micro', 0, 3, NULL, NULL, NULL, NULL)")
    row = await cur.fetchone()
    assert row is not None
    rid = row[0]
    await conn.execute("SELECT pgdurable.budget_started_run(%s, '{big}', NULL)", (rid,))
    cur = await conn.execute("SELECT lease_token FROM pgdurable.claim_runs('bench', "
                             "'{micro}', '{micro}', '{1}', 1, '1 hour')")
    row = await cur.fetchone()
    assert row is not None
    token = row[0]
    fence: list[float] = []
    reserve: list[float] = []
    for i in range(calls):
        t = time.perf_counter()
        await conn.execute("SELECT pgdurable._fenced(%s, %s, 'bench')", (rid, token))
        fence.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await conn.execute("SELECT * FROM pgdurable.budget_reserve(%s, %s, 'bench', %s, 'r0', "
                           "'{\"usd\": 0.01, \"calls\": 1}')", (rid, token, i))
        reserve.append((time.perf_counter() - t) * 1000)
    await conn.execute("UPDATE pgdurable.runs SET status = 'cancelled' WHERE id = %s", (rid,))
    return fence, reserve


def hot_row_tps(dsn: str, clients: int, seconds: float) -> float:
    """pgbench commits/s of ``clients`` clients updating one and the same row."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS bench_hot")
        c.execute("CREATE TABLE bench_hot (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)")
        c.execute("INSERT INTO bench_hot (id) VALUES (1)")
    return pgbench_tps(dsn, "UPDATE bench_hot SET v = v + 1 WHERE id = 1;\n",
                       ["-c", str(clients), "-j", "2", "-T", str(max(1, round(seconds)))])


async def main(dsn: str, steps: int, rounds: int, seconds: float, ledger: int,
               calls: int) -> None:
    app = build(dsn, steps)
    async with app, await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await app.budget("tenant", limit={"usd": 1e9, "calls": 1e9})
        await app.budget("hot", limit={"usd": 1e9, "calls": 1e9})
        plain: list[float] = []
        budgeted: list[float] = []
        extra: list[float] = []
        for _ in range(rounds):
            plain.append(await one_run(app, conn, "plain", steps))
            budgeted.append(await one_run(app, conn, "budgeted", steps, extra,
                                          budgets=["tenant"], budget={"usd": 1e6}))
        p, b = statistics.median(plain), statistics.median(budgeted)
        print(f"per step: plain {p:.2f} ms, with reserve + settle {b:.2f} ms "
              f"(+{b - p:.2f} ms, x{b / p:.2f}); {statistics.median(extra):.2f} extra "
              "statements (transactions) per step, from the ledger's xmin")
        for n in (8, 32):
            rate = await hot_key(app, conn, n, seconds)
            row = await asyncio.to_thread(hot_row_tps, dsn, n, seconds)
            print(f"hot key, {n} concurrent callers: {rate:.0f} reservations/s (each a "
                  f"reserve + settle); one hot row, {n} pgbench clients: {row:.0f} commits/s; "
                  f"ratio reservations / (hot-row commits / 2) {rate / (row / 2):.2f}")
        fence, reserve = await reserve_cost(conn, ledger, calls)
        f, r = statistics.median(fence), statistics.median(reserve)
        print(f"one reservation, ledger of {ledger} settlements: {r:.2f} ms vs the bare fence "
              f"{f:.2f} ms (x{r / f:.2f}); reserve ms {spread(reserve)}; fence ms "
              f"{spread(fence)}; {load()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--ledger", type=int, default=20_000)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--async-commit", action="store_true",
                    help="synchronous_commit = off in the scratch database")
    args = ap.parse_args()
    bench = scratch_dsn(args.dsn, DB)
    if args.async_commit:  # separates the cost of the commits (fsync) from the statements'
        with psycopg.connect(bench, autocommit=True) as c:
            c.execute(f"ALTER DATABASE {DB} SET synchronous_commit = off")
    try:
        asyncio.run(main(bench, args.steps, args.rounds, args.seconds, args.ledger, args.calls))
    finally:
        drop_scratch(args.dsn, DB)
