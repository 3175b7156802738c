"""Neither the claim nor an idle worker's poll reads every parked run, and neither is
JIT-compiled, however many runs are parked (issue 45).

``next_wakeup`` finds the first timer a worker may take by an ordered walk of
``runs_timer_idx`` and then reads the timers that walk passed over (below a bound the
planner sees only as a parameter). With many parked timers the planner chose a
sequential scan of all of ``runs`` for that second read, on every idle poll of every
worker: the idle fleet's CPU grew with the number of parked runs. The function now runs
with ``enable_seqscan = off``. The claim's generic plan estimates the timer branch's
bound (``wake_at <= now``) to match a third of the parked timers: at 1,000,000 parked
runs it chose a sequential scan and a sort for every claim (2.1 s), and once that was
fixed, its cost was still past ``jit_above_cost`` and every claim was JIT-compiled
(~240 ms): both functions run with ``enable_seqscan = off`` and ``jit = off``."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

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


CLAIM = ("SELECT count(*) FROM pgdurable.claim_runs('w', '{default}', '{t,u}', '{1,1}', 32, "
         "'60 s')")


def test_the_claim_reads_no_parked_run_sequentially(conn: psycopg.Connection[Any]) -> None:
    """As the poll above: the session's estimates push towards sequential scans."""
    park_timers(conn, PARKED)
    conn.execute("INSERT INTO pgdurable.runs (task, revision) VALUES ('t', '1')")
    conn.execute("SET random_page_cost = 1000")
    with conn.transaction():
        got = conn.execute(CLAIM).fetchone()
        row = conn.execute("SELECT seq_scan FROM pg_stat_xact_user_tables "
                           "WHERE relid = 'pgdurable.runs'::regclass").fetchone()
    assert got == (1,) and row == (0,)


def test_neither_the_claim_nor_the_poll_is_jit_compiled(conn: psycopg.Connection[Any]) -> None:
    """With JIT on for every statement of the session (jit_above_cost 0), none of theirs is."""
    if not conn.execute("SELECT pg_jit_available()").fetchone() == (True,):
        pytest.skip("JIT is not available on this server")
    park_timers(conn, 1000)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice", "client_min_messages = notice",
                    "jit = on", "jit_above_cost = 0"):
        conn.execute("SET " + setting)
    conn.execute(CLAIM)
    conn.execute("SELECT pgdurable.next_wakeup('{default}', '{t}', '{1}', 'w')")
    nested = [n for n in notices if "claim_runs" not in n and "next_wakeup(" not in n]
    assert len(nested) >= 2, notices
    jitted = [n for n in nested if "JIT:" in n]
    assert not jitted, jitted[0]


def test_a_claim_of_due_timers_reads_what_it_takes_not_every_due_timer(
        conn: psycopg.Connection[Any]) -> None:
    """10,000 timers due at once (a timer storm): a claim of 10 fetches about 10 rows, not
    the 10,000 (an index-ordered walk per queue, as the runnable branch's)."""
    conn.execute(
        "INSERT INTO pgdurable.runs (task, revision, queue, status, wait_kind, wait_ref, "
        "wait_since, wake_at) SELECT 't', '1', 'default', 'waiting', 'k', g::text, "
        "pgdurable.now(), pgdurable.now() - interval '1 s' FROM generate_series(1, 10000) g")
    conn.execute("ANALYZE pgdurable.runs")
    for _ in range(3):
        with conn.transaction():
            got = conn.execute("SELECT count(*) FROM pgdurable.claim_runs('w', '{default}', "
                               "'{t}', '{1}', 10, '60 s')").fetchone()
            row = conn.execute("SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM "
                               "pg_stat_xact_user_tables WHERE relid = "
                               "'pgdurable.runs'::regclass").fetchone()
        assert got == (10,)
        assert row is not None and row[0] < 200, row
