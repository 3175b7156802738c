"""The durability capability: Pydantic AI's durable-execution interface on pgdurable.

:class:`PgDurability` is a :class:`pydantic_ai.durable_exec.BaseDurabilityCapability`
(the public base Pydantic AI gives durable engines; Temporal, DBOS and Prefect are
built on it). Pydantic AI's base owns what every engine shares: which calls are
durable units (model requests, function, MCP and dynamic tool calls, tool
discovery, argument validation), how models cross the boundary (by name: a
``Model`` instance that is not the agent's own or registered in ``models=`` is
refused), how control flow (``ModelRetry``, ``ApprovalRequired``, ``CallDeferred``)
crosses as values. This module supplies the engine:

* **a unit = a recorded workflow step.** :class:`_Backend` runs each unit as
  ``ctx.step(name, body, repeat=True)`` of the pgdurable workflow that runs the
  agent (:mod:`.runs`): its JSON result (``JSON_CODEC``: a model response with
  its ``usage``, a tool's return) is checkpointed under the lease's fence before
  the agent goes on, and a resumed run gets it back without calling the model or
  the tool again. Units are positional (a sequence journal), so tool calls run one
  at a time inside a durable run (``sequential_tools_in_durable_context``).
* **replay policies per tool**: tool metadata ``{"pgdurable": {...}}`` holds
  :class:`~pgdurable.StepPolicy` fields (``max_attempts``, ``retry_base``,
  ``retry_cap``, ``replay``, ``reconcile``); ``{"pgdurable": False}`` runs the
  tool inline, unrecorded. A ``reconcile`` function gets the tool's validated
  arguments as keywords and returns the tool's real result (or
  :data:`~pgdurable.NOT_PERFORMED`): a call found started and unfinished after a
  crash is reconciled, never re-run blindly.
* **waits = parks.** :class:`_Waiter` is Pydantic AI's
  :class:`~pydantic_ai.durable_exec.ExternalEventWaiter`: a wait (a deferred tool
  call, an approval, ``RequestInput``) is a recorded ``ask`` step and a park on
  the signal ``("approval", token)``; the run holds no worker until the signal
  comes (or the timeout), and a replay returns the recorded payload.
* **the event stream** goes to the run's output stream: the model's text (a text
  part's first content and its ``TextPartDelta`` s) to ``ctx.emit_text``
  (buffered: a few ``{"type": "text"}`` rows, not one per token), every other
  event to ``ctx.emit`` (model events live from inside the model unit, the
  run's other events, tool calls and results, from the workflow), each once:
  replayed code emits nothing; a crashed attempt's events are overwritten in
  place by the retry (same ``seq``) and its stored text is not written again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import AsyncIterable, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import JsonValue, TypeAdapter
from pydantic_ai.capabilities.abstract import WrapRunHandler
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallToolResult,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    ExternalEventError,
    ExternalEventWaiter,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    ToolsetKind,
    conversation_id_from_run_id,
    external_event_scope,
)
from pydantic_ai.durable_exec._operation_backend import in_durable_unit
from pydantic_ai.durable_exec._toolset import wrap_tool_call_result
from pydantic_ai.exceptions import ToolFailed, UserError
from pydantic_ai.external_events import wait_for_external_event
from pydantic_ai.messages import (
    AgentStreamEvent,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
)
from pydantic_ai.models import Model
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import (
    AgentDepsT,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolDefinition,
    ToolDenied,
)

from ...foundation.effects import NOT_PERFORMED
from ...models.workflows import StepPolicy, WaitTimeout
from ...runs.budgets import amounts_json
from ...runs.steps import in_thread
from .scope import SCOPE, Scope, event_json
from .workflow import register

if TYPE_CHECKING:
    from ...app.durable import Durable

__all__ = ["APPROVAL_KIND", "PgDurability", "decision"]

#: The signal kind of a parked wait: ``pgdurable signal approval <token> --payload ...``.
APPROVAL_KIND = "approval"

_RESULTS: TypeAdapter[DeferredToolResults] = TypeAdapter(DeferredToolResults)
_POLICY_FIELDS = {f.name for f in dataclasses.fields(StepPolicy)}


def _policy(config: Mapping[str, Any] | StepPolicy | None, base: StepPolicy,
            tool_name: str = "") -> StepPolicy:
    """``base`` with the fields of ``config`` (tool metadata) applied."""
    if config is None or isinstance(config, StepPolicy):
        return config or base
    extra = set(config) - _POLICY_FIELDS
    if extra:
        raise UserError(f"tool {tool_name!r}: unknown pgdurable policy field(s) {sorted(extra)}; "
                        f"use {sorted(_POLICY_FIELDS)}")
    fields = {f: getattr(base, f) for f in _POLICY_FIELDS} | dict(config)
    if "reconcile" in config and "replay" not in config:
        fields["replay"] = "reconcile" if config["reconcile"] is not None else "safe"
    try:
        return StepPolicy(**fields)
    except (TypeError, ValueError) as exc:
        raise UserError(f"tool {tool_name!r}: bad pgdurable policy: {exc}") from None


async def _reconcile_tool(reconcile: Callable[..., Any], args: dict[str, Any]) -> Any:
    """A tool's ``reconcile(**args)`` (async, or sync in a worker thread) as the step
    result its call would have recorded, or :data:`~pgdurable.NOT_PERFORMED`."""
    if inspect.iscoroutinefunction(reconcile):
        value = await reconcile(**args)
    else:
        value = await in_thread(functools.partial(reconcile, **args))
        if inspect.isawaitable(value):
            value = await value
    if value is NOT_PERFORMED:
        return value

    async def returned() -> Any:
        return value

    return JSON_CODEC.dump(CallToolResult, await wrap_tool_call_result(returned()))


def _usage_amounts(result: object, reserved: Mapping[str, float]) -> dict[str, float]:
    """What a model request spent, from the usage of its (JSON) response: the token
    units the reservation named (``tokens`` = in + out) and ``calls`` = 1."""
    usage = result.get("usage") if isinstance(result, Mapping) else getattr(result, "usage", None)
    if isinstance(usage, Mapping):
        tin, tout = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    else:
        tin, tout = getattr(usage, "input_tokens", 0), getattr(usage, "output_tokens", 0)
    measured = {"tokens_in": float(tin or 0), "tokens_out": float(tout or 0),
                "tokens": float((tin or 0) + (tout or 0)), "calls": 1.0}
    return {u: v for u, v in measured.items() if u in reserved}


class _Backend(JournalCallableOperationBackend[StepPolicy]):
    """Each durable unit is one recorded step of the run's workflow."""

    def __init__(self, *args: Any, reserve: Mapping[str, float] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reserve = reserve

    async def execute(self, *, operation_id: DurableOperationId, name: str,
                      body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...],
                      config: StepPolicy) -> object:
        scope = SCOPE.get()
        if scope is None:  # pragma: no cover - in_durable_context guards every call
            raise RuntimeError("a pgdurable durable unit outside a pgdurable run")
        policy = config if isinstance(config, StepPolicy) else StepPolicy()
        if policy.reconcile is not None:
            if isinstance(operation_id, ToolsetCallToolId) and scope.call is not None:
                reconcile = functools.partial(_reconcile_tool, policy.reconcile, scope.call[1])
                policy = dataclasses.replace(policy, reconcile=reconcile)
            else:  # the tool's argument validation, say: nothing to reconcile
                policy = dataclasses.replace(policy, replay="safe", reconcile=None)
        run = scope.ctx.run
        first_event = run._emitted
        text = run._text  # the step's text stream (pgdurable.runs.text), if any yet
        first_text = text.emitted if text is not None and not text.closed else 0
        tries = 0

        async def unit() -> object:
            nonlocal tries
            tries += 1
            # a retried attempt (StepPolicy) re-emits into the same stream rows, and
            # replays its text from where the unit's text began: what the failed attempt
            # streamed is stored first, and the replay skips it (as after a crash)
            run._emitted = first_event
            if tries > 1 and run._text is not None and not run._text.closed:
                await run.text_so_far()
                run._text.emitted = first_text
            return await body()

        reserve = self._reserve
        if reserve is not None and isinstance(operation_id, ModelRequestId):
            async def charged() -> object:
                # a budget reservation around the model request (docs/budgets.md),
                # settled from the usage it returns; usd from the price table
                amounts: dict[str, Any] = dict(reserve)  # units only (checked at __init__)
                async with run.reserve(**amounts) as r:
                    result = await unit()
                    r.settle(model=operation_id.model_name if "usd" in reserve else None,
                             **_usage_amounts(result, reserve))
                return result

            return await scope.ctx.step(name, charged, policy=policy, repeat=True)
        return await scope.ctx.step(name, unit, policy=policy, repeat=True)


