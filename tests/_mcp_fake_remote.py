"""A scripted remote MCP server whose task takes "minutes": ``python tests/_mcp_fake_remote.py PORT``.

``deploy`` answers with a task handle hinting ``pollIntervalMs`` = 60 000 (a
minute). The task advances by polls, not by wall time (the test compresses the
minutes by making the poller's rows due at once): working for 2 polls, then
``input_required`` (key ``approve``) until ``tasks/update`` answers it, then
working for 2 more polls, then completed. ``GET /stats`` is not served; the
poll counts are in the task's ``statusMessage``.

``vanish`` answers with a task handle the server never knew: ``tasks/get``
answers ``-32602`` (as for an unknown or expired task). ``stall``'s task hangs
its first ``tasks/get`` for an hour (a poller killed meanwhile never hears back)
and is completed from the second on; each of its polls is a row of the test's
table ``mcp_fake_polls`` (in ``PGDURABLE_DSN``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolRequestParams, RequestParams
from pydantic import ConfigDict, Field

TASKS: dict[str, dict[str, Any]] = {}
NOW = datetime.now(UTC).isoformat()


class Params(RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")


def shape(t: dict[str, Any]) -> dict[str, Any]:
    out = {"taskId": t["id"], "status": t["status"], "createdAt": NOW, "lastUpdatedAt": NOW,
           "ttlMs": 3_600_000, "pollIntervalMs": 60_000,
           "statusMessage": f"poll {t['polls']}"}
    if t["status"] == "input_required":
        out["inputRequests"] = {"approve": {"method": "elicitation/create", "params": {
            "mode": "form", "message": f"Deploy {t['args'].get('service')}?",
            "requestedSchema": {"type": "object",
                                "properties": {"ok": {"type": "boolean"}}}}}}
    if t["status"] == "completed":
        out["result"] = {"content": [{"type": "text", "text":
                         f"deployed {t['args'].get('service')} approved={t['answer']}"}],
                         "isError": False}
    return out


def _record_poll(task_id: str, n: int) -> None:
    """A ``stall`` poll, in the test's table ``mcp_fake_polls`` (what the test waits on)."""
    with psycopg.connect(os.environ["PGDURABLE_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO mcp_fake_polls (task_id, n) VALUES (%s, %s)", (task_id, n))


async def get(ctx: ServerRequestContext[Any, Any], p: Params) -> Any:
    t = TASKS.get(p.task_id)
    if t is None:
        raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found",
                       data={"taskId": p.task_id})
    t["polls"] += 1
    if t["tool"] == "stall":
        await asyncio.to_thread(_record_poll, p.task_id, t["polls"])
        if t["polls"] == 1:
            await asyncio.sleep(3600)  # the first poller never hears back
        t["status"] = "completed"
        t["answer"] = "stalled"
        return shape(t)
    if t["status"] == "working":
        if t["answer"] is None and t["polls"] >= 3:
            t["status"] = "input_required"
        elif t["answer"] is not None and t["polls"] >= t["answered_at"] + 2:
            t["status"] = "completed"
    return shape(t)


async def update(ctx: ServerRequestContext[Any, Any], p: Params) -> Any:
    t = TASKS[p.task_id]
    answer = (p.input_responses or {}).get("approve")
    if t["status"] == "input_required" and answer is not None:
        t["answer"] = (answer.get("content") or {}).get("ok")
        t["answered_at"] = t["polls"]
        t["status"] = "working"
    return {}


async def cancel(ctx: ServerRequestContext[Any, Any], p: Params) -> Any:
    TASKS[p.task_id]["status"] = "cancelled"
    return {}


class Scripted(Extension):
    identifier = "io.modelcontextprotocol/tasks"

    def methods(self) -> Sequence[MethodBinding]:
        return [MethodBinding("tasks/get", Params, get), MethodBinding("tasks/update", Params, update),
                MethodBinding("tasks/cancel", Params, cancel)]

    async def intercept_tool_call(self, params: CallToolRequestParams,
                                  ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        if params.name not in ("deploy", "vanish", "stall"):
            return await call_next(ctx)
        tid = str(uuid.uuid4())
        task = {"id": tid, "tool": params.name, "status": "working", "polls": 0,
                "answer": None, "answered_at": 0, "args": dict(params.arguments or {})}
        if params.name != "vanish":  # a vanished task was never kept
            TASKS[tid] = task
        return {"resultType": "task", **{k: v for k, v in shape(task).items()
                                          if k != "result"}}


server = MCPServer("scripted-remote", extensions=[Scripted()])


@server.tool()
def deploy(service: str) -> str:  # answered by the interceptor
    return "never"


@server.tool()
def vanish() -> str:  # answered by the interceptor
    return "never"


@server.tool()
def stall(service: str) -> str:  # answered by the interceptor
    return "never"


@server.tool()
def echo(text: str) -> str:
    return text


if __name__ == "__main__":
    asgi = server.streamable_http_app(stateless_http=True, json_response=True)
    uvicorn.run(asgi, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
