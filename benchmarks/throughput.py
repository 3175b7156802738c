"""End-to-end run throughput of one worker process vs pgbench single-row UPDATEs.

One command::

    .venv/bin/python benchmarks/throughput.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 5000] [--concurrency 32] [--pool-size 8] [--rounds 1]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its own scratch database ``pgdurable_bench_throughput`` and migrates it.

pgdurable side: ONE worker process (``python -m pgdurable.worker
_throughput_app:app --concurrency 32``) is started and left idle; then the
clock starts, ``--runs`` runs of the task ``noop3`` (3 no-op steps: two
fenced checkpoints, then checkpoint + completion in one statement) are
enqueued in batches of 500 (one ``start_run`` statement per batch), and the
clock stops at the last completion (``max(finished_at)`` on the database
clock). Reported: runs/s and steps/s, enqueue to completion.

Baseline, in the same run and the same database: ``pgbench -n -M prepared
-c 32 -j 2`` doing as many single-row ``UPDATE`` commits as the runs had
steps (runs x 3) on a scratch table of 10,000 rows. Ratio = pgdurable
steps/s / pgbench commits/s (target >= 0.5). Each pgdurable step is a whole
fenced transition (lock the run under the fence, update it, insert the
checkpoint history row), and every run also costs a start and a claim share,
so a ratio of 1 would mean a step costs one bare UPDATE.

``--live-steps on|off|both`` sets ``pgdurable.live_steps`` on the scratch
database (the dashboard's one NOTIFY per ``write_steps`` statement; default
on, as shipped); ``both`` measures the two in every round against the same
pgbench. Each round prints its own ratio; the last line gives the medians.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_throughput"
HERE = Path(__file__).resolve().parent
STEPS = 3
BATCH = 500


def start_worker(dsn: str, concurrency: int, pool_size: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}",
           "PGDURABLE_DSN": dsn, "BENCH_POOL_SIZE": str(pool_size)}
    return subprocess.Popen(
        [sys.executable, "-m", "pgdurable.worker", "_throughput_app:app",
         "--concurrency", str(concurrency), "--lease-ttl", "60", "--poll", "5"],
        env=env, cwd=HERE.parent)


def wait_listening(conn: psycopg.Connection[object]) -> None:
    """Until the worker's listener is connected (its pool opened before it)."""
    for _ in range(600):
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND query LIKE 'LISTEN pgdurable%'").fetchone()
        if row and row[0]:
            return
        time.sleep(0.05)
    raise RuntimeError("worker did not start")


def run_pgdurable(dsn: str, runs: int, concurrency: int, pool_size: int) -> tuple[float, float]:
    """(seconds enqueue->last completion, runs completed)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("TRUNCATE pgdurable.runs CASCADE")
        c.execute("VACUUM ANALYZE pgdurable.runs")
        worker = start_worker(dsn, concurrency, pool_size)
        try:
            wait_listening(c)
            time.sleep(0.5)
            row = c.execute("SELECT clock_timestamp()").fetchone()
            assert row is not None
            t0 = row[0]
            left = runs
            while left > 0:
                n = min(BATCH, left)
                c.execute("SELECT pgdurable.start_run('noop3', '1', '{}', 'default', 0, 3, NULL, "
                          "NULL, NULL, NULL) FROM generate_series(1, %s)", (n,))
                left -= n
            deadline = time.monotonic() + 600
            while True:
                row = c.execute("SELECT count(*) FILTER (WHERE status = 'completed'), "
                                "count(*) FILTER (WHERE status IN ('failed', 'cancelled')), "
                                "max(finished_at) FROM pgdurable.runs").fetchone()
                assert row is not None
                if row[0] + row[1] >= runs:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {row[0]} of {runs} runs completed")
                time.sleep(0.2)
            if row[1]:
                raise RuntimeError(f"{row[1]} runs did not complete")
            return (row[2] - t0).total_seconds(), float(row[0])
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)


def run_pgbench(dsn: str, commits: int, clients: int) -> float:
    """pgbench commits/s for ``commits`` single-row UPDATE transactions."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS bench_counter")
        c.execute("CREATE TABLE bench_counter (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)")
        c.execute("INSERT INTO bench_counter (id) SELECT g FROM generate_series(1, 10000) g")
        c.execute("VACUUM ANALYZE bench_counter")
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write("\\set id random(1, 10000)\nUPDATE bench_counter SET v = v + 1 WHERE id = :id;\n")
        script = f.name
    try:
        out = subprocess.run(
            ["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", "2",
             "-t", str(math.ceil(commits / clients)), "-f", script, dsn],
            check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(script)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if m is None:
        raise RuntimeError(f"cannot parse pgbench output:\n{out}")
    return float(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--live-steps", choices=("on", "off", "both"), default="on",
                        help="pgdurable.live_steps on the scratch database (both: each round)")
    args = parser.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    modes = ["on", "off"] if args.live_steps == "both" else [args.live_steps]
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    try:
        print(f"{args.runs} runs x {STEPS} no-op steps, one worker process, concurrency "
              f"{args.concurrency}, pool {args.pool_size}; pgbench: {args.runs * STEPS} "
              f"single-row UPDATE commits at {args.concurrency} clients")
        for r in range(1, args.rounds + 1):
            tps = run_pgbench(dsn, args.runs * STEPS, args.concurrency)
            for mode in (modes if r % 2 else modes[::-1]):
                set_live_steps(args.dsn, mode)
                secs, done = run_pgdurable(dsn, args.runs, args.concurrency, args.pool_size)
                runs_s, steps_s = done / secs, done * STEPS / secs
                ratios[mode].append(steps_s / tps)
                print(f"round {r}: live_steps {mode:>3}: pgdurable {runs_s:7.0f} runs/s "
                      f"{steps_s:7.0f} steps/s ({secs:.2f} s) | pgbench {tps:7.0f} commits/s | "
                      f"ratio steps/commits {steps_s / tps:.2f}", flush=True)
    finally:
        drop_scratch(args.dsn, DB)
    print("median ratio: " + ", ".join(f"live_steps {m} {statistics.median(v):.2f} "
                                       f"(rounds {' '.join(f'{x:.2f}' for x in v)})"
                                       for m, v in ratios.items()))


def set_live_steps(admin_dsn: str, mode: str) -> None:
    """``pgdurable.live_steps`` for new sessions of the scratch database."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(f"ALTER DATABASE {DB} SET pgdurable.live_steps = '{mode}'")


if __name__ == "__main__":
    main()
