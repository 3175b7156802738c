"""Claim latency with an empty table vs with 1,000,000 finished and parked runs.

One command::

    .venv/bin/python benchmarks/claim_scaling.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--rows 1000000] [--samples 2000]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) two scratch databases, ``pgdurable_bench_claims_empty`` and
``pgdurable_bench_claims_full``, and migrates them.

Each sample: one runnable run is started (not timed), then ONE
``pgdurable.claim_runs`` call (limit 1, prepared, one round trip) is timed
from the client, then the run is completed (not timed), in two databases:

1. ``empty``: only the sampled runs themselves;
2. ``full``: after bulk-inserting ``--rows`` runs with ``generate_series``:
   half ``completed``, a quarter ``waiting`` on a signal with no timer and a
   quarter ``waiting`` on a timer a day away (none claimable), then
   ``VACUUM ANALYZE``.

The two are sampled in alternating blocks of 100 claims, so that load from
other processes on the machine hits both alike.

Printed: p50/p90/p99 per phase and the ratio full/empty of the p50 (target
<= 1.5: claim cost stays flat as completed and parked runs accumulate, because
each claim branch reads only its partial index).
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from _scratch import drop_scratch, scratch_dsn

DBS = ("pgdurable_bench_claims_empty", "pgdurable_bench_claims_full")
START = ("SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, "
         "NULL, NULL)")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('bench', %s::text[], %s::text[], "
         "%s::text[], 1, '60 s'::interval)")
COMPLETE = "SELECT pgdurable.complete_run(%s, %s, 'bench', '{}', 'null', 0)"
BULK = """
INSERT INTO pgdurable.runs (task, revision, status, step, finished_at, result)
SELECT 't', '1', 'completed', 3, now() - interval '1 hour', 'null'
  FROM generate_series(1, %(completed)s);
INSERT INTO pgdurable.runs (task, revision, status, wait_kind, wait_ref, wait_since)
SELECT 't', '1', 'waiting', 'approval', 'ref-' || g, now()
  FROM generate_series(1, %(signal)s) g;
INSERT INTO pgdurable.runs (task, revision, status, wait_since, wake_at)
SELECT 't', '1', 'waiting', now(), now() + interval '1 day' + g * interval '1 ms'
  FROM generate_series(1, %(timer)s) g;
"""


def sample(conn: psycopg.Connection[object], n: int) -> list[float]:
    """Claim latencies (ms) of ``n`` single-run claims."""
    out: list[float] = []
    args = (["default"], ["t"], ["1"])
    for _ in range(n):
        conn.execute(START, prepare=True)
        t = time.perf_counter()
        row = conn.execute(CLAIM, args, prepare=True).fetchone()
        out.append((time.perf_counter() - t) * 1000)
        assert row is not None
        conn.execute(COMPLETE, row, prepare=True)
    return out


def pct(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100)[int(p) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    try:
        dsns = [scratch_dsn(args.dsn, db) for db in DBS]
        with psycopg.connect(dsns[0], autocommit=True) as c0, \
                psycopg.connect(dsns[1], autocommit=True) as c1:
            t = time.perf_counter()
            half, quarter = args.rows // 2, args.rows // 4
            counts = {"completed": half, "signal": quarter, "timer": args.rows - half - quarter}
            for stmt in BULK.strip().split(";\n"):
                c1.execute(stmt.strip().rstrip(";"), counts)
            for c in (c0, c1):
                c.execute("VACUUM ANALYZE pgdurable.runs")
            total = c1.execute("SELECT count(*) FROM pgdurable.runs").fetchone()
            print(f"bulk insert + VACUUM ANALYZE of {args.rows} runs: "
                  f"{time.perf_counter() - t:.1f} s (table now {total[0] if total else '?'} rows)")
            sample(c0, 50)  # warm up: plans cached, statements prepared
            sample(c1, 50)
            empty: list[float] = []
            full: list[float] = []
            for _ in range(max(1, args.samples // 100)):
                empty += sample(c0, 100)
                full += sample(c1, 100)
        print(f"{args.samples} claims per phase (limit 1, one round trip each)")
        for name, v in (("empty", empty), ("full", full)):
            print(f"  {name:5}: p50 {pct(v, 50):.3f} ms  p90 {pct(v, 90):.3f} ms  "
                  f"p99 {pct(v, 99):.3f} ms")
        print(f"ratio full/empty p50: {pct(full, 50) / pct(empty, 50):.2f} (target <= 1.5)")
    finally:
        drop_scratch(args.dsn, *DBS)


if __name__ == "__main__":
    main()
