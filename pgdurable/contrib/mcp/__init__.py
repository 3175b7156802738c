"""MCP tasks on pgdurable (extra ``pgdurable[mcp]``, the official ``mcp`` SDK).

Server side (:mod:`pgdurable.contrib.mcp.server`): :class:`DurableTasks`, an
extension of the SDK's ``MCPServer`` whose durable tools answer ``tools/call``
with a task handle whose id is a pgdurable run; the tool body (a
:class:`TaskContext`) runs on pgdurable workers.

Client side (:mod:`pgdurable.contrib.mcp.client`): :func:`call_tool` from a
workflow calls a remote MCP tool; a task handle parks the run (no worker held)
while a :class:`TaskPoller` polls ``tasks/get`` at the server's hinted interval
and wakes the run at the end; ``input_required`` becomes a wait that
:func:`answer_input` (a human or another agent) answers. See docs/mcp.md.
"""

from __future__ import annotations

from ._wire import EXTENSION_ID
from .client import (
    RemoteTaskFailed,
    TaskPoller,
    TasksClient,
    answer_input,
    call_tool,
    pending_input,
)
from .server import DurableTasks, DurableTool, TaskContext, ToolError

__all__ = [
    "EXTENSION_ID",
    "DurableTasks",
    "DurableTool",
    "RemoteTaskFailed",
    "TaskContext",
    "TaskPoller",
    "TasksClient",
    "ToolError",
    "answer_input",
    "call_tool",
    "pending_input",
]
