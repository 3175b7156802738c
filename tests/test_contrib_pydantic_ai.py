"""pgdurable.contrib.pydantic_ai: durable Pydantic AI agent runs.

In-process runs check what a run records (steps, usage, events, decisions); worker
processes (tests/_pydantic_ai_app.py, tests/_fleet.py) are SIGKILLed between the two
tools and after a side effect, a parked approval is resumed from other processes,
and a stream is followed across a crash. What ran is counted in ``test_ledger``
(rows the model and the tools commit before they return).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

pytest.importorskip("pydantic_ai")

from _agent_ledger import TABLES, cli_signal
from _pydantic_ai_app import build
from _waiting import WAIT_LIMIT, app_running, until, until_sync
from pydantic_ai import Agent
from pydantic_ai import RunContext as AIRunContext
from pydantic_ai.messages import AgentStreamEvent, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import pgdurable
from pgdurable.contrib.pydantic_ai import PgDurability, decision, start_agent, task_name

if TYPE_CHECKING:
    from fix_fleet import Fleet

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.fleet("_pydantic_ai_app:app")


@dataclass
class Deps:
    user: str


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)
        yield conn


@pytest.fixture
def env_dsn(dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("PGDURABLE_DSN", dsn)  # the test app's ledger connects with it
    return dsn


def _counts(db: psycopg.Connection[Any], order: str) -> dict[str, int]:
    rows = db.execute("SELECT event, count(*) FROM test_ledger WHERE tag LIKE %s || '%%' "
                      "GROUP BY event", (order,)).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def _status(db: psycopg.Connection[Any], rid: str) -> tuple[str, Any, Any]:
    row = db.execute("SELECT status, wait_kind, lease_owner FROM pgdurable.runs WHERE id = %s",
                     (rid,)).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _merged(shapes: list[str]) -> list[str]:
    """Shapes with consecutive text rows joined: how the text is cut into rows depends on
    timing (a flush every 100 ms), the text does not."""
    out: list[str] = []
    for shape in shapes:
        if shape.startswith("text:") and out and out[-1].startswith("text:"):
            out[-1] += shape[len("text:"):]
        else:
            out.append(shape)
    return out


def _steps(db: psycopg.Connection[Any], rid: str) -> list[str]:
    return [r[0] for r in db.execute(
        "SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints WHERE run_id = %s "
        "ORDER BY step", (rid,)).fetchall()]


def _events(db: psycopg.Connection[Any], rid: str) -> list[tuple[int, Any]]:
    return [(int(r[0]), r[1]) for r in db.execute(
        "SELECT seq, event FROM pgdurable.run_events WHERE run_id = %s ORDER BY seq",
        (rid,)).fetchall()]


def _shape(event: Any) -> str:
    """An event without what differs between runs (timestamps, ids): its kind and subject
    (a text row: ``text:<its text>``)."""
    if event.get("type") == "text":
        return f"text:{event['text']}"
    if "event_kind" not in event:
        return str(event.get("type"))
    part = event.get("part") or event.get("delta") or {}
    what = part.get("tool_name") or part.get("content") or part.get("content_delta") or ""
    return f"{event['event_kind']}:{what}"


# -- in-process ------------------------------------------------------------------------


async def test_a_run_records_every_model_request_and_tool_call(
        env_dsn: str, db: psycopg.Connection[Any]) -> None:
    app, agents = build(env_dsn)
    planner = agents["planner"]
    try:
        rid = await start_agent(app, planner, "plan a trip for o-1", metadata={"user": "u-7"})
        async with app_running(app):
            result = await app.result(rid, timeout=WAIT_LIMIT)
        assert result["output"] == "done: 3 hits for o-1; charged 42 for o-1"
        assert _steps(db, rid) == [
            "planner__model.request_stream",
            "planner__function_toolset__<agent>.call_tool:search",
            "planner__model.request_stream#2",
            "planner__function_toolset__<agent>.call_tool:charge_card",
            "planner__model.request_stream#3",
            "return",
        ]
        assert _counts(db, "o-1") == {"model": 3, "search": 1, "charge": 1}
        # the run is an ordinary pgdurable run: task, revision, metadata
        row = db.execute("SELECT task, revision, metadata FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone()
        assert row == ("pydantic_ai.planner", "1", {"user": "u-7"})
        assert task_name(planner) == "pydantic_ai.planner"
        # usage: per model step in its recorded entry, and the run's total in the result
        per_step = db.execute(
            "SELECT (state->'workflow'->'result'->'usage'->>'input_tokens')::int,"
            "       (state->'workflow'->'result'->'usage'->>'output_tokens')::int"
            "  FROM pgdurable.checkpoints WHERE run_id = %s"
            "   AND state->'workflow'->>'name' LIKE %s ORDER BY step",
            (rid, "%model.request%")).fetchall()
        assert len(per_step) == 3 and all(i > 0 and o > 0 for i, o in per_step)
        assert result["usage"]["requests"] == 3 and result["usage"]["tool_calls"] == 2
        assert result["usage"]["input_tokens"] == sum(i for i, _ in per_step)
        assert result["usage"]["output_tokens"] == sum(o for _, o in per_step)
        # the conversation comes back as messages, to continue it
        assert [m["kind"] for m in result["messages"]] == [
            "request", "response", "request", "response", "request", "response"]
    finally:
        await app.close()


async def test_the_stream_holds_each_event_once_in_order(
        env_dsn: str, db: psycopg.Connection[Any]) -> None:
    app, agents = build(env_dsn)
    try:
        rid = await start_agent(app, agents["planner"], "plan o-2")
        async with app_running(app):
            seen = [ev async for ev in app.stream(rid)]
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        shapes = [_shape(e.event) for e in seen]
        assert shapes[:4] == ["part_start:search", "part_end:search",
                              "function_tool_call:search", "function_tool_result:search"]
        assert "function_tool_result:charge_card" in shapes
        # the model's text (a delta per character) went to emit_text: the stored text is the
        # model's, in a few rows, and no text delta is a row of its own
        answer = "done: 3 hits for o-2; charged 42 for o-2"
        texts = [e.event["text"] for e in seen if e.event.get("type") == "text"]
        assert "".join(texts) == answer
        assert 1 <= len(texts) < len(answer) // 4
        assert not [s for s in shapes if s.startswith(("part_delta:", "part_start:", "part_end:"))
                    and not s.endswith(("search", "charge_card"))]
        paid = shapes.index("function_tool_result:charge_card")
        assert all(i > paid for i, x in enumerate(shapes) if x.startswith("text:"))
        assert shapes[-1] == "end"
        # the events load back as Pydantic AI's own
        from pydantic import TypeAdapter
        adapter: TypeAdapter[AgentStreamEvent] = TypeAdapter(AgentStreamEvent)
        loaded = [adapter.validate_python(e.event) for e in seen if "event_kind" in e.event]
        assert type(loaded[0]).__name__ == "PartStartEvent"
    finally:
        await app.close()


async def test_outside_a_run_the_capability_changes_nothing(dsn: str) -> None:
    app = pgdurable.Durable(dsn)
    try:
        agent = Agent(TestModel(), name="plain", capabilities=[PgDurability(app)])

        @agent.tool_plain
        def double(x: int) -> int:
            return 2 * x

        result = await agent.run("go")
        assert "double" in result.output
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)
    finally:
        await app.close()


async def test_test_model_agent_with_deps_history_and_model_by_name(dsn: str) -> None:
    """TestModel calls every tool; deps cross as JSON into the agent's deps_type; a
    second run continues the first's conversation; a model crosses by name."""
    app = pgdurable.Durable(dsn)
    try:
        agent = Agent(TestModel(), name="helper", deps_type=Deps,
                      capabilities=[PgDurability(app, stream=False)])

        @agent.tool
        def whoami(ctx: AIRunContext[Deps]) -> str:
            return f"you are {ctx.deps.user}"

        rid = await start_agent(app, agent, "who am i?", deps={"user": "u-7"})
        async with app_running(app):
            first = await app.result(rid, timeout=WAIT_LIMIT)
            assert "you are u-7" in json.dumps(first["output"])
            rid2 = await start_agent(app, agent, "again", deps=Deps("u-8"),
                                     message_history=first["messages"], model="test")
            second = await app.result(rid2, timeout=WAIT_LIMIT)
        assert len(second["messages"]) > len(first["messages"])
        assert second["messages"][:len(first["messages"])] == first["messages"]
        with pytest.raises(TypeError, match="by name"):
            await start_agent(app, agent, "x", model=TestModel())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="PgDurability"):
            await start_agent(app, Agent(TestModel()), "x")
    finally:
        await app.close()


