"""Ledger checks shared by the integrations' budget tests (OpenAI Agents, LangGraph)."""

from __future__ import annotations

from typing import Any

import psycopg


def settled_twice(db: psycopg.Connection[Any], rid: str) -> int:
    """How many (step, reservation key, unit) of run ``rid`` were settled more than once."""
    row = db.execute("SELECT count(*) FROM (SELECT step, rkey, unit FROM pgdurable.budget_ledger "
                     "WHERE run_id = %s AND kind = 'settle' GROUP BY 1, 2, 3 "
                     "HAVING count(*) > 1) x", (rid,)).fetchone()
    assert row is not None
    return int(row[0])


def held(db: psycopg.Connection[Any]) -> int:
    """The holds of every budget still open."""
    row = db.execute("SELECT count(*) FROM pgdurable.budget_holds").fetchone()
    assert row is not None
    return int(row[0])
