"""Every fence finds its run by the primary key (sql/0028_fence_by_primary_key.sql): the
single-run transitions (``_fenced``, ``_fenced_token``), ``write_steps`` and
``renew_runs`` never read runs_leased_idx (every leased run of the fleet), whatever the
statistics say, and the batched two keep one generic plan per connection. The
index scans are read from the server's own counters for the current transaction
(``pg_stat_get_xact_numscans``), in a new connection each time (its plans made with
the statistics as they are)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgdurable.foundation import run_queries as q

WRITE = ("SELECT id, status FROM pgdurable.write_steps('w', %s::uuid[], %s::bigint[], "
         "%s::jsonb[], %s::numeric[], %s::boolean[], %s::jsonb[])")
SCANS = ("SELECT pg_stat_get_xact_numscans('pgdurable.runs_leased_idx'::regclass), "
         "pg_stat_get_xact_numscans('pgdurable.runs_pkey'::regclass), "
         "pg_stat_get_xact_numscans('pgdurable.runs'::regclass)")  # the last: sequential scans
START = ("SELECT pgdurable.start_run(%s, '1', '{}', 'q', 0, 3, NULL, NULL, NULL, NULL) "
         "FROM generate_series(1, %s)")
# single-run transitions through _fenced (emit_event, release_run) and _fenced_token
# (start_child, whose parent is the run)
SINGLE = {
    "emit": "SELECT pgdurable.emit_event(%s, %s, 'w', 0, '{}')",
    "release": "SELECT pgdurable.release_run(%s, %s, 'w')",
    "child": ("SELECT run_id FROM pgdurable.start_child(%s, %s, 'k', 'leaf', '1', '{}', 'kids', "
              "0, 3, NULL, NULL, NULL)"),
}
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs(%s, '{q}', ARRAY[%s], '{1}', %s, "
         "'1 hour')")


NO_AUTOVACUUM = "ALTER TABLE pgdurable.runs SET (autovacuum_enabled = off)"


def _fleet(dsn: str, analyze_after: bool) -> None:
    """2,000 finished runs and 500 runs leased by other workers, the statistics taken
    before they were leased (the planner thinks few runs are leased) or after (no
    autovacuum ANALYZE in between: the statistics stay as set up)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(NO_AUTOVACUUM)
        c.execute(START, ("done", 2000))
        c.execute("UPDATE pgdurable.runs SET status = 'completed', finished_at = now()")
        c.execute("VACUUM ANALYZE pgdurable.runs")
        c.execute(START, ("fleet", 500))
        assert len(c.execute(CLAIM, ("fleet", "fleet", 500)).fetchall()) == 500
        if analyze_after:
            c.execute("ANALYZE pgdurable.runs")
        c.execute(START, ("mine", 16 * 8))


def _call(c: psycopg.Connection[Any], call: str, n: int) -> tuple[int, int, int, int]:
    """Claim ``n`` runs of task 'mine' as 'w' and make ``call`` on them: (runs it
    answered for, runs_leased_idx scans, runs_pkey scans, sequential scans of runs)."""
    rows = c.execute(CLAIM, ("w", "mine", n)).fetchall()
    c.commit()
    ids, tokens = [r[0] for r in rows], [r[1] for r in rows]
    before = c.execute(SCANS).fetchone()
    assert before is not None
    if call == "write":
        got = c.execute(WRITE, (ids, tokens, ["{}"] * n, [0] * n, [False] * n,
                                [None] * n)).fetchall()
        assert {r[1] for r in got} == {"leased"}
    elif call == "renew":
        got = c.execute(q.RENEW, ("w", ids, tokens, timedelta(hours=1))).fetchall()
    else:  # one run's transitions: _fenced, then _fenced_token (start_child)
        got = c.execute(SINGLE[call], (ids[0], tokens[0])).fetchall()
    after = c.execute(SCANS).fetchone()
    assert after is not None
    c.commit()
    return (len(got), after[0] - before[0], after[1] - before[1], after[2] - before[2])


