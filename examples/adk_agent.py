"""Google ADK on pgdurable: a durable agent run that parks on a tool confirmation.

Run with a migrated database (no network: a scripted ``BaseLlm`` stands in for
Gemini):
    PGDURABLE_DSN=postgresql://... python examples/adk_agent.py

Needs ``pip install 'pgdurable[adk]'``. In production the model is a name
(``LlmAgent(model="gemini-2.5-flash", ...)``) and the worker is ``python -m
pgdurable.worker mymodule:app``.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import AsyncGenerator
from datetime import timedelta

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools import FunctionTool
from google.genai import types

import pgdurable
from pgdurable.contrib.adk import register_agent, run_agent

warnings.filterwarnings("ignore", category=UserWarning, module="google.adk")
logging.getLogger("opentelemetry.context").setLevel(logging.CRITICAL)

app = pgdurable.Durable(pgdurable.resolve_dsn())


class ScriptedGemini(BaseLlm):
    """Looks the order up, then refunds it (a tool that needs a confirmation), then answers."""

    model: str = "scripted"

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        results = [p.function_response for c in llm_request.contents for p in (c.parts or [])
                   if p.function_response and p.function_response.name != "adk_request_confirmation"]
        if not results:
            part = types.Part(function_call=types.FunctionCall(name="lookup", args={"order": "A-17"}))
        elif len(results) == 1:
            part = types.Part(function_call=types.FunctionCall(name="refund", args={"order": "A-17"}))
        else:
            part = types.Part(text=f"Done: {(results[-1].response or {}).get('result')}")
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def lookup(order: str) -> str:
    """Look an order up (a recorded call: never repeated for one run)."""
    return f"{order}: delivered, 49 EUR"


def refund(order: str) -> str:
    """Refund an order (runs only once a person confirmed it)."""
    return f"refunded {order}"


agent = LlmAgent(name="support", model=ScriptedGemini(),
                 tools=[lookup, FunctionTool(refund, require_confirmation=True)])
register_agent(app, agent, name="support")


async def main() -> None:
    run_id = await run_agent(app, "support", "Please refund A-17", user_id="u-7")
    worker = app.worker(lease_ttl=timedelta(seconds=10), poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        async for event in app.stream(run_id):
            if event.event.get("type") == "approval_requested":
                kind, ref = event.event["signal"]
                print("confirmation asked for", event.event["pending"][0]["tool"])
                await app.signal(kind, ref, True)  # or: pgdurable signal approval REF --payload true
            elif event.final:
                break
        result = await app.result(run_id, timeout=30)
        print(result["final_output"])
        assert result["final_output"] == "Done: refunded A-17"
    finally:
        await worker.stop(grace=2)
        await task
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
