"""What the command line prints where there is no terminal (a pipe, CI, ``docker logs``)
and on a narrow one, ``pgdurable start``, and what ``run ID`` says about a run.

The commands run as real processes: their stdout is a pipe (``subprocess``) or
a pseudo-terminal of 80 columns (``pty``), as a user's would be.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pgdurable"]

LONG_TASK = "research.summarize_the_quarterly_reports_of_every_subsidiary"
LONG_QUEUE = "tenant-acme-eu-west-priority-interactive"
LONG_ERROR = ("the model answered with a tool call whose arguments do not match the schema "
              "of the tool (missing field 'ticker')")


def pgdurable(dsn: str, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    """``pgdurable ARGS`` with stdout and stderr pipes, COLUMNS=80."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PGDURABLE_DSN": dsn, "COLUMNS": "80",
                               **(env or {})})


def on_a_terminal(dsn: str, *args: str, columns: int = 80) -> str:
    """``pgdurable ARGS`` on a pseudo-terminal of ``columns`` columns; what it showed."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    p = subprocess.Popen([*CLI, *args], stdout=child, stderr=child, stdin=subprocess.DEVNULL,
                         cwd=ROOT, env={**os.environ, "PGDURABLE_DSN": dsn,
                                        "COLUMNS": str(columns), "TERM": "xterm"})
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([parent], [], [], 60)
        assert ready, "the command printed nothing for 60 s"
        try:
            data = os.read(parent, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert p.wait(timeout=60) == 0
    os.close(parent)
    import re
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")


@pytest.fixture
def long_runs(conn: psycopg.Connection[Any]) -> dict[str, str]:
    rows = conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, queue, status, error, finished_at, step)
      VALUES (%s, '1', %s, 'failed', jsonb_build_object('type', 'ToolArgumentsInvalid',
              'message', %s::text), now(), 3),
             (%s, '1', %s, 'runnable', NULL, NULL, 0)
      RETURNING status, id::text""", (LONG_TASK, LONG_QUEUE, LONG_ERROR, LONG_TASK, LONG_QUEUE)
                        ).fetchall()
    return dict(rows)


def test_runs_and_stats_through_a_pipe_print_every_value_whole(
        dsn: str, long_runs: dict[str, str]) -> None:
    runs = pgdurable(dsn, "runs")
    assert runs.returncode == 0, runs.stderr
    assert "…" not in runs.stdout, runs.stdout
    failed = next(line for line in runs.stdout.splitlines() if long_runs["failed"] in line)
    for value in (LONG_TASK, LONG_QUEUE, "failed", f"ToolArgumentsInvalid: {LONG_ERROR}"):
        assert value in failed, (value, failed)  # one row, one line, whatever COLUMNS says
    stats = pgdurable(dsn, "stats")
    assert stats.returncode == 0 and "…" not in stats.stdout, stats.stdout
    row = next(line for line in stats.stdout.splitlines() if LONG_QUEUE in line)
    assert row.split()[:3] == [LONG_QUEUE, "1", "1"], row  # queue, runnable, due
    run = pgdurable(dsn, "run", long_runs["failed"])
    assert f"ToolArgumentsInvalid: {LONG_ERROR}" in run.stdout and "…" not in run.stdout


def test_runs_on_an_80_column_terminal_is_a_record_per_run(
        dsn: str, long_runs: dict[str, str]) -> None:
    shown = on_a_terminal(dsn, "runs")
    assert "t…" not in shown and "q…" not in shown, shown
    lines = [line.rstrip() for line in shown.splitlines()]
    assert max(len(line) for line in lines) <= 80, shown
    assert f"id       {long_runs['failed']}" in lines, shown
    assert any(line.startswith("status") and line.endswith("failed") for line in lines)
    assert "queue    " + LONG_QUEUE in lines, shown
    wide = on_a_terminal(dsn, "runs", columns=400)  # room enough: the table
    assert any(long_runs["failed"] in line and LONG_QUEUE in line
               for line in wide.splitlines()), wide


def test_runs_json_is_the_whole_page_with_its_cursor(dsn: str, long_runs: dict[str, str]
                                                     ) -> None:
    p = pgdurable(dsn, "runs", "--limit", "1", "--json")
    doc = json.loads(p.stdout)
    assert len(doc["runs"]) == 1 and doc["next_cursor"], doc
    assert doc["runs"][0]["error_message"] in (None, LONG_ERROR)
    rest = json.loads(pgdurable(dsn, "runs", "--limit", "1", "--cursor", doc["next_cursor"],
                                "--json").stdout)
    assert rest["next_cursor"] is None
    assert {doc["runs"][0]["id"], rest["runs"][0]["id"]} == set(long_runs.values())


# -- pgdurable start ------------------------------------------------------------------

