"""The operator CLI: runs, run, leases, cancel, retry, prune, stats, worker, migrate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from pgdurable import DurableClient
from pgdurable.ops import cli as cli_module
from pgdurable.ops.cli import app

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pgdurable"]
NO_RUN = "00000000-0000-0000-0000-000000000000"


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


def jcli(*args: str) -> Any:
    r = cli(*args, "--json")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    if args[0] == "runs":  # a page: its runs and the next page's cursor
        assert set(doc) == {"runs", "next_cursor"}, doc
        return doc["runs"]
    return doc


@pytest.fixture
def runs(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """A run per status of interest; returns {name: id}."""
    rows = conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, queue, status, lease_owner, lease_expires_at,
                                  wait_kind, wait_ref, wait_since, error, finished_at, step, state)
      VALUES ('agent', '1', 'default', 'runnable', NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, '{}'),
             ('agent', '1', 'default', 'leased', 'host:1:w', now() + interval '1 min', NULL, NULL,
              NULL, NULL, NULL, 1, '{"a": 1}'),
             ('agent', '1', 'fast', 'waiting', NULL, NULL, 'approval', 'r-1', now(), NULL, NULL, 2, '{}'),
             ('report', '1', 'fast', 'failed', NULL, NULL, NULL, NULL, NULL,
              '{"type": "ValueError", "message": "bad tool output", "traceback": "tb"}', now(), 1, '{}'),
             ('report', '1', 'default', 'completed', NULL, NULL, NULL, NULL, NULL, NULL,
              now() - interval '10 days', 2, '{"done": true}')
      RETURNING status, id""").fetchall()
    ids = {status: str(rid) for status, rid in rows}
    leased = ids["leased"]
    conn.execute("""INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake)
                    VALUES (%s, 1, 7, '{"a": 1}', '{"type": "signal", "kind": "ci", "ref": "b"}')""",
                 (leased,))
    conn.execute("INSERT INTO pgdurable.run_events (run_id, seq, event) VALUES (%s, 1, '{\"token\": \"hi\"}')",
                 (leased,))
    conn.execute("""INSERT INTO pgdurable.effects (run_id, key, status, token, result)
                    VALUES (%s, 'search', 'succeeded', 7, '{"hits": 3}')""", (leased,))
    return ids


@pytest.fixture(autouse=True)
def _dsn_env(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module.out, "width", 250)
    monkeypatch.setenv("PGDURABLE_DSN", dsn)
    monkeypatch.delenv("DATABASE_URL", raising=False)


def test_runs_lists_and_filters(runs: dict[str, str]) -> None:
    assert len(jcli("runs")) == 5
    assert [r["id"] for r in jcli("runs", "--status", "failed")] == [runs["failed"]]
    assert {r["status"] for r in jcli("runs", "--task", "report")} == {"failed", "completed"}
    assert {r["status"] for r in jcli("runs", "--queue", "fast")} == {"waiting", "failed"}
    assert len(jcli("runs", "--limit", "2")) == 2
    failed = jcli("runs", "--status", "failed")[0]
    assert (failed["error_type"], failed["error_message"]) == ("ValueError", "bad tool output")
    r = cli("runs")
    assert r.exit_code == 0 and "5 run(s)" in r.stdout and "approval:r-1" in r.stdout
    r = cli("runs", "--status", "sleeping")
    assert r.exit_code == 2 and "unknown status 'sleeping'" in r.stderr


def test_run_shows_state_steps_events_effects(runs: dict[str, str]) -> None:
    doc = jcli("run", runs["leased"])
    assert doc["run"]["status"] == "leased" and doc["run"]["lease_owner"] == "host:1:w"
    assert doc["steps"] == [{"step": 1, "token": 7, "created_at": doc["steps"][0]["created_at"],
                             "wake": {"type": "signal", "kind": "ci", "ref": "b"}, "state": {"a": 1}}]
    assert [e["event"] for e in doc["events"]] == [{"token": "hi"}]
    assert [(e["key"], e["status"], e["result"]) for e in doc["effects"]] == [
        ("search", "succeeded", {"hits": 3})]
    r = cli("run", runs["leased"])
    assert r.exit_code == 0
    for needle in ("lease", "host:1:w", "steps", "effects", "events", "search"):
        assert needle in r.stdout
    r = cli("run", runs["failed"])
    assert "ValueError: bad tool output" in r.stdout
    r = cli("run", runs["waiting"])
    assert "approval:r-1" in r.stdout


def test_run_unknown_and_malformed_ids() -> None:
    r = cli("run", NO_RUN)
    assert r.exit_code == 3 and f"no run {NO_RUN}" in r.stderr
    r = cli("run", "not-a-uuid")
    assert r.exit_code == 2 and "is not a run id" in r.stderr


def test_leases_shows_provider_leases_and_leased_runs(conn: psycopg.Connection[Any], runs: dict[str, str]) -> None:
    conn.execute("SELECT pgdurable.acquire_lease('thread:abc'::text, 'proc-1'::text, 60000::bigint)")
    doc = jcli("leases")
    assert [(x["key"], x["owner"]) for x in doc["leases"]] == [("thread:abc", "proc-1")]
    assert [x["id"] for x in doc["runs"]] == [runs["leased"]]
    r = cli("leases")
    assert r.exit_code == 0 and "thread:abc" in r.stdout and "1 leased run(s)" in r.stdout


