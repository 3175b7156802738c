"""What the CHECK of ``runs`` costs: one CHECK calling ``pgdurable._runs_check``
(sql/0025_runs_check.sql) against the 14 CHECK constraints it replaced.

One command::

    .venv/bin/python benchmarks/runs_check.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--rounds 4] [--seconds 4]

``--dsn`` names a maintenance database. Two scratch databases are made, both
migrated: ``pgdurable_bench_check_new`` as shipped, and
``pgdurable_bench_check_old``, where ``runs_check`` is dropped and the 14 old
CHECKs are put back (their definitions as in 0001, 0003, 0006, 0010 and 0017).
In each round, alternating, ``pgbench -M prepared -c 1`` runs for ``--seconds``
on each database:

* ``start_run``: one ``SELECT * FROM pgdurable.start_run(...)`` per transaction
  (the server's part of ``start()``);
* ``update 32``: one UPDATE of 32 runs per transaction (the shape of a
  ``write_steps`` batch or a claim of a cohort).

``synchronous_commit = off`` for both, so that the server's CPU is measured, not
the WAL flush. Printed: transactions/s per round and the ratio new / old; the
baseline is the old schema in the same round.
"""

from __future__ import annotations

import argparse
import statistics

import psycopg
from _pgbench import pgbench_tps
from _scratch import drop_scratch, scratch_dsn

NEW, OLD = "pgdurable_bench_check_new", "pgdurable_bench_check_old"
OLD_CHECKS = """
ALTER TABLE pgdurable.runs DROP CONSTRAINT runs_check,
  ADD CONSTRAINT runs_task_check CHECK (task <> ''),
  ADD CONSTRAINT runs_queue_check CHECK (queue <> ''),
  ADD CONSTRAINT runs_status_check CHECK (status IN ('runnable', 'leased', 'waiting',
    'completed', 'failed', 'cancelled', 'incompatible')),
  ADD CONSTRAINT runs_step_check CHECK (step >= 0),
  ADD CONSTRAINT runs_attempts_check CHECK (attempts >= 0),
  ADD CONSTRAINT runs_max_attempts_check CHECK (max_attempts > 0),
  ADD CONSTRAINT runs_claims_check CHECK (claims >= 0),
  ADD CONSTRAINT runs_reclaims_check CHECK (reclaims >= 0),
  ADD CONSTRAINT runs_budget_check CHECK (budget IS NULL OR budget >= 0),
  ADD CONSTRAINT runs_thread_key_check CHECK (thread_key <> ''),
  ADD CONSTRAINT runs_child_key_check CHECK (child_key <> ''),
  ADD CONSTRAINT runs_parent_policy_check CHECK (parent_policy IN ('cancel', 'abandon')),
  ADD CONSTRAINT runs_child_shape CHECK ((parent_run_id IS NULL) = (child_key IS NULL)
    AND (parent_run_id IS NULL) = (parent_policy IS NULL)
    AND (parent_run_id IS NULL) = (root_run_id IS NULL)),
  ADD CONSTRAINT runs_forked_from_step_check CHECK (forked_from_step IS NULL
    OR forked_from_step >= 0)
"""
SCRIPTS = {
    "start_run": "SELECT * FROM pgdurable.start_run('t', '1', '{\"n\": 1}', 'idle', 0, 3, "
                 "NULL, NULL, NULL, NULL);\n",
    "update 32": "UPDATE pgdurable.runs SET attempts = attempts + 1, updated_at = now() "
                 "WHERE queue = 'b32';\n",
}


def reset(dsn: str) -> None:
    """Empty runs, then 32 runs on queue b32 for the UPDATE."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("TRUNCATE pgdurable.runs CASCADE")
        c.execute("INSERT INTO pgdurable.runs (task, revision, queue) "
                  "SELECT 't', '1', 'b32' FROM generate_series(1, 32)")
        c.execute("VACUUM ANALYZE pgdurable.runs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args()
    new, old = scratch_dsn(args.dsn, NEW), scratch_dsn(args.dsn, OLD)
    try:
        with psycopg.connect(old, autocommit=True) as c:
            c.execute(OLD_CHECKS)
        ratios: dict[str, list[float]] = {name: [] for name in SCRIPTS}
        print(f"{'round':<6} {'statement':<10} {'14 CHECKs tps':>14} {'runs_check tps':>15} "
              f"{'new / old':>10}")
        for r in range(1, args.rounds + 1):
            for name, script in SCRIPTS.items():
                tps: dict[str, float] = {}
                # alternate which schema goes first
                for which in (("old", "new") if r % 2 else ("new", "old")):
                    dsn = old if which == "old" else new
                    reset(dsn)
                    tps[which] = pgbench_tps(dsn, script, ["-c", "1", "-T", str(args.seconds)],
                                             {"PGOPTIONS": "-c synchronous_commit=off"})
                ratio = tps["new"] / tps["old"]
                ratios[name].append(ratio)
                print(f"{r:<6} {name:<10} {tps['old']:>14,.0f} {tps['new']:>15,.0f} {ratio:>10.2f}")
        for name, rs in ratios.items():
            print(f"{name}: runs_check / 14 CHECKs, median {statistics.median(rs):.2f} "
                  f"(min {min(rs):.2f}, max {max(rs):.2f})")
    finally:
        drop_scratch(args.dsn, NEW, OLD)


if __name__ == "__main__":
    main()
