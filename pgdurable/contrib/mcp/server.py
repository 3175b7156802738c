"""Durable MCP tasks: an MCP server whose long tools are pgdurable runs.

:class:`DurableTasks` is an extension of the official MCP Python SDK
(``mcp.server.extension.Extension``, identifier ``io.modelcontextprotocol/tasks``,
SEP-2663). A tool registered with :meth:`DurableTasks.tool` is a workflow of the
pgdurable app (``mcp.tool:<name>``): ``tools/call`` starts a run and answers
with a task handle whose ``taskId`` is the run's id; the body runs on pgdurable
workers (recorded steps, effects, waits), not in the MCP server process.
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` read and change the
database only (``pgdurable.mcp_task_*``), so any server process behind a load
balancer answers for any task.

Which form answers what:

* 2026-07-28 (the extension): a client that declares
  ``io.modelcontextprotocol/tasks`` in its per-request capabilities gets a
  ``CreateTaskResult`` (``resultType: "task"``) from a durable tool;
  ``tasks/get`` returns the ``DetailedTask`` (``result``, ``error`` or
  ``inputRequests`` inlined); ``tasks/update`` and ``tasks/cancel`` return
  empty acks. A client that does not declare it gets the tool's result once the
  run has ended (``task_support="optional"``, still run by the workers) or
  ``-32021`` (``"required"``); ``tasks/*`` answer it ``-32021``.
* 2025-11-25 (the experimental core form, :attr:`DurableTasks.legacy`, a
  server middleware): ``tools/call`` with a ``task`` parameter answers
  ``{"task": Task}``; ``tasks/get`` and ``tasks/cancel`` return the ``Task``,
  ``tasks/result`` waits for the run and returns the tool's result; the
  ``initialize`` result advertises ``capabilities.tasks``. ``input_required``
  has no ``tasks/update`` there: its requests are answered with
  ``tasks/update`` only on 2026-07-28 (or by :meth:`DurableTasks.answer`). A
  session with a standalone stream (stateful Streamable HTTP, stdio) that
  created a task gets ``notifications/tasks/status`` when its status changes
  (:mod:`pgdurable.contrib.mcp._push`: LISTEN/NOTIFY through the process's one
  notifier). 2026-07-28 pushes (``notifications/tasks`` on
  ``subscriptions/listen`` with ``taskIds``) cannot be served on the SDK 2.3.0:
  its listen handler drops filter keys it does not know (docs/mcp.md).

The body of a durable tool gets a :class:`TaskContext`: the workflow's steps and
waits, :meth:`~TaskContext.report` (``statusMessage``, ``pollIntervalMs``,
shown by ``tasks/get``; recorded before the body parks), :meth:`~TaskContext.input` and
:meth:`~TaskContext.elicit` (status ``input_required``: the run parks on a wait
whose requests ``tasks/get`` shows, and ``tasks/update`` wakes it). Raise
:class:`ToolError` for a tool error (the task completes with ``isError``); any
other exception fails the task (status ``failed``, a JSON-RPC error).

A task's result or error is kept for its TTL (``ttl=``, from creation; the wire
``ttlMs``): ``tasks/get`` answers ``-32602`` ("Task has expired") after it, and
retention (``pgdurable prune``) deletes the run only once both its own cut-off
and the TTL have passed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, ToolBinding
from mcp.shared.exceptions import MCPError
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    RequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict, Field

from ...app.durable import Durable
from ...foundation.errors import RunCancelled, RunFailed
from ...models.workflows import StepPolicy, WorkflowContext
from . import _sql
from ._push import Pusher
from ._report import Reports
from ._wire import (
    EXTENSION_ID,
    TaskRow,
    created_task,
    detailed_task,
    error_result,
    legacy_task,
    rpc_error,
    tool_result,
)

__all__ = ["DurableTasks", "TaskContext", "ToolError", "DurableTool"]

TaskSupport = Literal["optional", "required"]
#: The signal kind a task's input round waits on (ref ``"<run id>:<round>"``).
INPUT_SIGNAL = "mcp.input"
_LEGACY = "2025-11-25"


class ToolError(Exception):
    """Raised by a durable tool's body: a tool error, not a failure.

    The task completes with ``isError: true`` and the message as its text
    (SEP-2663: ``failed`` is for protocol errors only)."""


@dataclass
class TaskContext:
    """What a durable tool's body gets: its workflow, and the task's input and status.

    Steps and waits are those of :class:`~pgdurable.WorkflowContext` (recorded,
    replayed after a crash or a park, so the body follows the workflow's
    determinism rule): :meth:`step`, :meth:`sleep`, :meth:`sleep_until`,
    :meth:`wait_signal`, :meth:`start_child`, :meth:`gather`, :meth:`emit`,
    :meth:`patched`; the whole context is :attr:`workflow`.
    """

    workflow: WorkflowContext
    tasks: DurableTasks
    _reports: Reports = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._reports = Reports(self.workflow.run)

    @property
    def task_id(self) -> str:
        """The MCP taskId: the run's id."""
        return self.workflow.run_id

    @property
    def replaying(self) -> bool:
        """True while recorded history is being replayed."""
        return self.workflow.replaying

    async def step(self, name: str, fn: Callable[..., Any], *args: Any,
                   policy: StepPolicy | None = None, repeat: bool = False, **kwargs: Any) -> Any:
        """A recorded step (:meth:`WorkflowContext.step <pgdurable.WorkflowContext.step>`)."""
        if policy is None:
            return await self.workflow.step(name, fn, *args, repeat=repeat, **kwargs)
        return await self.workflow.step(name, fn, *args, policy=policy, repeat=repeat, **kwargs)

    async def sleep(self, duration: timedelta | float) -> None:
        """Park for ``duration``; no worker is held meanwhile."""
        await self._reports.flush()
        await self.workflow.sleep(duration)

    async def sleep_until(self, until: datetime) -> None:
        """Park until ``until`` (database clock)."""
        await self._reports.flush()
        await self.workflow.sleep_until(until)

    async def wait_signal(self, kind: str, ref: str, *,
                          timeout: timedelta | float | None = None) -> Any:  # noqa: ASYNC109
        """Park until the signal ``(kind, ref)``; its payload."""
        await self._reports.flush()
        return await self.workflow.wait_signal(kind, ref, timeout=timeout)

    async def start_child(self, task: str, state: Any = None, *, key: str | None = None,
                          **options: Any) -> str:
        """Start a child run as a recorded step; its id."""
        return await self.workflow.start_child(task, state, key=key, **options)

    async def gather(self, ids: list[str], **options: Any) -> list[dict[str, Any]]:
        """Park until children end; their outcomes."""
        await self._reports.flush()
        return await self.workflow.gather(ids, **options)

    async def emit(self, event: Any) -> int:
        """Append to the run's output stream."""
        return await self.workflow.emit(event)

    async def patched(self, change_id: str) -> bool:
        """Guard a code change (:meth:`WorkflowContext.patched <pgdurable.WorkflowContext.patched>`)."""
        return await self.workflow.patched(change_id)

    def report(self, message: str | None = None, *, poll_interval: timedelta | None = None,
               **progress: Any) -> None:
        """Report the task's ``statusMessage`` (and a new ``pollIntervalMs`` hint).

        Stored as the run's progress (``runs.progress -> 'mcp'``, fenced by the
        lease): written in the background at once, and awaited before the body
        parks (every wait of this context flushes it first), so a message
        reported just before a sleep or a wait is what ``tasks/get`` shows
        from any process while the run is parked. Each call updates what this
        execution reported before (a message stays until another replaces
        it). Extra keyword values (JSON) are stored beside it but not sent on
        the wire: a task has no field for them. Not re-reported while replaying.
        """
        if self.replaying:
            return
        mcp: dict[str, Any] = dict(progress)
        if message is not None:
            mcp["statusMessage"] = message
        if poll_interval is not None:
            mcp["pollIntervalMs"] = _ms(poll_interval)
        self._reports.report(mcp)

    async def input(self, requests: Mapping[str, Mapping[str, Any]], *,
                    timeout: timedelta | float | None = None,  # noqa: ASYNC109
                    ) -> dict[str, Any]:
        """Ask the client for input and park until every request is answered.

        ``requests`` maps keys (unique over the task's lifetime) to
        server-to-client requests, e.g. ``{"confirm": {"method":
        "elicitation/create", "params": {...}}}``. The task shows
        ``input_required`` with these ``inputRequests`` until ``tasks/update``
        has answered every key (one at a time or all at once); the run holds no
        worker meanwhile and wakes once, when the last is answered. Returns the
        responses by key. ``timeout``: :class:`~pgdurable.WaitTimeout` after it.
        """
        if not requests:
            raise ValueError("input() needs at least one request")
        for key, request in requests.items():
            if not isinstance(key, str) or not key or len(key) > 200:
                raise ValueError(f"input request keys must be 1-200 characters, not {key!r}")
            if not isinstance(request, Mapping) or not isinstance(request.get("method"), str):
                raise ValueError(f"input request {key!r} must be an object with a 'method'")
        wf = self.workflow
        round_ = wf.position + 1  # the wait's position: the same at every replay
        body = {k: dict(v) for k, v in requests.items()}
        await wf.step(f"mcp.ask#{round_}", _sql.ask, self.tasks.app, wf.run_id, round_, body)
        await self._reports.flush()
        payload = await wf.wait_signal(INPUT_SIGNAL, f"{wf.run_id}:{round_}", timeout=timeout)
        return dict(payload or {})

    async def elicit(self, message: str, schema: Mapping[str, Any] | None = None, *,
                     key: str | None = None,
                     timeout: timedelta | float | None = None,  # noqa: ASYNC109
                     ) -> dict[str, Any]:
        """One form elicitation (``elicitation/create``) through :meth:`input`;
        the client's response (``{"action": ..., "content": {...}}``)."""
        params: dict[str, Any] = {"mode": "form", "message": message,
                                  "requestedSchema": dict(schema or {"type": "object",
                                                                     "properties": {}})}
        name = key or f"elicit-{self.workflow.position + 1}"
        answers = await self.input({name: {"method": "elicitation/create", "params": params}},
                                   timeout=timeout)
        answer = answers.get(name)
        return dict(answer) if isinstance(answer, Mapping) else {"action": "cancel"}