def _count(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT count(*) FROM pgdurable.runs").fetchone()[0])  # type: ignore[index]


def test_start_starts_a_run_as_app_start_does(dsn: str, conn: psycopg.Connection[Any]) -> None:
    p = pgdurable(dsn, "start", "agent", "--revision", "3", "--state", '{"topic": "pg"}',
                  "--queue", "q1", "--key", "tenant-a", "--delay", "1h",
                  "--metadata", '{"tenant": "acme"}')
    assert p.returncode == 0, p.stderr
    rid = p.stdout.strip()
    row = conn.execute(
        "SELECT task, revision, queue, state, concurrency_key, metadata, status, "
        "available_at > now() + interval '59 minutes' FROM pgdurable.runs WHERE id = %s",
        (rid,)).fetchone()
    assert row == ("agent", "3", "q1", {"topic": "pg"}, "tenant-a", {"tenant": "acme"},
                   "runnable", True)
    # the revision the task's registered workers serve; --json; an idempotent repeat
    conn.execute("SELECT pgdurable.register_worker('w-1', ARRAY['mailer'], ARRAY['7'])")
    doc = json.loads(pgdurable(dsn, "start", "mailer", "--idempotency-key", "k-1", "--json").stdout)
    assert (doc["task"], doc["revision"], doc["queue"], doc["created"]) == (
        "mailer", "7", "default", True)
    again = pgdurable(dsn, "start", "mailer", "--idempotency-key", "k-1")
    assert again.returncode == 0 and again.stdout.strip() == doc["id"], again.stderr
    assert "the run it started before" in again.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["agent", "--revision", "1", "--state", "{"], "--state is not JSON"),
    (["agent", "--revision", "1", "--metadata", "[1]"], "metadata must be a dict"),
    (["agent", "--revision", "1", "--metadata", "{"], "--metadata is not JSON"),
    (["agent", "--revision", "1", "--delay", "soon"], "bad age 'soon'"),
    (["agent", "--revision", "1", "--queue", ""], "queue"),
    (["", "--revision", "1"], "task"),
    (["agent", "--revision", "1", "--state", '"\\ud800"'], "surrogate"),
    (["agent"], "no worker has registered task 'agent': pass --revision"),
])
def test_start_refuses_bad_input_in_one_line_and_writes_nothing(
        dsn: str, conn: psycopg.Connection[Any], args: list[str], needle: str) -> None:
    before = _count(conn)
    p = pgdurable(dsn, "start", *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert needle in p.stderr, p.stderr
    assert _count(conn) == before


def test_start_names_the_revisions_when_workers_serve_several(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.register_worker('w-1', ARRAY['agent'], ARRAY['1'])")
    conn.execute("SELECT pgdurable.register_worker('w-2', ARRAY['agent'], ARRAY['2'])")
    p = pgdurable(dsn, "start", "agent")
    assert p.returncode == 2 and "in revisions '2', '1': pass --revision" in p.stderr, p.stderr
    assert _count(conn) == 0


# -- pgdurable run ID: what it says about a run ------------------------------------------

def test_run_of_a_recovered_run_tree_order_and_wakes(dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    parent = str(uuid.uuid4())
    conn.execute("""
      INSERT INTO pgdurable.runs (id, task, revision, status, step, result, error, finished_at,
                                  created_at)
      VALUES (%s, 'fan', '1', 'completed', 2, '{"ok": true}',
              '{"type": "LeaseExpired", "message": "lease of worker w-1 expired"}', now(),
              now() - interval '1 hour')""", (parent,))
    # three children, started one after the other; their ids sort in another order
    kids = sorted((str(uuid.uuid4()) for _ in range(3)), reverse=True)
    for i, kid in enumerate(kids):
        conn.execute("""
          INSERT INTO pgdurable.runs (id, task, revision, status, parent_run_id, root_run_id,
                                      child_key, parent_policy, created_at, finished_at)
          VALUES (%s, 'leaf', '1', 'completed', %s, %s, %s, 'cancel',
                  now() - interval '50 minutes' + %s * interval '1 minute', now())""",
                     (kid, parent, parent, f"child-{i}", i))
    conn.execute("""
      INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake)
      VALUES (%s, 1, 1, '{}', NULL),
             (%s, 2, 2, '{}', jsonb_build_object('type', 'children', 'at', now(),
                'children', jsonb_build_object(%s::text, 'completed', %s::text, 'completed',
                                               %s::text, 'completed')))""",
                 (parent, parent, *kids))
    p = pgdurable(dsn, "run", parent)
    assert p.returncode == 0, p.stderr
    assert "last error" not in p.stdout and "\n error " not in p.stdout, p.stdout
    assert ("recovered from  LeaseExpired: lease of worker w-1 expired (an earlier attempt; "
            "the run completed)") in p.stdout
    step2 = next(line for line in p.stdout.splitlines() if line.split()[:2] == ["2", "2"])
    assert "children (3 finished)" in step2 and "children :" not in p.stdout, step2
    tree = json.loads(pgdurable(dsn, "run", parent, "--tree", "--json").stdout)["tree"]
    assert [n["child_key"] for n in tree] == [None, "child-0", "child-1", "child-2"]
    shown = pgdurable(dsn, "run", parent, "--tree").stdout
    assert shown.index("child-0") < shown.index("child-1") < shown.index("child-2"), shown
