"""A workflow that awaits a remote MCP task (tests/test_contrib_mcp_client.py).

Workers: ``python -m pgdurable.worker _mcp_client_app:app`` with ``MCP_REMOTE``
(the remote server's URL) set.
"""

from __future__ import annotations

import os
from typing import Any

from pgdurable import Durable, WorkflowContext
from pgdurable.contrib.mcp import RemoteTaskFailed, call_tool

app = Durable(os.environ.get("PGDURABLE_DSN", "postgresql://postgres@127.0.0.1/postgres"))
REMOTE = os.environ.get("MCP_REMOTE", "http://127.0.0.1:1/mcp")


@app.workflow("agent")
async def agent(ctx: WorkflowContext, service: str) -> dict[str, Any]:
    echoed = await call_tool(ctx, app, REMOTE, "echo", {"text": service}, key="echo")
    deployed = await call_tool(ctx, app, REMOTE, "deploy", {"service": service})
    return {"echo": echoed["content"][0]["text"], "deploy": deployed["content"][0]["text"]}


@app.workflow("agent_vanish")
async def agent_vanish(ctx: WorkflowContext, _: Any) -> dict[str, Any]:
    """Awaits a remote task the server does not know (tasks/get: -32602)."""
    try:
        await call_tool(ctx, app, REMOTE, "vanish", {})
    except RemoteTaskFailed as failed:
        return {"failed": str(failed), "error": failed.task.get("error")}
    return {"failed": None}


@app.workflow("agent_stall")
async def agent_stall(ctx: WorkflowContext, service: str) -> dict[str, Any]:
    """Awaits the remote task whose first tasks/get never answers."""
    done = await call_tool(ctx, app, REMOTE, "stall", {"service": service})
    return {"stall": done["content"][0]["text"]}
