"""Cost of the database boundary: pinned search_path + SECURITY DEFINER (0009).

One command::

    .venv/bin/python benchmarks/boundary_overhead.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--blocks 20] [--batch 16]

Two scratch databases, both migrated: ``pinned`` as shipped, and ``baseline``
where every pgdurable function gets ``RESET search_path`` and ``SECURITY
INVOKER`` (the state before 0009). Each block, in each database alternately
(so that load from other processes hits both alike): start ``--batch`` runs
(not timed), then time ONE ``claim_runs`` of them and ONE ``write_steps``
completing them all (the worker's hot path), and 50 lease acquire + release
pairs. Printed: p50 per phase and database, and the ratio pinned/baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from _scratch import drop_scratch, scratch_dsn

DBS = ("pgdurable_bench_boundary_pinned", "pgdurable_bench_boundary_baseline")
UNPIN = """
DO $$
DECLARE f regprocedure;
BEGIN
  FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE pronamespace = 'pgdurable'::regnamespace
  LOOP
    EXECUTE format('ALTER ROUTINE %s RESET search_path', f);
    EXECUTE format('ALTER ROUTINE %s SECURITY INVOKER', f);
  END LOOP;
END $$
"""
START = ("SELECT (pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, NULL, "
         "NULL)).run_id FROM generate_series(1, %s)")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('w', '{default}', '{t}', '{1}', %s, "
         "'1 min')")
WRITE = ("SELECT * FROM pgdurable.write_steps('w', %s::uuid[], %s::bigint[], %s::jsonb[], "
         "%s::numeric[], %s::boolean[], %s::jsonb[])")
ACQ = "SELECT acquired FROM pgdurable.acquire_lease('k', 'o', 10000)"
REL = "SELECT pgdurable.release_lease('k', 'o')"


def block(c: psycopg.Connection, batch: int, out: dict[str, list[float]]) -> None:
    c.execute(START, (batch,)).fetchall()
    t = time.perf_counter()
    rows = c.execute(CLAIM, (batch,), prepare=True).fetchall()
    out["claim"].append(time.perf_counter() - t)
    n = len(rows)
    t = time.perf_counter()
    c.execute(WRITE, ([r[0] for r in rows], [r[1] for r in rows], ["{}"] * n, [0] * n,
                      [True] * n, ["1"] * n), prepare=True).fetchall()
    out["write_steps"].append(time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(50):
        c.execute(ACQ, prepare=True).fetchone()
        c.execute(REL, prepare=True).fetchone()
    out["lease pair"].append((time.perf_counter() - t) / 50)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    dsns = [scratch_dsn(a.dsn, db) for db in DBS]
    try:
        with psycopg.connect(dsns[1], autocommit=True) as c:
            c.execute(UNPIN)
        results: list[dict[str, list[float]]] = [
            {"claim": [], "write_steps": [], "lease pair": []} for _ in dsns]
        conns = [psycopg.connect(d, autocommit=True) for d in dsns]
        try:
            for _ in range(3):  # warm-up
                for c in conns:
                    block(c, a.batch, {"claim": [], "write_steps": [], "lease pair": []})
            for _ in range(a.blocks):
                for c, out in zip(conns, results, strict=True):
                    block(c, a.batch, out)
        finally:
            for c in conns:
                c.close()
        print(f"{'phase':<12} {'pinned p50 ms':>14} {'baseline p50 ms':>16} {'ratio':>7}")
        for phase in results[0]:
            p = statistics.median(results[0][phase]) * 1000
            b = statistics.median(results[1][phase]) * 1000
            print(f"{phase:<12} {p:>14.3f} {b:>16.3f} {p / b:>7.2f}")
    finally:
        drop_scratch(a.dsn, *DBS)


if __name__ == "__main__":
    main()
