"""Awaiting a remote MCP task from a workflow without holding a worker.

``await call_tool(ctx, url, "deploy", {...})`` inside a workflow calls a remote
MCP tool (Streamable HTTP, the official SDK's ``Client``, declaring
``io.modelcontextprotocol/tasks``). A plain result returns at once. A task
handle (``resultType: "task"``) is recorded with the step (the taskId is in the
checkpoint: a crash of any worker loses nothing) and the run parks on the
signal ``("mcp.remote", "<run>:<key>:<round>")``: no worker, thread or
connection is held while the remote task runs. A :class:`TaskPoller` (any
number of processes, beside the workers: ``asyncio.gather(worker.run(),
TaskPoller(app).run())``) polls ``tasks/get`` for every awaited task at the
server's ``pollIntervalMs`` and wakes the run when the task ends or needs
input (``pgdurable.mcp_remote_seen``). A ``tasks/get`` answered ``-32602``
(the server does not know the task, or no longer: past its TTL) is permanent:
it is recorded as a failed task and the run raises :class:`RemoteTaskFailed`;
any other failure (the server down) is retried when the poll's lease lapses. The poller is a self-contained service:
the engine's ``Service`` protocol is not there yet to plug it into.

``input_required`` becomes a wait: the run parks on ``("mcp.answer",
"<run>:<key>:<round>")``; :func:`pending_input` shows the remote
``inputRequests`` to a human or another agent and :func:`answer_input`
answers them; the run then sends ``tasks/update`` and awaits the task again.
A completed task returns its ``CallToolResult`` (JSON); a failed or cancelled
one raises :class:`RemoteTaskFailed` (recorded: a replay raises it again).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult, Request, RequestParams, Result
from psycopg.types.json import Jsonb
from pydantic import ConfigDict, Field

from ...app.durable import Durable
from ...foundation.db import translated
from ...foundation.errors import PgDurableError
from ...foundation.queries import mcp as mq
from ...foundation.queries.core import first, many, one
from ...models.workflows import WorkflowContext
from ._wire import EXTENSION_ID

__all__ = ["CreatedTask", "RemoteTaskFailed", "TaskPoller", "TasksClient", "answer_input", "call_tool", "pending_input"]

log = logging.getLogger("pgdurable.mcp")

#: The signal a run awaiting a remote task parks on (ref ``"<run>:<key>:<round>"``).
REMOTE_SIGNAL = "mcp.remote"
#: The signal that answers a remote task's input requests (same ref).
ANSWER_SIGNAL = "mcp.answer"

# (the statements and their typed rows: pgdurable.foundation.queries.mcp, as ``mq``)


class RemoteTaskFailed(PgDurableError):
    """The remote task ended ``failed`` or ``cancelled``; ``.task`` is its last state."""

    def __init__(self, message: str, task: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.task = task or {}


class _TaskParams(RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")


class _UpdateParams(_TaskParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


class _AnyResult(Result):
    model_config = ConfigDict(extra="allow")


class _GetTask(Request[_TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskParams
    name_param = "taskId"


class _UpdateTask(Request[_UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: _UpdateParams
    name_param = "taskId"


class _CancelTask(Request[_TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskParams
    name_param = "taskId"


class CreatedTask(Result):
    """A ``CreateTaskResult`` (``resultType: "task"``) as the client parses it."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    result_type: Literal["task"] = Field(default="task", alias="resultType")
    task_id: str = Field(alias="taskId")
    status: str
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")


async def _resolve(created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
    """Finish a task handle in-line (a plain ``client.call_tool``): poll to its end."""
    while True:
        task = _dump(await ctx.session.send_request(
            _GetTask(params=_TaskParams(taskId=created.task_id)), _AnyResult))
        if task.get("status") == "completed":
            return CallToolResult.model_validate(task.get("result") or {"content": []})
        if task.get("status") in ("failed", "cancelled"):
            raise RemoteTaskFailed(f"remote task {created.task_id} {task.get('status')}", task)
        await asyncio.sleep(max(1, int(task.get("pollIntervalMs") or 1000)) / 1000)


class TasksClient(ClientExtension):
    """The client half of the Tasks extension for the SDK's ``Client``: declares
    ``io.modelcontextprotocol/tasks`` and claims ``resultType: "task"``
    (``client.call_tool`` polls a task to its end; ``session.call_tool(...,
    allow_claimed=True)`` returns the :class:`CreatedTask`)."""

    identifier = EXTENSION_ID

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=_resolve)]