def _scans(dsn: str, call: str, n: int) -> list[tuple[int, int, int, int]]:
    """:func:`_call` 8 times in a new connection (past PL/pgSQL's first five custom
    plans)."""
    with psycopg.connect(dsn) as c:
        return [_call(c, call, n) for _ in range(8)]


CALLS = [("write", 1), ("write", 16), ("renew", 16), ("emit", 1), ("release", 1), ("child", 1)]


@pytest.mark.parametrize("analyze_after", [False, True], ids=["stats-none-leased",
                                                               "stats-many-leased"])
@pytest.mark.parametrize(("call", "n"), CALLS)
def test_the_fence_reads_the_given_runs_by_primary_key(
        dsn: str, analyze_after: bool, call: str, n: int) -> None:
    _fleet(dsn, analyze_after)
    for answered, leased_scans, pkey_scans, seq_scans in _scans(dsn, call, n):
        assert answered == n
        assert leased_scans == 0  # never a walk over every leased run
        assert seq_scans == 0 and pkey_scans >= n


@pytest.mark.parametrize(("call", "n"), CALLS)
def test_a_plan_made_while_runs_was_small_still_reads_by_primary_key(
        dsn: str, call: str, n: int) -> None:
    """A connection plans the fences while runs holds a few rows (a new installation),
    then the table grows to 5,000 without an ANALYZE (autovacuum off for runs): the
    kept plans still probe runs_pkey; they never scan the table."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(NO_AUTOVACUUM)
        c.execute(START, ("mine", 16 * 9))
    with psycopg.connect(dsn) as c:
        for _ in range(7):
            _call(c, call, n)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute(START, ("done", 5000))
        answered, leased_scans, pkey_scans, seq_scans = _call(c, call, n)
    assert answered == n
    assert (leased_scans, seq_scans) == (0, 0) and pkey_scans >= n


def test_a_fence_that_fails_still_answers_lost_and_writes_nothing(
        conn: psycopg.Connection[Any]) -> None:
    """The status test is IS NOT DISTINCT FROM 'leased' now: a run that is not
    leased (parked here) is still refused, with its token and owner right."""
    conn.execute(START, ("mine", 2))
    (a, ta), (b, tb) = conn.execute(CLAIM, ("w", "mine", 2)).fetchall()
    conn.execute("SELECT pgdurable.park_run(%s, %s, 'w', '{}', 0, 'signal', 'go', NULL, NULL)",
                 (b, tb))
    runs = "SELECT step, status, state, lease_expires_at FROM pgdurable.runs WHERE id = %s"
    parked = conn.execute(runs, (b,)).fetchone()
    got = dict(conn.execute(WRITE, ([a, b], [ta, tb], ['{"x": 1}', '{"x": 2}'], [0, 0],
                                    [False, False], [None, None])).fetchall())
    assert got == {a: "leased", b: "lost"}
    assert conn.execute(runs, (b,)).fetchone() == parked
    assert conn.execute(q.RENEW, ("w", [b], [tb], timedelta(hours=1))).fetchall() == []
    assert conn.execute(runs, (b,)).fetchone() == parked


@pytest.mark.parametrize("signature", [
    "write_steps(text, uuid[], bigint[], jsonb[], numeric[], boolean[], jsonb[])",
    "renew_runs(text, uuid[], bigint[], interval)",
])
def test_the_batched_fences_plan_generically(conn: psycopg.Connection[Any], signature: str) -> None:
    """0028 sets plan_cache_mode on both (no planning per call); a migration that
    re-creates them must keep it."""
    row = conn.execute("SELECT proconfig FROM pg_proc WHERE oid = %s::regprocedure",
                       (f"pgdurable.{signature}",)).fetchone()
    assert row is not None and "plan_cache_mode=force_generic_plan" in row[0]