async def test_an_approval_parks_and_a_denial_reaches_the_model(
        env_dsn: str, db: psycopg.Connection[Any]) -> None:
    app, agents = build(env_dsn)
    try:
        rid = await start_agent(app, agents["cashier"], "buy o-3")
        async with app_running(app):
            async def parked() -> bool:
                return _status(db, rid)[0] == "waiting"

            await until(parked, "the park")
            status, kind, owner = _status(db, rid)
            assert (status, kind, owner) == ("waiting", "approval", None)  # holds no worker
            asked = [e for _, e in _events(db, rid) if e.get("type") == "approval_requested"]
            assert len(asked) == 1
            assert asked[0]["signal"] == ["approval", f"{rid}:approval"]
            assert asked[0]["approvals"][0]["tool_name"] == "charge_card"
            assert asked[0]["approvals"][0]["args"] == {"order": "o-3", "amount": 42}
            await app.signal("approval", f"{rid}:approval",
                             {"approved": False, "message": "over budget"})
            result = await app.result(rid, timeout=WAIT_LIMIT)
        assert "over budget" in result["output"]
        assert _counts(db, "o-3").get("charge", 0) == 0
    finally:
        await app.close()


def _concierge(messages: list[Any], info: AgentInfo) -> ModelResponse:
    """An MCP tool (lookup), then a tool that needs an approval (book), then the answer."""
    results = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
    if not results:
        return ModelResponse(parts=[ToolCallPart("lookup", {"code": "B-1"}, tool_call_id="m1")])
    if len(results) == 1:
        return ModelResponse(parts=[ToolCallPart("book", {"code": "B-1"}, tool_call_id="b1")])
    return ModelResponse(parts=[TextPart(" / ".join(str(r.content) for r in results))])


