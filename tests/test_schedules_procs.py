"""Schedules with real worker processes: exactly one run per tick.

Workers are ``python -m pgdurable.worker _sched_app:app`` subprocesses whose
database clock follows ``test_clock`` (tests/_sched_app.py). The test moves
the clock tick by tick and NOTIFYs the queue; every assertion is made from
the database. Races are made deterministic by waiting on ``pg_stat_activity``
(a backend blocked on a lock), never on sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _sched_app import CLOCK_TABLE, set_clock
from _waiting import WAIT_LIMIT, until_sync

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
EVERY_MINUTE = [{"name": "m", "every": 60, "task": "tick", "overlap": "allow", "catchup": "all"}]


class Workers:
    """Worker subprocesses of one test; whatever is left is killed at the end."""

    def __init__(self, dsn: str, log_dir: Path) -> None:
        self.dsn, self.log_dir, self.procs = dsn, log_dir, list[subprocess.Popen[bytes]]()

    def start(self, name: str, declare: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}",
               "PGDURABLE_DSN": self.dsn, "PGDURABLE_LOG": "INFO",
               "SCHED_DECLARE": json.dumps(declare)}
        with open(self.log_dir / f"worker-{name}.log", "wb") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", "pgdurable.worker", "_sched_app:app",
                 "--lease-ttl", "3600", "--poll", "60", "--concurrency", "4", "--grace", "1",
                 "--worker-id", name],
                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(timeout=WAIT_LIMIT)

    def logs(self) -> str:
        return "\n".join(f.read_text(errors="replace")[-3000:]
                         for f in sorted(self.log_dir.glob("worker-*.log")))


@pytest.fixture
def workers(dsn: str, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(dsn, tmp_path)
    try:
        yield w
    finally:
        w.stop_all()


@pytest.fixture
def clock(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(CLOCK_TABLE)
    set_clock(conn, T0)
    return conn


def count(conn: psycopg.Connection[Any], sql: str, *args: Any) -> int:
    row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def declared_by_all(conn: psycopg.Connection[Any], n: int) -> None:
    """Wait until the schedule exists and ``n`` workers are listening (started)."""
    until_sync(lambda: count(conn, "SELECT count(*) FROM pgdurable.schedules") == 1
               and count(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                         "current_database() AND query LIKE 'LISTEN%%'") >= n,
               "workers to start and declare the schedule")


@pytest.mark.slow
def test_three_workers_and_100_ticks_give_100_runs(
        workers: Workers, clock: psycopg.Connection[Any]) -> None:
    for name in ("a", "b", "c"):
        workers.start(name, EVERY_MINUTE)
    declared_by_all(clock, 3)
    assert count(clock, "SELECT count(*) FROM pgdurable.schedules") == 1  # declared 3x, one row
    for i in range(1, 101):
        # the clock moves one minute and all three workers are woken at once: they race
        set_clock(clock, T0 + timedelta(minutes=i))
        until_sync(lambda i=i: count(clock, "SELECT count(*) FROM pgdurable.schedule_runs") >= i,
                   f"tick {i} to become a run\n{workers.logs()}")
    ticks = [r[0] for r in clock.execute(
        "SELECT tick FROM pgdurable.schedule_runs ORDER BY tick").fetchall()]
    assert ticks == [T0 + timedelta(minutes=i) for i in range(1, 101)]  # none missed, no dup
    assert count(clock, "SELECT count(*) FROM pgdurable.runs") == 100
    assert count(clock, "SELECT count(DISTINCT idempotency_key) FROM pgdurable.runs") == 100
    assert count(clock, "SELECT fired FROM pgdurable.schedules") == 100
    until_sync(lambda: count(clock, "SELECT count(*) FROM pgdurable.runs "
                                    "WHERE status = 'completed'") == 100, "runs to complete")
    # more than one worker did fire ticks (the race was real), per their logs
    firing = {p for p in ("worker-a", "worker-b", "worker-c")
              if "tick" in (workers.log_dir / f"{p}.log").read_text()}
    print(f"workers that fired ticks: {sorted(firing)}")


def _firing_backend(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE '%%fire_schedule%%' AND wait_event_type = 'Lock' "
        "AND pid <> pg_backend_pid()").fetchone()
    return None if row is None else int(row[0])


@pytest.mark.crash
@pytest.mark.parametrize("backend", ["aborted", "left-running"])
def test_a_worker_killed_while_firing_still_gives_exactly_one_run(
        workers: Workers, clock: psycopg.Connection[Any], dsn: str, backend: str) -> None:
    a = workers.start("a", EVERY_MINUTE)
    declared_by_all(clock, 1)
    with psycopg.connect(dsn) as blocker:  # a transaction: holds the lock until commit
        blocker.execute("LOCK TABLE pgdurable.schedule_runs IN EXCLUSIVE MODE")
        set_clock(clock, T0 + timedelta(minutes=1))
        # worker a is inside fire_schedule: run inserted, schedule row locked, blocked
        until_sync(lambda: _firing_backend(clock) is not None, "worker a to be mid-fire")
        pid = _firing_backend(clock)
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=WAIT_LIMIT)
        if backend == "aborted":  # its transaction dies with it (e.g. the host went away)
            clock.execute("SELECT pg_terminate_backend(%s)", (pid,))
            until_sync(lambda: count(clock, "SELECT count(*) FROM pg_stat_activity "
                                            "WHERE pid = %s", pid) == 0, "backend gone")
        blocker.commit()
    # the orphaned statement (if left running) finishes; then a new worker comes up
    until_sync(lambda: _firing_backend(clock) is None, "the orphaned fire to end")
    before = count(clock, "SELECT count(*) FROM pgdurable.schedule_runs")
    print(f"backend {backend}: the killed worker's fire {'committed' if before else 'rolled back'}")
    workers.start("b", EVERY_MINUTE)
    declared_by_all(clock, 1)
    set_clock(clock, T0 + timedelta(minutes=1, seconds=1))  # wake b: tick 1 is due or done
    set_clock(clock, T0 + timedelta(minutes=2))
    until_sync(lambda: count(clock, "SELECT count(*) FROM pgdurable.schedule_runs "
                                    "WHERE tick = %s", T0 + timedelta(minutes=2)) == 1,
               f"tick 2 to become a run\n{workers.logs()}")
    rows = clock.execute("SELECT tick, count(*) FROM pgdurable.schedule_runs "
                         "GROUP BY tick ORDER BY tick").fetchall()
    assert rows == [(T0 + timedelta(minutes=1), 1), (T0 + timedelta(minutes=2), 1)]
    assert count(clock, "SELECT count(*) FROM pgdurable.runs") == 2
