"""Batch start: ``start_many`` of N runs against N single ``start()`` calls.

One command::

    .venv/bin/python benchmarks/start_many.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and drops) the
scratch database ``pgdurable_bench_start_many``. One client process, no
worker. Alternating, ``--rounds`` times each (after one warm-up round):

* ``start_many``: ``await app.start_many([...])`` of ``--n`` runs (default
  500), each with its own state and metadata label (one statement, one
  commit, one NOTIFY);
* baseline: the same ``--n`` runs started with ``await app.start(...)`` one
  after the other (N statements, N commits, N NOTIFYs).

Runs/s = runs / wall time of the calls. Target (issue 21): start_many >=
10,000 runs/s at N = 500.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from _scratch import drop_scratch, scratch_dsn

from pgdurable import Durable, Start

DB = "pgdurable_bench_start_many"


async def bench(dsn: str, n: int, rounds: int) -> tuple[list[float], list[float]]:
    many: list[float] = []
    single: list[float] = []
    async with Durable(dsn, pool_size=2) as app:
        for r in range(rounds + 1):  # round 0: warm-up
            starts = [Start("agent", {"round": r, "i": i}, revision="1",
                            metadata={"tenant": f"t{i % 10}"}) for i in range(n)]
            t0 = time.perf_counter()
            ids = await app.start_many(starts)
            t1 = time.perf_counter()
            for s in starts:
                await app.start(s.task, s.state, revision=s.revision, metadata=s.metadata)
            t2 = time.perf_counter()
            assert len(set(ids)) == n
            if r > 0:
                many.append(n / (t1 - t0))
                single.append(n / (t2 - t1))
    return many, single


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        load0 = os.getloadavg()[0]
        many, single = asyncio.run(bench(dsn, args.n, args.rounds))
    finally:
        drop_scratch(args.dsn, DB)
    print(f"start {args.n} runs: start_many vs {args.n} x start() ({args.rounds} alternating "
          f"rounds; load avg {load0:.1f} -> {os.getloadavg()[0]:.1f})")
    print(f"{'call':<22} {'median runs/s':>14} {'min':>8} {'max':>8}")
    for name, xs in ((f"start_many({args.n})", many), (f"{args.n} x start()", single)):
        print(f"{name:<22} {statistics.median(xs):14.0f} {min(xs):8.0f} {max(xs):8.0f}")
    m = statistics.median(many)
    print(f"ratio start_many / single starts = {m / statistics.median(single):.1f}x")
    print(f"start_many runs/s = {m:.0f} (target >= 10,000: {'met' if m >= 10_000 else 'NOT met'})")


if __name__ == "__main__":
    main()
