"""Google ADK agents run by pgdurable worker processes (tests/test_contrib_adk.py), on a
scripted ``BaseLlm`` subclass (no network).

Every real model call and tool call records a row in ``test_ledger`` before it returns
(tests/_agent_ledger.py); a test arms a crash by inserting ``before:pay`` into
``test_kills``.

The scripted model answers from the request: no tool result yet -> call ``search``;
one -> call ``pay`` (the order is the user message's last word); two -> the final
text. ``desk`` pays at once, ``counter``'s ``pay`` needs a confirmation, ``tickets``
opens a ticket with a long-running tool instead of paying, ``till``'s ``pay``
reconciles after a crash, ``flaky``'s model drops its connection on its first call
in a process, ``clerk``'s second tool raises (its ``on_tool_error_callback``
answers), its ``before_model_callback`` counts model calls in the ledger and its
``after_model_callback`` signs the final answer,
``pair`` pays two orders (``a-<order>``, ``b-<order>``) in one response, which ADK
calls concurrently (``Shuffle`` makes the ``a-`` call late on a replay). Crash
points: ``before:pay``, ``after:pay`` (after the side effect), ``after:pay:<order>``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import warnings
from collections.abc import AsyncGenerator
from typing import Any

import psycopg
from _agent_ledger import ledger, maybe_die
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.tools import FunctionTool, LongRunningFunctionTool
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import pgdurable
from pgdurable import NOT_PERFORMED
from pgdurable.contrib.adk import register_agent
from pgdurable.foundation.db import resolve_dsn

warnings.filterwarnings("ignore", category=UserWarning, module="google.adk")
logging.getLogger("opentelemetry.context").setLevel(logging.CRITICAL)


class ScriptedLlm(BaseLlm):
    """Search, then pay (or open a ticket), then answer with what the tools said."""

    model: str = "scripted"
    second: str = "pay"
    flaky: bool = False
    pair: bool = False

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        parts = [p for c in llm_request.contents for p in (c.parts or [])]
        order = next(p.text for p in parts if p.text).split()[-1]
        if self.flaky and order not in _FLAKED:
            _FLAKED.add(order)
            ledger("flake", order)
            raise ConnectionError("connection reset by peer")
        results = [p.function_response for p in parts if p.function_response
                   and p.function_response.name != "adk_request_confirmation"]
        ledger("model", f"{order}:{len(results)}")
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=11, candidates_token_count=4, total_token_count=15)
        if self.pair:  # two payments in one response, then the answer
            if results:
                said = "; ".join(str((r.response or {}).get("result")) for r in results)
                yield LlmResponse(content=types.Content(role="model", parts=[
                    types.Part(text=f"done: {said}")]), usage_metadata=usage)
                return
            yield LlmResponse(content=types.Content(role="model", parts=[
                types.Part(function_call=types.FunctionCall(name="pay", args={"order": o}))
                for o in (f"a-{order}", f"b-{order}")]), usage_metadata=usage)
            return
        if not results:
            call = types.FunctionCall(name="search", args={"q": order})
        elif len(results) == 1:
            call = types.FunctionCall(name=self.second, args={"order": order})
        else:
            said = "; ".join(str((r.response or {}).get("result", r.response)) for r in results)
            yield LlmResponse(content=types.Content(role="model", parts=[
                types.Part(text=f"done: {said}")]), usage_metadata=usage)
            return
        yield LlmResponse(content=types.Content(role="model", parts=[
            types.Part(function_call=call)]), usage_metadata=usage)


def search(q: str) -> str:
    """Search for ``q``."""
    ledger("search", q)
    return f"found {q}"


_FLAKED: set[str] = set()  # orders whose model call already failed in this process


def pay(order: str) -> str:
    """Pay for ``order`` (the side effect)."""
    maybe_die("before:pay")
    ledger("pay", order)
    maybe_die("after:pay")
    maybe_die(f"after:pay:{order}")
    return f"paid {order}"


def reconcile_pay(order: str) -> Any:
    """The real outcome of a ``pay`` that crashed before its result was recorded."""
    ledger("reconcile", order)
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM test_ledger WHERE event = 'pay' AND tag = %s",
                           (order,)).fetchone()
    return f"paid {order}" if row else NOT_PERFORMED


def decline(order: str) -> str:
    """Charge ``order``'s card, which is declined."""
    ledger("decline", order)
    raise ValueError(f"card declined for {order}")