@dataclass(frozen=True)
class DurableTool:
    """A tool registered by :meth:`DurableTasks.tool`."""

    name: str
    workflow: str
    fn: Callable[..., Awaitable[Any]]
    task_support: TaskSupport
    ttl: timedelta | None
    poll_interval_ms: int
    description: str | None


def _ms(value: timedelta) -> int:
    return max(1, int(value.total_seconds() * 1000))


class _TaskParams(RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    task_id: str = Field(alias="taskId")


class _UpdateParams(_TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


def _declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    declared = caps.extensions if caps else None
    return bool(declared) and EXTENSION_ID in (declared or {})


def _missing_capability() -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Missing required client capability: extension {EXTENSION_ID!r}",
        data={"requiredCapabilities": {"extensions": {EXTENSION_ID: {}}}},
    )


def _unknown(task_id: str, why: str = "Task not found") -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=f"Failed to retrieve task: {why}",
                    data={"taskId": task_id})


def _check_name_header(ctx: ServerRequestContext[Any, Any], task_id: str) -> None:
    """SEP-2663 over Streamable HTTP: ``Mcp-Name`` must be the taskId (-32020)."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    if headers is None:
        return
    name = headers.get("mcp-name")
    if name is None or name != task_id:
        raise MCPError(code=HEADER_MISMATCH,
                       message="Mcp-Name header does not match params.taskId")


class DurableTasks(Extension):
    """The Tasks extension over a pgdurable app: durable tools whose tasks are runs.

    ``app``: the :class:`~pgdurable.Durable` app whose workers run the tools
    (the worker processes import the same module, so the same tools are
    registered there). ``ttl``: how long a task is kept from its creation
    (default 1 hour; ``None``: unlimited, retention never prunes it);
    ``poll_interval``: the ``pollIntervalMs`` hint (default 1 s); ``queue``:
    the queue the runs go to. Pass it to ``MCPServer(extensions=[tasks],
    middleware=[tasks.legacy])`` (the middleware only for 2025-11-25 clients).
    """

    identifier = EXTENSION_ID

    def __init__(self, app: Durable, *, ttl: timedelta | None = timedelta(hours=1),
                 poll_interval: timedelta = timedelta(seconds=1), queue: str = "default") -> None:
        if ttl is not None and ttl <= timedelta(0):
            raise ValueError("ttl must be positive or None")
        if poll_interval <= timedelta(0):
            raise ValueError("poll_interval must be positive")
        self.app = app
        self.ttl = ttl
        self.poll_interval_ms = _ms(poll_interval)
        self.queue = queue
        self._tools: dict[str, DurableTool] = {}
        self._pusher: Pusher | None = None

    # -- registration ---------------------------------------------------------

    def tool(self, name: str | None = None, *, description: str | None = None,
             task_support: TaskSupport = "optional", revision: str = "1",
             max_attempts: int = 1, ttl: timedelta | Literal["default"] | None = "default",
             poll_interval: timedelta | None = None,
             ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        """Register ``async def fn(ctx: TaskContext, **arguments)`` as a durable tool.

        Its input schema is that of ``fn``'s parameters after ``ctx``. It is
        the workflow ``mcp.tool:<name>`` of the app (``revision``,
        ``max_attempts``: failed attempts of the whole body before the task
        fails). ``task_support="required"``: a client that did not declare the
        extension gets ``-32021`` instead of a synchronous answer.
        """
        if task_support not in ("optional", "required"):
            raise ValueError("task_support must be 'optional' or 'required'")

        def deco(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError("a durable tool must be an async function")
            tool_name = name or fn.__name__
            if tool_name in self._tools:
                raise ValueError(f"durable tool {tool_name!r} is already registered")
            wf_name = f"mcp.tool:{tool_name}"
            self.app.workflow(wf_name, revision=revision, max_attempts=max_attempts)(
                functools.partial(_run_tool, fn, self))
            self._tools[tool_name] = DurableTool(
                name=tool_name, workflow=wf_name, fn=fn, task_support=task_support,
                ttl=self.ttl if ttl == "default" else ttl,
                poll_interval_ms=(self.poll_interval_ms if poll_interval is None
                                  else _ms(poll_interval)),
                description=description or inspect.getdoc(fn))
            return fn

        return deco

    @property
    def durable_tools(self) -> dict[str, DurableTool]:
        """The registered durable tools by name."""
        return dict(self._tools)

    # -- the extension's contributions ---------------------------------------

    def tools(self) -> Sequence[ToolBinding]:
        # no output schema: a task's result is whatever CallToolResult the body made
        return [ToolBinding(fn=_schema_stub(t), kwargs={"name": t.name,
                                                        "description": t.description,
                                                        "structured_output": False})
                for t in self._tools.values()]

    def methods(self) -> Sequence[MethodBinding]:
        modern = frozenset(MODERN_PROTOCOL_VERSIONS)
        return [
            MethodBinding("tasks/get", _TaskParams, self._on_get, protocol_versions=modern),
            MethodBinding("tasks/update", _UpdateParams, self._on_update,
                          protocol_versions=modern),
            MethodBinding("tasks/cancel", _TaskParams, self._on_cancel,
                          protocol_versions=modern),
        ]

    async def intercept_tool_call(self, params: CallToolRequestParams,
                                  ctx: ServerRequestContext[Any, Any],
                                  call_next: CallNext) -> HandlerResult:
        tool = self._tools.get(params.name)
        if tool is None:
            return await call_next(ctx)
        arguments = dict(params.arguments or {})
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and _declared(ctx):
            row = await self.create(tool.name, arguments)
            return created_task(row)
        if tool.task_support == "required":
            raise _missing_capability()
        # a client without tasks: the workers run it all the same; answer at its end
        row = await self.create(tool.name, arguments)
        result = await self._final_result(row.task_id)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            result = {**result, "resultType": "complete"}
        return result

    # -- the operations, from any process ------------------------------------

    async def create(self, tool: str, arguments: dict[str, Any]) -> TaskRow:
        """Start the tool's run and register it as a task, in one transaction; its row.

        Durable before it returns (SEP-2663: a ``tasks/get`` for it resolves)."""
        spec = self._tools[tool]
        await self.app.open()
        async with self.app.pool.connection() as conn, conn.transaction():
            run_id = await self.app.start(spec.workflow, {"arguments": arguments},
                                          queue=self.queue, conn=conn)
            await _sql.register(conn, run_id, spec.name, spec.ttl, spec.poll_interval_ms)
        row = await _sql.fetch_task(self.app, run_id)
        assert row is not None  # committed above
        return row

    async def get(self, task_id: str) -> dict[str, Any]:
        """The ``DetailedTask`` (``tasks/get``); ``-32602`` when unknown or expired."""
        row = await _sql.fetch_task(self.app, task_id)
        if row is None:
            raise _unknown(task_id)
        if row.expired:
            raise _unknown(task_id, "Task has expired")
        return detailed_task(row)

    async def answer(self, task_id: str, responses: Mapping[str, Any]) -> int:
        """Deliver input responses (``tasks/update``); how many were outstanding and taken."""
        taken = await _sql.update(self.app, task_id, dict(responses))
        if taken is None:
            raise _unknown(task_id)
        return taken

    async def cancel(self, task_id: str) -> str:
        """Cancel the task's run (``tasks/cancel``); the run's status after it."""
        status = await _sql.cancel(self.app, task_id)
        if status is None:
            raise _unknown(task_id)
        return status

    def _push_status(self, ctx: ServerRequestContext[Any, Any], task: dict[str, Any]) -> None:
        """Push the task's status changes to this session (2025-11-25), if it has a
        standalone stream (a stateful Streamable HTTP session, stdio)."""
        # the SDK keeps the session's Connection (its standalone channel and its
        # exit stack) private on the per-request ServerSession
        connection = getattr(ctx.session, "_connection", None)
        if connection is None or not getattr(connection, "has_standalone_channel", False):
            return
        if self._pusher is None:
            self._pusher = Pusher(self.app)
        self._pusher.watch(str(task["taskId"]), connection, task)

    async def _final_result(self, task_id: str) -> dict[str, Any]:
        try:
            result = await self.app.result(task_id)
        except RunCancelled:
            return error_result("The task was cancelled.")
        except RunFailed as failed:
            err = rpc_error(failed.error)
            raise MCPError(code=err["code"], message=err["message"], data=err.get("data")) from None
        return tool_result(result)

    # -- method handlers (2026-07-28) ----------------------------------------

    async def _on_get(self, ctx: ServerRequestContext[Any, Any], params: _TaskParams) -> Any:
        if not _declared(ctx):
            raise _missing_capability()
        _check_name_header(ctx, params.task_id)
        return await self.get(params.task_id)

    async def _on_update(self, ctx: ServerRequestContext[Any, Any],
                         params: _UpdateParams) -> Any:
        if not _declared(ctx):
            raise _missing_capability()
        _check_name_header(ctx, params.task_id)
        await self.answer(params.task_id, params.input_responses)
        return {}

    async def _on_cancel(self, ctx: ServerRequestContext[Any, Any], params: _TaskParams) -> Any:
        if not _declared(ctx):
            raise _missing_capability()
        _check_name_header(ctx, params.task_id)
        await self.cancel(params.task_id)
        return {}

    # -- 2025-11-25: the experimental core form, as a server middleware -------

    @property
    def legacy(self) -> Callable[[ServerRequestContext[Any, Any], CallNext],
                                 Awaitable[HandlerResult]]:
        """A server middleware serving the 2025-11-25 experimental tasks form.

        Pass it as ``MCPServer(..., middleware=[tasks.legacy])``. Only
        connections at protocol 2025-11-25 are touched."""
        return self._legacy

    async def _legacy(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext,
                      ) -> HandlerResult:
        if ctx.protocol_version != _LEGACY and ctx.method != "initialize":
            return await call_next(ctx)
        params = dict(ctx.params or {})
        if ctx.method == "initialize":
            result = await call_next(ctx)
            if (isinstance(result, dict) and params.get("protocolVersion") == _LEGACY
                    and result.get("protocolVersion") == _LEGACY):
                caps = dict(result.get("capabilities") or {})
                caps["tasks"] = {"cancel": {}, "requests": {"tools": {"call": {}}}}
                result = {**result, "capabilities": caps}
            return result
        if ctx.method == "tools/list":
            result = await call_next(ctx)
            if isinstance(result, dict) and isinstance(result.get("tools"), list):
                tools = []
                for t in result["tools"]:
                    spec = self._tools.get(str(t.get("name"))) if isinstance(t, dict) else None
                    if spec is not None:
                        t = {**t, "execution": {"taskSupport": spec.task_support}}
                    tools.append(t)
                result = {**result, "tools": tools}
            return result
        if ctx.method == "tools/call" and isinstance(params.get("task"), dict):
            spec = self._tools.get(str(params.get("name")))
            if spec is None:
                return await call_next(ctx)
            row = await self.create(spec.name, dict(params.get("arguments") or {}))
            task = legacy_task(row)
            self._push_status(ctx, task)
            return {"task": task}
        if ctx.method in ("tasks/get", "tasks/cancel", "tasks/result"):
            task_id = params.get("taskId")
            if not isinstance(task_id, str):
                raise MCPError(code=INVALID_PARAMS, message="taskId is required")
            if ctx.method == "tasks/cancel":
                await self.cancel(task_id)
            found = await _sql.fetch_task(self.app, task_id)
            if found is None or found.expired:
                raise _unknown(task_id, "Task has expired" if found else "Task not found")
            if ctx.method != "tasks/result":
                return legacy_task(found)
            result = await self._final_result(task_id)
            meta = {**(result.get("_meta") or {}),
                    "io.modelcontextprotocol/related-task": {"taskId": task_id}}
            return {**result, "_meta": meta}
        if ctx.method == "tasks/update":
            raise MCPError(code=-32601, message="Method not found", data="tasks/update")
        return await call_next(ctx)


async def _run_tool(fn: Callable[..., Awaitable[Any]], tasks: DurableTasks,
                    ctx: WorkflowContext, state: Any) -> dict[str, Any]:
    """The workflow of a durable tool: the body, its value as a ``CallToolResult``."""
    arguments = state.get("arguments", {}) if isinstance(state, dict) else {}
    try:
        value = await fn(TaskContext(ctx, tasks), **arguments)
    except ToolError as err:
        return error_result(str(err) or type(err).__name__)
    return tool_result(value)


def _schema_stub(tool: DurableTool) -> Callable[..., Any]:
    """A function with the tool's signature after ``ctx``: what the SDK reads the
    input schema from (and calls never: the interceptor answers every call)."""
    sig = inspect.signature(tool.fn)
    params = list(sig.parameters.values())[1:]

    async def stub(**kwargs: Any) -> Any:  # pragma: no cover - never called
        raise MCPError(code=INTERNAL_ERROR, message=f"durable tool {tool.name!r} not intercepted")

    stub.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    hints = dict(getattr(tool.fn, "__annotations__", {}))
    first = next(iter(sig.parameters), None)
    if first is not None:
        hints.pop(first, None)
    stub.__annotations__ = hints
    stub.__name__ = tool.name
    stub.__doc__ = tool.description
    stub.__module__ = tool.fn.__module__
    return stub