class _Waiter(ExternalEventWaiter):
    """Pydantic AI's external-event wait as a recorded ask step and a park on a signal."""

    def __init__(self, scope: Scope, kind: str) -> None:
        self.scope, self.kind = scope, kind

    async def wait(self, name: str, *, ask: Callable[[str], Awaitable[JsonValue]],
                   timeout: timedelta | None) -> JsonValue:  # noqa: ASYNC109
        ctx = self.scope.ctx
        n = self.scope.waits.get(name, 0) + 1
        self.scope.waits[name] = n
        token = f"{ctx.run_id}:{name}" if n == 1 else f"{ctx.run_id}:{name}#{n}"
        answer = await ctx.step(f"ask:{name}", ask, token, repeat=True)
        if answer is not None:
            return answer  # type: ignore[no-any-return]
        try:
            payload = await ctx.wait_signal(self.kind, token, timeout=timeout)
        except WaitTimeout:
            raise ExternalEventError(f"no signal ({self.kind!r}, {token!r}) within {timeout}"
                                     ) from None
        if isinstance(payload, dict) and set(payload) == {"error"}:
            raise ExternalEventError(str(payload["error"]))
        return payload  # type: ignore[no-any-return]


def decision(requests: DeferredToolRequests, payload: Any) -> DeferredToolResults:
    """The :class:`DeferredToolResults` an approval signal's payload says.

    ``true`` / ``false``: approve / deny every pending approval;
    ``{"approved": bool, "message": str}``: the same, with the denial's message;
    otherwise the JSON form of ``DeferredToolResults``
    (``{"approvals": {call_id: true | false | {"kind": "tool-denied", "message": ...}},
    "calls": {call_id: result}}``). Anything else: ``UserError``.
    """
    if isinstance(payload, bool):
        payload = {"approved": payload}
    if isinstance(payload, dict) and "approved" in payload and set(payload) <= {
            "approved", "message"}:
        if payload["approved"] is True:
            return requests.build_results(approve_all=True)
        message = str(payload.get("message") or "The tool call was denied.")
        return requests.build_results(
            approvals={c.tool_call_id: ToolDenied(message) for c in requests.approvals})
    try:
        results = _RESULTS.validate_python(payload)
        return requests.build_results(approvals=results.approvals, calls=results.calls,
                                      metadata=results.metadata, answered_by=results.answered_by)
    except ValueError as exc:
        raise UserError(f"the approval payload is not a decision for the pending calls: {exc}"
                        ) from exc


