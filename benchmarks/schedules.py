"""Schedules: what they cost an idle worker, and what firing a tick costs.

One command::

    .venv/bin/python benchmarks/schedules.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its own scratch database ``pgdurable_bench_schedules`` and migrates it.
Every figure is a ratio against a baseline measured in the same run:

* **idle query**: the worker's idle statement is ``next_wakeup(...)`` plus, since
  schedules, ``schedule_wakeup(queues)`` in the same statement. Baseline: the
  ``next_wakeup`` call alone. Measured with no schedule, and with 10,000
  schedules (100 in the worker's queue).
* **firing a tick**: ``fire_schedule`` (fence, lock, overlap check, start_run,
  schedule_runs row, advance), one tick per call, vs. a plain ``start_run``
  with an idempotency key (the baseline: what an outside cron calling
  ``start`` would cost).

About 20 seconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

import pgdurable

DB = "pgdurable_bench_schedules"
BASE = "SELECT pgdurable.next_wakeup(%s::text[], %s::text[], %s::text[])"
IDLE = ("SELECT pgdurable.next_wakeup(%s::text[], %s::text[], %s::text[]), "
        "pgdurable.schedule_wakeup(%s::text[])")
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def per_call(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], n: int) -> float:
    """Median over 5 batches of the mean seconds per call."""
    for _ in range(50):
        conn.execute(sql, params, prepare=True)
    batches = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            conn.execute(sql, params, prepare=True).fetchall()
        batches.append((time.perf_counter() - t) / n)
    return statistics.median(batches)


def idle(conn: psycopg.Connection[Any], label: str) -> None:
    q = (["default"], ["t"], ["1"])
    base = per_call(conn, BASE, q, 1000)
    new = per_call(conn, IDLE, (*q, ["default"]), 1000)
    print(f"idle query, {label}: {new / base:.2f}x the next_wakeup-only query "
          f"({base * 1e6:.0f} us -> {new * 1e6:.0f} us)")


def firing(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute("SELECT set_config('pgdurable.now', %s, false)", ((T0 + timedelta(days=1)).isoformat(),))
    conn.execute(
        "SELECT pgdurable.upsert_schedule('fire', NULL, '1 second', 'UTC', 't', '1', '{}', "
        "'bench', 3, 'allow', 'all', 100, %s, NULL)", (T0,))
    t = time.perf_counter()
    for i in range(n):
        tick, nxt = T0 + timedelta(seconds=i), T0 + timedelta(seconds=i + 1)
        rows = conn.execute("SELECT * FROM pgdurable.fire_schedule('fire', %s, %s, %s)",
                            (tick, [tick], nxt), prepare=True).fetchall()
        assert len(rows) == 1
    fire = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for i in range(n):
        conn.execute("SELECT pgdurable.start_run('t', '1', '{}', 'bench', 0, 3, %s, NULL, NULL, "
                     "NULL)", (f"base-{i}",), prepare=True).fetchall()
    start = (time.perf_counter() - t) / n
    print(f"firing a tick: {fire / start:.2f}x a plain start_run with an idempotency key "
          f"({start * 1e6:.0f} us -> {fire * 1e6:.0f} us per tick, {n} ticks)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        admin.execute(f"CREATE DATABASE {DB}")
    dsn = make_conninfo(args.dsn, dbname=DB)
    try:
        pgdurable.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            idle(conn, "no schedule")
            conn.execute(
                "INSERT INTO pgdurable.schedules (name, every, task, queue, next_fire_at) "
                "SELECT 's' || i, '1 hour', 't', CASE WHEN i % 100 = 0 THEN 'default' "
                "ELSE 'q' || (i % 50) END, now() + i * interval '1 second' "
                "FROM generate_series(1, 10000) AS i")
            conn.execute("ANALYZE pgdurable.schedules")
            idle(conn, "10,000 schedules (100 in the worker's queue)")
            firing(conn, 2000)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main()
