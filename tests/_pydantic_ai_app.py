"""Pydantic AI agents run by pgdurable worker processes (tests/test_contrib_pydantic_ai.py),
with Pydantic AI's own stand-in for a model: a ``FunctionModel`` (no network).

Every real model call and tool call records a row in ``test_ledger`` before it returns
(tests/_agent_ledger.py); a test arms a crash by inserting a point into ``test_kills``.
Points: ``before:charge`` (the second tool, before its side effect),
``after:charge`` (after the side effect, before the step is recorded).

The scripted model answers from the conversation: no tool result yet -> call
``search``; one -> call ``charge_card`` (the order id is the prompt's last word);
two -> stream the final text (a delta per character). ``planner``'s ``charge_card`` reconciles after a crash
(replay policy ``reconcile``), ``shopper``'s may run again (``safe``), ``cashier``'s
needs an approval. ``PA_REVISION``
(default ``1``) is the agents' revision; ``ping`` is a plain task.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from _agent_ledger import ledger, maybe_die
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

import pgdurable
from pgdurable import NOT_PERFORMED, Done
from pgdurable.contrib.pydantic_ai import PgDurability
from pgdurable.foundation.db import resolve_dsn


def _order(messages: list[ModelMessage]) -> str:
    for m in messages:
        for p in m.parts:
            if p.part_kind == "user-prompt" and isinstance(p.content, str):
                return p.content.split()[-1]
    return "none"


def _turn(messages: list[ModelMessage]) -> ModelResponse:
    """The scripted answer (deterministic across processes)."""
    results = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
    order = _order(messages)
    ledger("model", f"{order}:{len(results)}")
    if not results:
        return ModelResponse(parts=[ToolCallPart("search", {"q": order}, tool_call_id="c-search")])
    if len(results) == 1:
        return ModelResponse(parts=[ToolCallPart("charge_card", {"order": order, "amount": 42},
                                                 tool_call_id="c-charge")])
    said = "; ".join(str(r.content) for r in results)
    return ModelResponse(parts=[TextPart(f"done: {said}")])


def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return _turn(messages)


async def stream_script(messages: list[ModelMessage],
                        info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
    for part in _turn(messages).parts:
        if isinstance(part, TextPart):
            for ch in part.content:  # a delta per character, as an LLM streams tokens
                yield ch
        elif isinstance(part, ToolCallPart):
            yield {0: DeltaToolCall(name=part.tool_name, json_args=json.dumps(part.args),
                                    tool_call_id=part.tool_call_id)}


def search(q: str) -> str:
    """Search for ``q``."""
    ledger("search", q)
    return f"3 hits for {q}"


def charge_card(order: str, amount: int) -> str:
    """Charge the card for ``order`` (the side effect)."""
    maybe_die("before:charge")
    ledger("charge", order)
    maybe_die("after:charge")
    return f"charged {amount} for {order}"


def reconcile_charge(order: str, amount: int) -> Any:
    """The real outcome of a charge that crashed before it was recorded."""
    ledger("reconcile", order)
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM test_ledger WHERE event = 'charge' AND tag = %s",
                           (order,)).fetchone()
    return f"charged {amount} for {order}" if row else NOT_PERFORMED


def model() -> FunctionModel:
    return FunctionModel(script, stream_function=stream_script)


def build(dsn: str | None = None,
          revision: str | None = None) -> tuple[pgdurable.Durable, dict[str, Agent[None, str]]]:
    """The app and its agents (``planner``, ``shopper``, ``cashier``)."""
    app = pgdurable.Durable(dsn or resolve_dsn())
    rev = revision or os.environ.get("PA_REVISION", "1")
    planner = Agent(model(), name="planner", capabilities=[PgDurability(app, revision=rev)])
    planner.tool_plain(search)
    planner.tool_plain(metadata={"pgdurable": {"reconcile": reconcile_charge}})(charge_card)
    shopper = Agent(model(), name="shopper", capabilities=[PgDurability(app, revision=rev)])
    shopper.tool_plain(search)
    shopper.tool_plain(charge_card)  # replay policy "safe" (the default)
    cashier = Agent(model(), name="cashier", capabilities=[PgDurability(app, revision=rev)])
    cashier.tool_plain(search)
    cashier.tool_plain(requires_approval=True)(charge_card)

    @app.task("ping")
    async def ping(ctx: pgdurable.RunContext, state: Any) -> Done:
        return Done("pong")

    return app, {"planner": planner, "shopper": shopper, "cashier": cashier}


app: pgdurable.Durable | None = build()[0] if os.environ.get("PGDURABLE_DSN") else None
