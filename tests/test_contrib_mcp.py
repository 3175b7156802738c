"""Durable MCP tasks, server side (pgdurable.contrib.mcp.DurableTasks), with real processes.

Real MCP server processes (tests/_mcp_server.py: the SDK's MCPServer over
Streamable HTTP, stateless) and real worker processes (tests/_mcp_app.py), driven
by the SDK's own client (mcp.Client, 2026-07-28, declaring the Tasks extension).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

pytest.importorskip("mcp")

from _mcp_procs import ROOT, TESTS, ServerProc
from _waiting import WAIT_LIMIT, app_running, until, until_sync
from fix_fleet import Fleet
from mcp.shared.exceptions import MCPError

from pgdurable import Durable
from pgdurable.contrib.mcp import DurableTasks, TaskContext
from pgdurable.contrib.mcp.client import (
    cancel_task,
    connect,
    get_task,
    update_task,
)

pytestmark = [pytest.mark.crash, pytest.mark.fleet("_mcp_app:app")]


@pytest.fixture
def procs(fleet: Fleet) -> Iterator[tuple[Fleet, list[ServerProc]]]:
    servers: list[ServerProc] = []
    try:
        yield fleet, servers
    finally:
        for s in servers:
            s.stop()


async def create(url: str, tool: str, arguments: dict[str, Any]) -> str:
    async with connect(url) as client:
        created = await client.session.call_tool(tool, arguments, allow_claimed=True)
    data = created.model_dump(by_alias=True)
    assert data["resultType"] == "task", data
    return str(data["taskId"])


async def until_status(url: str, task_id: str, *statuses: str) -> dict[str, Any]:
    task: dict[str, Any] = {}

    async def reached() -> bool:
        nonlocal task
        task = await get_task(url, task_id)
        return task["status"] in statuses

    await until(reached, f"task {task_id} in {statuses}")
    return task


async def test_server_sigkill_another_process_answers_and_the_task_completes(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    fleet, servers = procs
    fleet.start("w1", poll=1.0)
    a = ServerProc(dsn, tmp_path, "a")
    servers.append(a)
    task_id = await create(a.url, "gated", {"ref": "sigkill"})
    first = await get_task(a.url, task_id)
    assert first["status"] == "working"
    a.kill()  # the server that created the task is gone
    b = ServerProc(dsn, tmp_path, "b")
    servers.append(b)
    again = await get_task(b.url, task_id)
    assert again["taskId"] == task_id and again["createdAt"] == first["createdAt"]
    assert again["status"] == "working"
    async with Durable(dsn) as app:
        await app.signal("gate", "sigkill", {"by": "test"})
    done = await until_status(b.url, task_id, "completed", "failed")
    assert done["status"] == "completed"
    assert done["result"]["content"][0]["text"] == "opened sigkill: {'by': 'test'}"
    # and the restarted first server answers the same
    a2 = ServerProc(dsn, tmp_path, "a2")
    servers.append(a2)
    assert (await get_task(a2.url, task_id))["result"] == done["result"]


async def parked(dsn: str, ids: list[str]) -> None:
    """Until every run of ``ids`` is parked (waiting, no lease: no worker holds it)."""
    async with Durable(dsn) as app:
        async def all_parked() -> bool:
            rows = await app.fetchall(
                "SELECT count(*) FROM pgdurable.runs WHERE id = ANY(%s::uuid[]) "
                "AND status = 'waiting' AND lease_owner IS NULL", (ids,))
            return bool(rows[0][0] == len(ids))

        await until(all_parked, f"{len(ids)} tasks parked")


async def test_a_report_made_just_before_the_park_is_shown_by_another_server(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    """slow_compute reports "computing <label>" and sleeps at once: the report must
    be recorded before the run gives its lease up (a background write after it is
    refused). Six tasks: without the flush most of them lost their message."""
    fleet, servers = procs
    fleet.start("w1", poll=1.0, concurrency=8)
    a, b = ServerProc(dsn, tmp_path, "a"), ServerProc(dsn, tmp_path, "b")
    servers += [a, b]
    ids = [await create(a.url, "slow_compute", {"seconds": 3600, "label": f"x{i}"})
           for i in range(6)]
    await parked(dsn, ids)
    for i, tid in enumerate(ids):
        task = await get_task(b.url, tid)  # another server process, the run parked
        assert (task["status"], task.get("statusMessage")) == ("working", f"computing x{i}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT id::text, progress FROM pgdurable.runs "
                              "WHERE id = ANY(%s::uuid[])", (ids,)).fetchall()
    assert dict(stored) == {tid: {"mcp": {"statusMessage": f"computing x{i}"}}
                            for i, tid in enumerate(ids)}
    for tid in ids:
        await cancel_task(a.url, tid)


async def test_report_poll_interval_reaches_the_wire_and_extra_values_are_stored_only(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    fleet, servers = procs
    fleet.start("w1", poll=1.0)
    a, b = ServerProc(dsn, tmp_path, "a"), ServerProc(dsn, tmp_path, "b")
    servers += [a, b]
    tid = await create(a.url, "reporter", {"ref": "rep"})
    await parked(dsn, [tid])
    task = await get_task(b.url, tid)
    assert task["statusMessage"] == "waiting for rep"
    assert task["pollIntervalMs"] == 750  # ctx.report(poll_interval=...)
    # a task has no field for other progress: not on the wire, kept in runs.progress
    assert not {"stage", "of"} & set(task)
    assert set(task["_meta"]) == {"io.modelcontextprotocol/serverInfo"}  # the SDK's own
    with psycopg.connect(dsn, autocommit=True) as conn:
        progress = conn.execute("SELECT progress FROM pgdurable.runs WHERE id = %s",
                                (tid,)).fetchone()
    assert progress == ({"mcp": {"statusMessage": "waiting for rep", "pollIntervalMs": 750,
                                 "stage": 2, "of": 3}},)
    async with Durable(dsn) as app:
        await app.signal("gate", "rep", "go")
    done = await until_status(b.url, tid, "completed", "failed")
    assert done["result"]["content"][0]["text"] == "reported rep: go"
    assert done["pollIntervalMs"] == 750


UPDATE_SCRIPT = """
import asyncio, sys
from pgdurable.contrib.mcp.client import update_task
asyncio.run(update_task(sys.argv[1], sys.argv[2],
                        {"confirm": {"action": "accept", "content": {"confirm": True}}}))
