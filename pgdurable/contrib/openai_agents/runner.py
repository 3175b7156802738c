"""Durable OpenAI Agents SDK runs: model and tool calls recorded as pgdurable effects.

::

    register_agent(app, agent, name="support")            # on every worker and client
    run_id = await run_agent(app, "support", "Where is my order?", session_id="user-7")

A run is one pgdurable step that runs ``Runner.run`` on a copy of the agent
whose model and function tools are wrapped:

* **model calls** -- the n-th call of the run is the effect ``model:<n>``: its
  response (output items, usage, response id) is recorded once the model
  answers; a replay after a crash returns the recorded response instead of
  paying for the call again (the agents of ``handoffs`` are wrapped too). A
  model that raises (a dropped connection) fails the step's attempt without a
  final outcome: the retry calls it again, as the attempt ``model:<n>#2``
  (:mod:`pgdurable.contrib._attempts`);
* **tool calls** -- each function tool call is the effect
  ``tool:<name>:<call_id>``; its recorded output is returned on replay, so a
  side effect whose result was recorded never runs again. A call that crashed
  before its result was recorded follows the tool's replay policy: ``safe``
  (the default) runs it again; a tool named in ``register_agent(...,
  reconcile={"pay": find_payment})`` gets ``find_payment(**arguments)``
  instead, which returns the tool's real output or :data:`~pgdurable.NOT_PERFORMED`
  (then the tool runs);
* **budgets** (``register_agent(..., reserve={...})``) -- a model call that is
  really made (inside its effect: a recorded call replayed is not charged again)
  reserves ``reserve`` from the run's budgets as ``model:<n>`` before it calls the
  model and settles the ``usage`` of the ``ModelResponse`` (of the stream's
  ``response.completed``) when it answers; a budget that cannot give the amount
  parks the run or fails it with :class:`~pgdurable.BudgetExceeded` (its policy),
  before the model is called (see :mod:`pgdurable.contrib._budget`);
* **the session** -- the history is read once (effect ``session:history``),
  the run's new items are appended to the :class:`PgDurableSession` once
  (idempotent per run), so the conversation continues in the same session;
* **approvals** -- a tool with ``needs_approval`` interrupts the SDK's run: the
  :class:`~agents.RunState` (``result.to_state().to_string()``) is checkpointed and
  the run parks on the signal ``("approval", "<run id>:<n>")`` holding no worker.
  The signal's payload is the decision (see :func:`apply_decision`); the next step,
  on any worker, rebuilds the state with ``RunState.from_string``, approves or
  rejects the pending calls and runs on from there;
* **streaming** (``register_agent(..., stream=True)``) -- the run uses
  ``Runner.run_streamed``: the model's text deltas (``response.output_text.delta``)
  go to ``ctx.emit_text`` (buffered: a few ``{"type": "text"}`` rows, not one per
  token) and every other stream event to ``ctx.emit`` (:func:`event_json`). A
  model call's raw events are recorded with its response and its ``usage``, so
  a replay yields the same events: the events are rewritten in place (same
  ``seq``), the text already stored is skipped, never duplicated.

A crashed worker's run is claimed by another worker, which replays the
recorded calls and continues with the first unrecorded one. Results and tool
outputs are stored as JSON (values JSON cannot hold are stored as ``str``).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from agents import Agent, FunctionTool, RunConfig, Runner, RunState
from agents.items import ModelResponse, ToolApprovalItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.stream_events import StreamEvent
from agents.usage import Usage
from openai.types.responses import ResponseTextDeltaEvent
from pydantic import BaseModel, TypeAdapter

from ...foundation.effects import NOT_PERFORMED
from ...runs.budgets import write_settlements
from ...runs.steps import Done, RunContext, Wait
from .._attempts import attempted_effect, check_reconcile, reconcile_call
from .._budget import check_reserve, usage_amounts
from .session import PgDurableSession

if TYPE_CHECKING:
    from ...app.durable import Durable

__all__ = ["APPROVAL_KIND", "apply_decision", "event_json", "register_agent", "run_agent"]

#: The signal kind a run waiting for approvals parks on.
APPROVAL_KIND = "approval"

_OUTPUT: TypeAdapter[Any] = TypeAdapter(list[TResponseOutputItem])
_EVENT: TypeAdapter[Any] = TypeAdapter(TResponseStreamEvent)
_DONE = object()


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _usage(u: Usage) -> dict[str, int]:
    return {"requests": u.requests, "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens, "total_tokens": u.total_tokens}


def dump_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as JSON (what the effect records)."""
    return {
        "output": [item.model_dump(mode="json", exclude_none=True) for item in response.output],
        "usage": _usage(response.usage),
        "response_id": response.response_id,
    }


