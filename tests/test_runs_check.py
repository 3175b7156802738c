"""The rules of a runs row: one CHECK (runs_check, sql/0025_runs_check.sql) that
calls pgdurable._runs_check, in place of 14 CHECK constraints. Every old rule
still holds, and a write that breaks one fails as before: check_violation, the
old constraint's name, nothing changed."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgdurable import DurableClient

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