async def test_an_mcp_tool_call_is_a_recorded_step(env_dsn: str,
                                                   db: psycopg.Connection[Any]) -> None:
    """The MCP server's tool runs once: the run parks after it (an approval) and the
    claim that resumes it replays the recorded MCP call instead of calling the server."""
    from fastmcp.client.transports import PythonStdioTransport
    from pydantic_ai.mcp import MCPToolset

    app = pgdurable.Durable(env_dsn)
    try:
        server = MCPToolset(PythonStdioTransport(ROOT / "tests" / "_mcp_lookup_server.py",
                                                 env={"PGDURABLE_DSN": env_dsn}), id="bookings")
        agent = Agent(FunctionModel(_concierge), name="concierge", toolsets=[server],
                      capabilities=[PgDurability(app, stream=False)])

        @agent.tool_plain(requires_approval=True)
        def book(code: str) -> str:
            return f"booked {code}"

        rid = await start_agent(app, agent, "book B-1")
        async with app_running(app):
            async def parked() -> bool:
                return _status(db, rid)[0] == "waiting"

            await until(parked, "the park")
            await app.signal("approval", f"{rid}:approval", True)
            result = await app.result(rid, timeout=WAIT_LIMIT)
        assert result["output"] == "booking B-1: confirmed / booked B-1"
        assert db.execute("SELECT count(*) FROM test_ledger WHERE event = 'mcp'").fetchone() == (1,)
        steps = _steps(db, rid)
        assert "concierge__mcp_server__bookings.call_tool" in steps
        assert any(s.startswith("concierge__mcp_server__bookings.get_tools") for s in steps)
    finally:
        await app.close()


