"""A Google ADK ``Runner`` plugin that records model and tool calls as pgdurable effects.

:class:`PgDurablePlugin` is an ADK :class:`~google.adk.plugins.BasePlugin` bound to
the pgdurable step that runs the agent (:mod:`.runs`):

* ``before_model_callback`` makes the model call itself, as the effect
  ``model:<n>`` (the n-th model call of the run): the agent's
  ``canonical_model`` answers (``generate_content_async``, not streamed) and its
  :class:`~google.adk.models.llm_response.LlmResponse` (with ``usage_metadata``)
  is recorded once it answered; the plugin returns it, which tells ADK to skip
  its own call. A replay after a crash returns the recorded response without
  calling the model;
* ``before_tool_callback`` runs the tool itself, as the effect
  ``tool:<n>:<name>``, and returns its result (ADK then skips its own call); what
  the tool did to its ``ToolContext.actions`` (state deltas, a confirmation it
  requested) is recorded with the result and restored on replay. A tool that
  needs a confirmation it does not have yet is left to ADK (its confirmation gate
  runs after plugins): ADK asks for the confirmation, and the run parks.

A tool killed mid-call, before its result was recorded, runs again (ADK tools get
replay policy ``safe``: make side effects idempotent, e.g. keyed by the run id).
"""

from __future__ import annotations

import json
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.events.event_actions import EventActions
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext

from ...runs.steps import RunContext

__all__ = ["PgDurablePlugin"]


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class PgDurablePlugin(BasePlugin):
    """Model and tool calls of one pgdurable run as recorded effects (module docstring).

    Made by the run's step for each attempt (:func:`.runs.register_agent`); the
    counters number the calls in the order ADK makes them, which a replay repeats.
    """

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(name="pgdurable")
        self.ctx = ctx
        self.model_calls = 0
        self.tool_calls = 0
        self._agents: dict[str, BaseAgent] = {}

    async def before_agent_callback(self, *, agent: BaseAgent,
                                    callback_context: CallbackContext) -> None:
        self._agents[agent.name] = agent  # whose model the next model call is
        return None

    async def before_model_callback(self, *, callback_context: CallbackContext,
                                    llm_request: LlmRequest) -> LlmResponse | None:
        agent = self._agents.get(callback_context.agent_name)
        model = getattr(agent, "canonical_model", None)
        if model is None:  # pragma: no cover - an agent without a model makes no call
            return None
        self.model_calls += 1

        async def call() -> dict[str, Any]:
            last: LlmResponse | None = None
            async for response in model.generate_content_async(llm_request, stream=False):
                last = response
            if last is None:
                raise RuntimeError(f"model {model.model!r} returned no response")
            return last.model_dump(mode="json", exclude_none=True)

        data = await self.ctx.effect(f"model:{self.model_calls}", call)
        return LlmResponse.model_validate(data)

    async def before_tool_callback(self, *, tool: BaseTool, tool_args: dict[str, Any],
                                   tool_context: ToolContext) -> dict[str, Any] | None:
        confirmation = tool_context.tool_confirmation
        if confirmation is None and await tool.check_require_confirmation(tool_args,
                                                                          tool_context):
            return None  # ADK's gate asks for a confirmation: the run parks on it
        if confirmation is not None and not confirmation.confirmed:
            return None  # rejected: ADK's gate answers the model
        self.tool_calls += 1

        async def call() -> dict[str, Any]:
            result = await tool.run_async(args=tool_args, tool_context=tool_context)
            actions = tool_context.actions.model_dump(mode="json", exclude_defaults=True)
            return {"result": _jsonable(result), "actions": actions}

        data = await self.ctx.effect(f"tool:{self.tool_calls}:{tool.name}", call)
        recorded = EventActions.model_validate(data.get("actions") or {})
        for field in (data.get("actions") or {}):
            setattr(tool_context.actions, field, getattr(recorded, field))
        result = data["result"]
        return result if isinstance(result, dict) else {"result": result}
