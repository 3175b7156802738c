"""The statements the MCP server side issues (one round trip each) and row decoding."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from ...app.durable import Durable
from ...foundation.db import translated
from ._wire import TaskRow

# -- make a just-started run an MCP task (run, tool, ttl, poll ms); its creation time
REGISTER = "SELECT pgdurable.mcp_task_register(%s, %s, %s, %s)"
# -- what tasks/get shows of a task; no row for an unknown task
GET = "SELECT * FROM pgdurable.mcp_task_get(%s)"
# -- the run asks for input (run, round, {key: request}); how many are outstanding
ASK = "SELECT pgdurable.mcp_task_ask(%s, %s, %s)"
# -- tasks/update (run, {key: response}); responses taken, NULL for an unknown task
UPDATE = "SELECT pgdurable.mcp_task_update(%s, %s)"
# -- tasks/cancel through cancel_run; the run's status, NULL for an unknown task
CANCEL = "SELECT pgdurable.mcp_task_cancel(%s)"


def task_uuid(task_id: object) -> uuid.UUID | None:
    """The run id a taskId names, or None when it is not a run id at all."""
    if not isinstance(task_id, str):
        return None
    try:
        return uuid.UUID(task_id)
    except ValueError:
        return None


async def fetch_task(app: Durable, task_id: str) -> TaskRow | None:
    """The task's row (``mcp_task_get``), or None for an unknown task."""
    rid = task_uuid(task_id)
    if rid is None:
        return None
    await app.open()  # once; later calls return at once
    with translated():
        async with app.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(GET, (rid,))
            row = await cur.fetchone()
    if row is None:
        return None
    return TaskRow(task_id=str(rid), **row)


async def register(conn: Any, run_id: str, tool: str, ttl: timedelta | None,
                   poll_interval_ms: int) -> None:
    """Register the run as an MCP task inside the caller's transaction."""
    with translated():
        await conn.execute(REGISTER, (uuid.UUID(run_id), tool, ttl, poll_interval_ms))


async def ask(app: Durable, run_id: str, round_: int, requests: dict[str, Any]) -> int:
    """Record a round of input requests; how many are still outstanding."""
    row = await app.fetchone(ASK, (uuid.UUID(run_id), round_, Jsonb(requests)))
    return int(row[0]) if row else 0


async def update(app: Durable, task_id: str, responses: dict[str, Any]) -> int | None:
    """Deliver responses (tasks/update); how many were taken, None for an unknown task."""
    rid = task_uuid(task_id)
    if rid is None:
        return None
    row = await app.fetchone(UPDATE, (rid, Jsonb(responses)))
    return None if row is None or row[0] is None else int(row[0])


async def cancel(app: Durable, task_id: str) -> str | None:
    """Cancel the task's run (tasks/cancel); its status, None for an unknown task."""
    rid = task_uuid(task_id)
    if rid is None:
        return None
    row = await app.fetchone(CANCEL, (rid,))
    return None if row is None or row[0] is None else str(row[0])
