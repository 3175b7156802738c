"""The Tasks extension's wire shapes, from a task's row (sans-IO).

:func:`detailed_task` turns what ``pgdurable.mcp_task_get`` returns (a
:class:`TaskRow`) into the ``DetailedTask`` of ``tasks/get`` and
``notifications/tasks`` (SEP-2663); :func:`created_task` is the
``CreateTaskResult`` that ``tools/call`` answers; :func:`legacy_task` is the
``Task`` of the 2025-11-25 experimental form. :func:`tool_result` turns what a
tool body returned into a ``CallToolResult``. Nothing here does I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel

__all__ = [
    "EXTENSION_ID",
    "TERMINAL",
    "TaskRow",
    "TaskStatus",
    "created_task",
    "detailed_task",
    "legacy_task",
    "task_status",
    "tool_result",
]

#: The Tasks extension's identifier (SEP-2663).
EXTENSION_ID = "io.modelcontextprotocol/tasks"

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
#: Statuses after which a task never changes.
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})

#: JSON-RPC internal error: what a task whose run failed reports as its error.
INTERNAL_ERROR = -32603


@dataclass(frozen=True)
class TaskRow:
    """One row of ``pgdurable.mcp_task_get``: a task as the database has it."""

    task_id: str
    status: str  # the run's status
    tool: str
    created_at: datetime
    updated_at: datetime
    ttl_ms: int | None
    poll_interval_ms: int
    expired: bool
    result: Any
    error: Any
    progress: Any
    wake_at: datetime | None
    inputs: dict[str, Any] | None


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def task_status(row: TaskRow) -> TaskStatus:
    """The task's status from its run's: ``runnable``/``leased``/``waiting`` are
    ``working`` (``input_required`` while requests are outstanding),
    ``incompatible`` is ``failed``."""
    if row.status == "completed":
        return "completed"
    if row.status in ("failed", "incompatible"):
        return "failed"
    if row.status == "cancelled":
        return "cancelled"
    return "input_required" if row.inputs else "working"


def _reported(row: TaskRow) -> dict[str, Any]:
    progress = row.progress
    if isinstance(progress, dict) and isinstance(progress.get("mcp"), dict):
        return progress["mcp"]  # type: ignore[no-any-return]
    return {}


def _status_message(row: TaskRow, status: TaskStatus) -> str | None:
    if status == "failed" and isinstance(row.error, dict):
        return str(row.error.get("message") or row.error.get("type") or "the task failed")
    if status == "cancelled":
        return "The task was cancelled."
    message = _reported(row).get("statusMessage")
    return message if isinstance(message, str) else None


def _poll_interval(row: TaskRow) -> int:
    hinted = _reported(row).get("pollIntervalMs")
    if isinstance(hinted, int) and not isinstance(hinted, bool) and hinted > 0:
        return hinted
    return row.poll_interval_ms


def _base(row: TaskRow, status: TaskStatus) -> dict[str, Any]:
    task: dict[str, Any] = {
        "taskId": row.task_id,
        "status": status,
        "createdAt": _iso(row.created_at),
        "lastUpdatedAt": _iso(row.updated_at),
        "ttlMs": row.ttl_ms,
        "pollIntervalMs": _poll_interval(row),
    }
    message = _status_message(row, status)
    if message is not None:
        task["statusMessage"] = message
    return task


def rpc_error(error: Any) -> dict[str, Any]:
    """The JSON-RPC error a failed task carries, from the run's recorded error."""
    if isinstance(error, dict):
        message = str(error.get("message") or error.get("type") or "the task failed")
        data = {k: error[k] for k in ("type", "step") if k in error}
        out: dict[str, Any] = {"code": INTERNAL_ERROR, "message": message}
        if data:
            out["data"] = data
        return out
    return {"code": INTERNAL_ERROR, "message": "the task failed"}


def detailed_task(row: TaskRow) -> dict[str, Any]:
    """The ``DetailedTask`` of ``tasks/get``: the task with its ``result``
    (completed), ``error`` (failed) or ``inputRequests`` (input_required)."""
    status = task_status(row)
    task = _base(row, status)
    if status == "completed":
        task["result"] = row.result if isinstance(row.result, dict) else tool_result(row.result)
    elif status == "failed":
        task["error"] = rpc_error(row.error)
    elif status == "input_required":
        task["inputRequests"] = dict(row.inputs or {})
    return task


def created_task(row: TaskRow) -> dict[str, Any]:
    """The ``CreateTaskResult`` of a ``tools/call`` that made a task."""
    status = task_status(row)
    return {"resultType": "task", **_base(row, status)}


def legacy_task(row: TaskRow) -> dict[str, Any]:
    """The 2025-11-25 experimental ``Task`` (``ttl``/``pollInterval``, no inlined result)."""
    status = task_status(row)
    task: dict[str, Any] = {
        "taskId": row.task_id,
        "status": status,
        "createdAt": _iso(row.created_at),
        "lastUpdatedAt": _iso(row.updated_at),
        "ttl": row.ttl_ms,
        "pollInterval": _poll_interval(row),
    }
    message = _status_message(row, status)
    if message is not None:
        task["statusMessage"] = message
    return task


def tool_result(value: Any) -> dict[str, Any]:
    """A ``CallToolResult`` (JSON) for what a tool body returned.

    A ``CallToolResult`` (model or a dict with ``content``) as it is; a string
    as one text block; other JSON as its text, with ``structuredContent`` when
    it is an object.
    """
    if isinstance(value, BaseModel):
        dumped: dict[str, Any] = value.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        return value
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}], "isError": False}
    out: dict[str, Any] = {
        "content": [{"type": "text", "text": json.dumps(value, separators=(",", ":"))}],
        "isError": False,
    }
    if isinstance(value, dict):
        out["structuredContent"] = value
    return out


def error_result(message: str) -> dict[str, Any]:
    """The ``CallToolResult`` of a tool error (``isError``: the task still completes)."""
    return {"content": [{"type": "text", "text": message}], "isError": True}
