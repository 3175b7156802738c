"""pgdurable.contrib.openai_agents with budgets (issue 42): ``register_agent(...,
reserve=...)`` reserves from the run's budgets before each model call that is really
made and settles the usage of the SDK's ``ModelResponse``. The agents run on the SDK's
own scripted model (tests/_agents_app.py: 7 tokens in, 3 out a call), by an in-process
worker or by worker processes killed mid-run; every assertion reads the ledger
(``pgdurable.budget_ledger``) and what the model really did (``test_ledger``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from _budget_ledger import held, settled_twice

pytest.importorskip("agents")

from _agent_ledger import TABLES
from _waiting import app_running, finished, until, until_sync

from pgdurable import InvalidInput
from pgdurable.contrib.openai_agents import register_agent, run_agent

#: The scripted model's usage of one call (tests/_agents_app.py).
IN, OUT = 7, 3
PRICE_IN, PRICE_OUT = Decimal("0.001"), Decimal("0.002")


@pytest.fixture
def db(dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[psycopg.Connection[Any]]:
    monkeypatch.setenv("PGDURABLE_DSN", dsn)  # the test app's ledger() writes there
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLES)
        yield conn


def ledger(db: psycopg.Connection[Any], rid: str, kind: str) -> dict[str, dict[str, Decimal]]:
    """{reservation key: {unit: amount}} of the run's ``kind`` rows on tenant:acme; a
    (step, key, unit) settled twice would show as a sum above one call's usage."""
    out: dict[str, dict[str, Decimal]] = {}
    for rkey, unit, amount in db.execute(
            "SELECT rkey, unit, sum(amount) FROM pgdurable.budget_ledger WHERE run_id = %s "
            "AND budget_key = 'tenant:acme' AND kind = %s GROUP BY rkey, unit", (rid, kind)):
        out.setdefault(rkey, {})[unit] = amount
    return out


def model_calls(db: psycopg.Connection[Any], order: str) -> list[int]:
    """The pids that really called the scripted model for ``order``."""
    return [r[0] for r in db.execute("SELECT pid FROM test_ledger WHERE event = 'model' "
                                     "AND tag LIKE %s || ':%%' ORDER BY at", (order,))]


async def prices(app: Any) -> None:
    """The scripted model's price under the names ``metered`` and ``metered-stream``
    give it (their Model's class name)."""
    for name in ("ScriptedModel", "CharByChar"):
        await app.set_price(name, usd_per_token_in=PRICE_IN, usd_per_token_out=PRICE_OUT)


ONE_CALL = {"calls": Decimal(1), "tokens_in": Decimal(IN), "tokens_out": Decimal(OUT),
            "usd": IN * PRICE_IN + OUT * PRICE_OUT}
RESERVED = {"calls": Decimal(1), "tokens_in": Decimal(100), "tokens_out": Decimal(50),
            "usd": Decimal("0.05")}


def test_bad_reserve_is_refused_before_anything_is_registered(dsn: str) -> None:
    from _agents_app import scripted_model
    from agents import Agent

    import pgdurable

    app = pgdurable.Durable(dsn)
    agent = Agent(name="x", model=scripted_model())
    for bad, fragment in [({"eur": 1}, "unknown unit"), ({"calls": -1}, ">= 0"),
                          ({"usd": "1"}, "number"), ({}, "at least one unit")]:
        with pytest.raises(InvalidInput, match=fragment):
            register_agent(app, agent, name="x", reserve=bad)
    assert "x" not in app.tasks


@pytest.mark.parametrize(("agent", "priced"), [("metered", "ScriptedModel"),
                                               ("metered-stream", "CharByChar")])
