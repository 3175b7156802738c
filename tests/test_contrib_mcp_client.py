"""Awaiting a remote MCP task from a workflow (pgdurable.contrib.mcp.call_tool, TaskPoller).

The remote is tests/_mcp_fake_remote.py: a scripted MCP server whose task takes
"minutes" (it hints pollIntervalMs = 60 s and advances one stage per poll). The
test compresses those minutes: after checking that the poller scheduled the
next poll a full minute out (the hint honoured), it makes the row due at once.
The workflow runs on a worker process that is SIGKILLed while the run waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("mcp")

from _mcp_procs import ServerProc
from _waiting import until
from fix_fleet import Fleet

from pgdurable import Durable
from pgdurable.contrib.mcp import TaskPoller, answer_input, pending_input

pytestmark = [pytest.mark.crash, pytest.mark.fleet("_mcp_client_app:app")]


@pytest.fixture
def remote(dsn: str, tmp_path: Path) -> Iterator[ServerProc]:
    proc = ServerProc(dsn, tmp_path, "remote", script="_mcp_fake_remote.py")
    try:
        yield proc
    finally:
        proc.stop()


def row(conn: psycopg.Connection[Any], run_id: str) -> tuple[Any, ...]:
    got = conn.execute(
        "SELECT state, round, polls, extract(epoch FROM next_poll_at - updated_at)::int "
        "FROM pgdurable.mcp_remote_tasks WHERE run_id = %s", (run_id,)).fetchone()
    assert got is not None
    return tuple(got)


def run_status(conn: psycopg.Connection[Any], run_id: str) -> tuple[Any, ...]:
    got = conn.execute("SELECT status, lease_owner FROM pgdurable.runs WHERE id = %s",
                       (run_id,)).fetchone()
    assert got is not None
    return tuple(got)


async def test_a_workflow_awaits_a_remote_task_through_a_worker_sigkill(
        dsn: str, remote: ServerProc, fleet: Fleet) -> None:
    env = {"MCP_REMOTE": remote.url}  # the workers' environment
    w1 = fleet.start("w1", poll=0.5, env=env)
    async with Durable(dsn) as app:
        run_id = await app.start("agent", "api", revision="1")
        poller = TaskPoller(app)
        conn = psycopg.connect(dsn, autocommit=True)

        async def watching() -> bool:
            r = conn.execute("SELECT count(*) FROM pgdurable.mcp_remote_tasks "
                             "WHERE run_id = %s", (run_id,)).fetchone()
            return bool(r and r[0])

        await until(watching, "the run to watch its remote task")
        await until(lambda: _async(run_status(conn, run_id) == ("waiting", None)),
                    "the run to park")
        # the remote task is in the checkpoint; the worker dies mid-wait
        w1.kill()
        cp = conn.execute("SELECT count(*) FROM pgdurable.workflow_steps WHERE run_id = %s "
                          "AND name = 'mcp.call:deploy'", (run_id,)).fetchone()
        assert cp == (1,)
        # poll 1: working; the next poll is a minute out (the server's hint)
        assert await poller.run_once() == 1
        assert row(conn, run_id) == ("polling", 1, 1, 60)
        assert await poller.run_once() == 0  # not due: nothing polled
        due = "UPDATE pgdurable.mcp_remote_tasks SET next_poll_at = now() WHERE run_id = %s"
        conn.execute(due, (run_id,))  # a minute passes
        await poller.run_once()
        conn.execute(due, (run_id,))
        await poller.run_once()  # poll 3: input_required wakes the run
        assert row(conn, run_id)[0] == "asked"
        fleet.start("w2", poll=0.5, env=env)  # a new worker takes the run

        async def asked() -> bool:
            p = await pending_input(app, run_id)
            return (p is not None and p.state == "asked"
                    and run_status(conn, run_id) == ("waiting", None))

        await until(asked, "the run to wait for an answer")
        pending = await pending_input(app, run_id)
        assert pending is not None and list(pending.input_requests) == ["approve"]
        assert await answer_input(app, run_id,
                                  {"approve": {"action": "accept", "content": {"ok": True}}})
        await until(lambda: _async(row(conn, run_id)[:2] == ("polling", 2)),
                    "the run to send tasks/update and watch again")
        for _ in range(3):
            conn.execute(due, (run_id,))
            await poller.run_once()
        result = await app.result(run_id, timeout=60)
        assert result == {"echo": "api", "deploy": "deployed api approved=True"}
        assert row(conn, run_id)[0] == "done"
        conn.close()


async def _async(value: bool) -> bool:
    return value
