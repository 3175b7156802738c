"""Flow control overhead (issue 13): a capped queue vs an unlimited one, and
the fair claim over 10,000 keys vs a plain claim, each in the same run.

One command::

    .venv/bin/python benchmarks/flow_control.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 3000] [--rounds 2] [--concurrency 32] [--keys 10000] [--samples 400]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its scratch database ``pgdurable_bench_flow`` and migrates it.

1. Throughput: one worker process (``_throughput_app:app``, task ``noop3``,
   3 steps) at ``--concurrency`` drains ``--runs`` runs of queue ``plain``
   (no limits) or of queue ``capped`` (``set_queue(concurrency=2 x
   --concurrency)``: a cap at or above what the worker can hold, so only the
   claim path differs: row lock, live-lease count, key rotation). Rounds
   alternate plain / capped; runs/s from the first start to the last
   completion (database clock). Target: capped >= 0.8 x plain.
   Then the cost of flow control to queues WITHOUT limits: the same unlimited
   drain with the flow-control index ``runs_runnable_key_idx`` vs without it
   (dropped for the round, as before the migration), alternating. The
   freed-slot check (is the queue limited?) was a trigger of its own, disabled
   for those rounds too, until sql/0027_run_end_trigger.sql made it part of
   ``runs_end``; its cost is now measured on its own in benchmarks/RESULTS.md
   ("One trigger at a run's end").
2. Claim p50: queue ``keyed`` (limited, so claims rotate between keys) holds
   ``--keys`` runs with distinct keys; queue ``plainq`` the same number
   without limits. Each sample times ONE ``claim_runs`` of 16 runs from the
   client (prepared), then gives the runs back untimed (release_run);
   alternating blocks of 25. Target: keyed p50 <= 2 x plain p50.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_flow"
HERE = Path(__file__).resolve().parent
START = ("SELECT pgdurable.start_run_flow(%s, '1', '{}', %s, 0, 3, NULL, NULL, NULL, NULL, "
         "CASE WHEN %s THEN 'k' || g ELSE '' END, NULL, NULL) FROM generate_series(1, %s) g")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('bench', %s::text[], '{t}', '{1}', "
         "16, '60 s'::interval)")
RELEASE = "SELECT pgdurable.release_run(%s, %s, 'bench')"
WITHOUT = "DROP INDEX pgdurable.runs_runnable_key_idx"
WITH = ("CREATE INDEX runs_runnable_key_idx ON pgdurable.runs "
        "(queue, concurrency_key, priority DESC, available_at) WHERE status = 'runnable'")


def drain(dsn: str, conn: psycopg.Connection[object], queue: str, runs: int,
          concurrency: int) -> float:
    """runs/s of one worker process draining ``runs`` runs of ``queue``."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}",
           "PGDURABLE_DSN": dsn, "PGAPPNAME": "bench-flow-worker"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgdurable.worker", "_throughput_app:app", "--queues", queue,
         "--concurrency", str(concurrency), "--lease-ttl", "60", "--poll", "5"],
        env=env, cwd=HERE.parent)
    try:
        while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                               "'bench-flow-worker' AND query LIKE 'LISTEN%%'").fetchone()[0]:
            time.sleep(0.05)
        t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        conn.execute(START, ("noop3", queue, False, runs))
        while conn.execute("SELECT count(*) FROM pgdurable.runs WHERE queue = %s AND status "
                           "<> 'completed'", (queue,)).fetchone()[0]:
            time.sleep(0.1)
        t1 = conn.execute("SELECT max(finished_at) FROM pgdurable.runs WHERE queue = %s",
                          (queue,)).fetchone()[0]
        conn.execute("DELETE FROM pgdurable.runs WHERE queue = %s", (queue,))
        return runs / (t1 - t0).total_seconds()
    finally:
        proc.terminate()
        proc.wait()


def claim_block(conn: psycopg.Connection[object], queue: str, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        rows = conn.execute(CLAIM, ([queue],), prepare=True).fetchall()
        out.append((time.perf_counter() - t) * 1000)
        assert len(rows) == 16, len(rows)
        for rid, token in rows:
            conn.execute(RELEASE, (rid, token), prepare=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--runs", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--samples", type=int, default=400)
    a = ap.parse_args()
    dsn = scratch_dsn(a.dsn, DB)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgdurable.set_queue('capped', %s, NULL, NULL, NULL)",
                         (2 * a.concurrency,))
            plain, capped = [], []
            for _ in range(a.rounds):
                plain.append(drain(dsn, conn, "plain", a.runs, a.concurrency))
                capped.append(drain(dsn, conn, "capped", a.runs, a.concurrency))
            p, c = statistics.median(plain), statistics.median(capped)
            print(f"throughput runs/s: plain {[round(x) for x in plain]} "
                  f"capped {[round(x) for x in capped]}")
            print(f"  median plain {p:.0f}, capped {c:.0f}: ratio capped/plain {c / p:.2f} "
                  "(target >= 0.8)")

            with_fc, without_fc = [], []
            for _ in range(a.rounds):
                with_fc.append(drain(dsn, conn, "plain", a.runs, a.concurrency))
                conn.execute(WITHOUT)
                without_fc.append(drain(dsn, conn, "plain", a.runs, a.concurrency))
                conn.execute(WITH)
            w, wo = statistics.median(with_fc), statistics.median(without_fc)
            print(f"unlimited queue runs/s: with the flow-control index "
                  f"{[round(x) for x in with_fc]}, without {[round(x) for x in without_fc]}: "
                  f"ratio {w / wo:.2f}")

            conn.execute("SELECT pgdurable.set_queue('keyed', 1000000, NULL, NULL, NULL)")
            conn.execute(START, ("t", "keyed", True, a.keys))
            conn.execute(START, ("t", "plainq", False, a.keys))
            conn.execute("VACUUM ANALYZE pgdurable.runs")
            keyed, plainq = [], []
            for _ in range(max(1, a.samples // 25)):
                plainq += claim_block(conn, "plainq", 25)
                keyed += claim_block(conn, "keyed", 25)
            kp, pp = statistics.median(keyed), statistics.median(plainq)
            print(f"claim of 16, p50 ms: plain {pp:.3f}, {a.keys} keys {kp:.3f}: "
                  f"ratio {kp / pp:.2f} (target <= 2)")
            served = conn.execute("SELECT count(DISTINCT concurrency_key) FROM pgdurable.runs "
                                  "WHERE queue = 'keyed' AND claims > 0").fetchone()[0]
            print(f"  distinct keys served by the keyed claims: {served}")
    finally:
        drop_scratch(a.dsn, DB)


if __name__ == "__main__":
    main()
