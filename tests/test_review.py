"""Review tests: holes in the SQL engine found by a second pair of eyes.

Each test drives the SQL functions directly (one connection, the database
clock) and checks an invariant of DESIGN.md: no run is lost (3) and bad input
changes nothing (8), plus the indexes the engine relies on.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

Conn = psycopg.Connection[Any]


def _start(conn: Conn, task: str = "t") -> uuid.UUID:
    row = conn.execute(
        "SELECT run_id FROM pgdurable.start_run(%s, 'r1', '{}'::jsonb, 'default', 0, 3, NULL, "
        "NULL, NULL, NULL)",
        (task,),
    ).fetchone()
    assert row is not None
    rid: uuid.UUID = row[0]
    return rid


def _claim(conn: Conn, owner: str = "w1", ttl: str | None = "30 seconds") -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status, lease_token FROM pgdurable.claim_runs(%s, ARRAY['default'], "
        "ARRAY['t'], ARRAY['r1'], 10, %s::interval)",
        (owner, ttl),
    ).fetchall()


def _run(conn: Conn, rid: uuid.UUID) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgdurable.runs WHERE id = %s", (rid,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def test_fk_columns_referencing_runs_are_indexed(conn: Conn) -> None:
    """Every column with a foreign key to pgdurable.runs leads an index that
    covers every non-NULL value: deleting a run (prune_runs, ON DELETE
    CASCADE) must not scan the whole referencing table once per deleted run."""
    rows = conn.execute(
        """
        SELECT c.conrelid::regclass::text, a.attname,
               EXISTS (SELECT FROM pg_index i
                        WHERE i.indrelid = c.conrelid AND i.indkey[0] = c.conkey[1]
                          AND (i.indpred IS NULL
                               OR pg_get_expr(i.indpred, i.indrelid)
                                  = format('(%I IS NOT NULL)', a.attname))) AS indexed
          FROM pg_constraint c
          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
         WHERE c.contype = 'f' AND c.confrelid = 'pgdurable.runs'::regclass
        """
    ).fetchall()
    assert rows, "expected foreign keys to pgdurable.runs"
    missing = [f"{t}.{col}" for t, col, ok in rows if not ok]
    assert missing == []


@pytest.mark.parametrize("ttl", [None, "0 seconds", "-5 seconds"])
def test_claim_runs_rejects_a_lease_that_cannot_expire_or_is_already_over(
    conn: Conn, ttl: str | None
) -> None:
    """A NULL ttl would leave a 'leased' run with lease_expires_at NULL: never
    renewed, never reclaimed (lost, invariant 3). Bad input: PD000, no claim."""
    rid = _start(conn)
    with pytest.raises(psycopg.Error) as ei:
        _claim(conn, ttl=ttl)
    assert ei.value.sqlstate == "PD000"
    r = _run(conn, rid)
    assert r["status"] == "runnable" and r["lease_token"] == 0 and r["claims"] == 0


@pytest.mark.parametrize("ttl", [None, "0 seconds"])
def test_renew_runs_rejects_a_null_or_empty_ttl(conn: Conn, ttl: str | None) -> None:
    """renew_runs with a NULL ttl set lease_expires_at = NULL on a leased run:
    it could then never be reclaimed. Bad input: PD000, the lease unchanged."""
    rid = _start(conn)
    [(cid, status, token)] = _claim(conn)
    assert cid == rid and status == "leased"
    before = _run(conn, rid)["lease_expires_at"]
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.renew_runs('w1', ARRAY[%s::uuid], ARRAY[%s::bigint], "
            "%s::interval)",
            (rid, token, ttl),
        )
    assert ei.value.sqlstate == "PD000"
    after = _run(conn, rid)
    assert after["status"] == "leased" and after["lease_expires_at"] == before


def test_write_steps_with_ragged_arrays_changes_nothing(conn: Conn) -> None:
    """unnest pads shorter arrays with NULL: a missing done[i] made run i
    'leased' with lease_owner and lease_expires_at NULL (unreachable forever).
    Arrays of different lengths or NULL ids/tokens/states/done: PD000."""
    a, b = _start(conn), _start(conn)
    claimed = {row[0]: row[2] for row in _claim(conn)}
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.write_steps('w1', ARRAY[%s, %s]::uuid[], "
            "ARRAY[%s, %s]::bigint[], ARRAY['{\"n\": 1}', '{\"n\": 1}']::jsonb[], "
            "ARRAY[0, 0]::numeric[], ARRAY[false]::boolean[], ARRAY[NULL, NULL]::jsonb[])",
            (a, b, claimed[a], claimed[b]),
        )
    assert ei.value.sqlstate == "PD000"
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.write_steps('w1', ARRAY[%s]::uuid[], ARRAY[%s]::bigint[], "
            "ARRAY['{}']::jsonb[], ARRAY[0]::numeric[], ARRAY[NULL]::boolean[], "
            "ARRAY[NULL]::jsonb[])",
            (a, claimed[a]),
        )
    assert ei.value.sqlstate == "PD000"
    for rid in (a, b):
        r = _run(conn, rid)
        assert r["status"] == "leased" and r["step"] == 0
        assert r["lease_owner"] == "w1" and r["lease_expires_at"] is not None
    # the well-formed call still works
    rows = conn.execute(
        "SELECT * FROM pgdurable.write_steps('w1', ARRAY[%s, %s]::uuid[], "
        "ARRAY[%s, %s]::bigint[], ARRAY['{}', '{}']::jsonb[], ARRAY[0, NULL]::numeric[], "
        "ARRAY[false, true]::boolean[], ARRAY[NULL, '1']::jsonb[])",
        (a, b, claimed[a], claimed[b]),
    ).fetchall()
    assert dict(rows) == {a: "leased", b: "completed"}


def test_park_run_timer_without_a_wake_time_is_rejected(conn: Conn) -> None:
    """A plain timer park (kind/ref NULL) with neither wake_at nor wake_in and
    no deadline parked the run 'waiting' on nothing: no timer, no signal can
    wake it (lost, invariant 3). Bad input: PD000, nothing changes."""
    rid = _start(conn)
    [(_, _, token)] = _claim(conn)
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.park_run(%s, %s, 'w1', '{\"n\": 1}'::jsonb, 0, NULL, NULL, "
            "NULL, NULL)",
            (rid, token),
        )
    assert ei.value.sqlstate == "PD000"
    r = _run(conn, rid)
    assert r["status"] == "leased" and r["step"] == 0 and r["state"] == {}
    # a wait on a signal without a timeout stays valid (a signal can satisfy it)
    row = conn.execute(
        "SELECT status, wake_at FROM pgdurable.park_run(%s, %s, 'w1', '{}'::jsonb, 0, 'ci', "
        "'b1', NULL, NULL)",
        (rid, token),
    ).fetchone()
    assert row == ("waiting", None)


def test_claim_does_not_starve_expired_leases_and_due_timers(conn: Conn) -> None:
    """claim_runs took runnable runs first and cut the union at p_limit, so
    while the runnable backlog filled every claim, a run whose worker crashed
    (expired lease) or whose timer was due was never claimed: its "future"
    never came (invariant 3; Sleep overshoot without bound). Same priority:
    the run that has been due the longest is claimed first, whatever the
    branch; a higher priority still goes first."""
    crashed, sleeper = _start(conn), _start(conn)
    tokens = {row[0]: row[2] for row in _claim(conn)}
    # sleeper: a timer due since 2000; crashed: its worker's lease lapsed in 2000
    conn.execute(
        "SELECT * FROM pgdurable.park_run(%s, %s, 'w1', '{}'::jsonb, 0, NULL, NULL, "
        "'2000-01-01 00:00:00+00', NULL)",
        (sleeper, tokens[sleeper]),
    )
    conn.execute(
        "UPDATE pgdurable.runs SET lease_expires_at = '2000-01-01 00:00:01+00' WHERE id = %s",
        (crashed,),
    )
    backlog = [_start(conn) for _ in range(3)]  # runnable since now
    got = []
    for _ in range(2):
        [(rid, status, _)] = conn.execute(
            "SELECT id, status, lease_token FROM pgdurable.claim_runs('w2', ARRAY['default'], "
            "ARRAY['t'], ARRAY['r1'], 1, '30 s'::interval)"
        ).fetchall()
        assert status == "leased"
        got.append(rid)
    assert got == [sleeper, crashed]
    # priority still wins over age
    high = conn.execute(
        "SELECT run_id FROM pgdurable.start_run('t', 'r1', '{}'::jsonb, 'default', 5, 3, NULL, "
        "NULL, NULL, NULL)"
    ).fetchone()
    assert high is not None
    claim = (
        "SELECT id FROM pgdurable.claim_runs('w2', ARRAY['default'], ARRAY['t'], ARRAY['r1'], "
        "%s, '30 s'::interval)"
    )
    assert conn.execute(claim, (1,)).fetchall() == [(high[0],)]
    assert {r[0] for r in conn.execute(claim, (10,)).fetchall()} == set(backlog)