Connect = Callable[[str], AbstractAsyncContextManager[Client]]


def connect(server: str) -> AbstractAsyncContextManager[Client]:
    """The SDK client for ``server`` (Streamable HTTP, 2026-07-28), declaring the Tasks
    extension."""
    return Client(server, extensions=[TasksClient()], mode="2026-07-28", cache=None)


def _dump(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


def _leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The one error a task group wrapped (the SDK's client raises through anyio)."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return inner


async def _request(server: str, connector: Connect, request: Any) -> dict[str, Any]:
    try:
        async with connector(server) as client:
            return _dump(await client.session.send_request(request, _AnyResult))
    except BaseExceptionGroup as group:
        raise _leaf(group) from None


async def _tools_call(server: str, name: str, arguments: dict[str, Any],
                      connector: Connect) -> dict[str, Any]:
    try:
        async with connector(server) as client:
            result = await client.session.call_tool(name, arguments, allow_claimed=True)
    except BaseExceptionGroup as group:
        raise _leaf(group) from None
    data = _dump(result)
    if data.get("resultType") == "task" or "taskId" in data:
        return {"task": data}
    return {"result": data}


def unknown_task(task_id: str, message: str) -> dict[str, Any]:
    """The failed task recorded for a ``tasks/get`` the server answered ``-32602``."""
    return {"taskId": task_id, "status": "failed",
            "statusMessage": f"the server does not know the task: {message}",
            "error": {"code": INVALID_PARAMS, "message": message}}


async def get_task(server: str, task_id: str, connector: Connect = connect) -> dict[str, Any]:
    """``tasks/get`` on ``server``: the task as a dict."""
    return await _request(server, connector, _GetTask(params=_TaskParams(taskId=task_id)))


async def update_task(server: str, task_id: str, responses: dict[str, Any],
                      connector: Connect = connect) -> None:
    """``tasks/update`` on ``server`` with ``responses`` (``inputResponses``)."""
    await _request(server, connector,
                   _UpdateTask(params=_UpdateParams(taskId=task_id, inputResponses=responses)))


async def cancel_task(server: str, task_id: str, connector: Connect = connect) -> None:
    """``tasks/cancel`` on ``server``."""
    await _request(server, connector, _CancelTask(params=_TaskParams(taskId=task_id)))


async def _watch(app: Durable, run_id: str, key: str, server: str, task_id: str, round_: int,
                 poll_ms: int) -> bool:
    await one(app, mq.WATCH, (uuid.UUID(run_id), key, server, task_id, round_, poll_ms))
    return True


async def call_tool(ctx: WorkflowContext, app: Durable, server: str, name: str,
                    arguments: dict[str, Any] | None = None, *, key: str | None = None,
                    timeout: timedelta | float | None = None,  # noqa: ASYNC109
                    connector: Connect = connect) -> dict[str, Any]:
    """Call the remote MCP tool ``name`` on ``server`` from a workflow; its ``CallToolResult``.

    Every exchange is a recorded step and every wait parks the run (no worker
    held): the ``tools/call`` (``mcp.call:<key>``; ``key`` defaults to the
    tool's name and must be unique in the run), then, for a task handle, the
    waits for the :class:`TaskPoller`'s wake-ups (``timeout`` for each:
    :class:`~pgdurable.WaitTimeout`), the waits for answers to
    ``input_required`` and the ``tasks/update`` that delivers them.
    ``app`` is the app whose tables the poller reads (the workflow's own).
    """
    key = key or name
    step = await ctx.step(f"mcp.call:{key}", _tools_call, server, name, dict(arguments or {}),
                          connector)
    if "result" in step:
        return dict(step["result"])
    created = step["task"]
    task_id = str(created["taskId"])
    poll_ms = int(created.get("pollIntervalMs") or 1000)
    round_ = 1
    while True:
        await ctx.step(f"mcp.watch:{key}#{round_}", _watch, app, ctx.run_id, key, server,
                       task_id, round_, max(1, min(poll_ms, 86_400_000)))
        ref = f"{ctx.run_id}:{key}:{round_}"
        task: dict[str, Any] = await ctx.wait_signal(REMOTE_SIGNAL, ref, timeout=timeout)
        status = task.get("status")
        if status == "completed":
            return dict(task.get("result") or {})
        if status in ("failed", "cancelled"):
            err = task.get("error") or {}
            raise RemoteTaskFailed(
                f"remote task {task_id} of {name!r} {status}: "
                f"{err.get('message') or task.get('statusMessage') or status}", task)
        # input_required: a human or another agent answers (answer_input)
        answers = await ctx.wait_signal(ANSWER_SIGNAL, ref, timeout=timeout)
        await ctx.step(f"mcp.update:{key}#{round_}", update_task, server, task_id,
                       dict(answers or {}), connector)
        round_ += 1


@dataclass(frozen=True)
class PendingInput:
    """What a run awaiting a remote task is asked (:func:`pending_input`)."""

    run_id: str
    key: str
    server: str
    task_id: str
    round: int
    state: str
    input_requests: dict[str, Any]
    task: dict[str, Any] | None


async def pending_input(app: Durable, run_id: str, key: str | None = None) -> PendingInput | None:
    """The remote task the run awaits (its latest, or ``key``'s) with the
    ``inputRequests`` it shows; None when the run awaits none."""
    await app.open()
    with translated():
        async with app.pool.connection() as conn:
            remote = await first(conn, mq.REMOTE_GET, (uuid.UUID(str(run_id)), key))
    if remote is None:
        return None
    task = remote.last_task if isinstance(remote.last_task, dict) else None
    requests = (task or {}).get("inputRequests") if remote.state == "asked" else None
    return PendingInput(run_id=str(run_id), key=remote.key, server=remote.server,
                        task_id=remote.task_id, round=remote.round, state=remote.state,
                        input_requests=dict(requests or {}), task=task)


async def answer_input(app: Durable, run_id: str, responses: dict[str, Any],
                       key: str | None = None) -> bool:
    """Answer the remote task's input requests the run waits on (``inputResponses``
    by request key); False when it waits on none."""
    pending = await pending_input(app, run_id, key)
    if pending is None or pending.state != "asked":
        return False
    ref = f"{run_id}:{pending.key}:{pending.round}"
    await app.signal(ANSWER_SIGNAL, ref, responses)
    return True


class TaskPoller:
    """Polls ``tasks/get`` for the remote tasks that parked runs await.

    ``await poller.run()`` until cancelled (beside a worker, in any number of
    processes: rows are taken ``FOR UPDATE SKIP LOCKED`` and leased for
    ``lease``); :meth:`run_once` polls what is due now. Between rounds it sleeps
    until the next task is due (at most ``idle``). A failed ``tasks/get`` (the
    server down) is retried when the lease lapses; ``-32602`` (an unknown or
    expired task) fails the remote task for good.
    """

    def __init__(self, app: Durable, *, batch: int = 50, lease: timedelta = timedelta(seconds=30),
                 idle: float = 1.0, connector: Connect = connect) -> None:
        if batch < 1 or batch > 10_000:
            raise ValueError("batch must be 1 to 10000")
        if lease <= timedelta(0) or idle <= 0:
            raise ValueError("lease and idle must be positive")
        self.app, self.batch, self.lease, self.idle = app, batch, lease, idle
        self.connector = connector
        self.polls = 0

    async def run_once(self) -> int:
        """Poll every task due now (one batch); how many were polled."""
        await self.app.open()
        with translated():
            async with self.app.pool.connection() as conn:
                due = await many(conn, mq.REMOTE_DUE, (self.batch, self.lease))
        await asyncio.gather(*(self._poll(d) for d in due))
        return len(due)

    async def _poll(self, due: mq.DueRemoteTask) -> None:
        try:
            task = await get_task(due.server, due.task_id, self.connector)
        except MCPError as err:
            if err.error.code != INVALID_PARAMS:
                log.warning("tasks/get %s on %s failed: %s", due.task_id, due.server, err)
                return  # polled again when the lease lapses
            # -32602: the server does not know the task (never, or no longer: past its
            # TTL). Permanent: the awaiting run wakes and raises RemoteTaskFailed.
            task = unknown_task(due.task_id, err.error.message)
        except Exception as err:  # the server down, a network error: polled again when
            log.warning("tasks/get %s on %s failed: %s",  # the lease lapses
                        due.task_id, due.server, err)
            return
        self.polls += 1
        await one(self.app, mq.SEEN, (due.run_id, due.key, due.round, Jsonb(task)))

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            if await self.run_once() >= self.batch:
                continue
            due = await first(self.app, mq.NEXT_POLL, ())
            await asyncio.sleep(self.idle if due is None else min(self.idle, max(0.0, due)))