async def test_each_model_call_reserves_and_settles_its_usage(
        dsn: str, db: psycopg.Connection[Any], agent: str, priced: str) -> None:
    """Three model calls (search, pay, the answer): each reserved what ``reserve``
    says and settled the usage the model returned (usd from the price table); the
    rest was released; nothing is held after the run."""
    from _agents_app import build

    app = build(dsn)
    async with app:
        await app.budget("tenant:acme", limit={"calls": 10, "usd": 1})
        await app.set_price(priced, usd_per_token_in=PRICE_IN, usd_per_token_out=PRICE_OUT)
        rid = await run_agent(app, agent, "pay o-1", session_id="s-1", budgets=["tenant:acme"])
        async with app_running(app):
            result = await app.result(rid, timeout=60)
    assert result["final_output"] == "done: found o-1; paid o-1"
    assert len(model_calls(db, "o-1")) == 3
    keys = ["model:1", "model:2", "model:3"]
    assert ledger(db, rid, "reserve") == dict.fromkeys(keys, RESERVED)
    assert ledger(db, rid, "settle") == dict.fromkeys(keys, ONE_CALL)
    rest = {u: RESERVED[u] - ONE_CALL[u] for u in ("tokens_in", "tokens_out", "usd")}
    assert ledger(db, rid, "release") == {k: rest for k in keys}
    # the recorded usage of each call (the effects) is what was settled
    usage = db.execute("SELECT result->'usage' FROM pgdurable.effects WHERE run_id = %s "
                       "AND key LIKE 'model:%%' ORDER BY key", (rid,)).fetchall()
    assert [(u["input_tokens"], u["output_tokens"]) for (u,) in usage] == [(IN, OUT)] * 3
    assert held(db) == 0


async def test_a_model_error_releases_its_reservation_and_the_retry_is_charged_once(
        dsn: str, db: psycopg.Connection[Any]) -> None:
    """``metered-flaky``'s model drops its connection on its first call: that call's
    reservation is released whole, the step's retry reserves again and settles; each
    of the three calls is charged once."""
    from _agents_app import build

    app = build(dsn)
    async with app:
        await app.budget("tenant:acme", limit={"calls": 10, "usd": 1})
        await app.set_price("Flaky", usd_per_token_in=PRICE_IN, usd_per_token_out=PRICE_OUT)
        rid = await run_agent(app, "metered-flaky", "pay o-5", session_id="s-5",
                              budgets=["tenant:acme"])
        async with app_running(app):
            result = await app.result(rid, timeout=60)
    assert result["final_output"] == "done: found o-5; paid o-5"
    flakes = db.execute("SELECT count(*) FROM test_ledger WHERE event = 'flake'").fetchone()
    assert flakes == (1,)
    rows = db.execute("SELECT step, rkey, kind, unit, amount FROM pgdurable.budget_ledger "
                      "WHERE run_id = %s AND rkey = 'model:1' AND unit = 'calls' ORDER BY id",
                      (rid,)).fetchall()
    # the failed attempt: reserved and released whole; the retry: reserved and settled
    assert [(k, a) for _, _, k, _, a in rows] == [("reserve", 1), ("release", 1),
                                                  ("reserve", 1), ("settle", 1)]
    settled = ledger(db, rid, "settle")
    assert sorted(settled) == ["model:1", "model:2", "model:3"]
    assert all(v == ONE_CALL for v in settled.values())
    assert held(db) == 0


@pytest.mark.parametrize("agent", ["metered", "metered-stream"])
async def test_fail_policy_fails_the_run_before_the_call_it_cannot_pay(
        dsn: str, db: psycopg.Connection[Any], agent: str) -> None:
    """A budget of 2 calls, policy fail: the third call's reservation fails the run
    with BudgetExceeded naming the budget; the model was called twice, charged twice."""
    from _agents_app import build

    app = build(dsn)
    async with app:
        await app.budget("tenant:acme", limit={"calls": 2}, policy="fail")
        await prices(app)
        rid = await run_agent(app, agent, "pay o-2", session_id="s-2",
                              budgets=["tenant:acme"])
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "BudgetExceeded"
    assert "tenant:acme" in info.error["message"]
    assert info.attempts == 1  # not retried
    assert len(model_calls(db, "o-2")) == 2
    assert ledger(db, rid, "settle") == dict.fromkeys(["model:1", "model:2"], ONE_CALL)
    assert held(db) == 0


