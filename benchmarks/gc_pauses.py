"""Garbage-collector pauses in a busy worker, with and without ``gc.freeze()``.

One command::

    .venv/bin/python benchmarks/gc_pauses.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 10000] [--rounds 2]

``--dsn`` names a maintenance database; the benchmark creates (and drops) the
scratch database ``pgdurable_bench_gc``. Each measurement is a fresh Python
process that opens the app, starts ``--runs`` three-step ``noop3`` runs with
``start_many``, then drains them with one in-process worker (concurrency 32),
timing every collection with ``gc.callbacks``. Two modes, alternated
``--rounds`` times:

* ``plain``: as ``Worker.run()`` runs by default;
* ``frozen``: ``gc.collect(); gc.freeze()`` after the app is open, as
  ``python -m pgdurable.worker`` (and ``pgdurable worker``) does.

A pause stalls every run the worker holds, and its heartbeats. Printed per
mode: the longest pause of each generation, all collections' total time,
runs/s and the worker's CPU per run; then the ratio frozen / plain of the
longest full (generation 2) pause and of the total time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

from pgdurable import Continue, Done, Durable, RunContext, Start

DB = "pgdurable_bench_gc"


async def measure(dsn: str, runs: int, frozen: bool) -> dict[str, Any]:
    app = Durable(dsn, pool_size=8)

    @app.task("noop3", revision="1")
    async def noop3(ctx: RunContext, state: dict[str, Any]) -> Any:
        i = state.get("i", 0) + 1
        return Done(i) if i >= 3 else Continue({"i": i})

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute("TRUNCATE pgdurable.runs CASCADE")  # the previous round's runs
    await app.open()
    for _ in range(0, runs, 500):
        await app.start_many([Start("noop3", {}) for _ in range(500)])
    if frozen:
        gc.collect()
        gc.freeze()
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    began = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - began[0])

    gc.callbacks.append(timed)
    worker = app.worker(concurrency=32, poll_interval=5)
    cpu, wall = time.process_time(), time.monotonic()
    task = asyncio.create_task(worker.run())
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        while True:
            cur = await c.execute("SELECT count(*) FROM pgdurable.runs WHERE status <> 'completed'")
            row = await cur.fetchone()
            if row is None or row[0] == 0:
                break
            await asyncio.sleep(0.02)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    gc.callbacks.remove(timed)
    await worker.stop(grace=1)
    await task
    await app.close()
    return {"max_ms": {g: 1e3 * max(p, default=0.0) for g, p in pauses.items()},
            "count": {g: len(p) for g, p in pauses.items()},
            "total_ms": 1e3 * sum(sum(p) for p in pauses.values()),
            "runs_s": runs / wall, "cpu_us": 1e6 * cpu / runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", choices=["plain", "frozen"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(measure(args.dsn, args.runs, args.child == "frozen"))))
        return
    dsn = scratch_dsn(args.dsn, DB)
    got: dict[str, list[dict[str, Any]]] = {"plain": [], "frozen": []}
    try:
        for _ in range(args.rounds):
            for mode in got:
                out = subprocess.run([sys.executable, __file__, "--child", mode, "--dsn", dsn,
                                      "--runs", str(args.runs)],
                                     check=True, capture_output=True, text=True).stdout
                got[mode].append(json.loads(out.splitlines()[-1]))
    finally:
        drop_scratch(args.dsn, DB)
    print(f"GC pauses while one in-process worker drains {args.runs} three-step runs "
          f"({args.rounds} alternated rounds per mode)")
    print(f"{'mode':<7} {'gen0 max':>9} {'gen1 max':>9} {'gen2 max':>9} {'gen2 n':>7} "
          f"{'GC total':>9} {'runs/s':>7} {'CPU us/run':>10}")
    for mode, rows in got.items():
        for r in rows:
            m = r["max_ms"]
            print(f"{mode:<7} {m['0']:7.2f}ms {m['1']:7.2f}ms {m['2']:7.2f}ms "
                  f"{r['count']['2']:>7} {r['total_ms']:7.1f}ms {r['runs_s']:7.0f} "
                  f"{r['cpu_us']:10.0f}")

    def gen2(mode: str) -> float:  # the longest full collection of any round
        return max(r["max_ms"]["2"] for r in got[mode])

    def total(mode: str) -> float:  # all collections' time, the worst round
        return max(r["total_ms"] for r in got[mode])

    print(f"ratio frozen / plain: longest gen2 pause "
          f"{gen2('frozen') / max(gen2('plain'), 1e-9):.2f}, "
          f"GC total {total('frozen') / total('plain'):.2f} (worst round of each)")

if __name__ == "__main__":
    main()
