"""Schedules with real worker processes: exactly one run per tick.

Workers are ``python -m pgdurable.worker _sched_app:app`` subprocesses (the
``fleet`` fixture, tests/fix_fleet.py) whose
database clock follows ``test_clock`` (tests/_sched_app.py). The test moves
the clock tick by tick and NOTIFYs the queue; every assertion is made from
the database. Races are made deterministic by waiting on ``pg_stat_activity``
(a backend blocked on a lock), never on sleeps.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _sched_app import CLOCK_TABLE, set_clock
from _waiting import until_sync
from fix_fleet import Fleet, WorkerProc

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)
EVERY_MINUTE = [{"name": "m", "every": 60, "task": "tick", "overlap": "allow", "catchup": "all"}]

pytestmark = pytest.mark.fleet("_sched_app:app", ttl=3600.0, poll=60.0, grace=1.0,
                               env={"SCHED_DECLARE": json.dumps(EVERY_MINUTE)})


@pytest.fixture
def clock(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(CLOCK_TABLE)
    set_clock(conn, T0)
    return conn


def count(conn: psycopg.Connection[Any], sql: str, *args: Any) -> int:
    row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def declared_by(conn: psycopg.Connection[Any], fleet: Fleet, *workers: WorkerProc) -> None:
    """Wait until ``workers`` are listening (started) and the schedule exists."""
    fleet.ready(*workers)
    until_sync(lambda: count(conn, "SELECT count(*) FROM pgdurable.schedules") == 1,
               "workers to start and declare the schedule")


@pytest.mark.slow
def test_three_workers_and_100_ticks_give_100_runs(
        fleet: Fleet, clock: psycopg.Connection[Any]) -> None:
    workers = [fleet.start(name) for name in ("a", "b", "c")]
    declared_by(clock, fleet, *workers)
    assert count(clock, "SELECT count(*) FROM pgdurable.schedules") == 1  # declared 3x, one row
    for i in range(1, 101):
        # the clock moves one minute and all three workers are woken at once: they race
        set_clock(clock, T0 + timedelta(minutes=i))
        until_sync(lambda i=i: count(clock, "SELECT count(*) FROM pgdurable.schedule_runs") >= i,
                   f"tick {i} to become a run")
    ticks = [r[0] for r in clock.execute(
        "SELECT tick FROM pgdurable.schedule_runs ORDER BY tick").fetchall()]
    assert ticks == [T0 + timedelta(minutes=i) for i in range(1, 101)]  # none missed, no dup
    assert count(clock, "SELECT count(*) FROM pgdurable.runs") == 100
    assert count(clock, "SELECT count(DISTINCT idempotency_key) FROM pgdurable.runs") == 100
    assert count(clock, "SELECT fired FROM pgdurable.schedules") == 100
    until_sync(lambda: count(clock, "SELECT count(*) FROM pgdurable.runs "
                                    "WHERE status = 'completed'") == 100, "runs to complete")
    # more than one worker did fire ticks (the race was real), per their logs
    firing = {w.name for w in workers if " tick 20" in w.log()}  # "schedule 'x' tick 2030-...", not the start line
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
        fleet: Fleet, clock: psycopg.Connection[Any], dsn: str, backend: str) -> None:
    a = fleet.start("a")
    declared_by(clock, fleet, a)
    with psycopg.connect(dsn) as blocker:  # a transaction: holds the lock until commit
        blocker.execute("LOCK TABLE pgdurable.schedule_runs IN EXCLUSIVE MODE")
        set_clock(clock, T0 + timedelta(minutes=1))
        # worker a is inside fire_schedule: run inserted, schedule row locked, blocked
        until_sync(lambda: _firing_backend(clock) is not None, "worker a to be mid-fire")
        pid = _firing_backend(clock)
        a.kill()
        if backend == "aborted":  # its transaction dies with it (e.g. the host went away)
            clock.execute("SELECT pg_terminate_backend(%s)", (pid,))
            until_sync(lambda: count(clock, "SELECT count(*) FROM pg_stat_activity "
                                            "WHERE pid = %s", pid) == 0, "backend gone")
        blocker.commit()
    # the orphaned statement (if left running) finishes; then a new worker comes up
    until_sync(lambda: _firing_backend(clock) is None, "the orphaned fire to end")
    before = count(clock, "SELECT count(*) FROM pgdurable.schedule_runs")
    print(f"backend {backend}: the killed worker's fire {'committed' if before else 'rolled back'}")
    b = fleet.start("b")
    declared_by(clock, fleet, b)
    set_clock(clock, T0 + timedelta(minutes=1, seconds=1))  # wake b: tick 1 is due or done
    set_clock(clock, T0 + timedelta(minutes=2))
    until_sync(lambda: count(clock, "SELECT count(*) FROM pgdurable.schedule_runs "
                                    "WHERE tick = %s", T0 + timedelta(minutes=2)) == 1,
               "tick 2 to become a run")
    rows = clock.execute("SELECT tick, count(*) FROM pgdurable.schedule_runs "
                         "GROUP BY tick ORDER BY tick").fetchall()
    assert rows == [(T0 + timedelta(minutes=1), 1), (T0 + timedelta(minutes=2), 1)]
    assert count(clock, "SELECT count(*) FROM pgdurable.runs") == 2
