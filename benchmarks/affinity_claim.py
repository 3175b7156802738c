"""What run affinity (sql/*_run_affinity.sql) costs the claim of runs that have none.

One command::

    .venv/bin/python benchmarks/affinity_claim.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--rows 1000000] [--runs 1000] [--rounds 6]

``--dsn`` names a maintenance database. Three scratch databases are made, each
holding ``--rows`` finished and parked runs (claim_scaling.py's mix: half
``completed``, a quarter waiting on a signal, a quarter on a timer a day away),
``VACUUM ANALYZE``d:

* ``old``: migrated up to the migration before the affinity one (the claim,
  _claim_flow and next_wakeup of 0016/0021: the baseline);
* ``new``: migrated as shipped, no run has affinity;
* ``new+affine``: as shipped, with a worker present and, pinned to it, 1,000
  parked runs (timers a day away) and 20 ready runs reserved for it at a
  higher priority than everything else: every other worker's claim passes over
  those 20 first (the filter's worst case for the plain runs behind them).

In each round, in alternating order, each database is vacuumed and gets
``--runs`` runnable runs without affinity; ONE ``DO`` block then claims each
(``claim_runs``, limit 1, as another worker) timed with ``clock_timestamp()``
and completes it untimed: server time per claim, without the client's round
trip or a commit. Around that block, the backend's time on a CPU
(``/proc/PID/schedstat``, when the server runs on this machine: other
processes' load does not count) gives the CPU per claim and completion. After
all the claim rounds, in as many rounds, a ``DO`` block calls an idle worker's
``next_wakeup`` 50 times (backend CPU per call). Printed: per round, and the
medians with their ratio against ``old``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from _scratch import drop_scratch, scratch_dsn
from claim_scaling import BULK

from pgdurable.foundation import migrations

DBS = {"old": "pgdurable_bench_aff_old", "new": "pgdurable_bench_aff_new",
       "new+affine": "pgdurable_bench_aff_affine"}
START_MANY = ("INSERT INTO pgdurable.runs (task, revision, queue) "
              "SELECT 't', '1', 'default' FROM generate_series(1, %s)")
CLAIM_EACH = """
DO $$
DECLARE
  r record;
  t0 timestamptz;
  spent interval := interval '0';
BEGIN
  FOR i IN 1..current_setting('bench.runs')::integer LOOP
    t0 := clock_timestamp();
    SELECT c.id, c.lease_token INTO r
      FROM pgdurable.claim_runs('bench', '{default}', '{t}', '{1}', 1, '600 s') c;
    spent := spent + (clock_timestamp() - t0);
    IF r.id IS NULL THEN
      RAISE EXCEPTION 'nothing to claim';
    END IF;
    PERFORM pgdurable.complete_run(r.id, r.lease_token, 'bench', '{}', '{}', 0);
  END LOOP;
  PERFORM set_config('bench.ms', (extract(epoch FROM spent) * 1000)::text, false);
END
$$"""
WAKEUP_EACH = """
DO $$
BEGIN
  FOR i IN 1..current_setting('bench.n')::integer LOOP
    PERFORM pgdurable.next_wakeup('{default}', '{t}', '{1}');
  END LOOP;
END
$$"""
AFFINE = """
SELECT pgdurable.worker_present('holder', 'h1', interval '1 day');
INSERT INTO pgdurable.runs (task, revision, status, wait_since, wake_at, affinity_worker,
                            affinity_instance, affinity_mode, affinity_wait)
SELECT 't', '1', 'waiting', now(), now() + interval '1 day', 'holder', 'h1', 'hard',
       interval '1 day' FROM generate_series(1, 1000);
INSERT INTO pgdurable.runs (task, revision, priority, affinity_worker, affinity_instance,
                            affinity_mode, affinity_wait)
