"""An OpenAI Agents SDK agent run by pgdurable workers in real-process tests
(tests/test_contrib_openai_agents.py), with the SDK's own way to stand in for a
model: a :class:`agents.models.interface.Model` with canned responses (no network).

Every real model call and tool call records a row in the scratch table
``test_ledger(event, pid, tag)`` (committed) before it returns, so the test can
prove from the database that nothing ran twice after its result was recorded.

The fake model answers from the conversation since the last user message:
no tool output yet -> call ``charge``; one -> call ``crash``; two -> the
final message (which quotes how many user messages the session holds).
``crash`` SIGKILLs its own process the first time (no ``killed`` row yet).

``teller`` (streamed, its text one character a delta), ``store`` (``pay`` needs an
approval), ``cashbox`` (``pay`` reconciles after a crash) and ``flaky`` (its model
raises ``ConnectionError`` on its first call in a process) run on the SDK's own
scripted model, ``agents.testing.ScriptedModel``: ``search``, then ``pay``, then the
answer. A test arms a crash by inserting ``before:pay`` or ``after:pay`` (after the
side effect) into ``test_kills`` (tests/_agent_ledger.py).

``metered``, ``metered-stream`` and ``metered-flaky`` (the scripted model: plain,
streamed, and dropping its first connection) reserve :data:`METERED` from the run's
budgets before each model call.

``python tests/_agents_app.py add SESSION TAG N`` appends N batches of 3 items.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import psycopg
from _agent_ledger import ledger, maybe_die
from agents import Agent, ModelSettings, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
)

import pgdurable
from pgdurable import NOT_PERFORMED
from pgdurable.contrib.openai_agents import PgDurableSession, register_agent
from pgdurable.foundation.db import resolve_dsn

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


def _count(event: str) -> int:
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM test_ledger WHERE event = %s",
                           (event,)).fetchone()
        return int(row[0]) if row else 0


def _since_last_user(items: list[Any]) -> list[Any]:
    last = max(i for i, it in enumerate(items) if it.get("role") == "user")
    return items[last + 1:]


class FakeModel(Model):
    """Canned responses chosen from the conversation (deterministic across processes)."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        outputs = [i for i in _since_last_user(items) if i.get("type") == "function_call_output"]
        users = sum(1 for i in items if i.get("role") == "user")
        n = len(outputs)
        ledger("model", f"{users}:{n}")
        if n < 2:
            name = ("charge", "crash")[n]
            out: Any = ResponseFunctionToolCall(
                type="function_call", call_id=f"call-{users}-{name}", name=name,
                arguments='{"amount": 5}' if name == "charge" else "{}",
                id=f"fc-{users}-{name}", status="completed")
        else:
            out = ResponseOutputMessage(
                type="message", id=f"msg-{users}", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", annotations=[],
                                            text=f"done after {users} user message(s)")])
        return ModelResponse(output=[out], usage=Usage(requests=1, input_tokens=10,
                                                       output_tokens=5, total_tokens=15),
                             response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def charge(amount: int) -> str:
    """Charge the customer (the side effect)."""
    ledger("charge", str(amount))
    return f"charged {amount}"


@function_tool
def crash() -> str:
    """Dies the first time it runs."""
    if _count("killed") == 0:
        ledger("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    ledger("crash-ok")
    return "survived"


# -- agents on the SDK's own scripted model (agents.testing.ScriptedModel) ------------


def scripted_turn(call: ModelCall) -> list[Any]:
    """no tool output since the user's message -> ``search``; one -> ``pay``; two -> the answer."""
    items = [{"role": "user", "content": call.input}] if isinstance(call.input, str) \
        else [i if isinstance(i, dict) else i.model_dump() for i in call.input]
    outputs = [i for i in _since_last_user(items) if i.get("type") == "function_call_output"]
    order = str(items[max(i for i, it in enumerate(items) if it.get("role") == "user")]
                ["content"]).split()[-1]
    ledger("model", f"{order}:{len(outputs)}")
    if not outputs:
        return [function_call("search", {"q": order}, call_id=f"s-{order}")]
    if len(outputs) == 1:
        return [function_call("pay", {"order": order}, call_id=f"p-{order}")]
    return [assistant_message("done: " + "; ".join(str(o.get("output")) for o in outputs))]


def scripted_model() -> ScriptedModel:
    return ScriptedModel([ModelStep.respond(scripted_turn) for _ in range(200)],
                         default_usage=Usage(requests=1, input_tokens=7, output_tokens=3,
                                             total_tokens=10))


class CharByChar(Model):
    """``inner``, its streamed text one character a delta (as an LLM streams tokens)."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return await self.inner.get_response(*args, **kwargs)

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        async for event in self.inner.stream_response(*args, **kwargs):
            if isinstance(event, ResponseTextDeltaEvent):
                for ch in event.delta:
                    yield event.model_copy(update={"delta": ch})
            else:
                yield event


class Flaky(Model):
    """``inner``, except that its first call in this process raises ``ConnectionError``
    (a dropped connection), recorded as ``flake`` in the ledger."""

    def __init__(self, inner: Model) -> None:
        self.inner, self.failed = inner, False

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        if not self.failed:
            self.failed = True
            ledger("flake")
            raise ConnectionError("connection reset by peer")
        return await self.inner.get_response(*args, **kwargs)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool
def search(q: str) -> str:
    """Search (the first tool)."""
    ledger("search", q)
    return f"found {q}"


def _pay(order: str) -> str:
    maybe_die("before:pay")
    ledger("pay", order)
    maybe_die("after:pay")
    return f"paid {order}"


def reconcile_pay(order: str) -> Any:
    """The real outcome of a ``pay`` that crashed before its output was recorded."""
    ledger("reconcile", order)
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM test_ledger WHERE event = 'pay' AND tag = %s",
                           (order,)).fetchone()
    return f"paid {order}" if row else NOT_PERFORMED


pay = function_tool(_pay, name_override="pay")
pay_approved = function_tool(_pay, name_override="pay", needs_approval=True)


#: What ``metered`` reserves before each model call (its usage: 7 in, 3 out; usd priced
#: under "ScriptedModel", the model's class name).
METERED = {"calls": 1, "tokens_in": 100, "tokens_out": 50, "usd": 0.05}


def build(dsn: str | None = None) -> pgdurable.Durable:
    app = pgdurable.Durable(dsn or resolve_dsn())
    agent = Agent(name="shop", instructions="Help.", model=FakeModel(),
                  model_settings=ModelSettings(), tools=[charge, crash])
    register_agent(app, agent, name="shop")
    # streamed, two tools: the SIGKILL and stream tests
    register_agent(app, Agent(name="teller", model=CharByChar(scripted_model()),
                              tools=[search, pay]), name="teller", stream=True)
    # pay's replay policy is reconcile: a crash after its side effect asks reconcile_pay
    register_agent(app, Agent(name="cashbox", model=scripted_model(), tools=[search, pay]),
                   name="cashbox", reconcile={"pay": reconcile_pay})
    # the model drops its connection once: the step's retry calls it again
    register_agent(app, Agent(name="flaky", model=Flaky(scripted_model()),
                              tools=[search, pay]), name="flaky")
    # budgets: each model call really made reserves and settles its usage (7 in, 3 out)
    register_agent(app, Agent(name="metered", model=scripted_model(), tools=[search, pay]),
                   name="metered", reserve=METERED)
    register_agent(app, Agent(name="metered-stream", model=CharByChar(scripted_model()),
                              tools=[search, pay]), name="metered-stream", stream=True,
                   reserve=METERED)
    register_agent(app, Agent(name="metered-flaky", model=Flaky(scripted_model()),
                              tools=[search, pay]), name="metered-flaky", reserve=METERED)
    # pay needs a human's approval: the run parks on it (RunState)
    register_agent(app, Agent(name="store", model=scripted_model(),
                              tools=[search, pay_approved]), name="store")
    return app


app: pgdurable.Durable | None = build() if os.environ.get("PGDURABLE_DSN") else None


async def _add(session_id: str, tag: str, n: int) -> None:
    session = PgDurableSession(session_id, resolve_dsn() or "")
    try:
        for i in range(n):
            await session.add_items([{"role": "user", "content": f"{tag}:{i}:{j}"}
                                     for j in range(3)])
    finally:
        await session.close()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "add":
    asyncio.run(_add(sys.argv[2], sys.argv[3], int(sys.argv[4])))
