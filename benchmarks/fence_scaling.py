"""The fences (``write_steps``, ``renew_runs``, the single-run ``_fenced``) against
the number of runs the rest of the fleet holds: sql/0028_fence_by_primary_key.sql
against the functions it replaced.

One command::

    .venv/bin/python benchmarks/fence_scaling.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--finished 20000] [--leased 32,1000,5000] [--calls 300] [--rounds 2]

``--dsn`` names a maintenance database. Two scratch databases: ``new``
migrated as shipped, ``old`` up to 0027 (the baseline). Each holds
``--finished`` completed runs. For each number L of ``--leased``, and for each
of two states of the planner's statistics (``ANALYZE`` taken while no run was
leased, and while the L runs were), L runs are leased by another owner; then,
alternating the databases, this client (prepared statements, one connection
per database) times ``--calls`` times each, on runs it claims just before
(untimed) and completes just after (untimed):

* ``write 1``: ``write_steps`` of one run (one step of a trickle);
* ``write 16``: ``write_steps`` of 16 runs (a worker's batch);
* ``renew 16``: ``renew_runs`` of 16 leases (a heartbeat);
* ``emit 1``: ``emit_event`` of one run (a single-run transition: ``_fenced``).

Printed: p50 per case in each database and the ratio new / old (lower is
better). The fenced work is the same; what differs is how the rows are found
(runs_leased_idx or the primary key) and whether each call is planned again.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

NEW, OLD = "pgdurable_bench_fence_new", "pgdurable_bench_fence_old"
START = ("SELECT pgdurable.start_run(%s, '1', '{}', 'q', 0, 3, NULL, NULL, NULL, NULL) "
         "FROM generate_series(1, %s)")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs(%s, '{q}', ARRAY[%s], '{1}', %s, "
         "'1 hour')")
WRITE = ("SELECT * FROM pgdurable.write_steps('bench', %s::uuid[], %s::bigint[], %s::jsonb[], "
         "%s::numeric[], %s::boolean[], %s::jsonb[])")
RENEW = "SELECT * FROM pgdurable.renew_runs('bench', %s::uuid[], %s::bigint[], '1 hour')"
EMIT = "SELECT pgdurable.emit_event(%s, %s, 'bench', 0, '{}')"


def prepare(dsn: str, finished: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(START, ("done", finished))
        c.execute("UPDATE pgdurable.runs SET status = 'completed', finished_at = now()")
        c.execute("VACUUM ANALYZE pgdurable.runs")


def lease_others(dsn: str, leased: int, analyze_after: bool) -> None:
    """``leased`` runs held by owner 'fleet' (the rest of the fleet), and the
    statistics taken before they were leased or after."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DELETE FROM pgdurable.runs WHERE task <> 'done'")
        c.execute("ANALYZE pgdurable.runs")
        c.execute(START, ("fleet", leased))
        c.execute(CLAIM, ("fleet", "fleet", leased)).fetchall()
        if analyze_after:
            c.execute("ANALYZE pgdurable.runs")


def timed(c: psycopg.Connection[Any], calls: int, case: str) -> float:
    """p50 seconds of ``case`` over ``calls`` calls, each on runs just claimed by
    'bench' (untimed) and completed after it (untimed): 'bench' holds at most one
    batch, so the leased runs are the fleet's plus that batch."""
    n = 16 if case.endswith("16") else 1
    c.execute(START, ("bench", calls * n))

    def write(batch: list[Any], done: bool) -> object:
        k = len(batch)
        return c.execute(WRITE, ([r[0] for r in batch], [r[1] for r in batch], ["{}"] * k,
                                 [0] * k, [done] * k, [None] * k), prepare=True).fetchall()

    def renew(batch: list[Any]) -> object:
        return c.execute(RENEW, ([r[0] for r in batch], [r[1] for r in batch]),
                         prepare=True).fetchall()

    ts = []
    for _ in range(calls):
        batch = c.execute(CLAIM, ("bench", "bench", n), prepare=True).fetchall()
        t0 = time.perf_counter()
        if case == "renew 16":
            renew(batch)
        elif case == "emit 1":
            c.execute(EMIT, batch[0], prepare=True).fetchone()
        else:
            write(batch, False)
        ts.append(time.perf_counter() - t0)
        write(batch, True)
    c.execute("DELETE FROM pgdurable.runs WHERE task = 'bench'")
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--finished", type=int, default=20000)
    ap.add_argument("--leased", default="32,1000,5000")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    dbs = {"new": scratch_dsn(a.dsn, NEW), "old": scratch_dsn(a.dsn, OLD, before=28)}
    try:
        for d in dbs.values():
            prepare(d, a.finished)
        print(f"{'leased':>6} {'stats':<14} {'case':<9} {'old p50 ms':>10} {'new p50 ms':>10} "
              f"{'new / old':>9}")
        ratios = []
        for leased in (int(x) for x in a.leased.split(",")):
            for analyze_after in (False, True):
                for d in dbs.values():
                    lease_others(d, leased, analyze_after)
                stats = "with L leased" if analyze_after else "none leased"
                for case in ("write 1", "write 16", "renew 16", "emit 1"):
                    p50: dict[str, list[float]] = {"new": [], "old": []}
                    for r in range(a.rounds):
                        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
                            # a new connection: its own plans, made with these statistics
                            with psycopg.connect(dbs[name], autocommit=True) as c:
                                p50[name].append(timed(c, a.calls, case))
                    old, new = statistics.median(p50["old"]), statistics.median(p50["new"])
                    ratios.append(new / old)
                    print(f"{leased:>6} {stats:<14} {case:<9} {old * 1000:>10.3f} "
                          f"{new * 1000:>10.3f} {new / old:>9.2f}")
        print(f"new / old over every case: median {statistics.median(ratios):.2f} "
              f"(min {min(ratios):.2f}, max {max(ratios):.2f})")
    finally:
        drop_scratch(a.dsn, NEW, OLD)


if __name__ == "__main__":
    main()
