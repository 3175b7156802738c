"""A Google ADK ``Runner`` plugin that records model and tool calls as pgdurable effects.

:class:`PgDurablePlugin` is an ADK :class:`~google.adk.plugins.BasePlugin` bound to
the pgdurable step that runs the agent (:mod:`.runs`):

* ``before_model_callback`` makes the model call itself, as the effect
  ``model:<n>`` (the n-th model call of the run): inside the effect the agent's
  own ``before_model_callback`` s run first (one that answers is the call's
  answer), then the agent's ``canonical_model`` answers
  (``generate_content_async``, not streamed), then the agent's
  ``after_model_callback`` s (one that answers replaces the response); the
  :class:`~google.adk.models.llm_response.LlmResponse` (with ``usage_metadata``)
  is recorded and returned, which tells ADK to skip its own call and its model
  callbacks (they ran). A replay after a crash returns the recorded response
  without calling the model or the callbacks. Other plugins'
  ``after_model_callback`` and the ``on_model_error_callback`` s do not run. A model that
  raises fails the step's attempt without a final outcome: the retry calls it
  again (the attempt ``model:<n>#2``, :mod:`pgdurable.contrib._attempts`).
* **tool calls** are recorded around ADK's own call: ``before_tool_callback``
  begins the effect ``tool:<name>:<digest of the arguments>`` (``:<k>`` for the
  k-th identical call of the run) and, if the call was recorded, returns its
  result (ADK then skips the tool and the agent's ``before_tool_callback`` s).
  Otherwise it returns ``None``: ADK runs the agent's callbacks, its confirmation
  gate, the tool and, if the tool raises, its ``on_tool_error_callback`` s, as
  without the plugin; ``after_tool_callback`` records what came out (with what
  the call did to its ``ToolContext.actions``). A tool that raised and was not
  answered by an error callback leaves no outcome: the step's retry runs it
  again. ADK runs a response's function calls concurrently, so calls are keyed
  by what they are (name and canonical arguments), not by the order they reach
  the plugin, which a replay need not repeat.
* **replay policy per tool**: a call found started and never finished (its
  worker died) runs again (``safe``), unless ``reconcile`` names the tool: then
  ``reconcile[name](**args)`` says what really happened (the tool's result, or
  :data:`~pgdurable.NOT_PERFORMED`: the tool runs now).

A tool that needs a confirmation it does not have yet is left to ADK (its
confirmation gate runs after plugins): ADK asks for the confirmation, and the run
parks.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.agents.callback_context import CallbackContext
from google.adk.events.event_actions import EventActions
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext

from ...foundation.effects import NOT_PERFORMED
from ...runs.steps import RunContext
from .._attempts import attempted_effect, reconcile_call

__all__ = ["PgDurablePlugin", "tool_key"]


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


async def _called(callback: Callable[..., Any], **kwargs: Any) -> Any:
    """An ADK callback's answer (sync or async callback)."""
    answer = callback(**kwargs)
    return await answer if inspect.isawaitable(answer) else answer


def tool_key(name: str, args: Mapping[str, Any], occurrence: int = 1) -> str:
    """The effect key of a tool call: ``tool:<name>:<16 hex of sha256(canonical args)>``,
    ``:<occurrence>`` appended from the second identical call of the run."""
    canonical = json.dumps(_jsonable(dict(args)), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    return f"tool:{name}:{digest}" + (f":{occurrence}" if occurrence > 1 else "")


class PgDurablePlugin(BasePlugin):
    """Model and tool calls of one pgdurable run as recorded effects (module docstring).

    Made by the run's step for each attempt (:func:`.runs.register_agent`), with
    the run's ``reconcile`` functions (tool name -> callable); :meth:`close` at the
    end of the attempt.
    """

    def __init__(self, ctx: RunContext,
                 reconcile: Mapping[str, Callable[..., Any]] | None = None) -> None:
        super().__init__(name="pgdurable")
        self.ctx = ctx
        self.model_calls = 0
        self.tool_calls = 0
        self._reconcile = dict(reconcile or {})
        self._agents: dict[str, BaseAgent] = {}
        self._seen: dict[str, int] = {}  # a call's key without occurrence -> calls so far
        # a tool call ADK is making (id of its ToolContext) -> its outcome, its effect
        self._open: dict[int, tuple[asyncio.Future[Any], asyncio.Future[Any]]] = {}

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
        before = list(getattr(agent, "canonical_before_model_callbacks", []))
        after = list(getattr(agent, "canonical_after_model_callbacks", []))

        async def call() -> dict[str, Any]:
            # the agent's own callbacks, as ADK runs them (a before that answers skips the
            # model and the afters; the first after that answers replaces the response)
            for callback in before:
                answer = await _called(callback, callback_context=callback_context,
                                       llm_request=llm_request)
                if answer is not None:
                    return answer.model_dump(mode="json", exclude_none=True)  # type: ignore[no-any-return]
            last: LlmResponse | None = None
            async for response in model.generate_content_async(llm_request, stream=False):
                last = response
            if last is None:
                raise RuntimeError(f"model {model.model!r} returned no response")
            for callback in after:
                answer = await _called(callback, callback_context=callback_context,
                                       llm_response=last)
                if answer:
                    last = answer
                    break
            return last.model_dump(mode="json", exclude_none=True)

        data = await attempted_effect(self.ctx, f"model:{self.model_calls}", call)
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
        base = tool_key(tool.name, tool_args)
        self._seen[base] = occurrence = self._seen.get(base, 0) + 1
        key = tool_key(tool.name, tool_args, occurrence)
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        entered = asyncio.Event()

        async def call() -> Any:
            entered.set()  # not recorded: ADK makes the call, after_tool_callback records it
            return await outcome

        find = self._reconcile.get(tool.name)

        async def reconciled() -> Any:
            assert find is not None
            value = await reconcile_call(find, tool_args)
            return value if value is NOT_PERFORMED else {"result": _jsonable(value),
                                                         "actions": {}}

        effect = asyncio.ensure_future(attempted_effect(
            self.ctx, key, call, None if find is None else reconciled))
        begun = asyncio.ensure_future(entered.wait())
        await asyncio.wait({effect, begun}, return_when=asyncio.FIRST_COMPLETED)
        begun.cancel()
        if not entered.is_set():  # recorded (or reconciled): ADK does not call the tool
            data = effect.result()
            recorded = EventActions.model_validate(data.get("actions") or {})
            for field in (data.get("actions") or {}):
                setattr(tool_context.actions, field, getattr(recorded, field))
            result = data["result"]
            return result if isinstance(result, dict) else {"result": result}
        self._open[id(tool_context)] = (outcome, effect)
        return None

    async def after_tool_callback(self, *, tool: BaseTool, tool_args: dict[str, Any],
                                  tool_context: ToolContext,
                                  result: dict[str, Any]) -> dict[str, Any] | None:
        opened = self._open.pop(id(tool_context), None)
        if opened is not None:  # ADK made the call: record what came out before going on
            outcome, effect = opened
            actions = tool_context.actions.model_dump(mode="json", exclude_defaults=True)
            outcome.set_result({"result": _jsonable(result), "actions": actions})
            await effect
        return None

    async def close(self) -> None:
        """End the attempt: a call ADK began and never finished (its tool raised, the
        invocation was cancelled) is left started, without an outcome."""
        opened, self._open = self._open, {}
        for _, effect in opened.values():
            effect.cancel()
        if opened:
            await asyncio.gather(*(e for _, e in opened.values()), return_exceptions=True)
