"""The rules of a runs row: one CHECK (runs_check, sql/0025_runs_check.sql) that
calls pgdurable._runs_check, in place of 14 CHECK constraints. Every old rule
still holds, and a write that breaks one fails as before: check_violation, the
old constraint's name, nothing changed."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from _released import migrate_released
from psycopg import sql

import pgdurable
from pgdurable import DurableClient
from pgdurable.foundation.migrations import load_migrations

# (the change, the old constraint that refuses it)
BROKEN = [
    ("task = ''", "runs_task_check"),
    ("queue = ''", "runs_queue_check"),
    ("status = 'paused'", "runs_status_check"),
    ("step = -1", "runs_step_check"),
    ("attempts = -1", "runs_attempts_check"),
    ("max_attempts = 0", "runs_max_attempts_check"),
    ("claims = -1", "runs_claims_check"),
    ("reclaims = -1", "runs_reclaims_check"),
    ("budget = -0.5", "runs_budget_check"),
    ("thread_key = ''", "runs_thread_key_check"),
    ("parent_policy = 'orphan'", "runs_parent_policy_check"),
    ("parent_run_id = id", "runs_child_shape"),  # a parent without child_key, policy, root
    ("forked_from_step = -1", "runs_forked_from_step_check"),
]


def _one_run(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    conn.execute("SELECT * FROM pgdurable.start_run('t', '1', '{\"n\": 1}', 'default', 0, 3, "
                 "NULL, NULL, NULL, NULL)")
    row = conn.execute("SELECT * FROM pgdurable.runs").fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(("change", "name"), BROKEN, ids=[b[1] for b in BROKEN])
def test_each_rule_refuses_its_write_by_its_old_name(
        conn: psycopg.Connection[Any], change: str, name: str) -> None:
    before = _one_run(conn)
    conn.commit()
    with pytest.raises(psycopg.errors.CheckViolation) as e:
        conn.execute(sql.SQL("UPDATE pgdurable.runs SET {}").format(sql.SQL(change)))  # type: ignore[arg-type]
    conn.rollback()
    assert e.value.diag.constraint_name == name
    assert e.value.diag.table_name == "runs" and e.value.diag.schema_name == "pgdurable"
    assert str(e.value).startswith(
        f'new row for relation "runs" violates check constraint "{name}"')
    assert tuple(conn.execute("SELECT * FROM pgdurable.runs").fetchone() or ()) == before


def test_child_key_empty_is_refused_for_a_child(conn: psycopg.Connection[Any]) -> None:
    _one_run(conn)
    with pytest.raises(psycopg.errors.CheckViolation) as e:
        conn.execute("UPDATE pgdurable.runs SET parent_run_id = id, root_run_id = id, "
                     "parent_policy = 'cancel', child_key = ''")
    assert e.value.diag.constraint_name == "runs_child_key_check"


def test_a_well_formed_child_and_null_optionals_pass(conn: psycopg.Connection[Any]) -> None:
    """NULL passes, as in a CHECK: budget, thread_key, forked_from_step and the
    child columns are NULL on an ordinary run; a child sets all four of its own."""
    _one_run(conn)
    conn.execute("UPDATE pgdurable.runs SET parent_run_id = id, root_run_id = id, "
                 "parent_policy = 'abandon', child_key = 'c1', budget = 0, "
                 "forked_from_step = 0, thread_key = 'k'")
    row = conn.execute("SELECT child_key, budget FROM pgdurable.runs").fetchone()
    assert row is not None and row[0] == "c1" and row[1] == 0


def test_an_insert_is_checked_too(dsn: str) -> None:
    """start() with a bad max_attempts never reaches the table in Python; the
    statement itself refuses it the same way."""
    with psycopg.connect(dsn) as c:
        with pytest.raises(psycopg.errors.CheckViolation) as e:
            c.execute("SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 0, "
                      "NULL, NULL, NULL, NULL)")
        assert e.value.diag.constraint_name == "runs_max_attempts_check"
        c.rollback()
        assert c.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)
    with DurableClient(dsn) as client:  # and the library still starts runs
        assert client.start("t", {}, revision="1")


def test_runs_has_one_validated_check(conn: psycopg.Connection[Any]) -> None:
    rows = conn.execute(
        "SELECT conname, convalidated FROM pg_constraint "
        "WHERE conrelid = 'pgdurable.runs'::regclass AND contype = 'c'").fetchall()
    assert rows == [("runs_check", True)]


def _sql_of(version: int) -> str:
    return next(m.sql for m in load_migrations() if m.version == version)


def _start_within(dsn: str, seconds: str) -> None:
    """A start from another connection, which gives up after ``seconds`` of waiting
    for a lock (psycopg.errors.LockNotAvailable)."""
    with psycopg.connect(dsn) as other:
        other.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(seconds)))
        other.execute("SELECT * FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, "
                      "NULL, NULL, NULL, NULL)")


def _drop_runs_check(c: psycopg.Connection[Any]) -> str:
    """Drop runs_check; its definition, to add it back."""
    row = c.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = 'pgdurable.runs'::regclass AND conname = 'runs_check'"
                    ).fetchone()
    assert row is not None
    c.execute("ALTER TABLE pgdurable.runs DROP CONSTRAINT runs_check")
    return str(row[0])


def _add_not_valid(c: psycopg.Connection[Any], definition: str) -> None:
    """runs_check as 0025 leaves it: added NOT VALID, for 0026 to validate."""
    c.execute(sql.SQL("ALTER TABLE pgdurable.runs ADD CONSTRAINT runs_check {} NOT VALID")
              .format(sql.SQL(definition)))  # type: ignore[arg-type]


def test_0026_validates_rows_while_starts_go_on(dsn: str) -> None:
    """0026's scan holds a lock that starts pass (SHARE UPDATE EXCLUSIVE), unlike
    0025's ALTER (ACCESS EXCLUSIVE), with rows written before it to check."""
    with psycopg.connect(dsn) as c:  # not autocommit: 0026 is held open below
        definition = _drop_runs_check(c)
        for _ in range(50):
            _one_run(c)
        _add_not_valid(c, definition)
        c.commit()
        c.execute(_sql_of(26))  # its lock is held until the commit
        _start_within(dsn, "5s")
        c.commit()
        assert c.execute(
            "SELECT convalidated FROM pg_constraint WHERE conrelid = 'pgdurable.runs'::regclass "
            "AND conname = 'runs_check'").fetchone() == (True,)
        assert c.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (51,)
        # the control: the same start waits behind an ALTER TABLE that adds a CHECK
        c.execute("ALTER TABLE pgdurable.runs ADD CONSTRAINT probe CHECK (true) NOT VALID")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            _start_within(dsn, "200ms")
        c.rollback()


