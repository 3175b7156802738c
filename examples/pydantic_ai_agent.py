"""Pydantic AI on pgdurable: a durable agent run that streams, parks for an approval
and resumes.

Run with a migrated database (no network: Pydantic AI's ``FunctionModel`` stands
in for the LLM):
    PGDURABLE_DSN=postgresql://... python examples/pydantic_ai_agent.py

Needs ``pip install 'pgdurable[pydantic-ai]'``. In production the model is a name
(``Agent("openai:gpt-5", ...)``) and the worker is ``python -m pgdurable.worker
mymodule:app`` in as many processes as you like.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import pgdurable
from pgdurable.contrib.pydantic_ai import PgDurability, start_agent

app = pgdurable.Durable(pgdurable.resolve_dsn())


def scripted_llm(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Search, then book (a tool that needs an approval), then answer."""
    done = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
    if not done:
        return ModelResponse(parts=[ToolCallPart("search", {"city": "Lisbon"})])
    if len(done) == 1:
        return ModelResponse(parts=[ToolCallPart("book_hotel", {"hotel": "Alfama Inn"})])
    return ModelResponse(parts=[TextPart(f"Booked: {done[-1].content}")])


async def streamed_llm(messages: list[ModelMessage],
                       info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    """The same answers, streamed (text word by word) as a real LLM does."""
    for part in scripted_llm(messages, info).parts:
        if isinstance(part, TextPart):
            for i, word in enumerate(part.content.split(" ")):
                yield (" " if i else "") + word
        elif isinstance(part, ToolCallPart):
            yield {0: DeltaToolCall(name=part.tool_name, json_args=json.dumps(part.args))}


agent = Agent(FunctionModel(scripted_llm, stream_function=streamed_llm), name="trip_planner",
              capabilities=[PgDurability(app)])


@agent.tool_plain
def search(city: str) -> list[str]:
    """Hotels in ``city`` (a recorded step: never searched twice for one run)."""
    return ["Alfama Inn", "Baixa Suites"]


@agent.tool_plain(requires_approval=True)
def book_hotel(hotel: str) -> str:
    """Book ``hotel`` (runs only after a human approved it)."""
    return f"{hotel}, confirmation LX-42"


async def main() -> None:
    run_id = await start_agent(app, agent, "Plan a trip to Lisbon", metadata={"user": "u-7"})
    worker = app.worker(lease_ttl=timedelta(seconds=10), poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        # the run parks on the approval: no worker holds it meanwhile
        async for event in app.stream(run_id):
            if event.event.get("event_kind") == "function_tool_call":
                print("tool call:", event.event["part"]["tool_name"])
            elif event.event.get("type") == "approval_requested":
                kind, ref = event.event["signal"]
                print("approval asked for", [c["tool_name"] for c in event.event["approvals"]])
                # from anywhere: pgdurable signal approval REF --payload true, a webhook, ...
                await app.signal(kind, ref, True)
            elif event.event.get("type") == "text":  # the model's text, a few rows (emit_text)
                print("  text:", repr(event.event["text"]))
            elif event.final:
                break
        result = await app.result(run_id, timeout=30)
        print(result["output"], "| tokens:", result["usage"]["input_tokens"],
              "in,", result["usage"]["output_tokens"], "out")
        assert result["output"] == "Booked: Alfama Inn, confirmation LX-42"
        steps = await app.fetchall(
            "SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints"
            " WHERE run_id = %s ORDER BY step", (run_id,))
        print(json.dumps([s[0] for s in steps], indent=1))
    finally:
        await worker.stop(grace=2)
        await task
        await app.close()


if __name__ == "__main__":
    asyncio.run(main())