def tool_error(tool: BaseTool, args: dict[str, Any], tool_context: ToolContext,
               error: Exception) -> dict[str, Any]:
    """The agent's on_tool_error_callback: the error, as the tool's answer."""
    ledger("tool_error", str(args.get("order")))
    return {"result": f"error: {error}"}


def count_model_call(callback_context: Any, llm_request: LlmRequest) -> None:
    """The agent's before_model_callback: a ledger row per model call made."""
    ledger("before_model", str(len(llm_request.contents)))


def mark_response(callback_context: Any, llm_response: LlmResponse) -> LlmResponse | None:
    """The agent's after_model_callback: a ledger row per response; the final answer
    gets a signature (the callback's answer replaces the response)."""
    ledger("after_model")
    parts = (llm_response.content.parts or []) if llm_response.content else []
    if parts and parts[0].text:
        return LlmResponse(content=types.Content(role="model", parts=[
            types.Part(text=parts[0].text + " (checked)")]),
            usage_metadata=llm_response.usage_metadata)
    return None


class Shuffle(BasePlugin):
    """Orders ``pair``'s two concurrent payments (a plugin before pgdurable's).

    First attempt: ``b-`` waits until ``a-`` is recorded, so a crash in ``b-``
    leaves ``a-`` recorded and ``b-`` started. Replay (a worker was killed):
    ``a-`` waits until ``b-`` went through, so the calls reach the recorder in the
    other order.
    """

    def __init__(self) -> None:
        super().__init__(name="shuffle")
        self.passed: dict[str, asyncio.Event] = {}

    def _event(self, order: str) -> asyncio.Event:
        return self.passed.setdefault(order.split("-", 1)[1], asyncio.Event())

    async def before_tool_callback(self, *, tool: BaseTool, tool_args: dict[str, Any],
                                   tool_context: ToolContext) -> None:
        order = str(tool_args.get("order", ""))
        with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
            replay = conn.execute("SELECT 1 FROM test_ledger WHERE event = 'killed'"
                                  ).fetchone() is not None
        if replay and order.startswith("a-"):
            await self._event(order).wait()
        elif not replay and order.startswith("b-"):
            first = "a-" + order.split("-", 1)[1]
            while True:
                with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
                    if conn.execute("SELECT 1 FROM pgdurable.effects WHERE status = "
                                    "'succeeded' AND result->>'result' = %s",
                                    (f"paid {first}",)).fetchone():
                        break
                await asyncio.sleep(0.05)
        return None

    async def after_tool_callback(self, *, tool: BaseTool, tool_args: dict[str, Any],
                                  tool_context: ToolContext, result: Any) -> None:
        order = str(tool_args.get("order", ""))
        if order.startswith("b-"):
            self._event(order).set()
        return None


def open_ticket(order: str) -> dict[str, str]:
    """Open a ticket for ``order``; a person resolves it later."""
    ledger("ticket", order)
    return {"status": "pending", "ticket": f"T-{order}"}


def build(dsn: str | None = None) -> pgdurable.Durable:
    app = pgdurable.Durable(dsn or resolve_dsn())
    register_agent(app, LlmAgent(name="desk", model=ScriptedLlm(), tools=[search, pay]),
                   name="desk")
    register_agent(app, LlmAgent(name="counter", model=ScriptedLlm(), tools=[
        search, FunctionTool(pay, require_confirmation=True)]), name="counter")
    register_agent(app, LlmAgent(name="tickets", model=ScriptedLlm(second="open_ticket"), tools=[
        search, LongRunningFunctionTool(open_ticket)]), name="tickets")
    register_agent(app, LlmAgent(name="till", model=ScriptedLlm(), tools=[search, pay]),
                   name="till", reconcile={"pay": reconcile_pay})
    register_agent(app, LlmAgent(name="flaky", model=ScriptedLlm(flaky=True),
                                 tools=[search, pay]), name="flaky")
    register_agent(app, LlmAgent(name="clerk", model=ScriptedLlm(second="decline"),
                                 tools=[search, decline], on_tool_error_callback=tool_error,
                                 before_model_callback=count_model_call,
                                 after_model_callback=mark_response), name="clerk")
    register_agent(app, LlmAgent(name="pair", model=ScriptedLlm(pair=True), tools=[pay]),
                   name="pair", plugins=[Shuffle()])
    return app


app: pgdurable.Durable | None = build() if os.environ.get("PGDURABLE_DSN") else None
