"""The operations views (run_overview, queue_stats) and retry_run, in SQL."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgdurable import Continue, Done, Durable, InvalidInput, RunContext, RunNotFound
from pgdurable.foundation.db import translated

NOW = "2030-01-10 12:00:00+00"

# one run per interesting situation, on a fixed database clock
SEED = """
INSERT INTO pgdurable.runs (task, revision, queue, status, available_at, lease_owner,
                            lease_expires_at, wait_kind, wait_ref, wait_since, wake_at, error,
                            created_at, finished_at, attempts)
VALUES
  ('t', '1', 'q1', 'runnable', '2030-01-10 11:59:00+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   '2030-01-10 11:00:00+00', NULL, 0),                                                  -- due 60 s
  ('t', '1', 'q1', 'runnable', '2030-01-10 12:05:00+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   '2030-01-10 11:00:00+00', NULL, 1),                                                  -- retry later
  ('t', '1', 'q1', 'leased', '2030-01-10 11:00:00+00', 'w1', '2030-01-10 12:00:30+00', NULL, NULL,
   NULL, NULL, NULL, '2030-01-10 11:00:00+00', NULL, 0),                                -- live lease
  ('t', '1', 'q1', 'leased', '2030-01-10 11:00:00+00', 'w2', '2030-01-10 11:59:59+00', NULL, NULL,
   NULL, NULL, NULL, '2030-01-10 11:00:00+00', NULL, 0),                                -- expired lease
  ('t', '1', 'q2', 'waiting', '2030-01-10 11:00:00+00', NULL, NULL, 'ci', 'b-1',
   '2030-01-10 11:30:00+00', '2030-01-10 13:00:00+00', NULL, '2030-01-10 11:00:00+00', NULL, 0),
  ('t', '1', 'q2', 'failed', '2030-01-10 11:00:00+00', NULL, NULL, NULL, NULL, NULL, NULL,
   '{"type": "ValueError", "message": "bad tool output", "traceback": null}',
   '2030-01-10 11:00:00+00', '2030-01-10 11:10:00+00', 3),
  ('t', '1', 'q2', 'completed', '2030-01-10 11:00:00+00', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   '2030-01-10 11:00:00+00', '2030-01-10 11:20:00+00', 0)
"""


@pytest.fixture
def seeded(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(SEED)
    return conn


def at_now(conn: psycopg.Connection[Any], sql: str) -> list[tuple[Any, ...]]:
    with conn.transaction():
        conn.execute(f"SET LOCAL pgdurable.now = '{NOW}'")
        return conn.execute(sql).fetchall()


def test_queue_stats(seeded: psycopg.Connection[Any]) -> None:
    rows = at_now(seeded, "SELECT * FROM pgdurable.queue_stats ORDER BY queue")
    assert rows == [
        ("q1", 2, 1, 2, 1, 0, 0, 0, 0, timedelta(seconds=60)),
        ("q2", 0, 0, 0, 0, 1, 1, 1, 0, None),
    ]


def test_run_overview_answers_where_stuck_waiting_failed(seeded: psycopg.Connection[Any]) -> None:
    where = at_now(seeded, """SELECT worker, lease_expired FROM pgdurable.run_overview
                               WHERE status = 'leased' ORDER BY worker""")
    assert where == [("w1", False), ("w2", True)]
    waits = at_now(seeded, """SELECT wait_kind, wait_ref, wait_since, wake_at FROM pgdurable.run_overview
                               WHERE status = 'waiting'""")
    assert [(k, r) for k, r, *_ in waits] == [("ci", "b-1")]
    failed = at_now(seeded, """SELECT error_type, error_message, attempts FROM pgdurable.run_overview
                                WHERE status = 'failed'""")
    assert failed == [("ValueError", "bad tool output", 3)]
    ages = at_now(seeded, "SELECT DISTINCT age FROM pgdurable.run_overview")
    assert ages == [(timedelta(hours=1),)]


def test_views_are_commented(conn: psycopg.Connection[Any]) -> None:
    for view in ("run_overview", "queue_stats"):
        row = conn.execute("SELECT obj_description(%s::regclass, 'pg_class')",
                           (f"pgdurable.{view}",)).fetchone()
        assert row and row[0]


def _retry(conn: psycopg.Connection[Any], rid: Any) -> Any:
    with translated():
        row = conn.execute("SELECT pgdurable.retry_run(%s::uuid)", (rid,)).fetchone()
    return row[0] if row else None


def test_retry_run_makes_failed_and_cancelled_runs_runnable(seeded: psycopg.Connection[Any]) -> None:
    seeded.execute("""INSERT INTO pgdurable.runs (task, revision, queue, status, finished_at,
                                                  cancel_requested_at, error, step, state, reclaims)
                      VALUES ('t', '1', 'q3', 'cancelled', now(), now(),
                              '{"type": "RunCancelled"}', 2, '{"kept": true}', 4)""")
    seeded.execute("LISTEN pgdurable_wake")
    ids = seeded.execute("""SELECT id FROM pgdurable.runs WHERE status IN ('failed', 'cancelled')
                             ORDER BY queue""").fetchall()
    for (rid,) in ids:
        assert _retry(seeded, rid) == "runnable"
    rows = seeded.execute("""
      SELECT queue, status, attempts + reclaims, claims, error, finished_at, cancel_requested_at,
             available_at <= now(), step, state
        FROM pgdurable.runs WHERE id = ANY (%s) ORDER BY queue""", ([r for (r,) in ids],)).fetchall()
    assert rows == [
        ("q2", "runnable", 0, 0, None, None, None, True, 0, {}),
        ("q3", "runnable", 0, 0, None, None, None, True, 2, {"kept": True}),
    ]
    notified = sorted(n.payload for n in seeded.notifies(timeout=1, stop_after=2))
    assert notified == ["q2", "q3"]


def test_retry_run_refuses_other_statuses_and_unknown_runs(seeded: psycopg.Connection[Any]) -> None:
    before = seeded.execute("SELECT * FROM pgdurable.runs ORDER BY id").fetchall()
    for status in ("runnable", "leased", "waiting", "completed"):
        row = seeded.execute("SELECT id FROM pgdurable.runs WHERE status = %s LIMIT 1", (status,)).fetchone()
        assert row is not None
        with pytest.raises(InvalidInput, match=f"is {status}: only failed or cancelled"):
            _retry(seeded, row[0])
    with pytest.raises(RunNotFound):
        _retry(seeded, "00000000-0000-0000-0000-000000000000")
    assert seeded.execute("SELECT * FROM pgdurable.runs ORDER BY id").fetchall() == before


async def test_a_retried_run_continues_from_its_checkpoint(dsn: str) -> None:
    calls: list[int] = []
    async with Durable(dsn) as app:

        @app.task("flaky", revision="1", max_attempts=1)
        async def flaky(ctx: RunContext, state: dict[str, Any]) -> Any:
            calls.append(ctx.step)
            if ctx.step == 0:
                return Continue({"n": 1})
            if state.get("fixed") is None and len(calls) == 2:
                raise RuntimeError("tool down")
            return Done({"n": state["n"]})

        worker = app.worker(lease_ttl=timedelta(seconds=5), poll_interval=0.2)
        running = asyncio.create_task(worker.run())
        try:
            rid = await app.start("flaky")
            for _ in range(200):
                if (await app.get_run(rid)).status == "failed":
                    break
                await asyncio.sleep(0.05)
            info = await app.get_run(rid)
            assert info.status == "failed" and info.error and info.error["type"] == "RuntimeError"
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                await c.execute("SELECT pgdurable.retry_run(%s::uuid)", (rid,))
            for _ in range(200):
                if (await app.get_run(rid)).status == "completed":
                    break
                await asyncio.sleep(0.05)
            info = await app.get_run(rid)
            assert info.status == "completed" and info.result == {"n": 1}
            assert calls == [0, 1, 1], "step 0 is not re-run: the retry resumes at the checkpoint"
        finally:
            await worker.stop(grace=1)
            await running