print("updated")
"""


async def test_input_required_answered_from_a_separate_process(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    fleet, servers = procs
    fleet.start("w1", poll=1.0)
    a, b = ServerProc(dsn, tmp_path, "a"), ServerProc(dsn, tmp_path, "b")
    servers += [a, b]
    task_id = await create(a.url, "confirm_delete", {"filename": "x.txt"})
    asked = await until_status(a.url, task_id, "input_required")
    assert list(asked["inputRequests"]) == ["confirm"]
    assert asked["inputRequests"]["confirm"]["method"] == "elicitation/create"
    # the question is stored (tasks/get shows it) in the statement before the park: the
    # run then parks, and no worker holds it
    with psycopg.connect(dsn, autocommit=True) as conn:
        def parked() -> bool:
            return conn.execute("SELECT status, lease_owner FROM pgdurable.runs WHERE id = %s",
                                (task_id,)).fetchone() == ("waiting", None)

        until_sync(parked, "the asking run parked")
    out = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", UPDATE_SCRIPT, b.url, task_id],
        capture_output=True, text=True, timeout=WAIT_LIMIT, cwd=ROOT,
        env={"PYTHONPATH": f"{TESTS}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    done = await until_status(a.url, task_id, "completed", "failed")
    assert done["result"]["content"][0]["text"] == "deleted x.txt"
    # an answer to a key already answered (or never asked) is ignored, acked
    await update_task(b.url, task_id, {"confirm": {"action": "decline"}, "nope": {}})
    assert (await get_task(b.url, task_id))["result"] == done["result"]


async def test_cancel_racing_completion_ends_in_exactly_one_terminal_state(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    fleet, servers = procs
    fleet.start("w1", poll=1.0, concurrency=8)
    a = ServerProc(dsn, tmp_path, "a")
    servers.append(a)
    ids = [await create(a.url, "gated", {"ref": f"race-{i}"}) for i in range(8)]
    async with Durable(dsn) as app:
        async def parked() -> bool:
            rows = await app.fetchall(
                "SELECT count(*) FROM pgdurable.runs WHERE id = ANY(%s::uuid[]) "
                "AND status = 'waiting'", (ids,))
            return bool(rows[0][0] == len(ids))

        await until(parked, "every gated task parked")
        # the release and the cancel race: the signal wakes the run, the cancel ends it
        await asyncio.gather(*(x for i, tid in enumerate(ids) for x in (
            app.signal("gate", f"race-{i}", i), cancel_task(a.url, tid))))
    finals = [await until_status(a.url, tid, "completed", "cancelled", "failed") for tid in ids]
    for tid, final in zip(ids, finals, strict=True):
        assert final["status"] in ("completed", "cancelled"), final
        assert ("result" in final) == (final["status"] == "completed")
        with psycopg.connect(dsn, autocommit=True) as conn:
            ends = conn.execute(
                "SELECT status, finished_at IS NOT NULL FROM pgdurable.runs WHERE id = %s",
                (tid,)).fetchone()
        assert ends == ({"completed": "completed", "cancelled": "cancelled"}[final["status"]],
                        True)
        # terminal means terminal: later reads agree, a late cancel changes nothing
        await cancel_task(a.url, tid)
        assert (await get_task(a.url, tid))["status"] == final["status"]


async def test_non_declaring_client_and_unknown_tasks(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    fleet, servers = procs
    fleet.start("w1", poll=1.0)
    a = ServerProc(dsn, tmp_path, "a")
    servers.append(a)
    from mcp import Client

    async with Client(a.url, mode="2026-07-28", cache=None) as plain:
        sync = await plain.call_tool("slow_compute", {"seconds": 0, "label": "s"})
        assert sync.content[0].text == "computed s after 0s"  # type: ignore[union-attr]
        with pytest.raises(MCPError) as required:
            await plain.call_tool("failing_job", {})
        assert required.value.error.code == -32021
    with pytest.raises(MCPError) as unknown:
        await get_task(a.url, "00000000-0000-0000-0000-000000000000")
    assert unknown.value.error.code == -32602
    with pytest.raises(MCPError) as not_a_run:
        await get_task(a.url, "not-a-task")
    assert not_a_run.value.error.code == -32602
    async with Durable(dsn) as app:  # another run of the app is no task
        other = await app.start("mcp.tool:gated", {"arguments": {"ref": "x"}}, revision="1")
    with pytest.raises(MCPError) as other_run:
        await cancel_task(a.url, other)
    assert other_run.value.error.code == -32602


async def test_legacy_2025_11_25_form(dsn: str, tmp_path: Path,
                                      procs: tuple[Fleet, list[ServerProc]]) -> None:
    fleet, servers = procs
    fleet.start("w1", poll=1.0)
    a = ServerProc(dsn, tmp_path, "a")
    servers.append(a)
    headers = {"Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    async with httpx.AsyncClient(headers=headers, timeout=WAIT_LIMIT) as http:
        async def rpc(method: str, params: dict[str, Any], rid: int = 1) -> dict[str, Any]:
            resp = await http.post(a.url, json={"jsonrpc": "2.0", "id": rid, "method": method,
                                                "params": params})
            body: dict[str, Any] = resp.json()
            return body

        init = await rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                        "clientInfo": {"name": "legacy", "version": "1"}})
        assert init["result"]["capabilities"]["tasks"]["requests"]["tools"]["call"] == {}
        tools = (await rpc("tools/list", {}))["result"]["tools"]
        assert {t["name"]: t.get("execution") for t in tools}["gated"] == {
            "taskSupport": "optional"}
        created = await rpc("tools/call", {"name": "slow_compute", "task": {"ttl": 60000},
                                           "arguments": {"seconds": 0.2, "label": "l"}})
        task = created["result"]["task"]
        assert task["status"] == "working" and task["ttl"] == 3_600_000
        got = (await rpc("tasks/get", {"taskId": task["taskId"]}))["result"]
        assert got["taskId"] == task["taskId"]
        result = (await rpc("tasks/result", {"taskId": task["taskId"]}))["result"]
        assert result["content"][0]["text"] == "computed l after 0.2s"
        assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == task["taskId"]
        # tasks/cancel (2025-11-25): the Task, cancelled, through the run's cancel path
        gated = (await rpc("tools/call", {"name": "gated", "task": {},
                                          "arguments": {"ref": "legacy-cancel"}}))["result"]["task"]

        async def parked() -> bool:  # a task whose step still runs is cancelled at its end
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                                   (gated["taskId"],)).fetchone()
            return row == ("waiting",)

        await until(parked, "the gated task parked")
        cancelled = (await rpc("tasks/cancel", {"taskId": gated["taskId"]}))["result"]
        assert (cancelled["taskId"], cancelled["status"]) == (gated["taskId"], "cancelled")
        assert cancelled["statusMessage"] == "The task was cancelled."
        assert (await rpc("tasks/get", {"taskId": gated["taskId"]}))["result"]["status"] == (
            "cancelled")
        with psycopg.connect(dsn, autocommit=True) as conn:
            ended = conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                                 (gated["taskId"],)).fetchone()
        assert ended == ("cancelled",)
        # terminal: a second cancel answers the same Task; an unknown task is -32602
        again = (await rpc("tasks/cancel", {"taskId": gated["taskId"]}))["result"]
        assert again["status"] == "cancelled"
        unknown = await rpc("tasks/cancel", {"taskId": "00000000-0000-0000-0000-000000000000"})
        assert unknown["error"]["code"] == -32602


async def test_legacy_status_notifications_are_pushed_from_listen_notify(
        dsn: str, tmp_path: Path, procs: tuple[Fleet, list[ServerProc]]) -> None:
    """A 2025-11-25 client on a stateful session hears notifications/tasks/status on
    its standalone stream: input_required (mcp_task_ask's NOTIFY), the answer
    (mcp_task_update's), the end (pgdurable_done), a cancel; never the same twice."""
    fleet, servers = procs
    fleet.start("w1", poll=1.0)
    a = ServerProc(dsn, tmp_path, "a", env={"MCP_STATEFUL": "1"})
    servers.append(a)
    accept = {"Accept": "application/json, text/event-stream"}
    pushed: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    async with httpx.AsyncClient(timeout=WAIT_LIMIT) as http:
        init = await http.post(a.url, headers=accept, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "legacy", "version": "1"}}})
        headers = {**accept, "Mcp-Session-Id": init.headers["mcp-session-id"],
                   "MCP-Protocol-Version": "2025-11-25"}
        await http.post(a.url, headers=headers,
                        json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        opened = asyncio.Event()

        async def listen() -> None:
            async with http.stream("GET", a.url, headers={**headers,
                                                          "Accept": "text/event-stream"}) as resp:
                assert resp.status_code == 200
                opened.set()
                async for line in resp.aiter_lines():
                    if line.startswith("data:"):
                        msg = json.loads(line[5:])
                        if msg.get("method") == "notifications/tasks/status":
                            await pushed.put(msg["params"])

        listener = asyncio.create_task(listen())
        try:
            await asyncio.wait_for(opened.wait(), WAIT_LIMIT)

            async def call(tool: str, arguments: dict[str, Any]) -> str:
                resp = await http.post(a.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": tool, "task": {}, "arguments": arguments}})
                return str(resp.json()["result"]["task"]["taskId"])

            seen: dict[str, list[str]] = {}

            async def until_pushed(task_id: str, status: str) -> dict[str, Any]:
                while True:
                    got = await asyncio.wait_for(pushed.get(), WAIT_LIMIT)
                    seen.setdefault(got["taskId"], []).append(got["status"])
                    if got["taskId"] == task_id and got["status"] == status:
                        return got

            async with Durable(dsn) as app:
                gated = await call("gated", {"ref": "push"})
                await app.signal("gate", "push", 1)
                await until_pushed(gated, "completed")  # pgdurable_done
                doomed = await call("gated", {"ref": "never"})
                await parked(dsn, [doomed])
                await http.post(a.url, headers=headers, json={
                    "jsonrpc": "2.0", "id": 3, "method": "tasks/cancel",
                    "params": {"taskId": doomed}})
                cancelled = await until_pushed(doomed, "cancelled")
                assert cancelled["statusMessage"] == "The task was cancelled."
                # the status-changing SQL NOTIFYs pgdurable_mcp with the run id
                hints = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                await hints.execute("LISTEN pgdurable_mcp")
                asked = await call("confirm_delete", {"filename": "n.txt"})
                await until_pushed(asked, "input_required")  # mcp_task_ask's NOTIFY
                await app.fetchone("SELECT pgdurable.mcp_task_update(%s, %s::jsonb)", (
                    asked, json.dumps({"confirm": {"action": "accept",
                                                   "content": {"confirm": True}}})))
                done = await until_pushed(asked, "completed")
                assert done["ttl"] == 3_600_000 and done["pollInterval"] == 200
                got = [n.payload async for n in hints.notifies(timeout=WAIT_LIMIT, stop_after=2)]
                assert got == [asked, asked]  # the ask, the update: one each
                await hints.close()
        finally:
            listener.cancel()
    # each change once, in order (working may be passed over: a push reads the
    # task as it is then); nothing after a terminal status
    assert seen[asked][0] == "input_required" and seen[asked][-1] == "completed"
    assert set(seen[asked]) <= {"input_required", "working", "completed"}
    assert len(seen[asked]) == len(set(seen[asked]))
    assert seen[gated] == ["completed"] and seen[doomed] == ["cancelled"]


async def test_ttl_keeps_the_task_then_retention_prunes_it(dsn: str) -> None:
    async with Durable(dsn) as app:
        tasks = DurableTasks(app, ttl=timedelta(minutes=5))

        @tasks.tool()
        async def quick(ctx: TaskContext, n: int) -> dict[str, int]:
            return {"n": n * 2}

        row = await tasks.create("quick", {"n": 21})
        assert row.ttl_ms == 300_000
        async with app_running(app):
            await until(lambda: _terminal(tasks, row.task_id), "the task's end")
        done = await tasks.get(row.task_id)
        assert done["result"]["structuredContent"] == {"n": 42}
        from pgdurable.ops.retention import prune

        await prune(app, older_than="0s")
        assert (await tasks.get(row.task_id))["status"] == "completed"  # within its TTL
        # the TTL passes (the row is seeded older: the database clock is not faked)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE pgdurable.mcp_tasks SET created_at = created_at - "
                         "interval '6 minutes' WHERE run_id = %s", (row.task_id,))
        with pytest.raises(MCPError) as expired:
            await tasks.get(row.task_id)
        assert expired.value.error.message.endswith("Task has expired")
        await prune(app, older_than="0s")
        left = await app.fetchone(
            "SELECT (SELECT count(*) FROM pgdurable.runs WHERE id = %s), "
            "(SELECT count(*) FROM pgdurable.mcp_tasks WHERE run_id = %s)",
            (row.task_id, row.task_id))
        assert left == (0, 0)


async def _terminal(tasks: DurableTasks, task_id: str) -> bool:
    return (await tasks.get(task_id))["status"] in ("completed", "failed", "cancelled")
