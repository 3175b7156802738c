"""MCP tasks (``sql/functions/mcp_tasks.sql``; :mod:`pgdurable.contrib.mcp`): the server
side's tasks (register, get, ask, update, cancel) and the client side's remote tasks
(watch, due, seen, the next poll, get)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .core import nullable, record, scalar, statement

__all__ = ["ASK", "CANCEL", "GET", "NEXT_POLL", "REGISTER", "REMOTE_DUE", "REMOTE_GET", "SEEN",
           "UPDATE", "WATCH", "DueRemoteTask", "RemoteTask", "TaskState"]


@dataclass(frozen=True, slots=True)
class TaskState:
    """A task as ``mcp_task_get`` has it (its run's status, the tool, the times, its
    result, error, progress, and the input requests and responses of its rounds)."""

    status: str
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


@dataclass(frozen=True, slots=True)
class DueRemoteTask:
    """A remote task whose next ``tasks/get`` is due (its poll leased to this poller)."""

    run_id: Any  # uuid
    key: str
    server: str
    task_id: str
    round: int


@dataclass(frozen=True, slots=True)
class RemoteTask:
    """The remote task a run awaits, as last polled."""

    key: str
    server: str
    task_id: str
    round: int
    state: str
    last_task: Any
    polls: int


# -- server side -----------------------------------------------------------------------
# -- make a just-started run an MCP task (run, tool, ttl, poll ms); its creation time
REGISTER = statement("SELECT pgdurable.mcp_task_register(%s, %s, %s, %s)")
# -- what tasks/get shows of a task: one TaskState, no row for an unknown task
GET = record("SELECT * FROM pgdurable.mcp_task_get(%s)", TaskState)
# -- the run asks for input (run, round, {key: request}); how many are outstanding
ASK = scalar("SELECT pgdurable.mcp_task_ask(%s, %s, %s)", int)
# -- tasks/update (run, {key: response}); responses taken, NULL for an unknown task
UPDATE = nullable("SELECT pgdurable.mcp_task_update(%s, %s)", int)
# -- tasks/cancel through cancel_run; the run's status, NULL for an unknown task
CANCEL = nullable("SELECT pgdurable.mcp_task_cancel(%s)", str)

# -- client side -----------------------------------------------------------------------
# -- the run awaits the remote task (run, key, server, task id, round, poll ms)
WATCH = statement("SELECT pgdurable.mcp_remote_watch(%s, %s, %s, %s, %s, %s)")
# -- take up to n due remote tasks, pushing their next poll by the lease; one
# -- DueRemoteTask per row
REMOTE_DUE = record("SELECT * FROM pgdurable.mcp_remote_due(%s, %s)", DueRemoteTask)
# -- record a tasks/get answer (run, key, round, task); the row's state
SEEN = nullable("SELECT pgdurable.mcp_remote_seen(%s, %s, %s, %s)", str)
# -- seconds until the next remote task is due (NULL: none)
NEXT_POLL = nullable(
    "SELECT extract(epoch FROM pgdurable.mcp_remote_next_poll() - pgdurable.now())", float)
# -- the remote task a run awaits (run, key or NULL): one RemoteTask, no row: none
REMOTE_GET = record("SELECT * FROM pgdurable.mcp_remote_get(%s, %s)", RemoteTask)
