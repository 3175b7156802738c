"""Cost of the live-step NOTIFY (one pg_notify per write_steps statement, the run_metadata migration).

One command::

    .venv/bin/python benchmarks/live_steps_overhead.py [--dsn ...] [--blocks 200] [--batch 16]

One scratch database. Each block starts ``--batch`` runs and claims them (not
timed), then times ONE ``write_steps`` checkpointing them all (Continue steps, so
no other NOTIFY; the worker's hot path, autocommit: statement and commit), alternating blocks with
a dashboard present (``pgdurable.listen_presence('pgdurable_steps')``: the
NOTIFY is sent) and nobody listening (the default for a database no dashboard
watches: no NOTIFY, one lookup in ``pgdurable.listeners``). Printed: p50 of
each and the ratio watched/unwatched. A single client: the NOTIFY's
cluster-wide commit lock (PITFALLS 1) costs more under many concurrent
committers than measured here.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_live_steps"
START = ("SELECT (pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, NULL, "
         "NULL)).run_id FROM generate_series(1, %s)")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('w', '{default}', '{t}', '{1}', %s, "
         "'1 min')")
WRITE = ("SELECT * FROM pgdurable.write_steps('w', %s::uuid[], %s::bigint[], %s::jsonb[], "
         "%s::numeric[], %s::boolean[], %s::jsonb[])")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    out: dict[str, list[float]] = {"watched": [], "unwatched": []}
    try:
        dsn = scratch_dsn(a.dsn, DB)
        with psycopg.connect(dsn, autocommit=True) as c:
            for i in range(a.blocks):
                mode = "watched" if i % 2 == 0 else "unwatched"
                if mode == "watched":
                    c.execute("SELECT pgdurable.listen_presence('pgdurable_steps', 3600)")
                else:
                    c.execute("UPDATE pgdurable.listeners SET until = NULL")
                c.execute(START, (a.batch,)).fetchall()
                rows = c.execute(CLAIM, (a.batch,), prepare=True).fetchall()
                n = len(rows)
                t = time.perf_counter()
                c.execute(WRITE, ([r[0] for r in rows], [r[1] for r in rows], ["{}"] * n,
                                  [0] * n, [False] * n, [None] * n), prepare=True).fetchall()
                out[mode].append(time.perf_counter() - t)
    finally:
        drop_scratch(a.dsn, DB)
    on, off = statistics.median(out["watched"]), statistics.median(out["unwatched"])
    print(f"write_steps x{a.batch}: p50 watched (NOTIFY) {on * 1000:.2f} ms, unwatched "
          f"{off * 1000:.2f} ms, ratio {on / off:.2f}")


if __name__ == "__main__":
    main()
