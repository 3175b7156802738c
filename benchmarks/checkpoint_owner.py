"""Cost of recording the lease owner with each checkpoint (migration checkpoint_owner).

One command::

    .venv/bin/python benchmarks/checkpoint_owner.py [--dsn ...] [--blocks 200] [--batch 16]

Two scratch databases migrated alike; in the baseline one, ``write_steps`` is
put back to its 0003_runs text (no ``owner`` in the history row). Each block
starts ``--batch`` runs and claims them (not timed), then times ONE
``write_steps`` checkpointing them all (the worker's hot path, autocommit),
alternating the two databases block by block (load hits both alike).
Printed: p50 of each and the ratio with owner / without (target: 1.0 within
the noise).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path

import psycopg
from _scratch import drop_scratch, scratch_dsn

DBS = ("pgdurable_bench_owner_with", "pgdurable_bench_owner_without")
START = ("SELECT (pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, NULL, "
         "NULL)).run_id FROM generate_series(1, %s)")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('w', '{default}', '{t}', '{1}', %s, "
         "'1 min')")
WRITE = ("SELECT * FROM pgdurable.write_steps('w', %s::uuid[], %s::bigint[], %s::jsonb[], "
         "%s::numeric[], %s::boolean[], %s::jsonb[])")


def old_write_steps() -> str:
    """write_steps as 0003_runs defined it (CREATE OR REPLACE), from the shipped file."""
    text = (Path(__file__).parent.parent / "sql" / "0003_runs.sql").read_text()
    m = re.search(r"CREATE FUNCTION pgdurable\.write_steps\(.*?\n\$\$;\n", text, re.S)
    assert m is not None
    return m.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    out: dict[str, list[float]] = {"with": [], "without": []}
    try:
        dsns = [scratch_dsn(a.dsn, db) for db in DBS]
        with psycopg.connect(dsns[1], autocommit=True) as c:
            c.execute(old_write_steps())
            c.execute("SELECT pgdurable.secure_schema()")
        with psycopg.connect(dsns[0], autocommit=True) as w, \
                psycopg.connect(dsns[1], autocommit=True) as wo:
            for i in range(a.blocks * 2):
                mode, c = ("with", w) if i % 2 == 0 else ("without", wo)
                c.execute(START, (a.batch,)).fetchall()
                rows = c.execute(CLAIM, (a.batch,), prepare=True).fetchall()
                n = len(rows)
                t = time.perf_counter()
                c.execute(WRITE, ([r[0] for r in rows], [r[1] for r in rows], ["{}"] * n,
                                  [0] * n, [False] * n, [None] * n), prepare=True).fetchall()
                out[mode].append(time.perf_counter() - t)
            owners = w.execute("SELECT count(*) FILTER (WHERE owner = 'w'), count(*) "
                               "FROM pgdurable.checkpoints").fetchone()
            none = wo.execute("SELECT count(owner) FROM pgdurable.checkpoints").fetchone()
            assert owners is not None and owners[0] == owners[1] > 0 and none == (0,)
    finally:
        drop_scratch(a.dsn, *DBS)
    on, off = statistics.median(out["with"]), statistics.median(out["without"])
    print(f"write_steps x{a.batch}: p50 with owner {on * 1000:.2f} ms, without {off * 1000:.2f} ms,"
          f" ratio {on / off:.2f}")


if __name__ == "__main__":
    main()
