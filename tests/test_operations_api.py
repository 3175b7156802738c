"""Operator API: app.retry / client.retry, client.mark_incompatible, a poll-only
worker (--no-listen), thread-message retention, the public start_params."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgdurable import Durable, DurableClient, InvalidInput, RunNotFound
from pgdurable.ops.retention import PruneResult, prune, prune_sync

ROOT = Path(__file__).resolve().parent.parent
NO_RUN = "00000000-0000-0000-0000-000000000000"


def _runs(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, status, error, finished_at, step, state, attempts)
      VALUES ('agent', '1', 'failed', '{"type": "ValueError", "message": "boom"}', now(), 2,
              '{"k": 1}', 3),
             ('agent', '1', 'cancelled', NULL, now(), 1, '{}', 1),
             ('agent', '1', 'completed', NULL, now(), 3, '{}', 1),
             ('agent', '1', 'runnable', NULL, NULL, 0, '{}', 0)
      RETURNING status, id""").fetchall()
    return {status: str(rid) for status, rid in rows}


def _snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT id, status, attempts, step, state, error, updated_at "
                        "FROM pgdurable.runs ORDER BY id").fetchall()


def _check_retry(conn: psycopg.Connection[Any], ids: dict[str, str], retry: Any) -> None:
    assert retry(ids["failed"]) == "runnable"
    row = conn.execute("SELECT status, attempts, step, state, error, finished_at "
                       "FROM pgdurable.runs WHERE id = %s", (ids["failed"],)).fetchone()
    assert row == ("runnable", 0, 2, {"k": 1}, None, None), "resumes from its checkpoint"
    assert retry(uuid.UUID(ids["cancelled"])) == "runnable"
    before = _snapshot(conn)
    for status in ("completed", "runnable", "failed"):  # "failed" is runnable now
        with pytest.raises(InvalidInput, match="only failed or cancelled runs can be retried"):
            retry(ids[status])
    with pytest.raises(RunNotFound):
        retry(NO_RUN)
    with pytest.raises(ValueError, match="not a UUID"):
        retry("nope")
    with pytest.raises(TypeError):
        retry(42)
    assert _snapshot(conn) == before, "a refused retry changes nothing"


async def test_app_retry(dsn: str, conn: psycopg.Connection[Any]) -> None:
    ids = _runs(conn)
    loop = asyncio.get_running_loop()
    async with Durable(dsn) as app:

        def retry(rid: Any) -> str:  # called from the checking thread, runs on this loop
            return asyncio.run_coroutine_threadsafe(app.retry(rid), loop).result(timeout=60)

        await asyncio.to_thread(_check_retry, conn, ids, retry)


def test_client_retry(dsn: str, conn: psycopg.Connection[Any]) -> None:
    ids = _runs(conn)
    with DurableClient(dsn) as client:
        _check_retry(conn, ids, client.retry)


