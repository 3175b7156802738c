"""End-to-end run throughput of one worker process vs pgbench single-row UPDATEs.

One command::

    .venv/bin/python benchmarks/throughput.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 5000] [--concurrency 32] [--pool-size 8] [--rounds 1]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its own scratch database ``pgdurable_bench_throughput`` and migrates it.

pgdurable side: ONE worker process (``python -m pgdurable.worker
_throughput_app:app --concurrency 32``) is started and warmed up with 500
runs; then, per round, the clock starts, ``--runs`` runs of the task
``noop3`` (3 no-op steps: two fenced checkpoints, then checkpoint +
completion in one statement) are enqueued in batches of 500 (one
``start_run`` statement per batch), and the clock stops at the last
completion (``max(finished_at)`` on the database clock; the driver is
benchmarks/_driver.py, shared with benchmarks/workflows.py). Reported:
runs/s and steps/s, enqueue to completion.

Baseline, in the same run and the same database: ``pgbench -n -M prepared
-c 32 -j 2`` doing as many single-row ``UPDATE`` commits as the runs had
steps (runs x 3) on a scratch table of 10,000 rows. Ratio = pgdurable
steps/s / pgbench commits/s (target >= 0.6, issue 21). Each pgdurable step is a whole
fenced transition (lock the run under the fence, update it, insert the
checkpoint history row), and every run also costs a start and a claim share,
so a ratio of 1 would mean a step costs one bare UPDATE.
"""

from __future__ import annotations

import argparse
import math

import psycopg
from _driver import load, spread, timed_runs, worker_process
from _pgbench import pgbench_tps
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_throughput"
STEPS = 3


def run_pgbench(dsn: str, commits: int, clients: int) -> float:
    """pgbench commits/s for ``commits`` single-row UPDATE transactions."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS bench_counter")
        c.execute("CREATE TABLE bench_counter (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)")
        c.execute("INSERT INTO bench_counter (id) SELECT g FROM generate_series(1, 10000) g")
        c.execute("VACUUM ANALYZE bench_counter")
    return pgbench_tps(
        dsn, "\\set id random(1, 10000)\nUPDATE bench_counter SET v = v + 1 WHERE id = :id;\n",
        ["-c", str(clients), "-j", "2", "-t", str(math.ceil(commits / clients))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        print(f"{args.runs} runs x {STEPS} no-op steps, one worker process, concurrency "
              f"{args.concurrency}, pool {args.pool_size}; pgbench: {args.runs * STEPS} "
              f"single-row UPDATE commits at {args.concurrency} clients; {load()}")
        ratios = []
        with (psycopg.connect(dsn, autocommit=True) as c,
              worker_process(dsn, "_throughput_app:app", concurrency=args.concurrency,
                             pool_size=args.pool_size)):
            timed_runs(c, "noop3", 500)  # warm-up (prepared statements, caches)
            for r in range(1, args.rounds + 1):
                secs = timed_runs(c, "noop3", args.runs)
                runs_s, steps_s = args.runs / secs, args.runs * STEPS / secs
                tps = run_pgbench(dsn, args.runs * STEPS, args.concurrency)
                ratios.append(steps_s / tps)
                print(f"round {r}: pgdurable {runs_s:7.0f} runs/s {steps_s:7.0f} steps/s "
                      f"({secs:.2f} s) | pgbench {tps:7.0f} commits/s | "
                      f"ratio steps/commits {steps_s / tps:.2f}")
        print(f"ratio steps/commits: {spread(ratios)} (target >= 0.6); {load()}")
    finally:
        drop_scratch(args.dsn, DB)


if __name__ == "__main__":
    main()
