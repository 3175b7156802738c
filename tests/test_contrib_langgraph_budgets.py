"""pgdurable.contrib.langgraph with budgets (issue 42): ``register_graph(...,
reserve=...)`` reserves from the run's budgets before each chat model call inside the
graph and settles the ``usage_metadata`` it reports (a LangChain callback handler).
The graph (tests/_langgraph_app.py, ``metered``: think -> pause -> answer) calls
LangChain's own fake chat model; it runs in an in-process worker or in worker processes
killed mid-graph; every assertion reads the ledger (``pgdurable.budget_ledger``) and
what the model really did (``test_ledger``)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from _budget_ledger import held, settled_twice

pytest.importorskip("langgraph")

from _agent_ledger import TABLES
from _waiting import app_running, finished, until, until_sync

import pgdurable
from pgdurable import InvalidInput
from pgdurable.contrib.langgraph import AsyncPgDurableSaver, register_graph, run_graph

PRICE_IN, PRICE_OUT = Decimal("0.001"), Decimal("0.002")
IN, OUT = 11, 4  # the fake model's usage_metadata (tests/_langgraph_app.py)
ONE_CALL = {"calls": Decimal(1), "tokens_in": Decimal(IN), "tokens_out": Decimal(OUT),
            "usd": IN * PRICE_IN + OUT * PRICE_OUT}
RESERVED = {"calls": Decimal(1), "tokens_in": Decimal(100), "tokens_out": Decimal(50),
            "usd": Decimal("0.05")}


@pytest.fixture
def db(dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[psycopg.Connection[Any]]:
    monkeypatch.setenv("PGDURABLE_DSN", dsn)  # the test app's ledger() writes there
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)
        yield conn


def ledger(db: psycopg.Connection[Any], rid: str, kind: str) -> dict[str, dict[str, Decimal]]:
    """{node: {unit: amount}} of the run's ``kind`` rows on tenant:acme (the key of a
    reservation is ``model:<node>:<task id>#<n>``); a call settled twice would show as
    a sum above one call's usage."""
    out: dict[str, dict[str, Decimal]] = {}
    for rkey, unit, amount in db.execute(
            "SELECT rkey, unit, sum(amount) FROM pgdurable.budget_ledger WHERE run_id = %s "
            "AND budget_key = 'tenant:acme' AND kind = %s GROUP BY rkey, unit", (rid, kind)):
        node = rkey.split(":")[1]
        assert node not in out or unit not in out[node], f"two reservations of {node}"
        out.setdefault(node, {})[unit] = amount
    return out


def model_calls(db: psycopg.Connection[Any], node: str) -> list[int]:
    """The pids whose chat model call in ``node`` answered."""
    return [r[0] for r in db.execute("SELECT pid FROM test_ledger WHERE event = 'model' "
                                     "AND tag = %s ORDER BY at", (node,))]


async def _setup(app: pgdurable.Durable, limit: dict[str, Any], policy: str = "fail") -> None:
    await app.budget("tenant:acme", limit=limit, policy=policy)
    await app.set_price("GenericFakeChatModel", usd_per_token_in=PRICE_IN,
                        usd_per_token_out=PRICE_OUT)


def test_bad_reserve_is_refused_before_anything_is_registered(dsn: str) -> None:
    from _langgraph_app import metered_graph

    app = pgdurable.Durable(dsn)
    graph = metered_graph(AsyncPgDurableSaver(dsn))
    for bad, fragment in [({"eur": 1}, "unknown unit"), ({"calls": -1}, ">= 0"),
                          ({"usd": "1"}, "number"), ({}, "at least one unit")]:
        with pytest.raises(InvalidInput, match=fragment):
            register_graph(app, graph, name="x", reserve=bad)
    assert "x" not in app.tasks