def test_cancel(conn: psycopg.Connection[Any], runs: dict[str, str]) -> None:
    r = cli("cancel", runs["runnable"])
    assert r.exit_code == 0 and "cancelled" in r.stdout
    r = cli("cancel", runs["leased"])
    assert r.exit_code == 0 and "cancel requested" in r.stdout
    r = cli("cancel", runs["completed"])
    assert r.exit_code == 0 and "already completed" in r.stdout
    assert cli("cancel", NO_RUN).exit_code == 3
    statuses = dict(conn.execute("SELECT id::text, status FROM pgdurable.runs").fetchall())
    assert statuses[runs["runnable"]] == "cancelled" and statuses[runs["leased"]] == "leased"


def test_retry(conn: psycopg.Connection[Any], runs: dict[str, str]) -> None:
    r = cli("retry", runs["failed"])
    assert r.exit_code == 0 and "runnable again" in r.stdout
    row = conn.execute("SELECT status, attempts, error FROM pgdurable.runs WHERE id = %s",
                       (runs["failed"],)).fetchone()
    assert row == ("runnable", 0, None)
    r = cli("retry", runs["completed"])
    assert r.exit_code == 2 and "only failed or cancelled runs can be retried" in r.stderr
    assert cli("retry", NO_RUN).exit_code == 3


def test_prune(conn: psycopg.Connection[Any], runs: dict[str, str]) -> None:
    assert jcli("prune", "--older-than", "7d", "--dry-run")["runs"] == 1
    assert conn.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (5,)
    done = jcli("prune", "--older-than", "7d", "--batch", "10")
    assert (done["runs"], done["dry_run"], done["batches"]) == (1, False, 1)
    r = cli("prune", "--older-than", "0s")
    assert r.exit_code == 0 and "deleted 1 run(s)" in r.stdout  # the failed one
    r = cli("prune", "--older-than", "a week")
    assert r.exit_code == 2 and "bad age" in r.stderr
    r = cli("prune", "--batch", "0")
    assert r.exit_code == 2


def test_stats(runs: dict[str, str]) -> None:
    rows = {r["queue"]: r for r in jcli("stats")}
    assert (rows["default"]["runnable"], rows["default"]["leased"], rows["default"]["completed"]) == (1, 1, 1)
    assert (rows["fast"]["waiting"], rows["fast"]["failed"]) == (1, 1)
    assert rows["default"]["oldest_runnable_age"] >= 0
    r = cli("stats")
    assert r.exit_code == 0 and "default" in r.stdout and "fast" in r.stdout


def test_migrate_shows_what_it_applied(empty_dsn: str) -> None:
    r = cli("migrate", "--dsn", empty_dsn)
    assert r.exit_code == 0 and "applied 0001_schema.sql" in r.stdout and "0007_operations" in r.stdout
    r = cli("migrate", "--dsn", empty_dsn)
    assert r.exit_code == 0 and "up to date" in r.stdout


def test_database_problems_are_one_line_errors(empty_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = cli("runs", "--dsn", empty_dsn)
    assert r.exit_code == 2 and "pgdurable migrate" in r.stderr
    monkeypatch.delenv("PGDURABLE_DSN")
    r = cli("stats")
    assert r.exit_code == 2 and "no database given" in r.stderr
    # a real process: exit code, one line, no traceback
    p = subprocess.run([*CLI, "run", NO_RUN, "--dsn", empty_dsn.replace("pgd_", "pgd_missing_")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_worker_command_runs_a_worker_and_a_pruner_until_sigterm(
    dsn: str, conn: psycopg.Connection[Any],
) -> None:
    conn.execute("""INSERT INTO pgdurable.runs (task, revision, status, finished_at)
                    SELECT 'old', '1', 'completed', now() - interval '8 days'
                      FROM generate_series(1, 5)""")
    env = {**os.environ, "PGDURABLE_DSN": dsn}
    proc = subprocess.Popen(
        [*CLI, "worker", "tests._ops_procs:app", "--concurrency", "2", "--lease-ttl", "5",
         "--poll", "0.2", "--grace", "2", "--prune-older-than", "7d", "--prune-every", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with DurableClient(dsn) as client:
            rid = client.start("ops.two_steps", {}, revision="1", idempotency_key=str(uuid.uuid4()))
            deadline = time.monotonic() + 30
            while client.get_run(rid).status != "completed":
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the worker did not finish the run"
                time.sleep(0.1)
            assert client.get_run(rid).result == {"ok": True}
            while conn.execute("SELECT count(*) FROM pgdurable.runs WHERE task = 'old'").fetchone() != (0,):
                assert time.monotonic() < deadline, "the pruner did not prune"
                time.sleep(0.1)
            assert client.get_run(rid).status == "completed", "young runs are kept"
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_usage_errors_are_one_line_with_exit_2() -> None:
    for args, needle in ((["runs", "--bogus"], "No such option: --bogus"),
                         (["runs", "--limit", "x"], "Invalid value for '--limit'"),
                         (["frobnicate"], "No such command"),
                         (["run"], "Missing argument")):
        p = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
