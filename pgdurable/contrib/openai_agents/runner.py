"""Durable OpenAI Agents SDK runs: model and tool calls recorded as pgdurable effects.

::

    register_agent(app, agent, name="support")            # on every worker and client
    run_id = await run_agent(app, "support", "Where is my order?", session_id="user-7")

A run is one pgdurable step that runs ``Runner.run`` on a copy of the agent
whose model and function tools are wrapped:

* **model calls** -- the n-th call of the run is the effect ``model:<n>``: its
  response (output items, usage, response id) is recorded once the model
  answers; a replay after a crash returns the recorded response instead of
  paying for the call again (the agents of ``handoffs`` are wrapped too);
* **tool calls** -- each function tool call is the effect
  ``tool:<name>:<call_id>``; its recorded output is returned on replay, so a
  side effect whose result was recorded never runs again (a call that crashed
  before its result was recorded runs again: make such tools idempotent, or
  reconcile, as for any pgdurable effect);
* **the session** -- the history is read once (effect ``session:history``),
  the run's new items are appended to the :class:`PgDurableSession` once
  (idempotent per run), so the conversation continues in the same session.

A crashed worker's run is claimed by another worker, which replays the
recorded calls and continues with the first unrecorded one. Results and tool
outputs are stored as JSON (values JSON cannot hold are stored as ``str``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from agents import Agent, FunctionTool, RunConfig, Runner
from agents.items import ModelResponse, TResponseOutputItem
from agents.models.interface import Model
from agents.usage import Usage
from pydantic import TypeAdapter

from ...runs.steps import Done, RunContext
from .session import PgDurableSession

if TYPE_CHECKING:
    from ...app.durable import Durable

__all__ = ["register_agent", "run_agent"]

_OUTPUT: TypeAdapter[Any] = TypeAdapter(list[TResponseOutputItem])


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def dump_response(response: ModelResponse) -> dict[str, Any]:
    """A model response as JSON (what the effect records)."""
    u = response.usage
    return {
        "output": [item.model_dump(mode="json", exclude_none=True) for item in response.output],
        "usage": {"requests": u.requests, "input_tokens": u.input_tokens,
                  "output_tokens": u.output_tokens, "total_tokens": u.total_tokens},
        "response_id": response.response_id,
    }


def load_response(data: dict[str, Any]) -> ModelResponse:
    """The response recorded by :func:`dump_response`."""
    return ModelResponse(output=_OUTPUT.validate_python(data["output"]),
                         usage=Usage(**data["usage"]), response_id=data.get("response_id"))


class _Recorder:
    """Numbers the model calls of one attempt (replays take the same numbers)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.calls = 0


class RecordedModel(Model):
    """A model whose every ``get_response`` is a pgdurable effect of the run."""

    def __init__(self, inner: Model, recorder: _Recorder) -> None:
        self.inner, self.recorder = inner, recorder

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.recorder.calls += 1

        async def call() -> dict[str, Any]:
            return dump_response(await self.inner.get_response(*args, **kwargs))

        data = await self.recorder.ctx.effect(f"model:{self.recorder.calls}", call)
        return load_response(data)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("durable agent runs do not stream: use Runner.run")


def _tool(tool: Any, recorder: _Recorder) -> Any:
    if not isinstance(tool, FunctionTool):
        return tool
    invoke = tool.on_invoke_tool

    async def durable_invoke(tool_ctx: Any, arguments: str) -> Any:
        async def call() -> Any:
            return _jsonable(await invoke(tool_ctx, arguments))

        return await recorder.ctx.effect(f"tool:{tool.name}:{tool_ctx.tool_call_id}", call)

    wrapped = copy.copy(tool)
    wrapped.on_invoke_tool = durable_invoke
    return wrapped


def _model_of(agent: Agent[Any], default: Model | None) -> Model:
    if isinstance(agent.model, Model):
        return agent.model
    if default is not None:
        return default
    from agents.models.multi_provider import MultiProvider

    return MultiProvider().get_model(agent.model)


def durable_agent(agent: Agent[Any], recorder: _Recorder, default: Model | None,
                  seen: dict[int, Agent[Any]] | None = None) -> Agent[Any]:
    """A copy of ``agent`` (and of its handoff agents) with recorded model and tools."""
    seen = {} if seen is None else seen
    if id(agent) in seen:
        return seen[id(agent)]
    clone = dataclasses.replace(agent)
    seen[id(agent)] = clone
    clone.model = RecordedModel(_model_of(agent, default), recorder)
    clone.tools = [_tool(t, recorder) for t in agent.tools]
    clone.handoffs = [durable_agent(h, recorder, default, seen) if isinstance(h, Agent) else h
                      for h in agent.handoffs]
    return clone


def register_agent(app: Durable, agent: Agent[Any], *, name: str = "agent",
                   model: Model | None = None, run_config: RunConfig | None = None,
                   max_turns: int = 10, revision: str = "1", max_attempts: int = 3) -> str:
    """Register durable runs of ``agent`` as the pgdurable task ``name``; returns it.

    ``model`` is used when ``agent.model`` is not a :class:`~agents.Model`
    instance (else the SDK's default provider resolves ``agent.model``).
    """
    if not isinstance(agent, Agent):
        raise TypeError("register_agent needs an agents.Agent")
    config = run_config or RunConfig()

    async def step(ctx: RunContext, state: dict[str, Any]) -> Done:
        session = PgDurableSession(state["session_id"], app.pool)

        async def read_history() -> list[Any]:
            return await session.get_items()

        history: list[Any] = await ctx.effect("session:history", read_history)
        recorder = _Recorder(ctx)
        result = await Runner.run(
            durable_agent(agent, recorder, model),
            [*history, {"role": "user", "content": state["input"]}],
            run_config=config, max_turns=max_turns)
        new_items = result.to_input_list()[len(history):]
        await session.add_items(_jsonable(new_items), key=f"pgdurable-run:{ctx.run_id}")
        return Done(result={"final_output": _jsonable(result.final_output),
                            "model_calls": recorder.calls})

    app.task(name, revision=revision, max_attempts=max_attempts)(step)
    return name


async def run_agent(app: Durable, name: str, input: str, *, session_id: str,
                    idempotency_key: str | None = None, queue: str = "default") -> str:
    """Start a durable run of the agent registered as ``name`` on ``session_id``,
    with the user message ``input``; return the run id."""
    if not isinstance(input, str):
        raise TypeError("input must be the user's message (a str)")
    if not isinstance(session_id, str) or not session_id or "\x00" in session_id:
        raise ValueError("session_id must be a non-empty str without NUL")
    return await app.start(name, state={"session_id": session_id, "input": input},
                           idempotency_key=idempotency_key, queue=queue)
