"""Fan-out / fan-in of 1,000 no-op children against 1,000 independent runs.

One command::

    .venv/bin/python benchmarks/fan_out.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--n 1000] [--rounds 3] [--workers 2] [--concurrency 64]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its scratch database ``pgdurable_bench_fan_out``. ``--workers`` worker
processes (concurrency ``--concurrency`` each) serve both modes, which
alternate for ``--rounds`` rounds:

* **independent** (the baseline): the driver starts N ``noop`` runs
  (``Durable.start``, 16 at a time over its pool) and waits until all N are
  completed;
* **children**: the driver starts one ``parent`` run, whose first step starts
  N ``noop`` children (``ctx.start_child``, 16 at a time) and returns
  ``Wait.children(ids)``; its second step completes with the N outcomes. The
  driver waits until the parent is completed.

Both waits poll one count query every 5 ms (the same measuring error on both
sides). Reported: wall time per mode (median of the rounds), the ratio
children / independent (target <= 1.3) and how many times each parent was
claimed (target: exactly 2, started and woken once).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

from pgdurable import Done, Durable, RunContext, Wait

DB = "pgdurable_bench_fan_out"
BATCH = 16


def make_app(dsn: str) -> Durable:
    """The benchmark's tasks: a no-op, and a parent fanning out to no-ops."""
    app = Durable(dsn, pool_size=BATCH + 4)

    @app.task("noop")
    async def noop(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    @app.task("parent")
    async def parent(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            keys = [f"k{i}" for i in range(state["n"])]
            ids: list[str] = []
            for i in range(0, len(keys), BATCH):
                ids += await asyncio.gather(*(ctx.start_child("noop", key=k)
                                              for k in keys[i:i + BATCH]))
            return Wait.children(ids, state={"n": len(ids)})
        kids = (ctx.wake or {}).get("children", {})
        return Done({"completed": sum(v["status"] == "completed" for v in kids.values())})

    return app


def worker_main(dsn: str, concurrency: int) -> None:
    """``--worker``: run one worker until SIGTERM."""
    app = make_app(dsn)

    async def run() -> None:
        w = app.worker(concurrency=concurrency, poll_interval=1.0)
        try:
            await w.run()
        finally:
            await app.close()

    asyncio.run(run())


async def wait_count(conn: psycopg.AsyncConnection[Any], query: str, params: tuple[Any, ...],
                     want: int) -> None:
    while True:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        if row is not None and row[0] >= want:
            return
        await asyncio.sleep(0.005)


async def independent(app: Durable, conn: psycopg.AsyncConnection[Any], n: int,
                      tag: str) -> float:
    t0 = time.perf_counter()
    for i in range(0, n, BATCH):
        await asyncio.gather(*(app.start("noop", {"tag": tag}) for _ in range(i, min(n, i + BATCH))))
    await wait_count(conn, "SELECT count(*) FROM pgdurable.runs WHERE status = 'completed' "
                     "AND parent_run_id IS NULL AND state->>'tag' = %s", (tag,), n)
    return time.perf_counter() - t0


async def children(app: Durable, conn: psycopg.AsyncConnection[Any], n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    pid = await app.start("parent", {"n": n})
    await wait_count(conn, "SELECT count(*) FROM pgdurable.runs WHERE id = %s "
                     "AND status = 'completed'", (pid,), 1)
    elapsed = time.perf_counter() - t0
    info = await app.get_run(pid)
    assert info.result == {"completed": n}, info.result
    return elapsed, info.claims


async def drive(dsn: str, n: int, rounds: int) -> dict[str, Any]:
    app = make_app(dsn)
    await app.open()
    ind: list[float] = []
    fan: list[float] = []
    claims: list[int] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await independent(app, conn, 100, "warmup")
        for r in range(rounds):
            ind.append(await independent(app, conn, n, f"r{r}"))
            t, c = await children(app, conn, n)
            fan.append(t)
            claims.append(c)
    await app.close()
    return {"independent": ind, "children": fan, "claims": claims}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--worker", metavar="DSN", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args.worker, args.concurrency)
        return 0
    dsn = scratch_dsn(args.dsn, DB)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", dsn,
                               "--concurrency", str(args.concurrency)])
             for _ in range(args.workers)]
    try:
        res = asyncio.run(drive(dsn, args.n, args.rounds))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        drop_scratch(args.dsn, DB)
    ind = statistics.median(res["independent"])
    fan = statistics.median(res["children"])
    print(f"fan_out.py on {platform.node()} ({os.cpu_count()} CPUs), n={args.n}, "
          f"{args.workers} worker(s) x concurrency {args.concurrency}, {args.rounds} rounds")
    print("  independent runs (s): " + ", ".join(f"{v:.3f}" for v in res["independent"]))
    print("  children       (s): " + ", ".join(f"{v:.3f}" for v in res["children"]))
    print(f"  median: independent {ind:.3f} s, children {fan:.3f} s, ratio {fan / ind:.2f} "
          f"(target <= 1.3)")
    print(f"  parent claims per round: {res['claims']} (target: 2 each)")
    ok = fan / ind <= 1.3 and all(c == 2 for c in res["claims"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
