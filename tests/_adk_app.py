"""Google ADK agents run by pgdurable worker processes (tests/test_contrib_adk.py), on a
scripted ``BaseLlm`` subclass (no network).

Every real model call and tool call records a row in ``test_ledger`` before it returns
(tests/_agent_ledger.py); a test arms a crash by inserting ``before:pay`` into
``test_kills``.

The scripted model answers from the request: no tool result yet -> call ``search``;
one -> call ``pay`` (the order is the user message's last word); two -> the final
text. ``desk`` pays at once, ``counter``'s ``pay`` needs a confirmation, ``tickets``
opens a ticket with a long-running tool instead of paying.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import AsyncGenerator

from _agent_ledger import ledger, maybe_die
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools import FunctionTool, LongRunningFunctionTool
from google.genai import types

import pgdurable
from pgdurable.contrib.adk import register_agent
from pgdurable.foundation.db import resolve_dsn

warnings.filterwarnings("ignore", category=UserWarning, module="google.adk")
logging.getLogger("opentelemetry.context").setLevel(logging.CRITICAL)


class ScriptedLlm(BaseLlm):
    """Search, then pay (or open a ticket), then answer with what the tools said."""

    model: str = "scripted"
    second: str = "pay"

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        parts = [p for c in llm_request.contents for p in (c.parts or [])]
        order = next(p.text for p in parts if p.text).split()[-1]
        results = [p.function_response for p in parts if p.function_response
                   and p.function_response.name != "adk_request_confirmation"]
        ledger("model", f"{order}:{len(results)}")
        usage = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=11, candidates_token_count=4, total_token_count=15)
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


def pay(order: str) -> str:
    """Pay for ``order`` (the side effect)."""
    maybe_die("before:pay")
    ledger("pay", order)
    return f"paid {order}"


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
    return app


app: pgdurable.Durable | None = build() if os.environ.get("PGDURABLE_DSN") else None