def test_client_mark_incompatible(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("""INSERT INTO pgdurable.runs (task, revision, status)
                    VALUES ('agent', '1', 'runnable'), ('agent', '1', 'runnable'),
                           ('agent', '2', 'runnable')""")
    with DurableClient(dsn) as client:
        before = _snapshot(conn)
        with pytest.raises(TypeError):
            client.mark_incompatible("agent", 1)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            client.mark_incompatible("agent", "1", "")
        assert _snapshot(conn) == before
        assert client.mark_incompatible("agent", "1", "retired") == 2
        assert client.mark_incompatible("agent", "1") == 0
    rows = conn.execute("SELECT revision, status, error->>'type' FROM pgdurable.runs "
                        "ORDER BY revision, status").fetchall()
    assert rows == [("1", "incompatible", "IncompatibleCheckpoint"),
                    ("1", "incompatible", "IncompatibleCheckpoint"),
                    ("2", "runnable", None)]


# -- poll-only workers -------------------------------------------------------------------

LISTENERS = """
SELECT count(*) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
   AND application_name = 'pgdurable' AND query ILIKE 'LISTEN%%'
"""


def _count(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> int:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return int(row[0])


# These three tests start their worker by hand, not with the ``fleet`` fixture
# (tests/fix_fleet.py), on purpose: they assert on each entry point's own command line
# (``--no-listen`` of ``python -m pgdurable.worker`` and of ``python -m pgdurable
# worker``, through the same helper, with the worker's own defaults) and on the
# application_name its connections carry by default ('pgdurable', in LISTENERS), which
# the fleet replaces with ``fleet-NAME``.
def _worker_completes_a_run(dsn: str, conn: psycopg.Connection[Any], argv: list[str]) -> None:
    env = {**os.environ, "PGDURABLE_DSN": dsn}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        with DurableClient(dsn) as client:
            # wait until the worker is up (its pool checked the schema), then start a run:
            # with no LISTEN only the poll can find it
            deadline = time.monotonic() + 60
            while _count(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                               "current_database() AND application_name = 'pgdurable' "
                               "AND pid <> pg_backend_pid()") == 0:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the worker did not connect"
                time.sleep(0.05)
            rid = client.start("ops.two_steps", {}, revision="1")
            while client.get_run(rid).status != "completed":
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the poll-only worker did not finish the run"
                time.sleep(0.05)
            assert client.get_run(rid).result == {"ok": True}
            assert _count(conn, LISTENERS) == 0, "a --no-listen worker opened a LISTEN"
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_python_m_worker_no_listen_polls_only(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _worker_completes_a_run(dsn, conn, [
        sys.executable, "-m", "pgdurable.worker", "tests._ops_procs:app", "--poll", "0.2",
        "--lease-ttl", "5", "--grace", "2", "--no-listen"])


def test_cli_worker_no_listen_polls_only(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _worker_completes_a_run(dsn, conn, [
        sys.executable, "-m", "pgdurable", "worker", "tests._ops_procs:app", "--poll", "0.2",
        "--lease-ttl", "5", "--grace", "2", "--no-listen"])


def test_listening_worker_shows_its_listen(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Control for the checks above: a default worker's LISTEN is visible."""
    env = {**os.environ, "PGDURABLE_DSN": dsn}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgdurable.worker", "tests._ops_procs:app", "--poll", "5",
         "--grace", "1"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 60
        while _count(conn, LISTENERS) == 0:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no LISTEN connection appeared"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


# -- retention of thread messages ---------------------------------------------------------

SEND = ("SELECT run_id::text FROM pgdurable.send_message(%s, %s, '1', NULL, 'chat', '1', "
        "'default', 0, 3)")


def _consumed_messages(conn: psycopg.Connection[Any], thread: str, n: int) -> None:
    """n consumed messages on ``thread`` (claimed, taken, checkpointed) and one pending."""
    row = conn.execute(SEND, (thread, f"{thread}-0")).fetchone()
    assert row is not None
    rid = row[0]
    for i in range(1, n):
        conn.execute(SEND, (thread, f"{thread}-{i}"))
    row = conn.execute("SELECT lease_token FROM pgdurable.claim_runs('w', '{default}', "
                       "'{chat}', '{1}', 1, '30 s')").fetchone()
    assert row is not None
    conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w')", (rid, row[0]))
    conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w', '{}', 0)", (rid, row[0]))
    conn.execute(SEND, (thread, f"{thread}-pending"))


def _messages(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT message_id FROM pgdurable.thread_messages ORDER BY message_id")]


def test_prune_deletes_consumed_thread_messages(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _consumed_messages(conn, "t1", 5)
    assert prune_sync(conn, "1h", dry_run=True).messages == 0, "too recent"
    assert prune_sync(conn, "1h") == PruneResult(batches=1)
    preview = prune_sync(conn, timedelta(0), dry_run=True)
    assert preview == PruneResult(dry_run=True, messages=5)
    assert len(_messages(conn)) == 6, "a dry run deletes nothing"
    # an exclusive batch that finds the pruner lock taken deletes no messages either
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pg_advisory_xact_lock(pgdurable.prune_lock_key())")
        assert prune_sync(conn, timedelta(0), exclusive=True).skipped
        other.rollback()
    assert len(_messages(conn)) == 6
    result = prune_sync(conn, timedelta(0), batch=2)
    assert (result.messages, result.batches, result.runs) == (5, 3, 0)
    assert result.rows == 5 and result.as_dict()["messages"] == 5
    assert _messages(conn) == ["t1-pending"], "pending messages are kept"


async def test_async_prune_and_cli_count_thread_messages(
    dsn: str, conn: psycopg.Connection[Any],
) -> None:
    _consumed_messages(conn, "t2", 3)
    async with Durable(dsn) as app:
        assert (await prune(app, timedelta(0), dry_run=True)).messages == 3
    p = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "pgdurable", "prune", "--older-than", "0s",
                         "--dsn", dsn], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "3 consumed thread message(s)" in p.stdout, p.stdout
    assert _messages(conn) == ["t2-pending"]


# -- public start parameters for integrations ------------------------------------------------

def test_start_params_is_public() -> None:
    from pgdurable.app import durable as runs

    registry = runs.TaskRegistry()
    app = Durable("postgresql://127.0.0.1/unused")

    @app.task("t", revision="7", max_attempts=4)
    def step(ctx: Any, state: Any) -> Any:
        return None

    params = runs.start_params(app._registry, "t", {"a": 1}, queue="q")
    assert params[:6] == ("t", "7", '{"a":1}', "q", 0, 4)
    with pytest.raises(Exception, match="no task 'other' is registered"):
        runs.start_params(registry, "other")
    with pytest.raises(TypeError):
        runs.start_params(registry, "x", set(), revision="1")