async def test_each_chat_model_call_reserves_and_settles_its_usage(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """Two chat model calls (think, answer): each reserved what ``reserve`` says and
    settled the model's usage_metadata (usd from the price table), the rest released."""
    from _langgraph_app import METERED_GRAPHS, build

    app, _ = build(dsn)
    async with app:
        await _setup(app, {"calls": 10, "usd": 1})
        rid = await run_graph(app, METERED_GRAPHS[id(app), "metered"], {"log": []},
                              thread_id="t-1", budgets=["tenant:acme"])
        async with app_running(app):
            result = await app.result(rid, timeout=60)
    assert result["log"] == ["think", "pause", "answer"]
    assert len(model_calls(db, "think")) == len(model_calls(db, "answer")) == 1
    assert ledger(db, rid, "reserve") == {"think": RESERVED, "answer": RESERVED}
    assert ledger(db, rid, "settle") == {"think": ONE_CALL, "answer": ONE_CALL}
    rest = {u: RESERVED[u] - ONE_CALL[u] for u in ("tokens_in", "tokens_out", "usd")}
    assert ledger(db, rid, "release") == {"think": rest, "answer": rest}
    assert held(db) == 0


async def test_a_streamed_call_without_usage_is_charged_what_was_reserved(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """Streamed (``stream_mode="messages"``), LangChain's fake chat model reports no
    usage: each call is charged one call and, for the other units, what was reserved
    (never less than it may have cost)."""
    from _langgraph_app import METERED_GRAPHS, build

    app, _ = build(dsn)
    async with app:
        await _setup(app, {"calls": 10, "usd": 1})
        rid = await run_graph(app, METERED_GRAPHS[id(app), "metered-stream"], {"log": []},
                              thread_id="t-2", budgets=["tenant:acme"])
        async with app_running(app):
            await app.result(rid, timeout=60)
    assert ledger(db, rid, "settle") == {"think": RESERVED, "answer": RESERVED}
    assert ledger(db, rid, "release") == {}
    assert held(db) == 0


async def test_fail_policy_fails_the_run_before_the_call_it_cannot_pay(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """A budget of 1 call, policy fail: answer's reservation fails the run with
    BudgetExceeded naming the budget; answer's model was never called."""
    from _langgraph_app import METERED_GRAPHS, build

    app, _ = build(dsn)
    async with app:
        await _setup(app, {"calls": 1})
        rid = await run_graph(app, METERED_GRAPHS[id(app), "metered"], {"log": []},
                              thread_id="t-3", budgets=["tenant:acme"])
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "BudgetExceeded"
    assert "tenant:acme" in info.error["message"]
    assert info.attempts == 1  # not retried
    assert (len(model_calls(db, "think")), len(model_calls(db, "answer"))) == (1, 0)
    assert ledger(db, rid, "settle") == {"think": ONE_CALL}
    assert held(db) == 0


async def test_park_policy_parks_and_a_raised_limit_resumes_without_charging_twice(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """A budget of 1 call, policy park: the run parks before answer's call (holding no
    worker); raising the limit wakes it; LangGraph continues the unfinished super-step:
    think is not run again, answer's call is made and charged once."""
    from _langgraph_app import METERED_GRAPHS, build

    app, _ = build(dsn)
    async with app:
        await _setup(app, {"calls": 1}, policy="park")
        rid = await run_graph(app, METERED_GRAPHS[id(app), "metered"], {"log": []},
                              thread_id="t-4", budgets=["tenant:acme"])
        async with app_running(app):
            async def parked() -> bool:
                return (await app.get_run(rid)).status == "waiting"

            await until(parked, "the run parked on its budget")
            row = db.execute("SELECT wait_kind, wait_ref, lease_owner FROM pgdurable.runs "
                             "WHERE id = %s", (rid,)).fetchone()
            assert row == ("pgdurable.budget", "tenant:acme", None)
            assert len(model_calls(db, "answer")) == 0
            await app.budget("tenant:acme", limit={"calls": 2}, policy="park")
            result = await app.result(rid, timeout=60)
    assert result["log"] == ["think", "pause", "answer"]
    assert (len(model_calls(db, "think")), len(model_calls(db, "answer"))) == (1, 1)
    assert ledger(db, rid, "settle") == {"think": ONE_CALL, "answer": ONE_CALL}
    assert settled_twice(db, rid) == 0
    assert held(db) == 0


@pytest.mark.crash
@pytest.mark.fleet("_langgraph_app:app", poll=0.5, concurrency=2, grace=5.0)
@pytest.mark.parametrize(("point", "think_calls"), [("after:think", 1), ("in:think", 2)])
def test_sigkill_mid_graph_charges_each_call_once(
        dsn: str, db: psycopg.Connection[Any], fleet: Any, point: str, think_calls: int) -> None:
    """Worker a dies mid-graph, worker b continues the run. ``after:think``: think's
    writes were saved, it is not run again. ``in:think``: a died after think's call was
    settled, before the node's writes: LangGraph runs the node again (its model is
    called again) under the same task id, and the reservation finds its settlement: the
    call is not charged twice. Either way one settlement per node, nothing held."""
    import asyncio

    from _langgraph_app import METERED_GRAPHS, build

    async def start() -> str:
        app, _ = build(dsn)
        async with app:
            await _setup(app, {"calls": 10, "usd": 1})
            return await run_graph(app, METERED_GRAPHS[id(app), "metered"], {"log": []},
                                   thread_id="t-5", budgets=["tenant:acme"])

    def status(rid: str) -> str:
        row = db.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
        assert row is not None
        return str(row[0])

    db.execute("INSERT INTO test_kills VALUES (%s)", (point,))
    rid = asyncio.run(start())
    a = fleet.start("a")
    until_sync(lambda: a.poll() is not None, f"worker a to die at {point}")
    b = fleet.start("b")
    until_sync(lambda: status(rid) == "completed", "worker b to finish the run")
    assert model_calls(db, "think") == [a.pid, b.pid][:think_calls]
    assert model_calls(db, "answer") == [b.pid]
    assert ledger(db, rid, "settle") == {"think": ONE_CALL, "answer": ONE_CALL}
    assert settled_twice(db, rid) == 0
    row = db.execute("SELECT settled, held FROM pgdurable.budget_usage "
                     "WHERE budget_key = 'tenant:acme' AND unit = 'calls'").fetchone()
    assert row == (2, 0)


def test_usage_is_read_from_messages_or_an_llms_token_usage() -> None:
    """What on_llm_end settles: the AIMessages' usage_metadata (summed over the
    generations), else an LLM's ``llm_output["token_usage"]``, else nothing measured."""
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, Generation, LLMResult

    from pgdurable.contrib.langgraph.budget import _usage

    def chat(tin: int, tout: int) -> ChatGeneration:
        return ChatGeneration(message=AIMessage("x", usage_metadata={
            "input_tokens": tin, "output_tokens": tout, "total_tokens": tin + tout}))

    assert _usage(LLMResult(generations=[[chat(11, 4)], [chat(1, 2)]])) == (12, 6)
    assert _usage(LLMResult(generations=[[Generation(text="x")]], llm_output={
        "token_usage": {"prompt_tokens": 30, "completion_tokens": 7}})) == (30, 7)
    assert _usage(LLMResult(generations=[[Generation(text="x")]])) is None
    assert _usage(LLMResult(generations=[[ChatGeneration(message=AIMessage("x"))]])) is None