def _text_of(event: AgentStreamEvent) -> str | None:
    """The text an event streams (``""`` for a text part's end: its text went already),
    or None for an event that is not the model's text."""
    if isinstance(event, PartStartEvent | PartEndEvent) and isinstance(event.part, TextPart):
        return event.part.content if isinstance(event, PartStartEvent) else ""
    if isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        return event.delta.content_delta
    return None


def _call_json(call: ToolCallPart) -> dict[str, Any]:
    return {"tool_name": call.tool_name, "tool_call_id": call.tool_call_id,
            "args": call.args_as_dict()}


@dataclass(init=False, kw_only=True)
class PgDurability(BaseDurabilityCapability[AgentDepsT]):
    """Make an agent durable on pgdurable: its runs survive crashes and deploys.

    ::

        agent = Agent("openai:gpt-5", name="planner", tools=[search, charge_card],
                      capabilities=[PgDurability(app)])
        run_id = await start_agent(app, agent, "Plan a trip to Lisbon", metadata={"user": "u-7"})

    Attaching it registers the pgdurable workflow ``pydantic_ai.<agent name>``
    (revision ``revision``) on ``app``: import the module defining the agent in
    your worker (``python -m pgdurable.worker mymodule:app``) and every worker
    runs it. Inside such a run every model request and tool call (function, MCP,
    dynamic) is a recorded step; outside one (a plain ``agent.run``) the
    capability changes nothing.

    ``models``: extra models by id, for per-run ``model=`` selection (model names
    need no registering: they cross as strings). ``model_policy`` /
    ``tool_policy``: the :class:`~pgdurable.StepPolicy` of model and tool steps
    (a tool's metadata ``{"pgdurable": {...}}`` overrides fields). ``stream``:
    send the agent's events to the run's output stream (``app.stream(run_id)``).
    ``approvals``: park deferred tool calls (``requires_approval=True``,
    ``ApprovalRequired``, ``CallDeferred``) until an approval signal (``False``:
    leave them to other capabilities or the run's ``DeferredToolRequests``
    output). ``approval_timeout``: deny what is still pending after it.
    ``revision`` / ``max_attempts`` / ``name``: the workflow's (``name``
    defaults to the agent's name, which the agent must then have).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="pgdurable",
        durable_unit_noun="step",
        durable_unit_plural="steps",
        durable_container_noun="run",
        codec=JSON_CODEC,
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={"function": "enter-always", "mcp": "enter-in-durable-unit",
                            "dynamic": "enter-never"},
        journal_discovery=True,
        sequential_tools_in_durable_context=True,
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        tool_config_key="pgdurable",
    )

    def __init__(
        self,
        app: Durable,
        *,
        name: str | None = None,
        revision: str = "1",
        max_attempts: int = 3,
        models: Mapping[str, Model] | None = None,
        model_policy: StepPolicy | None = None,
        tool_policy: StepPolicy | None = None,
        stream: bool = True,
        approvals: bool = True,
        approval_timeout: timedelta | None = None,
        reserve: Mapping[str, float] | None = None,
    ) -> None:
        for what, policy in (("model_policy", model_policy), ("tool_policy", tool_policy)):
            if policy is not None and not isinstance(policy, StepPolicy):
                raise TypeError(f"{what} must be a StepPolicy")
        if approval_timeout is not None and (not isinstance(approval_timeout, timedelta)
                                             or approval_timeout <= timedelta(0)):
            raise ValueError("approval_timeout must be a positive timedelta")
        super().__init__(models=models, name=name,
                         event_stream_handler=self._emit_stream if stream else None)
        self.app = app
        self.revision = revision
        self.max_attempts = max_attempts
        self._model_policy = model_policy or StepPolicy()
        self._tool_policy = tool_policy or StepPolicy()
        self._approvals = approvals
        self._approval_timeout = approval_timeout
        if reserve is not None:
            amounts_json(reserve, "PgDurability(reserve=...)", empty=False)  # InvalidInput
        #: Reserved before each model request from the run's budgets, settled from
        #: its usage (docs/budgets.md); None: no budget is charged.
        self.reserve = None if reserve is None else dict(reserve)

    # -- binding -------------------------------------------------------------

    @property
    def task_name(self) -> str:
        """The pgdurable workflow that runs this agent: ``pydantic_ai.<name>``."""
        return f"pydantic_ai.{self.name}"

    def _bind_to_agent(self, agent: Any) -> None:
        super()._bind_to_agent(agent)  # wrap and index the agent's leaf toolsets
        register(self, agent)

    # -- the engine ----------------------------------------------------------

    @property
    def in_durable_context(self) -> bool:
        scope = SCOPE.get()
        return scope is not None and scope.agent_name == self.name and not in_durable_unit()

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        def tool_config(operation_id: DurableOperationId, tool: object | None,
                        tool_name: str) -> StepPolicy | Literal[False]:
            kind: ToolsetKind = getattr(operation_id, "toolset_kind", "function")
            config = self._build_resolve_tool_config(self._toolset_base_config(kind))(
                tool, tool_name)  # type: ignore[arg-type]
            return False if config is False else _policy(config, self._tool_policy, tool_name)

        return _Backend(agent_name=self.name, reserve=self.reserve, config=RoleBasedOperationConfig(
            model=self._model_policy, event=self._tool_policy, capability=self._tool_policy,
            tool=self._tool_policy, resolve_tool=tool_config))

    def _toolset_base_config(self, kind: ToolsetKind) -> Any:
        return {}

    def get_default_run_id(self) -> str | None:
        scope = SCOPE.get()
        return scope.ctx.run_id if scope is not None and self.in_durable_context else None

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def wrap_run(self, ctx: RunContext[AgentDepsT], *,
                       handler: WrapRunHandler) -> AgentRunResult[Any]:
        scope = SCOPE.get()
        if scope is None or not self.in_durable_context:
            return await handler()
        with external_event_scope(_Waiter(scope, APPROVAL_KIND)):
            return await super().wrap_run(ctx, handler=handler)

    async def wrap_tool_execute(self, ctx: RunContext[AgentDepsT], *, call: ToolCallPart,
                                tool_def: ToolDefinition, args: dict[str, Any],
                                handler: Callable[[dict[str, Any]], Awaitable[Any]]) -> Any:
        scope = SCOPE.get()
        if scope is None or not self.in_durable_context:
            return await handler(args)
        scope.call = (call.tool_name, args)  # for a reconcile (tools run one at a time)
        try:
            return await handler(args)
        finally:
            scope.call = None

    # -- waits: deferred tool calls park the run -------------------------------

    async def handle_deferred_tool_calls(self, ctx: RunContext[AgentDepsT], *,
                                         requests: DeferredToolRequests,
                                         ) -> DeferredToolResults | None:
        scope = SCOPE.get()
        if not self._approvals or scope is None or not self.in_durable_context:
            return None

        async def ask(token: str) -> None:
            # recorded with the ask step: a replay does not announce it again
            await scope.ctx.emit({
                "type": "approval_requested", "signal": [APPROVAL_KIND, token],
                "approvals": [_call_json(c) for c in requests.approvals],
                "calls": [_call_json(c) for c in requests.calls]})

        try:
            payload = await wait_for_external_event("approval", ask=ask,
                                                    timeout=self._approval_timeout)
        except ExternalEventError as exc:
            message = f"No decision on this tool call arrived: {exc}"
            return requests.build_results(
                approvals={c.tool_call_id: ToolDenied(message) for c in requests.approvals},
                calls={c.tool_call_id: ToolFailed(message) for c in requests.calls})
        return decision(requests, payload)

    # -- the event stream ----------------------------------------------------

    async def _emit_stream(self, ctx: RunContext[AgentDepsT],
                           stream: AsyncIterable[AgentStreamEvent]) -> None:
        """The event handler inside a model unit: the model's text to ``emit_text``,
        its other events to ``emit``."""
        scope = SCOPE.get()
        # this handler belongs to the unbound capability: the run context says whose run it is
        # (a sub-agent run inside a tool is not this run)
        mine = scope is not None and in_durable_unit() and ctx.agent is scope.agent
        async for event in stream:
            if not mine:
                continue
            assert scope is not None
            text = _text_of(event)
            if text is None:
                await scope.ctx.emit(event_json(event))
            elif text:
                await scope.ctx.run.emit_text(text)

    async def _dispatch_event_stream_event(self, ctx: RunContext[AgentDepsT],
                                           event: AgentStreamEvent) -> None:
        """A workflow-side event (a tool call, its result): emitted once, not replayed."""
        scope = SCOPE.get()
        if scope is not None:
            await scope.ctx.emit(event_json(event))