def _asks(messages: list[Any], info: AgentInfo) -> ModelResponse:
    results = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
    if not results:
        return ModelResponse(parts=[ToolCallPart("quote", {"item": "desk"}, tool_call_id="q1")])
    return ModelResponse(parts=[TextPart(f"the quote: {results[0].content}")])


async def test_an_externally_executed_tool_parks_until_its_result_is_signalled(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """A tool that raises CallDeferred (executed elsewhere): the run parks; the signal's
    payload carries the result as Pydantic AI's DeferredToolResults JSON."""
    from pydantic_ai.exceptions import CallDeferred

    app = pgdurable.Durable(dsn)
    try:
        agent = Agent(FunctionModel(_asks), name="quoter",
                      capabilities=[PgDurability(app, stream=False)])

        @agent.tool_plain
        def quote(item: str) -> str:
            raise CallDeferred

        rid = await start_agent(app, agent, "price a desk")
        async with app_running(app):
            async def parked() -> bool:
                return _status(db, rid)[0] == "waiting"

            await until(parked, "the park")
            asked = [e for _, e in _events(db, rid) if e.get("type") == "approval_requested"]
            assert asked[0]["calls"] == [{"tool_name": "quote", "tool_call_id": "q1",
                                          "args": {"item": "desk"}}]
            await app.signal("approval", f"{rid}:approval", {"calls": {"q1": "120 EUR"}})
            result = await app.result(rid, timeout=WAIT_LIMIT)
        assert result["output"] == "the quote: 120 EUR"
    finally:
        await app.close()


async def test_a_model_that_fails_mid_stream_is_retried_and_its_text_stored_once(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """The model streams half its answer, then its connection drops; the model step's
    policy retries it in place and the model streams the same answer again: the stored
    text is the answer once (what the failed attempt streamed is not written twice)."""
    app = pgdurable.Durable(dsn)
    answer = "the answer is forty-two, and that is all there is to say about it"
    calls: list[int] = []

    def whole(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(answer)])

    async def stream(messages: list[Any], info: AgentInfo) -> Any:
        calls.append(1)
        for i, ch in enumerate(answer):
            if len(calls) == 1 and i == len(answer) // 2:
                await asyncio.sleep(0.3)  # let the first half be stored (a flush per 100 ms)
                raise ConnectionError("connection reset by peer")
            yield ch

    agent = Agent(FunctionModel(whole, stream_function=stream), name="flaky", capabilities=[
        PgDurability(app, model_policy=pgdurable.StepPolicy(max_attempts=2,
                                                            retry_base=0.01))])
    try:
        rid = await start_agent(app, agent, "say it")
        async with app_running(app):
            result = await app.result(rid, timeout=WAIT_LIMIT)
    finally:
        await app.close()
    assert result["output"] == answer and len(calls) == 2
    texts = [r[0] for r in db.execute(
        "SELECT event->>'text' FROM pgdurable.run_events WHERE run_id = %s "
        "AND event->>'type' = 'text' ORDER BY seq", (rid,))]
    assert "".join(texts) == answer


async def test_a_registered_model_is_chosen_by_name_and_an_unregistered_one_refused(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """``PgDurability(models={"alt": ...})``: ``start_agent(..., model="alt")`` runs on
    that instance, the default on the agent's own. A ``Model`` instance that is neither
    (here an ``agent.override(model=...)`` around the worker) cannot cross the durable
    boundary by name: the run fails saying so, and the model is never called."""
    app = pgdurable.Durable(dsn)
    called: list[str] = []

    def answer(name: str) -> Any:
        def fn(messages: list[Any], info: AgentInfo) -> ModelResponse:
            called.append(name)
            return ModelResponse(parts=[TextPart(f"from {name}")])
        return fn

    agent = Agent(FunctionModel(answer("main")), name="switch", capabilities=[
        PgDurability(app, models={"alt": FunctionModel(answer("alt"))}, stream=False,
                     max_attempts=1)])
    try:
        default = await start_agent(app, agent, "hi")
        alt = await start_agent(app, agent, "hi", model="alt")
        async with app_running(app):
            assert (await app.result(default, timeout=WAIT_LIMIT))["output"] == "from main"
            assert (await app.result(alt, timeout=WAIT_LIMIT))["output"] == "from alt"
        assert sorted(called) == ["alt", "main"]  # once each; the worker runs both at once
        refused = await start_agent(app, agent, "hi")
        with agent.override(model=FunctionModel(answer("stranger"))):
            async with app_running(app):
                with pytest.raises(pgdurable.RunFailed) as failed:
                    await app.result(refused, timeout=WAIT_LIMIT)
        assert "models=" in str(failed.value.error) or "registered" in str(failed.value.error)
        assert "stranger" not in called
    finally:
        await app.close()


def test_decision_payloads() -> None:
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.tools import DeferredToolRequests, ToolApproved, ToolDenied

    calls = [ToolCallPart("a", {}, tool_call_id="1"), ToolCallPart("b", {}, tool_call_id="2")]
    req = DeferredToolRequests(approvals=calls)
    assert all(isinstance(v, ToolApproved) for v in decision(req, True).approvals.values())
    denied = decision(req, {"approved": False, "message": "no"}).approvals
    assert all(isinstance(v, ToolDenied) and v.message == "no" for v in denied.values())
    mixed = decision(req, {"approvals": {"1": True, "2": {"kind": "tool-denied",
                                                          "message": "not b"}}})
    assert mixed.approvals["1"] is True and mixed.approvals["2"].message == "not b"
    with pytest.raises(UserError):
        decision(req, {"approvals": {"9": True}})
    with pytest.raises(UserError):
        decision(req, "yes")


def test_bad_tool_policy_and_names_are_refused(dsn: str) -> None:
    from pydantic_ai.exceptions import UserError

    app = pgdurable.Durable(dsn)

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("x")])

    agent = Agent(FunctionModel(model), name="twice", capabilities=[PgDurability(app)])
    with pytest.raises(ValueError, match="already durable"):
        Agent(FunctionModel(model), name="twice", capabilities=[PgDurability(app)])
    with pytest.raises(UserError, match="name"):
        Agent(FunctionModel(model), capabilities=[PgDurability(app)])
    with pytest.raises(TypeError):
        PgDurability(app, tool_policy={"max_attempts": 1})  # type: ignore[arg-type]
    cap = PgDurability.from_agent(agent)
    assert cap is not None
    from pgdurable.contrib.pydantic_ai.durability import _policy

    with pytest.raises(UserError, match="unknown"):
        _policy({"retries": 2}, pgdurable.StepPolicy(), "t")
    assert _policy({"max_attempts": 1}, pgdurable.StepPolicy(), "t").max_attempts == 1


