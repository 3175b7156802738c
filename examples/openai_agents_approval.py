"""OpenAI Agents SDK on pgdurable: a streamed durable run that parks on a tool approval
(the SDK's ``RunState``) and resumes.

Run with a migrated database (no network: the SDK's own ``agents.testing.ScriptedModel``
stands in for OpenAI):
    PGDURABLE_DSN=postgresql://... python examples/openai_agents_approval.py

Needs ``pip install 'pgdurable[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

from agents import Agent, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

import pgdurable
from pgdurable.contrib.openai_agents import register_agent, run_agent

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
app = pgdurable.Durable(pgdurable.resolve_dsn())


def reply(call: ModelCall) -> list[object]:
    """Refund the order the user named, then say so."""
    outputs = [i for i in call.input if isinstance(i, dict) and i.get("type") == "function_call_output"]
    if not outputs:
        return [function_call("refund", {"order": "A-17"}, call_id="call-refund")]
    return [assistant_message(f"Done: {outputs[-1]['output']}")]


@function_tool(needs_approval=True)
def refund(order: str) -> str:
    """Refund an order (runs only after a person approved it)."""
    return f"refunded {order}"


agent = Agent(name="support", model=ScriptedModel([ModelStep.respond(reply)] * 10), tools=[refund])
register_agent(app, agent, name="support", stream=True)


async def main() -> None:
    run_id = await run_agent(app, "support", "Please refund A-17", session_id="u-7")
    worker = app.worker(lease_ttl=timedelta(seconds=10), poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        async for event in app.stream(run_id):
            e = event.event
            if e.get("type") == "run_item_stream_event":
                print("event:", e["name"])
            elif e.get("type") == "text":  # the model's text deltas, a few rows (emit_text)
                print("text:", repr(e["text"]))
            elif e.get("type") == "approval_requested":
                kind, ref = e["signal"]
                print("approval asked for", [p["tool_name"] for p in e["approvals"]])
                await app.signal(kind, ref, True)  # or {"call-refund": False}, from anywhere
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
