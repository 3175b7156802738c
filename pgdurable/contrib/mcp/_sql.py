"""What the MCP server side does with the database, one round trip each (the statements
and their typed rows: :mod:`pgdurable.foundation.queries.mcp`)."""

from __future__ import annotations

import uuid
from dataclasses import fields
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from ...app.durable import Durable
from ...foundation.db import translated
from ...foundation.queries import mcp as mq
from ...foundation.queries.core import first
from ._wire import TaskRow

# (the statements and their typed rows: pgdurable.foundation.queries.mcp, as ``mq``)


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
            state = await first(conn, mq.GET, (rid,))
    if state is None:
        return None
    return TaskRow(task_id=str(rid), **{f.name: getattr(state, f.name) for f in fields(state)})


async def register(conn: Any, run_id: str, tool: str, ttl: timedelta | None,
                   poll_interval_ms: int) -> None:
    """Register the run as an MCP task inside the caller's transaction."""
    with translated():
        await conn.execute(mq.REGISTER.sql, (uuid.UUID(run_id), tool, ttl, poll_interval_ms))


async def ask(app: Durable, run_id: str, round_: int, requests: dict[str, Any]) -> int:
    """Record a round of input requests; how many are still outstanding."""
    return await first(app, mq.ASK, (uuid.UUID(run_id), round_, Jsonb(requests))) or 0


async def update(app: Durable, task_id: str, responses: dict[str, Any]) -> int | None:
    """Deliver responses (tasks/update); how many were taken, None for an unknown task."""
    rid = task_uuid(task_id)
    if rid is None:
        return None
    return await first(app, mq.UPDATE, (rid, Jsonb(responses)))


async def cancel(app: Durable, task_id: str) -> str | None:
    """Cancel the task's run (tasks/cancel); its status, None for an unknown task."""
    rid = task_uuid(task_id)
    if rid is None:
        return None
    return await first(app, mq.CANCEL, (rid,))