# -- worker processes ------------------------------------------------------------------


def test_sigkill_between_the_two_tools(db: psycopg.Connection[Any], fleet: Fleet,
                                       env_dsn: str) -> None:
    """The worker dies in the second tool, before its side effect: another worker
    resumes the run; the first tool ran once and no recorded model turn was asked again."""
    db.execute("INSERT INTO test_kills VALUES ('before:charge')")
    rid = _start("shopper", "plan o-10", env_dsn)
    fleet.start("a")
    until_sync(lambda: _counts(db, "before:charge").get("killed") == 1, "the kill")
    fleet.start("b")
    until_sync(lambda: _status(db, rid)[0] == "completed", "the run to complete")
    assert _counts(db, "o-10") == {"model": 3, "search": 1, "charge": 1}
    pids = dict(db.execute("SELECT event, array_agg(DISTINCT pid) FROM test_ledger "
                           "WHERE tag LIKE 'o-10%%' GROUP BY event").fetchall())
    assert pids["search"] == [fleet.workers[0].pid] and pids["charge"] == [fleet.workers[1].pid]
    output = db.execute("SELECT result->>'output' FROM pgdurable.runs WHERE id = %s",
                        (rid,)).fetchone()
    assert output == ("done: 3 hits for o-10; charged 42 for o-10",)