def stream_usage(events: list[Any]) -> dict[str, int] | None:
    """The usage of a streamed model call (from its ``response.completed`` event, as
    the SDK reads it), in :func:`dump_response`'s shape; None without one."""
    for event in reversed(events):
        if getattr(event, "type", None) == "response.completed":
            u = getattr(event.response, "usage", None)
            if u is None:
                return None
            return _usage(Usage(requests=1, input_tokens=u.input_tokens,
                                output_tokens=u.output_tokens, total_tokens=u.total_tokens))
    return None


def load_response(data: dict[str, Any]) -> ModelResponse:
    """The response recorded by :func:`dump_response`."""
    return ModelResponse(output=_OUTPUT.validate_python(data["output"]),
                         usage=Usage(**data["usage"]), response_id=data.get("response_id"))


class _Recorder:
    """Numbers the model calls of the run (replays take the same numbers); ``calls``
    starts where the run's earlier steps (before a park) left it. With ``reserve``,
    a model call that is really made is charged to the run's budgets."""

    def __init__(self, ctx: RunContext, calls: int = 0,
                 reserve: Mapping[str, float] | None = None) -> None:
        self.ctx = ctx
        self.calls = calls
        self.reserve = reserve

    async def charged(self, n: int, model: str | None,
                      call: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """``call()`` (a model call recorded as the effect ``model:<n>``: this runs only
        when the effect is not recorded yet) inside the reservation ``model:<n>`` of
        the run's budgets, settled from the ``usage`` it returns (usd priced under
        ``model``). A budget that cannot give the reservation parks the run or fails
        it (its policy) before the model is called."""
        reserve = self.reserve
        if reserve is None:
            return await call()
        async with self.ctx.reserve(key=f"model:{n}", **reserve) as r:
            data = await call()
            usage = data.get("usage")
            spent = usage_amounts(usage.get("input_tokens"), usage.get("output_tokens"),
                                  reserve, measured=True) if isinstance(usage, dict) \
                else usage_amounts(0, 0, reserve, measured=False)
            r.settle(model=model if "usd" in reserve else None, **spent)
        # written now, before the effect records the answer (not with the step's
        # checkpoint): a crash after the record must not lose the charge
        await write_settlements(self.ctx)
        return data


class RecordedModel(Model):
    """A model whose every ``get_response`` is a pgdurable effect of the run (and,
    with ``register_agent(..., reserve=...)``, a reservation of the run's budgets
    settled from its usage; ``name``: the model's name in the price table)."""

    def __init__(self, inner: Model, recorder: _Recorder, name: str | None = None) -> None:
        self.inner, self.recorder, self.name = inner, recorder, name

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.recorder.calls += 1
        n = self.recorder.calls

        async def request() -> dict[str, Any]:
            return dump_response(await self.inner.get_response(*args, **kwargs))

        async def call() -> dict[str, Any]:
            return await self.recorder.charged(n, self.name, request)

        data = await attempted_effect(self.recorder.ctx, f"model:{n}", call)
        return load_response(data)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The model's stream events, live, recorded as the effect ``model:<n>`` (the
        events and the call's ``usage``) once the stream ended: a replay yields the
        recorded events (the same ones) without calling."""
        self.recorder.calls += 1
        n = self.recorder.calls
        live: asyncio.Queue[Any] = asyncio.Queue()
        ran = False

        async def request() -> dict[str, Any]:
            nonlocal ran
            ran = True
            events = []
            async for event in self.inner.stream_response(*args, **kwargs):
                events.append(event)
                live.put_nowait(event)
            return {"events": [e.model_dump(mode="json", exclude_none=True) for e in events],
                    "usage": stream_usage(events)}

        async def call() -> dict[str, Any]:
            return await self.recorder.charged(n, self.name, request)

        effect = asyncio.ensure_future(attempted_effect(self.recorder.ctx, f"model:{n}", call))
        effect.add_done_callback(lambda _: live.put_nowait(_DONE))
        try:
            while (event := await live.get()) is not _DONE:
                yield event
            data = effect.result()  # the recorded events, or the error
        finally:
            if not effect.done():
                effect.cancel()
        if not ran:  # recorded by an earlier attempt: the same events again
            for raw in data["events"]:
                yield _EVENT.validate_python(raw)


def _tool(tool: Any, recorder: _Recorder, reconcile: dict[str, Any]) -> Any:
    if not isinstance(tool, FunctionTool):
        return tool
    invoke = tool.on_invoke_tool
    find = reconcile.get(tool.name)

    async def durable_invoke(tool_ctx: Any, arguments: str) -> Any:
        async def call() -> Any:
            return _jsonable(await invoke(tool_ctx, arguments))

        async def reconciled() -> Any:
            assert find is not None
            args = json.loads(arguments) if arguments else {}
            value = await reconcile_call(find, args)
            return value if value is NOT_PERFORMED else _jsonable(value)

        return await attempted_effect(recorder.ctx, f"tool:{tool.name}:{tool_ctx.tool_call_id}",
                                      call, None if find is None else reconciled)

    wrapped = copy.copy(tool)
    wrapped.on_invoke_tool = durable_invoke
    return wrapped


def _price_name(agent: Agent[Any], model: Model) -> str:
    """The name of an agent's model in the price table: ``agent.model`` when it is a
    name, else the Model's ``model`` attribute (the SDK's OpenAI models), else its
    class name."""
    if isinstance(agent.model, str) and agent.model:
        return agent.model
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


def _model_of(agent: Agent[Any], default: Model | None) -> Model:
    if isinstance(agent.model, Model):
        return agent.model
    if default is not None:
        return default
    from agents.models.multi_provider import MultiProvider

    return MultiProvider().get_model(agent.model)


def durable_agent(agent: Agent[Any], recorder: _Recorder, default: Model | None,
                  seen: dict[int, Agent[Any]] | None = None,
                  reconcile: dict[str, Any] | None = None) -> Agent[Any]:
    """A copy of ``agent`` (and of its handoff agents) with recorded model and tools
    (``reconcile``: tool name -> its reconcile function)."""
    seen = {} if seen is None else seen
    reconcile = reconcile or {}
    if id(agent) in seen:
        return seen[id(agent)]
    clone = dataclasses.replace(agent)
    seen[id(agent)] = clone
    inner = _model_of(agent, default)
    clone.model = RecordedModel(inner, recorder, _price_name(agent, inner))
    clone.tools = [_tool(t, recorder, reconcile) for t in agent.tools]
    clone.handoffs = [durable_agent(h, recorder, default, seen, reconcile)
                      if isinstance(h, Agent) else h for h in agent.handoffs]
    return clone


def _tool_names(agent: Agent[Any], seen: set[int] | None = None) -> set[str]:
    """The function tools of ``agent`` and of its handoff agents."""
    seen = set() if seen is None else seen
    if id(agent) in seen:
        return set()
    seen.add(id(agent))
    names = {t.name for t in agent.tools if isinstance(t, FunctionTool)}
    for h in agent.handoffs:
        if isinstance(h, Agent):
            names |= _tool_names(h, seen)
    return names


def event_json(event: StreamEvent) -> dict[str, Any]:
    """A ``Runner.run_streamed`` event as the JSON the run's output stream holds:
    ``{"type": "raw_response_event", "data": <the Responses API event>}``,
    ``{"type": "run_item_stream_event", "name", "item_type", "item": <its raw item>}``
    or ``{"type": "agent_updated_stream_event", "agent": <name>}``."""
    if event.type == "raw_response_event":
        return {"type": event.type, "data": event.data.model_dump(mode="json", exclude_none=True)}
    if event.type == "run_item_stream_event":
        raw = event.item.raw_item
        item = raw.model_dump(mode="json", exclude_none=True) if isinstance(raw, BaseModel) \
            else _jsonable(raw)
        return {"type": event.type, "name": event.name, "item_type": event.item.type,
                "item": item}
    return {"type": event.type, "agent": event.new_agent.name}


def _pending(item: ToolApprovalItem) -> dict[str, Any]:
    raw = item.raw_item
    get = raw.get if isinstance(raw, dict) else lambda k, d=None: getattr(raw, k, d)
    return {"call_id": get("call_id"), "tool_name": item.tool_name,
            "arguments": get("arguments")}


def apply_decision(state: RunState[Any, Any], payload: Any) -> int:
    """Approve or reject the pending tool calls of ``state`` as an approval signal's
    payload says; return how many were decided (the others stay pending).

    ``true`` / ``false``: every pending call; ``{"approved": bool, "message": str}``:
    the same, ``message`` being what the model is told of a rejection;
    ``{call_id: bool | {"approved": bool, "message": str}}``: call by call.
    Anything else: ``ValueError``.
    """
    items = state.get_interruptions()
    if isinstance(payload, bool) or (isinstance(payload, dict) and "approved" in payload
                                     and set(payload) <= {"approved", "message"}):
        decisions: dict[str, Any] = {str(_pending(i)["call_id"]): payload for i in items}
    elif isinstance(payload, dict):
        decisions = payload
    else:
        raise ValueError(f"an approval payload must be a bool or an object, not {payload!r}")
    done = 0
    for item in items:
        d = decisions.get(str(_pending(item)["call_id"]))
        if d is None:
            continue
        approved, message = (d, None) if isinstance(d, bool) else (
            d.get("approved"), d.get("message")) if isinstance(d, dict) else (None, None)
        if not isinstance(approved, bool):
            raise ValueError(f"a decision must be a bool or {{'approved': bool}}, not {d!r}")
        if approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=message)
        done += 1
    return done


def register_agent(app: Durable, agent: Agent[Any], *, name: str = "agent",
                   model: Model | None = None, run_config: RunConfig | None = None,
                   max_turns: int = 10, revision: str = "1", max_attempts: int = 3,
                   stream: bool = False,
                   reconcile: Mapping[str, Callable[..., Any]] | None = None,
                   reserve: Mapping[str, float] | None = None) -> str:
    """Register durable runs of ``agent`` as the pgdurable task ``name``; returns it.

    ``model`` is used when ``agent.model`` is not a :class:`~agents.Model`
    instance (else the SDK's default provider resolves ``agent.model``).
    ``stream``: run with ``Runner.run_streamed`` and send its events to the run's
    output stream (text deltas through ``ctx.emit_text``). A tool with
    ``needs_approval`` parks the run until an approval signal (see the module
    docstring). ``reconcile``: tool name -> ``fn(**arguments)``, the tool's replay
    policy ``reconcile`` (a call found started and unfinished after a crash asks
    ``fn`` for its real output, or :data:`~pgdurable.NOT_PERFORMED`, instead of
    running again); a name that is not a function tool of the agent (or of its
    handoff agents): ValueError. ``max_attempts``: attempts of the run's step (a
    model or tool error fails one; the next calls the model again).
    ``reserve``: the amounts (``{"calls": 1, "tokens_in": 8_000, "usd": 0.05}``)
    reserved from the run's budgets before each model call that is really made
    (not a recorded one replayed) and settled from the ``usage`` of its
    ``ModelResponse``; with ``usd``, priced under the model's name
    (``app.set_price``; the name is ``agent.model`` when a str, else the Model's
    ``model`` attribute, else its class name). A unit that is not known, or an
    amount that is negative or not a number: :class:`~pgdurable.InvalidInput`.
    """
    if not isinstance(agent, Agent):
        raise TypeError("register_agent needs an agents.Agent")
    config = run_config or RunConfig()
    reconcilers = check_reconcile(reconcile, _tool_names(agent))
    reserved = check_reserve(reserve, "register_agent")

    async def step(ctx: RunContext, state: dict[str, Any]) -> Done | Wait:
        session = PgDurableSession(state["session_id"], app.pool)

        async def read_history() -> list[Any]:
            return await session.get_items()

        history: list[Any] = await ctx.effect("session:history", read_history)
        recorder = _Recorder(ctx, state.get("model_calls", 0), reserved)
        durable = durable_agent(agent, recorder, model, reconcile=reconcilers)
        start: Any = [*history, {"role": "user", "content": state["input"]}]
        if state.get("run_state") is not None:
            # woken by an approval signal: the SDK's state, with the decisions applied
            start = await RunState.from_string(durable, state["run_state"])
            wake = ctx.wake or {}
            if wake.get("type") == "signal":
                apply_decision(start, wake.get("payload"))
        if stream:
            streamed = Runner.run_streamed(durable, start, run_config=config,
                                           max_turns=max_turns)
            async for event in streamed.stream_events():
                if event.type == "raw_response_event" and isinstance(event.data,
                                                                     ResponseTextDeltaEvent):
                    await ctx.emit_text(event.data.delta)  # buffered: a few rows, not one a token
                else:
                    await ctx.emit(event_json(event))
            result: Any = streamed
        else:
            result = await Runner.run(durable, start, run_config=config, max_turns=max_turns)
        if result.interruptions:
            parks = state.get("parks", 0) + 1
            ref = f"{ctx.run_id}:{parks}"
            pending = [_pending(i) for i in result.interruptions]
            await ctx.emit({"type": "approval_requested", "signal": [APPROVAL_KIND, ref],
                            "approvals": pending})
            return Wait(signal=(APPROVAL_KIND, ref), state={
                **state, "run_state": result.to_state().to_string(),
                "model_calls": recorder.calls, "parks": parks, "pending": pending})
        new_items = result.to_input_list()[len(history):]
        await session.add_items(_jsonable(new_items), key=f"pgdurable-run:{ctx.run_id}")
        return Done(result={"final_output": _jsonable(result.final_output),
                            "model_calls": recorder.calls})

    app.task(name, revision=revision, max_attempts=max_attempts)(step)
    return name


async def run_agent(app: Durable, name: str, input: str, *, session_id: str,
                    idempotency_key: str | None = None, queue: str = "default",
                    budgets: Iterable[str] | None = None,
                    budget: Mapping[str, float] | None = None) -> str:
    """Start a durable run of the agent registered as ``name`` on ``session_id``,
    with the user message ``input``; return the run id. ``budgets`` (named budgets'
    keys) and ``budget`` (the run's own limits, ``{"usd": 2}``) as for
    :meth:`Durable.start`: what ``register_agent(..., reserve=...)`` draws from."""
    if not isinstance(input, str):
        raise TypeError("input must be the user's message (a str)")
    if not isinstance(session_id, str) or not session_id or "\x00" in session_id:
        raise ValueError("session_id must be a non-empty str without NUL")
    return await app.start(name, state={"session_id": session_id, "input": input},
                           idempotency_key=idempotency_key, queue=queue, budgets=budgets,
                           budget=budget)
