"""start() latency while a worker is busy, against a bare single-row INSERT +
commit from the same client.

One command::

    .venv/bin/python benchmarks/start_latency.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and drops) the
scratch database ``pgdurable_bench_start_latency``. A worker process
(concurrency 32) drains a backlog of three-step runs on queue ``busy`` (kept
topped up by ``start_many``) for the whole measurement. The client process,
one asyncio loop, alternates, ``--samples`` times each:

* ``start()``: ``await app.start("t", {...}, queue="idle")`` through the app's
  pool, as an application calls it (validation, pool checkout, one prepared
  statement, commit, the NOTIFY);
* ``sync start()``: ``DurableClient.start`` (a web handler's call), same;
* baseline: ``INSERT INTO bench_bare (state) VALUES (%s)`` + commit on a
  dedicated autocommit psycopg connection (prepared), into a table with a
  uuid primary key and a jsonb column: the least a durable enqueue costs.

``--breakdown`` also times, in the same interleaved loop, where ``start()``'s
time goes: ``pool start_run`` (the same prepared ``start_run`` through the
app's pool, parameters built beforehand: no validation) and ``conn
start_run`` (that statement on a dedicated connection: no pool either), so
that ``start()`` - ``pool start_run`` is the Python before the statement,
``pool`` - ``conn`` the pool's checkout and ``conn`` - bare the server's
``start_run`` against a bare INSERT.

``--watched`` announces a listener on ``pgdurable_steps`` and ``pgdurable_done``
first (as an open dashboard does), so the worker's batches NOTIFY; by default
nobody listens and they do not (sql/0023_listener_presence.sql).
``--live-steps off`` sets ``pgdurable.live_steps = off`` on the database.

Target (issue 21): start() p50 <= 1.5x the bare INSERT's p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import psycopg
from _scratch import add_watch_args, drop_scratch, scratch_dsn, set_watch

from pgdurable import Continue, Done, Durable, DurableClient, RunContext, Start
from pgdurable.foundation.registry import start_params
from pgdurable.foundation.run_queries import START

DB = "pgdurable_bench_start_latency"
BARE = "INSERT INTO bench_bare (state) VALUES (%s::jsonb)"


def make_app(dsn: str) -> Durable:
    app = Durable(dsn, pool_size=8)

    @app.task("t", revision="1")
    async def t(ctx: RunContext, state: dict[str, Any]) -> Any:
        return Continue(state) if ctx.step < 2 else Done(None)

    return app


async def worker_main(dsn: str) -> None:
    async with make_app(dsn) as app:
        await app.worker(queues=["busy"], concurrency=32).run()


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def bench(dsn: str, samples: int, breakdown: bool = False) -> dict[str, list[float]]:
    worker = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--worker", "--dsn", dsn, stdout=subprocess.DEVNULL)
    app = make_app(dsn)
    await app.open()
    client = DurableClient(dsn, app=app)
    await asyncio.to_thread(client.open)
    bare = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await bare.execute("CREATE TABLE bench_bare (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                       "state jsonb NOT NULL)")
    out: dict[str, list[float]] = {"start()": [], "sync start()": [], "bare INSERT": []}
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True) if breakdown else None
    if breakdown:
        out |= {"pool start_run": [], "conn start_run": []}
    backlog = [Start("t", {"i": i}, queue="busy") for i in range(2000)]
    try:
        await app.start_many(backlog)
        await asyncio.sleep(0.5)  # the worker is busy
        for i in range(samples + 50):
            if i % (100 if breakdown else 200) == 0:  # the worker's backlog never runs dry
                await app.start_many(backlog)
            state = {"i": i, "user": "u-1", "prompt": "hello"}
            t0 = time.perf_counter()
            await app.start("t", state, queue="idle")
            t1 = time.perf_counter()
            client.start("t", state, queue="idle")
            t2 = time.perf_counter()
            await bare.execute(BARE, (psycopg.types.json.Jsonb(state),), prepare=True)
            t3 = time.perf_counter()
            if conn is not None:
                params = start_params(app._registry, "t", state, "idle", 0, None, None, None,
                                      None, None)
                t4 = time.perf_counter()
                await app.fetchone(START, params)
                t5 = time.perf_counter()
                await (await conn.execute(START, params, prepare=True)).fetchone()
                t6 = time.perf_counter()
                if i >= 50:
                    out["pool start_run"].append(t5 - t4)
                    out["conn start_run"].append(t6 - t5)
            if i >= 50:  # warm-up
                out["start()"].append(t1 - t0)
                out["sync start()"].append(t2 - t1)
                out["bare INSERT"].append(t3 - t2)
        busy = await app.fetchone("SELECT count(*) FILTER (WHERE status IN ('runnable', 'leased')), "
                                  "count(*) FILTER (WHERE status = 'completed') "
                                  "FROM pgdurable.runs WHERE queue = 'busy'", ())
        assert busy is not None and busy[0] > 0, "the worker ran dry: measure again"
        assert busy[1] > 0, "the worker completed nothing: it did not run"
        out["drained"] = [float(busy[1])]
    finally:
        worker.terminate()
        await worker.wait()
        await bare.close()
        if conn is not None:
            await conn.close()
        client.close()
        await app.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--samples", type=int, default=1500)
    ap.add_argument("--breakdown", action="store_true",
                    help="also time start_run through the pool and on a dedicated connection")
    add_watch_args(ap)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        asyncio.run(worker_main(args.dsn))
        return
    dsn = scratch_dsn(args.dsn, DB)
    try:
        set_watch(dsn, args)
        load0 = os.getloadavg()[0]
        t = time.monotonic()
        res = asyncio.run(bench(dsn, args.samples, args.breakdown))
        took = time.monotonic() - t
    finally:
        drop_scratch(args.dsn, DB)
    print(f"start() latency while a worker drains runs ({args.samples} samples each, "
          f"interleaved; {'watched' if args.watched else 'unwatched'}, live_steps "
          f"{args.live_steps}; load avg {load0:.1f} -> {os.getloadavg()[0]:.1f}; {took:.0f} s)")
    base = pct(res["bare INSERT"], 50)
    print(f"{'call':<16} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'p50 / bare':>10}")
    drained = int(res.pop("drained")[0])
    for name, xs in res.items():
        p50 = pct(xs, 50)
        print(f"{name:<16} {p50 * 1e3:8.3f} {pct(xs, 90) * 1e3:8.3f} {pct(xs, 99) * 1e3:8.3f} "
              f"{p50 / base:10.2f}")
    ratio = pct(res["start()"], 50) / base
    print(f"meanwhile the worker completed {drained} runs ({drained / took:.0f}/s)")
    print(f"ratio start() p50 / bare INSERT p50 = {ratio:.2f} "
          f"(target <= 1.50: {'met' if ratio <= 1.5 else 'NOT met'})")


if __name__ == "__main__":
    main()
