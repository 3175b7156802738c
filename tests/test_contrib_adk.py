"""pgdurable.contrib.adk: Google ADK agents as durable runs (tests/_adk_app.py).

A scripted ``BaseLlm`` stands in for Gemini. Worker processes are SIGKILLed between
the two tools; a confirmation parks the run and another process resumes it; a
long-running tool parks until its result is signalled. What ran is counted in
``test_ledger`` (rows the model and the tools commit before they return).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest

pytest.importorskip("google.adk")

from _adk_app import build
from _agent_ledger import TABLES, cli_signal
from _waiting import WAIT_LIMIT, app_running, until, until_sync

import pgdurable
from pgdurable.contrib.adk import answer, register_agent, run_agent
from pgdurable.contrib.adk.plugin import tool_key

if TYPE_CHECKING:
    from fix_fleet import Fleet

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.fleet("_adk_app:app")


@pytest.fixture
def db(dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[psycopg.Connection[Any]]:
    monkeypatch.setenv("PGDURABLE_DSN", dsn)  # the test app's ledger connects with it
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)
        yield conn


def _pids(db: psycopg.Connection[Any], event: str, order: str) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT pid FROM test_ledger WHERE event = %s AND tag LIKE %s || '%%' ORDER BY at",
        (event, order))]


def _run(db: psycopg.Connection[Any], rid: str) -> dict[str, Any]:
    row = db.execute("SELECT status, wait_kind, wait_ref, lease_owner, state, result "
                     "FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return dict(zip(["status", "wait_kind", "wait_ref", "owner", "state", "result"], row,
                    strict=True))


def _start(dsn: str, agent: str, text: str) -> str:
    async def go() -> str:
        app = build(dsn)
        async with app:
            return await run_agent(app, agent, text, user_id="u-7")

    return asyncio.run(go())


async def test_a_run_records_model_and_tool_calls_and_streams_its_events(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    app = build(dsn)
    async with app:
        rid = await run_agent(app, "desk", "pay o-1", user_id="u-7", metadata={"user": "u-7"})
        async with app_running(app):
            result = await app.result(rid, timeout=WAIT_LIMIT)
            events = [e.event async for e in app.stream(rid)]
    assert result == {"final_output": "done: found o-1; paid o-1", "model_calls": 3,
                      "tool_calls": 2}
    keys = [r[0] for r in db.execute("SELECT key FROM pgdurable.effects WHERE run_id = %s "
                                     "ORDER BY key", (rid,))]
    assert keys == sorted(["model:1", "model:2", "model:3", tool_key("search", {"q": "o-1"}),
                           tool_key("pay", {"order": "o-1"})])
    usage = db.execute(
        "SELECT sum((result->'usage_metadata'->>'prompt_token_count')::int),"
        "       sum((result->'usage_metadata'->>'candidates_token_count')::int)"
        "  FROM pgdurable.effects WHERE run_id = %s AND key LIKE 'model:%%'", (rid,)).fetchone()
    assert usage == (33, 12)
    authors = [e.get("author") for e in events[:-1]]
    assert authors == ["desk"] * 5  # call, response, call, response, answer
    assert events[-1]["type"] == "end"


@pytest.mark.crash
def test_sigkill_between_the_two_tools(dsn: str, db: psycopg.Connection[Any],
                                       fleet: Fleet) -> None:
    db.execute("INSERT INTO test_kills VALUES ('before:pay')")
    rid = _start(dsn, "desk", "pay o-2")
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: a.poll() is not None, "worker a to die in `pay`")
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert _pids(db, "model", "o-2") == [a.pid, a.pid, b.pid]  # the recorded turns: once
    assert _pids(db, "search", "o-2") == [a.pid]
    assert _pids(db, "pay", "o-2") == [b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: found o-2; paid o-2"
    # the stream: each event once, consecutive seqs, across the crash
    seqs = [r[0] for r in db.execute("SELECT seq FROM pgdurable.run_events WHERE run_id = %s "
                                     "ORDER BY seq", (rid,))]
    assert seqs == list(range(1, 7))


@pytest.mark.crash
def test_a_confirmation_parks_and_resumes_from_another_process(
        dsn: str, db: psycopg.Connection[Any], fleet: Fleet) -> None:
    rid = _start(dsn, "counter", "buy o-3")
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "waiting", "the park")
    run = _run(db, rid)
    assert (run["wait_kind"], run["wait_ref"], run["owner"]) == ("approval", f"{rid}:1", None)
    assert run["state"]["pending"][0]["kind"] == "confirmation"
    assert run["state"]["pending"][0]["tool"] == "pay"
    assert run["state"]["pending"][0]["args"] == {"order": "o-3"}
    a.kill()
    cli_signal(dsn, "approval", f"{rid}:1", True)
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert _pids(db, "model", "o-3") == [a.pid, a.pid, b.pid]
    assert _pids(db, "search", "o-3") == [a.pid]
    assert _pids(db, "pay", "o-3") == [b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: found o-3; paid o-3"
    kinds = [r[0] for r in db.execute(
        "SELECT coalesce(event->>'type', event->>'author') FROM pgdurable.run_events "
        "WHERE run_id = %s ORDER BY seq", (rid,))]
    assert kinds.count("approval_requested") == 1 and kinds[-1] == "end"
    # the step that resumed replayed the first part of the invocation: not streamed again
    calls = [p["function_call"]["name"] for (e,) in db.execute(
        "SELECT event FROM pgdurable.run_events WHERE run_id = %s", (rid,))
        for p in (e.get("content") or {}).get("parts", []) if "function_call" in p]
    assert calls == ["search", "pay", "adk_request_confirmation"]


async def test_a_rejection_and_a_long_running_tool(dsn: str,
                                                   db: psycopg.Connection[Any]) -> None:
    app = build(dsn)
    async with app:
        rejected = await run_agent(app, "counter", "buy o-4")
        ticket = await run_agent(app, "tickets", "help o-5")
        async with app_running(app):
            async def parked() -> bool:
                return all(_run(db, r)["status"] == "waiting" for r in (rejected, ticket))

            await until(parked, "both parks")
            assert _run(db, ticket)["state"]["pending"] == [
                {"position": 0, "kind": "long_running", "tool": "open_ticket",
                 "args": {"order": "o-5"}}]
            await app.signal("approval", f"{rejected}:1", {"confirmed": False})
            await app.signal("approval", f"{ticket}:1", {"resolution": "fixed by ana"})
            r1 = await app.result(rejected, timeout=WAIT_LIMIT)
            r2 = await app.result(ticket, timeout=WAIT_LIMIT)
    assert _pids(db, "pay", "o-4") == []
    assert "rejected" in r1["final_output"].lower()
    assert _pids(db, "ticket", "o-5") != [] and len(_pids(db, "ticket", "o-5")) == 1
    assert r2["final_output"] == "done: found o-5; {'resolution': 'fixed by ana'}"


async def test_a_model_error_is_retried_and_a_tool_error_reaches_the_agents_callback(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """``flaky``'s model drops its connection once: the step's retry calls it again
    (``model:1#2``) and the run completes. ``clerk``'s ``decline`` raises: the agent's
    ``on_tool_error_callback`` answers, as without the plugin, and the answer is
    recorded; its ``before_model_callback`` and ``after_model_callback`` run once per
    model call (the latter's answer replaces the response)."""
    app = build(dsn)
    async with app:
        flaky = await run_agent(app, "flaky", "pay o-6")
        clerk = await run_agent(app, "clerk", "pay o-7")
        async with app_running(app):
            r1 = await app.result(flaky, timeout=WAIT_LIMIT)
            r2 = await app.result(clerk, timeout=WAIT_LIMIT)
    assert r1["final_output"] == "done: found o-6; paid o-6"
    assert len(_pids(db, "flake", "o-6")) == 1 and len(_pids(db, "model", "o-6")) == 3
    assert len(_pids(db, "search", "o-6")) == len(_pids(db, "pay", "o-6")) == 1
    models = db.execute("SELECT key, status, error->>'type' FROM pgdurable.effects "
                        "WHERE run_id = %s AND key LIKE 'model:%%' ORDER BY key",
                        (flaky,)).fetchall()
    assert models == [("model:1", "failed", "ConnectionError"),
                      ("model:1#2", "succeeded", None), ("model:2", "succeeded", None),
                      ("model:3", "succeeded", None)]
    assert r2["final_output"] == "done: found o-7; error: card declined for o-7 (checked)"
    assert len(_pids(db, "decline", "o-7")) == len(_pids(db, "tool_error", "o-7")) == 1
    for callback in ("before_model", "after_model"):
        assert len(db.execute("SELECT 1 FROM test_ledger WHERE event = %s",
                              (callback,)).fetchall()) == 3


@pytest.mark.crash
@pytest.mark.parametrize(("agent", "pays", "reconciles"), [("till", 1, 1), ("desk", 2, 0)])
def test_sigkill_after_a_side_effect_follows_the_tools_replay_policy(
        dsn: str, db: psycopg.Connection[Any], fleet: Fleet, agent: str, pays: int,
        reconciles: int) -> None:
    """Killed after paying, before the call was recorded: ``till``'s ``pay``
    (``register_agent(..., reconcile={"pay": reconcile_pay})``) is reconciled, not paid
    again; ``desk``'s (safe, the default) runs again. No recorded model call again."""
    db.execute("INSERT INTO test_kills VALUES ('after:pay')")
    rid = _start(dsn, agent, "pay o-8")
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: a.poll() is not None, "worker a to die after `pay`")
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert len(_pids(db, "pay", "o-8")) == pays
    assert len(_pids(db, "reconcile", "o-8")) == reconciles
    assert _pids(db, "model", "o-8") == [a.pid, a.pid, b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: found o-8; paid o-8"


@pytest.mark.crash
def test_two_concurrent_calls_of_one_tool_keep_their_results_across_a_replay(
        dsn: str, db: psycopg.Connection[Any], fleet: Fleet) -> None:
    """``pair``'s model asks for ``pay(a-o-9)`` and ``pay(b-o-9)`` in one response; ADK
    runs them concurrently. The worker dies after ``b``'s side effect, ``a`` recorded;
    the replay meets them in the other order. Each call gets its own record (keyed by
    its arguments, not by arrival): ``a`` is not paid again, ``b`` (safe) is, and the
    model reads each result for its own call."""
    db.execute("INSERT INTO test_kills VALUES ('after:pay:b-o-9')")
    rid = _start(dsn, "pair", "pay o-9")
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: a.poll() is not None, "worker a to die after `pay(b-o-9)`")
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert _pids(db, "pay", "a-o-9") == [a.pid]
    assert _pids(db, "pay", "b-o-9") == [a.pid, b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: paid a-o-9; paid b-o-9"
    keys = {r[0] for r in db.execute("SELECT key FROM pgdurable.effects WHERE run_id = %s "
                                     "AND key LIKE 'tool:%%'", (rid,))}
    assert keys == {tool_key("pay", {"order": "a-o-9"}), tool_key("pay", {"order": "b-o-9"})}


def test_reconcile_names_a_tool_of_the_agent(dsn: str) -> None:
    from _adk_app import ScriptedLlm, pay
    from google.adk.agents import LlmAgent

    app = pgdurable.Durable(dsn)
    agent = LlmAgent(name="x", model=ScriptedLlm(), tools=[pay])
    with pytest.raises(ValueError, match="not a tool"):
        register_agent(app, agent, name="x", reconcile={"refund": lambda order: None})
    assert tool_key("pay", {"order": "o", "n": 1}) == tool_key("pay", {"n": 1, "order": "o"})
    assert tool_key("pay", {"order": "o"}, 2).endswith(":2")


def test_answer_payloads() -> None:
    one = [{"position": 0, "kind": "confirmation", "id": "x", "name": "adk_request_confirmation"}]
    part = answer(one, True)[0].function_response
    assert part is not None and part.response == {"confirmed": True} and part.id == "x"
    two = [*one, {"position": 1, "kind": "long_running", "id": "y", "name": "open_ticket"}]
    parts = answer(two, {"1": "ok"})
    assert [p.function_response.response for p in parts if p.function_response] == [
        {"result": "ok"}]
    assert len(answer(two, [False, {"a": 1}])) == 2
    with pytest.raises(ValueError):
        answer(one, "yes")
    with pytest.raises(ValueError):
        answer(two, "yes")