@pytest.mark.parametrize("agent", ["metered", "metered-stream"])
async def test_park_policy_parks_and_a_raised_limit_resumes_without_charging_twice(
        dsn: str, db: psycopg.Connection[Any], agent: str) -> None:
    """A budget of 2 calls, policy park: the run parks before its third call (holding
    no worker); raising the limit wakes it; the step runs again from its start: the two
    recorded calls are replayed, not called nor charged again; the third is made once."""
    from _agents_app import build

    app = build(dsn)
    async with app:
        await app.budget("tenant:acme", limit={"calls": 2}, policy="park")
        await prices(app)
        rid = await run_agent(app, agent, "pay o-3", session_id="s-3",
                              budgets=["tenant:acme"])
        async with app_running(app):
            async def parked() -> bool:
                return (await app.get_run(rid)).status == "waiting"

            await until(parked, "the run parked on its budget")
            row = db.execute("SELECT wait_kind, wait_ref, lease_owner FROM pgdurable.runs "
                             "WHERE id = %s", (rid,)).fetchone()
            assert row == ("pgdurable.budget", "tenant:acme", None)
            assert len(model_calls(db, "o-3")) == 2
            await app.budget("tenant:acme", limit={"calls": 3}, policy="park")
            result = await app.result(rid, timeout=60)
    assert result["final_output"] == "done: found o-3; paid o-3"
    assert len(model_calls(db, "o-3")) == 3
    settled = ledger(db, rid, "settle")
    assert sorted(settled) == ["model:1", "model:2", "model:3"]
    assert all(v == ONE_CALL for v in settled.values())
    assert settled_twice(db, rid) == 0
    assert held(db) == 0


@pytest.mark.crash
@pytest.mark.fleet("_agents_app:app", env={"OPENAI_AGENTS_DISABLE_TRACING": "1",
                                           "OPENAI_API_KEY": "unused-no-network"})
def test_sigkill_mid_run_charges_each_model_call_once(
        dsn: str, db: psycopg.Connection[Any], fleet: Any) -> None:
    """Worker a makes two model calls (settled) and dies in ``pay``; worker b replays
    them from their records (no reservation, no charge) and makes the third: the
    ledger holds one settlement per call, and the reservation a's death left is not
    held any more."""
    from _agents_app import build

    async def start() -> str:
        app = build(dsn)
        async with app:
            await app.budget("tenant:acme", limit={"calls": 10, "usd": 1})
            await app.set_price("ScriptedModel", usd_per_token_in=PRICE_IN,
                                usd_per_token_out=PRICE_OUT)
            return await run_agent(app, "metered", "pay o-4", session_id="s-4",
                                   budgets=["tenant:acme"])

    def status(rid: str) -> str:
        row = db.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
        assert row is not None
        return str(row[0])

    db.execute("INSERT INTO test_kills VALUES ('before:pay')")
    rid = asyncio.run(start())
    a = fleet.start("a", poll=0.5)
    until_sync(lambda: a.poll() is not None, "worker a to die in `pay`")
    b = fleet.start("b", poll=0.5)
    until_sync(lambda: status(rid) == "completed", "worker b to finish the run")
    assert model_calls(db, "o-4") == [a.pid, a.pid, b.pid]
    settled = ledger(db, rid, "settle")
    assert sorted(settled) == ["model:1", "model:2", "model:3"]
    assert all(v == ONE_CALL for v in settled.values())
    assert settled_twice(db, rid) == 0
    row = db.execute("SELECT settled, held FROM pgdurable.budget_usage "
                     "WHERE budget_key = 'tenant:acme' AND unit = 'calls'").fetchone()
    assert row == (3, 0)
