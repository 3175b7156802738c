"""pgdurable.contrib.openai_agents: the session protocol and durable agent runs,
with real processes (tests/_agents_app.py) and the SDK's fake-model approach."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytest.importorskip("agents")

from _agent_ledger import TABLES, cli_signal
from _waiting import WAIT_LIMIT, until_sync
from fix_fleet import Fleet

import pgdurable
from pgdurable.contrib.openai_agents import PgDurableSession, run_agent

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)
        yield conn


def _env(dsn: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", "PGDURABLE_DSN": dsn,
            "OPENAI_AGENTS_DISABLE_TRACING": "1", "OPENAI_API_KEY": "unused-no-network"}


async def test_session_protocol_round_trip(dsn: str) -> None:
    s = PgDurableSession("s1", dsn)
    other = PgDurableSession("s2", dsn)
    try:
        assert await s.get_items() == [] and await s.pop_item() is None
        await s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        await s.add_items([{"role": "assistant", "content": "c"}])
        await other.add_items([{"role": "user", "content": "x"}])
        assert [i["content"] for i in await s.get_items()] == ["a", "b", "c"]
        assert [i["content"] for i in await s.get_items(limit=2)] == ["b", "c"]
        assert (await s.pop_item())["content"] == "c"
        await s.add_items([{"role": "user", "content": "d"}], key="k")
        await s.add_items([{"role": "user", "content": "d"}], key="k")  # idempotent
        assert [i["content"] for i in await s.get_items()] == ["a", "b", "d"]
        await s.clear_session()
        assert await s.get_items() == []
        assert [i["content"] for i in await other.get_items()] == ["x"]
        with pytest.raises(ValueError):
            PgDurableSession("", dsn)
        with pytest.raises(TypeError):
            PgDurableSession("s", 42)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await other.add_items({"role": "user"})  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await other.get_items(limit=-1)
        assert len(await other.get_items()) == 1
    finally:
        await s.close()
        await other.close()


def test_concurrent_add_items_from_processes_keep_order_and_lose_nothing(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    procs = [subprocess.Popen([sys.executable, str(TESTS / "_agents_app.py"), "add", "shared",
                               f"p{k}", "30"], env=_env(dsn), cwd=ROOT)
             for k in range(4)]
    for p in procs:
        assert p.wait(timeout=WAIT_LIMIT * 2) == 0
    items = [r[0]["content"] for r in db.execute(
        "SELECT item FROM pgdurable.session_get_items('shared', NULL)")]
    assert len(items) == 4 * 30 * 3 and len(set(items)) == len(items)
    # each call's three items stay together and in order
    for i in range(0, len(items), 3):
        tag, call, _ = items[i].split(":")
        assert items[i:i + 3] == [f"{tag}:{call}:{j}" for j in range(3)]
    # each process's calls appear in the order it made them
    for k in range(4):
        calls = [int(x.split(":")[1]) for x in items[::3] if x.startswith(f"p{k}:")]
        assert calls == list(range(30))


def _ledger(db: psycopg.Connection[Any], event: str) -> list[tuple[int, str]]:
    return [(r[0], r[1]) for r in db.execute(
        "SELECT pid, tag FROM test_ledger WHERE event = %s ORDER BY at", (event,))]


@pytest.mark.crash
@pytest.mark.fleet("_agents_app:app", ttl=2.0, poll=0.5, grace=5.0, concurrency=16,
                   env={"OPENAI_AGENTS_DISABLE_TRACING": "1",
                        "OPENAI_API_KEY": "unused-no-network"})
def test_sigkill_mid_agent_run_resumes_without_repeating_model_calls_or_tools(
    dsn: str, db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    from _agents_app import build

    async def start(text: str) -> str:
        app = build(dsn)
        async with app:
            return await run_agent(app, "shop", text, session_id="cust-1")

    def status(rid: str) -> tuple[Any, ...]:
        row = db.execute("SELECT status, result, error FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone()
        assert row is not None
        return tuple(row)

    a = fleet.start("a")
    rid = asyncio.run(start("buy the thing"))
    assert a.wait(timeout=WAIT_LIMIT) == -signal.SIGKILL  # killed itself in tool `crash`
    b = fleet.start("b")
    try:
        until_sync(lambda: status(rid)[0] == "completed", "worker b to finish the run")
        # before the kill: model call 1 (-> charge), charge, model call 2 (-> crash): all
        # recorded, so none ran again; crash ran again (its result was never recorded)
        assert _ledger(db, "model") == [(a.pid, "1:0"), (a.pid, "1:1"), (b.pid, "1:2")]
        assert _ledger(db, "charge") == [(a.pid, "5")]
        assert _ledger(db, "killed") == [(a.pid, "")]
        assert _ledger(db, "crash-ok") == [(b.pid, "")]
        assert status(rid)[1]["final_output"] == "done after 1 user message(s)"
        # the conversation continues in the same session
        rid2 = asyncio.run(start("and again"))
        until_sync(lambda: status(rid2)[0] == "completed", "the second run")
        assert status(rid2)[1]["final_output"] == "done after 2 user message(s)"
        items = [r[0] for r in db.execute(
            "SELECT item FROM pgdurable.session_get_items('cust-1', NULL)")]
        kinds = [i.get("type", i.get("role")) for i in items]
        turn = ["user", "function_call", "function_call_output", "function_call",
                "function_call_output", "message"]
        assert kinds == turn + turn, kinds
        assert len(_ledger(db, "charge")) == 2
    finally:
        b.kill()


# -- the SDK's scripted model: SIGKILL, approvals through RunState, run_streamed ---------


@pytest.fixture
def kills(db: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    return db  # (test_kills is made with test_ledger)


def _start(dsn: str, agent: str, text: str, *, session: str, queue: str = "default") -> str:
    from _agents_app import build

    async def go() -> str:
        app = build(dsn)
        async with app:
            return await run_agent(app, agent, text, session_id=session, queue=queue)

    return asyncio.run(go())


def _run(db: psycopg.Connection[Any], rid: str) -> dict[str, Any]:
    row = db.execute("SELECT status, wait_kind, wait_ref, lease_owner, state, result "
                     "FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return dict(zip(["status", "wait_kind", "wait_ref", "owner", "state", "result"], row,
                    strict=True))


def _tagged(db: psycopg.Connection[Any], event: str, order: str) -> list[int]:
    return [r[0] for r in db.execute(
        "SELECT pid FROM test_ledger WHERE event = %s AND tag LIKE %s || '%%' ORDER BY at",
        (event, order))]


def _stream(db: psycopg.Connection[Any], rid: str) -> list[tuple[int, str]]:
    """(seq, what) of the run's stored events, without ids that differ between runs
    (a text row: ``text:<its text>``)."""
    out = []
    for seq, e in db.execute("SELECT seq, event FROM pgdurable.run_events WHERE run_id = %s "
                             "ORDER BY seq", (rid,)):
        what = e.get("name") or (e.get("data") or {}).get("type") or e.get("agent") or \
            e.get("text") or ""
        out.append((int(seq), f"{e['type']}:{what}"))
    return out


def _merged(stream: list[tuple[int, str]]) -> list[str]:
    """The stream's kinds with consecutive text rows joined: how a run's text is cut into
    rows depends on timing (a flush every 100 ms), the text itself does not."""
    out: list[str] = []
    for _, what in stream:
        if what.startswith("text:") and out and out[-1].startswith("text:"):
            out[-1] += what[len("text:"):]
        else:
            out.append(what)
    return out


@pytest.mark.crash
@pytest.mark.fleet("_agents_app:app")
def test_sigkill_through_the_streamed_runner_between_two_tools(
        dsn: str, kills: psycopg.Connection[Any], fleet: Any) -> None:
    """``Runner.run_streamed`` with the SDK's ScriptedModel: the worker dies in the second
    tool, before its side effect; another worker finishes the run. The first tool and the
    recorded model calls ran once; the run's stream holds the events of an uninterrupted
    run, each once, with consecutive seqs."""
    db = kills
    clean = _start(dsn, "teller", "pay o-1", session="s-clean")
    fleet.start("clean", poll=0.5)
    until_sync(lambda: _run(db, clean)["status"] == "completed", "the uninterrupted run")
    db.execute("INSERT INTO test_kills VALUES ('before:pay')")
    rid = _start(dsn, "teller", "pay o-2", session="s-crash", queue="crash")
    a = fleet.start("a", queues="crash", poll=0.5)
    until_sync(lambda: a.poll() is not None, "worker a to die in `pay`")
    b = fleet.start("b", queues="crash", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert _tagged(db, "model", "o-2") == [a.pid, a.pid, b.pid]
    assert _tagged(db, "search", "o-2") == [a.pid]
    assert _tagged(db, "pay", "o-2") == [b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: found o-2; paid o-2"
    stream = _stream(db, rid)
    assert [s for s, _ in stream] == list(range(1, len(stream) + 1))
    kinds = _merged(stream)
    assert kinds == [k.replace("o-1", "o-2") for k in _merged(_stream(db, clean))]
    assert kinds.count("run_item_stream_event:tool_called") == 2
    assert kinds.count("raw_response_event:response.completed") == 3
    assert kinds.count("text:done: found o-2; paid o-2") == 1  # the text once, whole
    assert kinds[-1] == "end:"


async def test_streamed_text_goes_to_emit_text_and_usage_is_recorded(
        dsn: str, kills: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``teller`` streams its answer one character a delta: the stored text is the model's
    text, in far fewer rows than deltas, and no delta is a row of its own; every streamed
    model call records its usage, so the documented SQL adds it up."""
    from _agents_app import build
    from _waiting import app_running

    db = kills
    monkeypatch.setenv("PGDURABLE_DSN", dsn)
    app = build(dsn)
    async with app:
        rid = await run_agent(app, "teller", "pay o-6", session_id="s-text")
        async with app_running(app):
            result = await app.result(rid, timeout=WAIT_LIMIT)
    answer = result["final_output"]
    assert answer == "done: found o-6; paid o-6"
    rows = [e for (e,) in db.execute("SELECT event FROM pgdurable.run_events WHERE run_id = %s "
                                     "ORDER BY seq", (rid,))]
    texts = [e["text"] for e in rows if e["type"] == "text"]
    assert "".join(texts) == answer
    assert 1 <= len(texts) < len(answer) // 4  # a delta per character, a row per flush
    assert not [e for e in rows if (e.get("data") or {}).get("type")
                == "response.output_text.delta"]
    usage = db.execute(  # docs/frameworks.md, "Durable agent runs"
        "SELECT key, (result->'usage'->>'input_tokens')::int AS input_tokens, "
        "       (result->'usage'->>'output_tokens')::int AS output_tokens "
        "  FROM pgdurable.effects WHERE run_id = %s AND key LIKE 'model:%%' "
        "   AND status = 'succeeded' ORDER BY key", (rid,)).fetchall()
    assert usage == [("model:1", 7, 3), ("model:2", 7, 3), ("model:3", 7, 3)]


