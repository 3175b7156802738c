"""OpenAI Agents SDK on pgdurable: a Postgres session and a durable agent run that
reserves from a budget before each model call and settles the call's usage.

Run with a migrated database (no network: a canned model stands in for OpenAI,
the SDK's own way, by implementing its ``Model`` interface):
    PGDURABLE_DSN=postgresql://... python examples/openai_agents_session.py

Needs ``pip install 'pgdurable[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from decimal import Decimal
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import pgdurable
from pgdurable.contrib.openai_agents import PgDurableSession, register_agent, run_agent

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


class CannedModel(Model):
    """Calls the ``lookup`` tool once per user message, then answers."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        last_user = max(i for i, it in enumerate(items) if it.get("role") == "user")
        since = items[last_user + 1:]
        usage = Usage(requests=1, input_tokens=20, output_tokens=5, total_tokens=25)
        if not any(i.get("type") == "function_call_output" for i in since):
            call = ResponseFunctionToolCall(
                type="function_call", call_id=f"call-{last_user}", name="lookup",
                arguments='{"order": "A-17"}', status="completed")
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", annotations=[],
                                  text=f"Order A-17 ships tomorrow ({len(items)} items seen).")
        msg = ResponseOutputMessage(type="message", id=f"msg-{last_user}", role="assistant",
                                    status="completed", content=[text])
        return ModelResponse(output=[msg], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def lookup(order: str) -> str:
    """Look an order up (a side effect a durable run performs once)."""
    return f"{order}: packed"


agent = Agent(name="support", instructions="Answer order questions.", model=CannedModel(),
              tools=[lookup])


async def until_status(app: pgdurable.Durable, run_id: str, *statuses: str) -> pgdurable.RunInfo:
    """Poll the run until it has one of ``statuses``."""
    for _ in range(1200):
        info = await app.get_run(run_id)
        if info.status in statuses:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(run_id)


async def main() -> None:
    dsn = pgdurable.resolve_dsn() or ""
    # 1. the session protocol: Runner.run(..., session=...) keeps the conversation
    session = PgDurableSession("customer-7", dsn)
    try:
        result = await Runner.run(agent, "Where is my order?", session=session,
                                  run_config=RunConfig(tracing_disabled=True))
        print("plain run:", result.final_output)
        print("session items:", len(await session.get_items()))
    finally:
        await session.close()

    # 2. a durable run: every model and tool call is recorded; a crashed worker's run
    #    resumes on another without paying for a model call or repeating a tool again
    #    reserve=: before each model call, hold this much of the run's budgets; settle
    #    what the call's usage says (usd from the price table) when it answered
    app = pgdurable.Durable(dsn)
    register_agent(app, agent, name="support", run_config=RunConfig(tracing_disabled=True),
                   reserve={"calls": 1, "tokens_in": 500, "tokens_out": 200, "usd": 0.01})
    async with app:
        await app.budget("tenant:acme", limit={"usd": 1, "calls": 100},
                         window=timedelta(days=1), policy="park")
        await app.set_price("CannedModel", usd_per_token_in=0.000002, usd_per_token_out=0.000008)
        worker = app.worker(concurrency=2)
        task = asyncio.create_task(worker.run())
        try:
            run_id = await run_agent(app, "support", "And when will it arrive?",
                                     session_id="customer-7", budgets=["tenant:acme"])
            info = await until_status(app, run_id, "completed", "failed")
            print("durable run:", info.result)
            assert info.status == "completed", info
            effects = await app.fetchall(
                "SELECT key FROM pgdurable.effects WHERE run_id = %s ORDER BY key", (run_id,))
            print("recorded:", [r[0] for r in effects])
            spent = {r[0]: r[1] for r in await app.fetchall(
                "SELECT unit, settled FROM pgdurable.budget_usage "
                "WHERE budget_key = 'tenant:acme'", ())}
            print("tenant:acme spent:", spent)  # 2 calls, 2 x (20 in, 5 out) priced
            assert spent["calls"] == 2 and spent["usd"] == Decimal("0.00016"), spent
        finally:
            await worker.stop()
            await task
    check = PgDurableSession("customer-7", dsn)
    try:
        print("the same session now holds", len(await check.get_items()), "items")
    finally:
        await check.close()


if __name__ == "__main__":
    asyncio.run(main())
