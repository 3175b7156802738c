"""Awaiting a remote MCP task from a workflow (pgdurable.contrib.mcp.call_tool, TaskPoller).

The remote is tests/_mcp_fake_remote.py: a scripted MCP server whose task takes
"minutes" (it hints pollIntervalMs = 60 s and advances one stage per poll). The
test compresses those minutes: after checking that the poller scheduled the
next poll a full minute out (the hint honoured), it makes the row due at once.
The workflow runs on a worker process that is SIGKILLed while the run waits.
Also: a remote task the server does not know (tasks/get -32602) fails the
awaiting run instead of being polled forever; a poller process SIGKILLed between
taking a row and recording what it saw leaves the row to another poller.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("mcp")

from _mcp_procs import ROOT, TESTS, ServerProc
from _waiting import WAIT_LIMIT, until
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


async def test_an_unknown_remote_task_fails_the_run_instead_of_being_polled_forever(
        dsn: str, remote: ServerProc, fleet: Fleet) -> None:
    fleet.start("w1", poll=0.5, env={"MCP_REMOTE": remote.url})
    async with Durable(dsn) as app:
        run_id = await app.start("agent_vanish", None, revision="1")
        with psycopg.connect(dsn, autocommit=True) as conn:
            async def watching() -> bool:
                r = conn.execute("SELECT count(*) FROM pgdurable.mcp_remote_tasks "
                                 "WHERE run_id = %s", (run_id,)).fetchone()
                return bool(r and r[0])

            await until(watching, "the run to watch its remote task")
            poller = TaskPoller(app)
            assert await poller.run_once() == 1  # tasks/get: -32602, recorded as failed
            assert row(conn, run_id)[:3] == ("done", 1, 1)
            result = await app.result(run_id, timeout=60)
            assert result["error"] == {"code": -32602,
                                       "message": "Failed to retrieve task: Task not found"}
            assert result["failed"].endswith("of 'vanish' failed: Failed to retrieve task: Task not found")
            conn.execute("UPDATE pgdurable.mcp_remote_tasks SET next_poll_at = now() "
                         "WHERE run_id = %s", (run_id,))
            assert await poller.run_once() == 0  # done: never polled again


POLLER_SCRIPT = """
import asyncio, sys
from datetime import timedelta
from pgdurable import Durable
from pgdurable.contrib.mcp import TaskPoller

async def main() -> None:
    async with Durable(sys.argv[1]) as app:
        await TaskPoller(app, lease=timedelta(seconds=2), idle=0.2).run()

asyncio.run(main())
"""


async def test_a_poller_killed_after_taking_a_row_leaves_it_to_another_after_the_lease(
        dsn: str, remote: ServerProc, fleet: Fleet) -> None:
    fleet.start("w1", poll=0.5, env={"MCP_REMOTE": remote.url})
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("CREATE TABLE mcp_fake_polls (task_id text, n int)")
    async with Durable(dsn) as app:
        run_id = await app.start("agent_stall", "svc", revision="1")

        async def waiting() -> bool:
            r = conn.execute("SELECT count(*) FROM pgdurable.mcp_remote_tasks "
                             "WHERE run_id = %s", (run_id,)).fetchone()
            return bool(r and r[0]) and run_status(conn, run_id) == ("waiting", None)

        await until(waiting, "the run to park on its remote task")
        first = await asyncio.create_subprocess_exec(
            sys.executable, "-c", POLLER_SCRIPT, dsn, cwd=ROOT,
            env={"PYTHONPATH": f"{TESTS}:{ROOT}", "PATH": "/usr/bin:/bin"})
        try:
            # the poller took the row (its next poll pushed by the lease) and its
            # tasks/get reached the remote, which never answers it
            async def in_flight() -> bool:
                taken = conn.execute(
                    "SELECT next_poll_at > updated_at, polls, state "
                    "FROM pgdurable.mcp_remote_tasks WHERE run_id = %s", (run_id,)).fetchone()
                asked = conn.execute("SELECT count(*) FROM mcp_fake_polls").fetchone()
                return taken == (True, 0, "polling") and asked == (1,)

            await until(in_flight, "the first poller's tasks/get in flight")
        finally:
            first.kill()  # SIGKILL
            await asyncio.wait_for(first.wait(), WAIT_LIMIT)
        assert row(conn, run_id)[:3] == ("polling", 1, 0)  # nothing recorded
        assert run_status(conn, run_id) == ("waiting", None)
        second = TaskPoller(app, lease=timedelta(seconds=2))

        async def polled() -> bool:  # not before the first poller's lease lapses
            return await second.run_once() == 1

        await until(polled, "the row to be due again and polled by the second poller")
        result = await app.result(run_id, timeout=60)
        assert result == {"stall": "deployed svc approved=stalled"}
        assert row(conn, run_id)[:3] == ("done", 1, 1)  # one recorded poll: the second's
        assert conn.execute("SELECT count(*) FROM mcp_fake_polls").fetchone() == (2,)
        woke = conn.execute("SELECT count(*) FROM pgdurable.signals WHERE kind = 'mcp.remote' "
                            "AND ref LIKE %s", (f"{run_id}:%",)).fetchone()
        assert woke == (1,)
        ends = conn.execute("SELECT status, attempts FROM pgdurable.runs WHERE id = %s",
                            (run_id,)).fetchone()
        assert ends == ("completed", 0)  # no failed attempt
    conn.close()