def test_0026_fails_on_a_row_written_around_the_rules(conn: psycopg.Connection[Any]) -> None:
    definition = _drop_runs_check(conn)
    _one_run(conn)
    conn.execute("UPDATE pgdurable.runs SET step = -1")  # no rule to refuse it now
    _add_not_valid(conn, definition)
    with pytest.raises(psycopg.errors.CheckViolation) as e:
        conn.execute(_sql_of(26))
    assert e.value.diag.constraint_name == "runs_step_check"


def test_an_installation_with_runs_upgrades_to_one_check(
        empty_dsn: str) -> None:
    """From 0024 (14 CHECKs) with rows of every shape: 0025 and 0026 apply, every row
    is kept as it was, and runs ends with one validated CHECK."""
    migrate_released(empty_dsn, 24)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = "
                         "'pgdurable.runs'::regclass AND contype = 'c'").fetchone() == (14,)
        c.execute("""
          INSERT INTO pgdurable.runs (task, revision, queue, status, step, attempts, budget,
                                      thread_key, forked_from_step, finished_at)
          SELECT 't', '1', 'q' || g % 3,
                 (ARRAY['runnable', 'waiting', 'completed', 'failed'])[g % 4 + 1],
                 g % 5, g % 2, CASE WHEN g % 3 = 0 THEN 1.5 END,
                 CASE WHEN g % 7 = 0 THEN 'th' || g END, CASE WHEN g % 11 = 0 THEN 1 END,
                 CASE WHEN g % 4 >= 2 THEN pgdurable.now() END
            FROM generate_series(1, 200) g""")
        c.execute("""
          INSERT INTO pgdurable.runs (task, revision, queue, parent_run_id, root_run_id,
                                      child_key, parent_policy)
          SELECT 'child', '1', 'default', id, id, 'c' || id, 'cancel'
            FROM pgdurable.runs WHERE task = 't' LIMIT 20""")
        cur = c.execute("SELECT * FROM pgdurable.runs ORDER BY id")
        columns = [d.name for d in cur.description or ()]
        before = cur.fetchall()
    applied = pgdurable.migrate(empty_dsn)
    assert [m.version for m in applied][:2] == [25, 26]  # and any later ones
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        kept = ", ".join(columns)  # later migrations may add columns
        assert c.execute(f"SELECT {kept} FROM pgdurable.runs ORDER BY id").fetchall() == before
        assert c.execute("SELECT conname, convalidated FROM pg_constraint WHERE conrelid = "
                         "'pgdurable.runs'::regclass AND contype = 'c'").fetchall() == [
            ("runs_check", True)]
    with DurableClient(empty_dsn) as client:
        assert client.start("t", {}, revision="1")
