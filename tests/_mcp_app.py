"""The pgdurable-backed MCP server of tests/test_contrib_mcp*.py and the conformance run.

``app`` (workers: ``python -m pgdurable.worker _mcp_app:app``) and ``server``
(the SDK's ``MCPServer``, served by tests/_mcp_server.py) are built from the same
module, as a deployment would: the durable tools' bodies run on the workers.
The tools are the conformance suite's fixtures (``greet``, ``slow_compute``,
``failing_job``, ``protocol_error_job``, ``confirm_delete``, ``multi_input``)
``gated`` (parks until the test releases it with a signal) and ``reporter``
(reports, then parks the same way).
"""

from __future__ import annotations

import os
from datetime import timedelta

from mcp.server.mcpserver import MCPServer

from pgdurable import Durable
from pgdurable.contrib.mcp import DurableTasks, TaskContext, ToolError

app = Durable(os.environ.get("PGDURABLE_DSN", "postgresql://postgres@127.0.0.1/postgres"))
tasks = DurableTasks(app, ttl=timedelta(hours=1), poll_interval=timedelta(milliseconds=200))


@tasks.tool(description="Sleep `seconds` (parked: no worker held), then answer.")
async def slow_compute(ctx: TaskContext, seconds: float = 1.0, label: str = "") -> str:
    ctx.report(f"computing {label}".strip())
    if seconds > 0:
        await ctx.sleep(seconds)
    return f"computed {label or 'result'} after {seconds:g}s"


@tasks.tool(task_support="required", description="Always a tool error.")
async def failing_job(ctx: TaskContext) -> str:
    raise ToolError("the job failed (a tool error)")


@tasks.tool(description="Always a protocol error (the run fails).")
async def protocol_error_job(ctx: TaskContext) -> str:
    raise RuntimeError("protocol_error_job broke")


@tasks.tool(description="Ask to confirm, then delete (nothing is deleted).")
async def confirm_delete(ctx: TaskContext, filename: str = "file.txt") -> str:
    answer = await ctx.elicit(f"Delete {filename}?", {
        "type": "object", "properties": {"confirm": {"type": "boolean"}},
        "required": ["confirm"]}, key="confirm")
    confirmed = answer.get("action") == "accept" and (answer.get("content") or {}).get("confirm")
    return f"deleted {filename}" if confirmed else f"kept {filename}"


@tasks.tool(description="Two questions at once.")
async def multi_input(ctx: TaskContext) -> str:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    answers = await ctx.input({
        key: {"method": "elicitation/create",
              "params": {"mode": "form", "message": f"{key}?", "requestedSchema": schema}}
        for key in ("first", "second")})
    return " and ".join(str((answers[k].get("content") or {}).get("name")) for k in sorted(answers))


@tasks.tool(description="Parks until the signal ('gate', ref); returns its payload.")
async def gated(ctx: TaskContext, ref: str) -> str:
    payload = await ctx.wait_signal("gate", ref)
    return f"opened {ref}: {payload}"


@tasks.tool(description="Reports twice (a poll interval, extra values), then parks until "
                        "('gate', ref).")
async def reporter(ctx: TaskContext, ref: str) -> str:
    ctx.report("starting", stage=1, of=3)
    ctx.report(f"waiting for {ref}", poll_interval=timedelta(milliseconds=750), stage=2)
    payload = await ctx.wait_signal("gate", ref)
    return f"reported {ref}: {payload}"


server = MCPServer("pgdurable-tests", extensions=[tasks], middleware=[tasks.legacy])


@server.tool(description="A plain (synchronous, in-process) tool.")
def greet(name: str = "World") -> str:
    return f"Hello, {name}!"