async def test_a_model_error_is_retried_not_recorded_as_the_runs_outcome(
        dsn: str, kills: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``flaky``'s model drops its connection on its first call: the step's attempt
    fails, its retry calls the model again (attempt ``model:1#2``) and the run completes;
    the tools ran once each."""
    from _agents_app import build
    from _waiting import app_running

    db = kills
    monkeypatch.setenv("PGDURABLE_DSN", dsn)
    app = build(dsn)
    async with app:
        rid = await run_agent(app, "flaky", "pay o-7", session_id="s-flaky")
        async with app_running(app):
            result = await app.result(rid, timeout=WAIT_LIMIT)
    assert result["final_output"] == "done: found o-7; paid o-7"
    assert len(_ledger(db, "flake")) == 1
    assert len(_tagged(db, "model", "o-7")) == 3  # each turn answered once
    assert len(_tagged(db, "search", "o-7")) == len(_tagged(db, "pay", "o-7")) == 1
    effects = db.execute("SELECT key, status, error->>'type' FROM pgdurable.effects "
                         "WHERE run_id = %s AND key LIKE 'model:%%' ORDER BY key",
                         (rid,)).fetchall()
    assert effects == [("model:1", "failed", "ConnectionError"),
                       ("model:1#2", "succeeded", None), ("model:2", "succeeded", None),
                       ("model:3", "succeeded", None)]


@pytest.mark.crash
@pytest.mark.fleet("_agents_app:app")
@pytest.mark.parametrize(("agent", "pays", "reconciles"), [("cashbox", 1, 1), ("teller", 2, 0)])
def test_sigkill_after_a_side_effect_follows_the_tools_replay_policy(
        dsn: str, kills: psycopg.Connection[Any], fleet: Any, agent: str, pays: int,
        reconciles: int) -> None:
    """Killed after paying, before the tool's output was recorded: ``cashbox``'s ``pay``
    (``register_agent(..., reconcile={"pay": reconcile_pay})``) is reconciled, not paid
    again; ``teller``'s (safe, the default) runs again. No recorded model call is made
    again."""
    db = kills
    db.execute("INSERT INTO test_kills VALUES ('after:pay')")
    rid = _start(dsn, agent, "pay o-8", session=f"s-{agent}")
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: a.poll() is not None, "worker a to die after `pay`")
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert len(_tagged(db, "pay", "o-8")) == pays
    assert len(_tagged(db, "reconcile", "o-8")) == reconciles
    assert _tagged(db, "model", "o-8") == [a.pid, a.pid, b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: found o-8; paid o-8"


def test_reconcile_names_a_tool_of_the_agent(dsn: str) -> None:
    from _agents_app import search
    from agents import Agent

    from pgdurable.contrib.openai_agents import register_agent

    app = pgdurable.Durable(dsn)
    agent = Agent(name="x", tools=[search])
    with pytest.raises(ValueError, match="not a tool"):
        register_agent(app, agent, name="x", reconcile={"pay": lambda order: None})
    with pytest.raises(TypeError):
        register_agent(app, agent, name="x", reconcile={"search": "nope"})  # type: ignore[dict-item]


@pytest.mark.crash
@pytest.mark.fleet("_agents_app:app")
def test_an_approval_parks_on_the_run_state_and_resumes_in_another_process(
        dsn: str, kills: psycopg.Connection[Any], fleet: Any) -> None:
    db = kills
    rid = _start(dsn, "store", "buy o-3", session="s-store")
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "waiting", "the park")
    run = _run(db, rid)
    assert (run["wait_kind"], run["wait_ref"], run["owner"]) == ("approval", f"{rid}:1", None)
    assert run["state"]["pending"] == [{"call_id": "p-o-3", "tool_name": "pay",
                                        "arguments": '{"order":"o-3"}'}]
    assert isinstance(run["state"]["run_state"], str)  # the SDK's serialized RunState
    a.kill()
    cli_signal(dsn, "approval", f"{rid}:1", True)
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: _run(db, rid)["status"] == "completed", "worker b to finish the run")
    assert _tagged(db, "model", "o-3") == [a.pid, a.pid, b.pid]
    assert _tagged(db, "search", "o-3") == [a.pid]
    assert _tagged(db, "pay", "o-3") == [b.pid]
    assert _run(db, rid)["result"]["final_output"] == "done: found o-3; paid o-3"
    items = [r[0] for r in db.execute(
        "SELECT item FROM pgdurable.session_get_items('s-store', NULL)")]
    assert [i.get("type", i.get("role")) for i in items] == [
        "user", "function_call", "function_call_output", "function_call",
        "function_call_output", "message"]


async def test_a_rejection_reaches_the_model_and_the_tool_never_runs(
        dsn: str, kills: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from _agents_app import build
    from _waiting import app_running, until

    db = kills
    monkeypatch.setenv("PGDURABLE_DSN", dsn)  # the test app's ledger
    app = build(dsn)
    async with app:
        rid = await run_agent(app, "store", "buy o-4", session_id="s-reject")
        async with app_running(app):
            async def parked() -> bool:
                return _run(db, rid)["status"] == "waiting"

            await until(parked, "the park")
            asked = [e for (e,) in db.execute(
                "SELECT event FROM pgdurable.run_events WHERE run_id = %s", (rid,))]
            assert asked[0]["type"] == "approval_requested"
            assert asked[0]["signal"] == ["approval", f"{rid}:1"]
            await app.signal("approval", f"{rid}:1",
                             {"p-o-4": {"approved": False, "message": "not today"}})
            result = await app.result(rid, timeout=WAIT_LIMIT)
    assert result["final_output"] == "done: found o-4; not today"
    assert _tagged(db, "pay", "o-4") == []


def test_apply_decision_payloads() -> None:
    from pgdurable.contrib.openai_agents import apply_decision

    class State:
        def __init__(self) -> None:
            self.approved: list[str] = []
            self.rejected: list[tuple[str, str | None]] = []

        def get_interruptions(self) -> list[Any]:
            from agents.items import ToolApprovalItem
            from openai.types.responses import ResponseFunctionToolCall

            return [ToolApprovalItem(agent=None, tool_name="pay", raw_item=ResponseFunctionToolCall(  # type: ignore[arg-type]
                type="function_call", call_id=c, name="pay", arguments="{}")) for c in ("a", "b")]

        def approve(self, item: Any) -> None:
            self.approved.append(item.raw_item.call_id)

        def reject(self, item: Any, rejection_message: str | None = None) -> None:
            self.rejected.append((item.raw_item.call_id, rejection_message))

    s = State()
    assert apply_decision(s, True) == 2 and s.approved == ["a", "b"]  # type: ignore[arg-type]
    s = State()
    assert apply_decision(s, {"approved": False, "message": "no"}) == 2  # type: ignore[arg-type]
    assert s.rejected == [("a", "no"), ("b", "no")]
    s = State()
    assert apply_decision(s, {"b": True}) == 1 and s.approved == ["b"]  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        apply_decision(State(), "yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        apply_decision(State(), {"a": "maybe"})  # type: ignore[arg-type]