@pytest.mark.parametrize(("agent", "expected"), [
    ("planner", {"model": 3, "search": 1, "charge": 1, "reconcile": 1}),
    ("shopper", {"model": 3, "search": 1, "charge": 2}),
])
def test_sigkill_after_a_side_effect_follows_the_tools_replay_policy(
        db: psycopg.Connection[Any], fleet: Fleet, env_dsn: str, agent: str,
        expected: dict[str, int]) -> None:
    """Killed after charging, before the step is recorded: ``planner``'s charge_card
    (replay policy reconcile) is reconciled, not charged again; ``shopper``'s (safe)
    runs again, as its policy allows. No recorded model turn is asked again."""
    db.execute("INSERT INTO test_kills VALUES ('after:charge')")
    rid = _start(agent, "plan o-11", env_dsn)
    fleet.start("a")
    until_sync(lambda: _counts(db, "after:charge").get("killed") == 1, "the kill")
    fleet.start("b")
    until_sync(lambda: _status(db, rid)[0] == "completed", "the run to complete")
    assert _counts(db, "o-11") == expected


def test_an_approval_parks_and_resumes_from_another_process(
        db: psycopg.Connection[Any], fleet: Fleet, env_dsn: str) -> None:
    rid = _start("cashier", "buy o-12", env_dsn)
    a = fleet.start("a")
    until_sync(lambda: _status(db, rid)[0] == "waiting", "the park")
    assert _status(db, rid) == ("waiting", "approval", None)  # no worker holds it
    a.kill()  # the worker that parked it is gone
    ref = f"{rid}:approval"
    cli_signal(env_dsn, "approval", ref, True)
    fleet.start("b")
    until_sync(lambda: _status(db, rid)[0] == "completed", "the run to complete")
    assert _counts(db, "o-12") == {"model": 3, "search": 1, "charge": 1}
    charged_by = db.execute("SELECT pid FROM test_ledger WHERE event = 'charge'").fetchone()
    assert charged_by == (fleet.workers[1].pid,)


def test_a_stream_followed_across_a_crash_has_no_gap_and_no_duplicate(
        db: psycopg.Connection[Any], fleet: Fleet, env_dsn: str) -> None:
    """A reader follows the run from another process while its worker is SIGKILLed;
    what it read, and a re-read from a cursor taken before the crash, are the events of
    an uninterrupted run of the same agent, each once, with consecutive seqs."""
    clean = _start("planner", "plan o-20", env_dsn)
    fleet.start("clean")
    until_sync(lambda: _status(db, clean)[0] == "completed", "the uninterrupted run")
    db.execute("INSERT INTO test_kills VALUES ('before:charge')")
    crashed = _start("planner", "plan o-21", env_dsn, queue="crash")
    reader = subprocess.Popen([sys.executable, "-c", _READER, env_dsn, crashed], cwd=ROOT,
                              env=fleet.env, stdout=subprocess.PIPE, text=True)
    fleet.start("a", queues="crash")
    until_sync(lambda: _counts(db, "before:charge").get("killed") == 1, "the kill")
    before_crash = max(s for s, _ in _events(db, crashed))
    fleet.start("b", queues="crash")
    out, _ = reader.communicate(timeout=WAIT_LIMIT)
    assert reader.returncode == 0
    read = [json.loads(line) for line in out.splitlines()]
    assert [s for s, _ in read] == list(range(1, len(read) + 1))
    stored = _events(db, crashed)
    assert [(s, _shape(e)) for s, e in read] == [(s, _shape(e)) for s, e in stored]
    expected = _merged([_shape(e) for _, e in _events(db, clean)])
    assert _merged([_shape(e) for _, e in stored]) == [x.replace("o-20", "o-21")
                                                       for x in expected]
    assert "".join(e["text"] for _, e in stored if e.get("type") == "text") == \
        "done: 3 hits for o-21; charged 42 for o-21"  # the text once, whole
    # a reader resuming from the cursor it had at the crash gets exactly the rest
    rest = asyncio.run(_read(env_dsn, crashed, before_crash))
    assert rest == [(s, _shape(e)) for s, e in stored if s > before_crash]
    assert 0 < before_crash < len(stored)


