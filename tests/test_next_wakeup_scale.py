"""An idle worker's poll does not read every parked run (issue 45).

``next_wakeup`` finds the first timer a worker may take by an ordered walk of
``runs_timer_idx`` and then reads the timers that walk passed over (below a bound the
planner sees only as a parameter). With many parked timers the planner chose a
sequential scan of all of ``runs`` for that second read, on every idle poll of every
worker: the idle fleet's CPU grew with the number of parked runs. The function now runs
with ``enable_seqscan = off``."""

from __future__ import annotations

from typing import Any

import psycopg

PARKED = 30_000


def park_timers(conn: psycopg.Connection[Any], n: int) -> None:
    """``n`` runs of t/1 parked on a signal with a timer in random order over the next three days, analyzed."""
    conn.execute(
        "INSERT INTO pgdurable.runs (task, revision, queue, status, wait_kind, wait_ref, "
        "wait_since, wake_at) SELECT 't', '1', 'default', 'waiting', 'k', g::text, "
        "pgdurable.now(), pgdurable.now() + interval '1 hour' + random() * interval '3 days' "
        "FROM generate_series(1, %s) g", (n,))
    conn.execute("ANALYZE pgdurable.runs")


def runs_read(conn: psycopg.Connection[Any], call: str) -> tuple[int, int]:
    """(sequential scans, tuples they read) of runs by ``call``, in one transaction."""
    with conn.transaction():
        conn.execute(call)
        row = conn.execute("SELECT seq_scan, seq_tup_read FROM pg_stat_xact_user_tables "
                           "WHERE relid = 'pgdurable.runs'::regclass").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_idle_poll_reads_no_parked_run_sequentially(conn: psycopg.Connection[Any]) -> None:
    """The session pushes the planner's estimates towards sequential scans (index pages
    1,000 times dearer: what the planner concluded by itself at 340,000 runs in
    benchmarks/million.py); the function's own setting keeps them off all the same. The
    first call of the session plans the function's statements."""
    park_timers(conn, PARKED)
    conn.execute("SET random_page_cost = 1000")
    for owner in ("w", None):
        call = ("SELECT pgdurable.next_wakeup('{default}', '{t,u}', '{1,1}', "
                + ("'w'" if owner else "NULL") + ")")
        assert runs_read(conn, call) == (0, 0)
    # and the answer is still the first timer's (about an hour away)
    row = conn.execute("SELECT pgdurable.next_wakeup('{default}', '{t}', '{1}', 'w')").fetchone()
    assert row is not None and 3500 < row[0] < 3700


def test_a_timer_reserved_for_another_worker_is_still_found(conn: psycopg.Connection[Any]) -> None:
    """The read that no longer scans still sees the timers the walk passed over: the
    earliest, reserved for a present worker other than the caller, is due when its
    reservation ends (before the first timer the caller may take)."""
    park_timers(conn, PARKED)
    conn.execute(
        "INSERT INTO pgdurable.worker_presence (worker_id, instance, since, until) "
        "VALUES ('other', 'i1', pgdurable.now(), pgdurable.now() + interval '1 day')")
    conn.execute(
        "UPDATE pgdurable.runs SET affinity_worker = 'other', affinity_instance = 'i1', "
        "affinity_mode = 'prefer', affinity_since = pgdurable.now(), "
        "affinity_wait = interval '10 min', wake_at = pgdurable.now() + interval '5 min' "
        "WHERE id = (SELECT id FROM pgdurable.runs ORDER BY wake_at LIMIT 1)")
    row = conn.execute("SELECT pgdurable.next_wakeup('{default}', '{t}', '{1}', 'w')").fetchone()
    assert row is not None and 850 < row[0] < 950  # wake_at (5 min) + the 10 min wait