SELECT 't', '1', 10, 'holder', 'h1', 'hard', interval '1 day' FROM generate_series(1, 20)
"""


def before_affinity() -> int:
    """The number of the affinity migration (found by name: it may be renumbered)."""
    (m,) = [m for m in migrations.load_migrations() if m.name.endswith("_run_affinity.sql")]
    return m.version


def on_cpu_ns(conn: psycopg.Connection[object]) -> int | None:
    """The connection's backend's time on a CPU so far (ns, /proc/PID/schedstat),
    None when the server is not on this machine: unlike a clock, other processes
    taking the CPUs do not count."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def per_claim_us(conn: psycopg.Connection[object], runs: int) -> tuple[float, float | None]:
    """(server time per claim, backend CPU per claim and its completion), µs."""
    # every block starts from a vacuumed table: the dead index entries that the
    # previous block's claims left would otherwise make each block slower than
    # the one before (PITFALLS #8), whatever the schema
    conn.execute("VACUUM pgdurable.runs")
    conn.execute(START_MANY, (runs,))
    conn.execute("SELECT set_config('bench.runs', %s, false)", (str(runs),))
    cpu0 = on_cpu_ns(conn)
    conn.execute(CLAIM_EACH)
    cpu1 = on_cpu_ns(conn)
    row = conn.execute("SELECT current_setting('bench.ms')::float8").fetchone()
    assert row is not None
    cpu = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / 1000 / runs
    return float(row[0]) * 1000 / runs, cpu


def per_wakeup_us(conn: psycopg.Connection[object], n: int) -> float:
    """Backend CPU per idle next_wakeup (µs; server time where CPU is not known)."""
    conn.execute("SELECT set_config('bench.n', %s, false)", (str(n),))
    cpu0 = on_cpu_ns(conn)
    t = time.perf_counter()
    conn.execute(WAKEUP_EACH)
    wall = time.perf_counter() - t
    cpu1 = on_cpu_ns(conn)
    if cpu0 is None or cpu1 is None:
        return wall * 1e6 / n
    return (cpu1 - cpu0) / 1000 / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    try:
        dsns = {k: scratch_dsn(args.dsn, db, before=before_affinity() if k == "old" else None)
                for k, db in DBS.items()}
        conns = {k: psycopg.connect(d, autocommit=True) for k, d in dsns.items()}
        half, quarter = args.rows // 2, args.rows // 4
        counts = {"completed": half, "signal": quarter, "timer": args.rows - half - quarter}
        for k, c in conns.items():
            for stmt in BULK.strip().split(";\n"):
                c.execute(stmt.strip().rstrip(";"), counts)
            if k == "new+affine":
                for stmt in AFFINE.strip().split(";\n"):
                    c.execute(stmt)
            c.execute("VACUUM ANALYZE pgdurable.runs")
            per_claim_us(c, 100)  # warm up: plans cached
        claims: dict[str, list[float]] = {k: [] for k in conns}
        cpus: dict[str, list[float]] = {k: [] for k in conns}
        polls: dict[str, list[float]] = {k: [] for k in conns}
        order = list(conns)
        # claims first, then idle polls: an idle poll of the old schema reads every
        # parked timer, and interleaved with the claims it slowed the claims after it
        for r in range(args.rounds):
            for k in order if r % 2 == 0 else reversed(order):
                claim, cpu = per_claim_us(conns[k], args.runs)
                claims[k].append(claim)
                if cpu is not None:
                    cpus[k].append(cpu)
            print(f"claims, round {r + 1}: " + "  ".join(
                f"{k} {claims[k][-1]:.1f} µs"
                + (f" (cpu {cpus[k][-1]:.1f} µs with its completion)" if cpus[k] else "")
                for k in order), flush=True)
        for r in range(args.rounds):
            for k in order if r % 2 == 0 else reversed(order):
                polls[k].append(per_wakeup_us(conns[k], 50))
            print(f"idle polls, round {r + 1}: "
                  + "  ".join(f"{k} {polls[k][-1]:.0f} µs" for k in order), flush=True)
        for c in conns.values():
            c.close()
        print(f"{args.rows} finished/parked runs; {args.runs} claims per round and database; "
              f"medians of {args.rounds} rounds (x: against old)")

        def med(v: dict[str, list[float]], k: str) -> str:
            if not v[k]:
                return "n/a"
            return f"{statistics.median(v[k]):.1f} µs (x{statistics.median(v[k]) / statistics.median(v['old']):.2f})"

        for k in order:
            print(f"  {k:10}: claim, server time {med(claims, k)}; claim + completion, "
                  f"backend CPU {med(cpus, k)}; idle next_wakeup, backend CPU {med(polls, k)}")
    finally:
        drop_scratch(args.dsn, *DBS.values())


if __name__ == "__main__":
    main()