async def _read(dsn: str, rid: str, after: int) -> list[tuple[int, str]]:
    app = pgdurable.Durable(dsn)
    try:
        return [(ev.seq, _shape(ev.event)) async for ev in app.stream(rid, after=after)]
    finally:
        await app.close()


_READER = """
import asyncio, json, sys
import pgdurable
async def main():
    app = pgdurable.Durable(sys.argv[1])
    async for ev in app.stream(sys.argv[2]):
        print(json.dumps([ev.seq, ev.event]), flush=True)
    await app.close()
asyncio.run(main())
"""


def test_a_worker_of_another_revision_does_not_take_the_run(
        db: psycopg.Connection[Any], fleet: Fleet, env_dsn: str) -> None:
    """The run records its agent's revision; a worker whose agents are revision 2
    claims a run started after it (``ping``) but leaves the revision-1 run alone."""
    rid = _start("planner", "plan o-30", env_dsn)
    fleet.start("v2", env={"PA_REVISION": "2"})
    ping = _start_task("ping", env_dsn)
    until_sync(lambda: _status(db, ping)[0] == "completed", "the ping")
    assert _status(db, rid)[0] == "runnable"
    assert db.execute("SELECT revision, attempts FROM pgdurable.runs WHERE id = %s",
                      (rid,)).fetchone() == ("1", 0)
    fleet.start("v1")
    until_sync(lambda: _status(db, rid)[0] == "completed", "the run to complete")


@pytest.mark.crash
def test_a_run_crashed_on_revision_1_is_not_taken_by_a_revision_2_worker(
        db: psycopg.Connection[Any], fleet: Fleet, env_dsn: str) -> None:
    """The revision-1 worker dies mid-run (two steps recorded); only a revision-2 worker
    is left. Its lease lapses, the revision-2 worker claims work after that (a ``ping``)
    but never the crashed run, which calls no model and no tool there; a revision-1
    worker then finishes it from its checkpoint."""
    db.execute("INSERT INTO test_kills VALUES ('before:charge')")
    rid = _start("planner", "plan o-31", env_dsn)
    fleet.start("v1")
    until_sync(lambda: _counts(db, "before:charge").get("killed") == 1, "the kill")
    steps = _steps(db, rid)
    assert len(steps) == 3  # model, search, model: recorded before the kill
    v2 = fleet.start("v2", env={"PA_REVISION": "2"})
    until_sync(lambda: db.execute("SELECT lease_expires_at < now() FROM pgdurable.runs "
                                  "WHERE id = %s", (rid,)).fetchone() == (True,),
               "the crashed run's lease to lapse")
    ping = _start_task("ping", env_dsn)
    until_sync(lambda: _status(db, ping)[0] == "completed", "the ping, after the lapse")
    assert db.execute("SELECT revision, status <> 'completed' FROM pgdurable.runs "
                      "WHERE id = %s", (rid,)).fetchone() == ("1", True)
    assert _steps(db, rid) == steps  # no step was run (or replayed) on revision 2
    assert _counts(db, "o-31") == {"model": 2, "search": 1}  # nothing ran on revision 2
    assert db.execute("SELECT count(*) FROM test_ledger WHERE pid = %s",
                      (v2.pid,)).fetchone() == (0,)
    fleet.start("v1b")
    until_sync(lambda: _status(db, rid)[0] == "completed", "the run to complete on revision 1")
    # (planner's charge_card reconciles: it was killed started, before its side effect)
    assert _counts(db, "o-31") == {"model": 3, "search": 1, "reconcile": 1, "charge": 1}


def _start(agent: str, prompt: str, dsn: str, *, queue: str = "default") -> str:
    async def go() -> str:
        app, agents = build(dsn)
        try:
            return await start_agent(app, agents[agent], prompt, queue=queue)
        finally:
            await app.close()

    return asyncio.run(go())


def _start_task(task: str, dsn: str) -> str:
    async def go() -> str:
        app, _ = build(dsn)
        try:
            return await app.start(task, None)
        finally:
            await app.close()

    return asyncio.run(go())
