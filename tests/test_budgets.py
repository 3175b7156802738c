"""Spend control (issue 42): the transactional budget ledger.

In-process tests drive real workers of a Durable app against a real
database; the fleet test runs 4 worker processes (tests/_budget_app.py) drawing
from one budget under SIGKILL and SIGSTOP and samples the budget from SQL while
they run. Every assertion reads the database's own record (the ledger, the
holds, the runs).
"""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from _waiting import app_running, finished, until, until_sync
from fix_fleet import Fleet

import pgdurable
from pgdurable import (
    BudgetNotFound,
    Done,
    InvalidInput,
    LeaseLost,
    RunContext,
    Wait,
)

pytestmark = pytest.mark.fleet("_budget_app:app", concurrency=16, ttl=2.0, poll=1.0)

LEDGER_ROWS = "SELECT count(*) FROM pgdurable.budget_ledger"
LEDGER = ("SELECT kind, unit, amount FROM pgdurable.budget_ledger WHERE run_id = %s "
          "ORDER BY id")


def scalar(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def usage(conn: psycopg.Connection[Any], key: str, unit: str) -> tuple[Decimal, Decimal]:
    row = conn.execute("SELECT settled, held FROM pgdurable.budget_usage "
                       "WHERE budget_key = %s AND unit = %s", (key, unit)).fetchone()
    assert row is not None
    return row[0], row[1]


# -- bad input: a typed error, nothing written ----------------------------------


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"limit": {"usd": -1}}, ">= 0"),
    ({"limit": {"eur": 5}}, "unknown unit"),
    ({"limit": {"usd": float("nan")}}, "finite"),
    ({"limit": {"usd": "5"}}, "number"),
    ({"limit": {"usd": True}}, "number"),
    ({"limit": {}}, "at least one unit"),
    ({"limit": {"usd": 1}, "policy": "maybe"}, "policy"),
    ({"limit": {"usd": 1}, "window": timedelta(0)}, "> 0"),
    ({"limit": {"usd": 1}, "window": "1 day"}, "timedelta"),
    ({"limit": {"usd": 1}, "calendar": True}, "needs a window"),
])
async def test_budget_bad_input_writes_nothing(dsn: str, conn: psycopg.Connection[Any],
                                               kwargs: dict[str, Any], fragment: str) -> None:
    async with pgdurable.Durable(dsn) as app:
        with pytest.raises(InvalidInput, match=fragment):
            await app.budget("tenant:acme", **kwargs)
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budgets") == 0


def test_sql_refuses_bad_input(conn: psycopg.Connection[Any]) -> None:
    """The database's own checks, for callers that are not this library."""
    for limits, window, length, policy in [
        ('{"usd": -1}', "none", None, "park"),
        ('{"gold": 1}', "none", None, "park"),
        ('{"usd": "1"}', "none", None, "park"),
        ('{"usd": 1}', "fixed", "1 month", "park"),
        ('{"usd": 1}', "rolling", None, "park"),
        ('{"usd": 1}', "none", None, "later"),
    ]:
        with pytest.raises(psycopg.Error, match="budget") as err:
            conn.execute("SELECT pgdurable.budget_set('k', %s::jsonb, %s, %s::interval, %s)",
                         (limits, window, length, policy))
        assert err.value.sqlstate == "PD000"
        conn.rollback()
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budgets") == 0


async def test_start_with_unknown_budget_or_bad_limits_starts_nothing(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            return Done(None)

        await app.budget("tenant:acme", limit={"usd": 5})
        with pytest.raises(BudgetNotFound, match="no budget tenant:nope"):
            await app.start("t", {}, budgets=["tenant:acme", "tenant:nope"])
        with pytest.raises(InvalidInput, match="unknown unit"):
            await app.start("t", {}, budget={"eur": 1})
        with pytest.raises(InvalidInput, match=">= 0"):
            await app.start("t", {}, budget={"usd": -2})
        with pytest.raises(InvalidInput, match="list of budget keys"):
            await app.start("t", {}, budgets="tenant:acme")
        with pytest.raises(InvalidInput, match="budget key"):
            await app.start("t", {}, budgets=[""])
    assert scalar(conn, "SELECT count(*) FROM pgdurable.runs") == 0
    assert scalar(conn, "SELECT count(*) FROM pgdurable.run_budgets") == 0
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budgets") == 1


async def test_reserve_bad_input_in_a_step_writes_nothing(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    seen: list[str] = []
    async with pgdurable.Durable(dsn) as app:
        @app.task("bad")
        async def bad(ctx: RunContext, state: Any) -> Any:
            for amounts in ({"usd": -1}, {"eur": 1}, {}, {"usd": float("inf")}):
                try:
                    async with ctx.reserve(**amounts):
                        raise AssertionError("entered")
                except InvalidInput as exc:
                    seen.append(str(exc))
            async with ctx.reserve(usd=1) as r:
                try:
                    r.settle(usd=-3)
                except InvalidInput as exc:
                    seen.append(str(exc))
                r.settle(usd=0.25)
            # the database refuses what Python would: PD000, nothing written
            assert ctx._app is not None
            try:
                await ctx._app.fetchone(
                    "SELECT * FROM pgdurable.budget_reserve(%s, %s, %s, 0, 'x', %s::jsonb)",
                    (ctx.run_id, ctx.token, ctx._owner, '{"calls": -1}'))
            except InvalidInput as exc:
                seen.append(str(exc))
            return Done(None)

        await app.budget("b", limit={"usd": 5})
        rid = await app.start("bad", {}, budgets=["b"])
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert len(seen) == 6, seen
    assert "unknown unit 'eur'" in seen[1] and "calls must be a number >= 0" in seen[5]
    # only the one good reservation is in the ledger
    assert conn.execute(LEDGER, (rid,)).fetchall() == [
        ("reserve", "usd", Decimal(1)), ("settle", "usd", Decimal("0.25")),
        ("release", "usd", Decimal("0.75"))]


async def test_set_price_bad_input(dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        with pytest.raises(InvalidInput):
            await app.set_price("gpt", usd_per_token_in=-1, usd_per_token_out=0)
        with pytest.raises(InvalidInput):
            await app.set_price("", usd_per_token_in=1, usd_per_token_out=0)
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_prices") == 0


# -- reserve, settle, release, prices, views ------------------------------------


async def test_reserve_settle_returns_the_rest_and_prices_tokens(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        @app.task("agent")
        async def agent(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=0.40, tokens_in=3000, tokens_out=1000) as r:
                r.settle(model="m1", tokens_in=1000, tokens_out=500)  # usd from the price
            with pytest.raises(RuntimeError):
                async with ctx.reserve(usd=0.1, calls=1):
                    raise RuntimeError("the model call failed")  # released
            async with ctx.reserve(calls=1):
                pass  # not settled by name: charged what was reserved
            return Done(None)

        await app.set_price("m1", usd_per_token_in=Decimal("0.0001"),
                            usd_per_token_out=Decimal("0.0004"))
        await app.budget("tenant:acme", limit={"usd": 1, "calls": 10})
        rid = await app.start("agent", {}, budgets=["tenant:acme"], budget={"usd": 2})
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    for key in ("tenant:acme", f"run:{rid}"):
        assert usage(conn, key, "usd") == (Decimal("0.3000"), 0)  # 1000*0.0001 + 500*0.0004
        assert usage(conn, key, "calls") == (1, 0)
        assert usage(conn, key, "tokens_in") == (1000, 0)
    rows = conn.execute(
        "SELECT kind, unit, amount FROM pgdurable.budget_ledger WHERE run_id = %s "
        "AND budget_key = 'tenant:acme' AND rkey = 'r1' ORDER BY id", (rid,)).fetchall()
    assert sorted(rows) == [("release", "calls", 1), ("release", "usd", Decimal("0.1")),
                            ("reserve", "calls", 1), ("reserve", "usd", Decimal("0.1"))]
    assert scalar(conn, "SELECT sum(settled) FROM pgdurable.budget_model_spend "
                        "WHERE model = 'm1' AND unit = 'usd'") == Decimal("0.6000")
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_holds") == 0


async def test_fail_policy_fails_the_run_naming_the_budget(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        @app.task("big")
        async def big(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=state["usd"]) as r:
                r.settle(usd=state["usd"])
            return Done(None)

        await app.budget("tenant:small", limit={"usd": 1}, policy="fail")
        ok = await app.start("big", {"usd": 0.75}, budgets=["tenant:small"])
        async with app_running(app):
            assert (await finished(app, ok)).status == "completed"
            over = await app.start("big", {"usd": 0.5}, budgets=["tenant:small"])
            too_big = await app.start("big", {"usd": 3}, budgets=["tenant:small"])
            infos = [await finished(app, over), await finished(app, too_big)]
    for info in infos:
        assert info.status == "failed"
        assert info.error is not None and info.error["type"] == "BudgetExceeded"
        assert "tenant:small" in info.error["message"]
        assert info.attempts == 1  # not retried
    assert usage(conn, "tenant:small", "usd") == (Decimal("0.75"), 0)


async def test_replayed_step_is_not_charged_twice_and_a_zombie_is_refused(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    idents: list[tuple[Any, ...]] = []
    async with pgdurable.Durable(dsn) as app:
        @app.task("flaky", max_attempts=3, retry_base=0.01)
        async def flaky(ctx: RunContext, state: Any) -> Any:
            idents.append((ctx.run_id, ctx.token, ctx._owner))
            async with ctx.reserve(usd=1) as r:
                r.settle(usd=0.5)
            if ctx.attempt == 1:
                raise RuntimeError("crash after the settlement, before the checkpoint")
            return Done(r.replayed)

        await app.budget("b", limit={"usd": 10})
        rid = await app.start("flaky", {}, budgets=["b"])
        async with app_running(app):
            info = await finished(app, rid)
        assert info.status == "completed" and info.result is True
        assert usage(conn, "b", "usd") == (Decimal("0.5"), 0)
        assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger "
                            "WHERE kind = 'settle'") == 1
        before = scalar(conn, LEDGER_ROWS)
        # the first attempt's ident is a zombie's now: refused, nothing written
        for ident in idents:
            with pytest.raises(LeaseLost):
                await app.fetchone(
                    "SELECT * FROM pgdurable.budget_reserve(%s, %s, %s, 5, 'z', %s::jsonb)",
                    (*ident, '{"usd": 1}'))
            with pytest.raises(LeaseLost):
                await app.fetchone(
                    "SELECT pgdurable.budget_settle(%s, %s, %s, 0, 'r0', %s::jsonb, NULL)",
                    (*ident, '{"usd": 9}'))
    assert scalar(conn, LEDGER_ROWS) == before


async def test_parent_with_ten_children_shares_its_budget(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Children draw from the parent's own budget: 10 children each wanting 1.5 of
    the parent's 10 usd, run concurrently: exactly 6 get it, 4 fail naming it."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("child", max_attempts=1)
        async def child(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=1.5) as r:
                r.settle(usd=1.5)
            return Done(None)

        @app.task("parent")
        async def parent(ctx: RunContext, state: Any) -> Any:
            if ctx.wake is None:
                ids = [await ctx.start_child("child", {}, key=f"c{i}") for i in range(10)]
                return Wait.children(ids)
            return Done(sorted(v["status"] for v in ctx.wake["children"].values()))

        rid = await app.start("parent", {}, budget={"usd": 10})
        async with app_running(app, concurrency=11):
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert info.result == ["completed"] * 6 + ["failed"] * 4
    assert usage(conn, f"run:{rid}", "usd") == (Decimal("9.0"), 0)
    errors = [r[0] for r in conn.execute(
        "SELECT error->>'message' FROM pgdurable.runs WHERE parent_run_id = %s "
        "AND status = 'failed'", (rid,)).fetchall()]
    assert len(errors) == 4 and all(f"run:{rid}" in e for e in errors)
    assert scalar(conn, "SELECT settled FROM pgdurable.budget_tree_spend "
                        "WHERE root_run_id = %s AND unit = 'usd'", rid) == Decimal("9.0")


async def test_window_refill_wakes_a_parked_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A rolling window of 2 s: the second run cannot have the calls, parks on the
    budget with a timer (holding no worker) and completes once the first one's
    settlement leaves the window."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("call")
        async def call(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(calls=1):
                pass
            return Done(ctx.wake)

        await app.budget("api", limit={"calls": 1}, window=timedelta(seconds=2), policy="park")
        first = await app.start("call", {}, budgets=["api"])
        second = await app.start("call", {}, budgets=["api"])
        async with app_running(app, concurrency=2):
            infos = {i: await finished(app, i) for i in (first, second)}
            parked = [i for i, info in infos.items() if info.result is not None]
    assert [infos[i].status for i in (first, second)] == ["completed", "completed"]
    assert len(parked) == 1
    wake = infos[parked[0]].result
    assert wake["type"] == "timeout" and wake["kind"] == "pgdurable.budget" and wake["ref"] == "api"
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger WHERE kind = 'settle'") == 2


async def test_raising_the_limit_wakes_a_parked_run(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        @app.task("call")
        async def call(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(calls=1):
                pass
            return Done(ctx.wake)

        await app.budget("ops", limit={"calls": 1}, policy="park")
        first = await app.start("call", {}, budgets=["ops"])
        async with app_running(app, concurrency=2):
            assert (await finished(app, first)).status == "completed"
            second = await app.start("call", {}, budgets=["ops"])

            async def parked() -> bool:
                info = await app.get_run(second)
                return info.status == "waiting"

            await until(parked, "the second run parked on the budget")
            row = conn.execute("SELECT wait_kind, wait_ref, wake_at FROM pgdurable.runs "
                               "WHERE id = %s", (second,)).fetchone()
            assert row == ("pgdurable.budget", "ops", None)  # no timer: only a raised limit
            await app.budget("ops", limit={"calls": 2}, policy="park")
            info = await finished(app, second)
    assert info.status == "completed"
    assert info.result["type"] == "signal" and info.result["ref"] == "ops"


def test_sync_client_sets_a_budget(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with pgdurable.DurableClient(dsn) as client:
        client.budget("team:a", limit={"tokens": 1000}, window=3600, calendar=True,
                      policy="park")
        client.set_price("m", usd_per_token_in=0.5, usd_per_token_out=1)
        with pytest.raises(InvalidInput):
            client.budget("team:b", limit={"tokens": -1})
    assert conn.execute("SELECT key, window_kind, window_length, policy FROM pgdurable.budgets"
                        ).fetchall() == [("team:a", "fixed", timedelta(hours=1), "park")]


# -- many processes, one budget, under SIGKILL and SIGSTOP ----------------------


SAMPLE = ("SELECT coalesce(sum(settled + held), 0) FROM pgdurable.budget_usage "
          "WHERE budget_key = 'shared' AND unit = 'tokens'")


@pytest.mark.slow
def test_four_workers_never_pass_the_budget(fleet: Fleet, conn: psycopg.Connection[Any],
                                            dsn: str) -> None:
    with pgdurable.DurableClient(dsn) as client:
        client.budget("shared", limit={"tokens": 1000}, policy="park")
        ids = [client.start("draw", {}, budgets=["shared"], revision="1") for _ in range(64)]
    samples: list[Decimal] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                samples.append(scalar(c, SAMPLE))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        procs = {name: fleet.start(name) for name in "abcd"}
        for p in procs.values():
            fleet.ready(p)
        # SIGKILL a worker holding reservations, and start it again
        until_sync(lambda: held_by(conn, "a") > 0, "worker a holds a reservation")
        procs["a"].kill()
        procs["a2"] = fleet.start("a2")
        # SIGSTOP b while it holds reservations, until its leases lapse and are taken
        until_sync(lambda: held_by(conn, "b") > 0, "worker b holds a reservation")
        procs["b"].stop()
        until_sync(lambda: leased_by(conn, "b") == 0, "b's runs reclaimed", timeout=120)
        procs["b"].cont()
        until_sync(lambda: scalar(conn, "SELECT count(*) FROM pgdurable.runs "
                                        "WHERE status <> 'completed'") == 0,
                   "every run completed", timeout=300)
    finally:
        stop.set()
        sampler.join()
    assert samples and max(samples) <= 1000, max(samples)
    print(f"{len(samples)} samples, the highest settled + held: {max(samples)}")
    # the budget was contended: runs had to park on it (live holds blocked them)
    assert scalar(conn, "SELECT count(*) FROM pgdurable.checkpoints "
                        "WHERE wake->>'kind' = 'pgdurable.budget'") > 0
    # after the drain: what the runs recorded (their own checkpoints) equals the ledger
    states = [r[0] for r in conn.execute(
        "SELECT state FROM pgdurable.runs WHERE id = ANY(%s)", (ids,)).fetchall()]
    charged = sum(sum(s["charged"]) for s in states)
    settled = scalar(conn, "SELECT coalesce(sum(amount), 0) FROM pgdurable.budget_ledger "
                           "WHERE kind = 'settle' AND unit = 'tokens'")
    assert settled == charged
    assert usage(conn, "shared", "tokens") == (settled, 0)
    assert scalar(conn, "SELECT count(*) FROM (SELECT 1 FROM pgdurable.budget_ledger "
                        "WHERE kind = 'settle' GROUP BY run_id, step, rkey, budget_key, unit "
                        "HAVING count(*) > 1) x") == 0
    assert scalar(conn, "SELECT count(DISTINCT (run_id, step)) FROM pgdurable.budget_ledger "
                        "WHERE kind = 'settle'") == sum(len(s["charged"]) for s in states)


def held_by(conn: psycopg.Connection[Any], worker: str) -> int:
    return int(scalar(conn, "SELECT count(*) FROM pgdurable.budget_holds h "
                            "JOIN pgdurable.runs r ON r.id = h.run_id AND r.lease_token = h.token "
                            "WHERE r.status = 'leased' AND r.lease_owner LIKE %s", f"{worker}%"))


def leased_by(conn: psycopg.Connection[Any], worker: str) -> int:
    return int(scalar(conn, "SELECT count(*) FROM pgdurable.runs WHERE status = 'leased' "
                            "AND lease_owner LIKE %s", f"{worker}%"))



async def test_workflow_step_reserves_parks_and_is_charged_once(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A workflow's step reserves from a budget that cannot give it: the run parks,
    a raised limit wakes it, the workflow replays and the step is charged once."""
    async with pgdurable.Durable(dsn) as app:
        @app.workflow("wf")
        async def wf(ctx: pgdurable.WorkflowContext, input: Any) -> Any:
            async def ask() -> str:
                async with ctx.reserve(calls=1) as r:
                    r.settle(calls=1)
                return "answer"

            first = await ctx.step("first", ask)
            second = await ctx.step("second", ask)
            return [first, second]

        await app.budget("wf", limit={"calls": 1}, policy="park")
        rid = await app.start("wf", {}, budgets=["wf"])
        async with app_running(app):
            async def parked() -> bool:
                return (await app.get_run(rid)).status == "waiting"

            await until(parked, "the workflow parked on the budget")
            await app.budget("wf", limit={"calls": 2}, policy="park")
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert info.result == ["answer", "answer"]
    assert usage(conn, "wf", "calls") == (2, 0)


def test_cli_budgets_shows_usage(dsn: str, conn: psycopg.Connection[Any]) -> None:
    import json

    from typer.testing import CliRunner

    from pgdurable.ops.cli import app as cli_app

    with pgdurable.DurableClient(dsn) as client:
        client.budget("tenant:acme", limit={"usd": 50, "calls": 10}, window=86400, policy="park")
    run = conn.execute("SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, "
                       "NULL, NULL, NULL, NULL)").fetchone()
    assert run is not None
    conn.execute("SELECT pgdurable.budget_started_run(%s, '{}', '{\"usd\": 2}')", (run[0],))
    conn.commit()
    out = CliRunner().invoke(cli_app, ["budgets", "--dsn", dsn, "--json"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["budget_key"], r["unit"], r["limit_amount"], r["available"]) for r in rows] == [
        ("tenant:acme", "calls", 10, 10), ("tenant:acme", "usd", 50, 50)]
    out = CliRunner().invoke(cli_app, ["budgets", "--dsn", dsn, "--runs"],
                             catch_exceptions=False)
    assert out.exit_code == 0 and f"run:{run[0]}" in out.output and "rolling 1d" in out.output


async def test_sync_step_reserves_with_a_plain_with(dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    async with pgdurable.Durable(dsn) as app:
        @app.task("sync")
        def sync(ctx: RunContext, state: Any) -> Any:
            with ctx.reserve(tokens=100) as r:
                r.settle(tokens=40)
            return Done(r.status)

        await app.budget("b", limit={"tokens": 1000})
        rid = await app.start("sync", {}, budgets=["b"])
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "completed" and info.result == "settled", info.error
    assert usage(conn, "b", "tokens") == (40, 0)


async def test_prometheus_counts_reservations_and_reads_budgets(
        dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from pgdurable.foundation import metrics

    monkeypatch.setattr(metrics, "_m", None)  # this test's registry and database
    registry = metrics.enable(dsn, CollectorRegistry())
    async with pgdurable.Durable(dsn) as app:
        @app.task("call")
        async def call(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=0.5) as r:
                r.settle(usd=0.25)
            return Done(None)

        await app.budget("tenant:acme", limit={"usd": 0.6})
        ok = await app.start("call", {}, budgets=["tenant:acme"])
        async with app_running(app):
            assert (await finished(app, ok)).status == "completed"
            over = await app.start("call", {}, budgets=["tenant:acme"])
            assert (await finished(app, over)).status == "failed"
    text = generate_latest(registry).decode()
    assert 'pgdurable_budget_reservations_total{outcome="reserved"} 1.0' in text
    assert 'pgdurable_budget_reservations_total{outcome="exhausted"} 1.0' in text
    assert 'pgdurable_budget_limit{budget="tenant:acme",unit="usd"} 0.6' in text
    assert 'pgdurable_budget_settled{budget="tenant:acme",unit="usd"} 0.25' in text
    assert 'pgdurable_budget_held{budget="tenant:acme",unit="usd"} 0.0' in text


def test_a_lost_lease_stops_holding_when_its_run_is_reclaimed(
        conn: psycopg.Connection[Any]) -> None:
    """Liveness by token: a crashed worker's hold counts until its run is claimed
    again (the limit errs on the safe side), then not; its settlement is refused."""
    conn.autocommit = True
    conn.execute("SELECT pgdurable.budget_set('b', '{\"calls\": 1}', 'none', NULL, 'fail')")

    def start_and_claim(owner: str) -> tuple[Any, int]:
        rid = scalar(conn, "SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', "
                           "0, 3, NULL, NULL, NULL, NULL)")
        conn.execute("SELECT pgdurable.budget_started_run(%s, '{b}', NULL)", (rid,))
        token = scalar(conn, "SELECT lease_token FROM pgdurable.claim_runs(%s, '{default}', "
                             "'{t}', '{1}', 1, '1 hour')", owner)
        return rid, token

    def reserve(rid: Any, token: int, owner: str) -> str:
        return str(scalar(conn, "SELECT status FROM pgdurable.budget_reserve(%s, %s, %s, 0, "
                                "'r0', '{\"calls\": 1}')", rid, token, owner))

    crashed, t1 = start_and_claim("w1")
    assert reserve(crashed, t1, "w1") == "reserved"
    other, t2 = start_and_claim("w2")
    assert reserve(other, t2, "w2") == "exhausted"
    # w1 dies: its lease lapses; until the run is claimed again its hold still counts
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = now() - interval '1 s' "
                 "WHERE id = %s", (crashed,))
    assert usage(conn, "b", "calls") == (0, 1)
    assert reserve(other, t2, "w2") == "exhausted"
    t3 = scalar(conn, "SELECT lease_token FROM pgdurable.claim_runs('w3', '{default}', '{t}', "
                      "'{1}', 1, '1 hour')")
    assert t3 > t1
    assert usage(conn, "b", "calls") == (0, 0)  # the old token's hold is dead
    assert reserve(other, t2, "w2") == "reserved"
    assert conn.execute(LEDGER, (crashed,)).fetchall() == [
        ("reserve", "calls", 1), ("release", "calls", 1)]  # swept by the next reservation
    with pytest.raises(psycopg.Error) as err:  # the zombie's settlement
        conn.execute("SELECT pgdurable.budget_settle(%s, %s, 'w1', 0, 'r0', '{}', NULL)",
                     (crashed, t1))
    assert err.value.sqlstate == "PD001"
    assert usage(conn, "b", "calls") == (0, 1)


def test_dashboard_shows_budgets_and_a_runs_spend(dsn: str, conn: psycopg.Connection[Any]) -> None:
    import httpx
    from _dashboard_server import serving

    from pgdurable.ops.dashboard import create_app

    conn.autocommit = True
    conn.execute("SELECT pgdurable.budget_set('tenant:acme', '{\"usd\": 5}', 'rolling', "
                 "'1 day', 'park')")
    rid = scalar(conn, "SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, "
                       "NULL, NULL, NULL, NULL)")
    conn.execute("SELECT pgdurable.budget_started_run(%s, '{tenant:acme}', NULL)", (rid,))
    token = scalar(conn, "SELECT lease_token FROM pgdurable.claim_runs('w', '{default}', '{t}', "
                         "'{1}', 1, '1 hour')")
    conn.execute("SELECT pgdurable.budget_reserve(%s, %s, 'w', 0, 'r0', '{\"usd\": 2}')",
                 (rid, token))
    conn.execute("SELECT pgdurable.budget_settle(%s, %s, 'w', 0, 'r0', '{\"usd\": 1.25}', NULL)",
                 (rid, token))
    conn.execute("SELECT pgdurable.budget_reserve(%s, %s, 'w', 1, 'r0', '{\"usd\": 0.5}')",
                 (rid, token))
    with serving(create_app(dsn)) as base:
        page = httpx.get(base + "/budgets").text
        row = page[page.index("tenant:acme"):]
        row = row[:row.index("</tr>")]
        # limit 5, settled 1.25, held 0.5 (live), left 3.25
        assert [c for c in re.findall(r'class="num[^"]*">([^<]*)<', row)] == [
            "5", "1.25", "0.5", "3.25"], row
        run_page = httpx.get(f"{base}/runs/{rid}").text
        spend = run_page[run_page.index('id="spend"'):]
        assert "tenant:acme" in spend[:spend.index("</table>")]
        assert ">1.25<" in spend[:spend.index("</table>")]


async def test_pydantic_ai_model_requests_reserve_and_settle_their_usage(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """PgDurability(reserve=...): each model request of a durable agent run reserves
    from the run's budgets and settles the usage the model returned."""
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from pgdurable.contrib.pydantic_ai import PgDurability, start_agent

    app = pgdurable.Durable(dsn)
    try:
        with pytest.raises(InvalidInput, match="unknown unit"):
            PgDurability(app, reserve={"eur": 1})
        agent = Agent(TestModel(), name="metered", capabilities=[
            PgDurability(app, stream=False, reserve={"calls": 1, "tokens_in": 5000,
                                                      "tokens_out": 5000})])

        @agent.tool_plain
        def double(x: int) -> int:
            return 2 * x

        await app.budget("tenant:acme", limit={"calls": 10, "tokens_in": 100_000})
        rid = await start_agent(app, agent, "go", budgets=["tenant:acme"])
        async with app_running(app):
            result = await app.result(rid, timeout=60)
    finally:
        await app.close()
    used = result["usage"]
    assert used["requests"] == 2  # a tool call, then the answer
    assert usage_of(conn, "calls") == used["requests"]
    assert usage_of(conn, "tokens_in") == used["input_tokens"] > 0
    assert usage_of(conn, "tokens_out") == used["output_tokens"] > 0
    assert usage(conn, "tenant:acme", "calls")[1] == 0  # nothing held after the run


def usage_of(conn: psycopg.Connection[Any], unit: str) -> int:
    return int(scalar(conn, "SELECT sum(amount) FROM pgdurable.budget_ledger "
                            "WHERE kind = 'settle' AND budget_key = 'tenant:acme' AND unit = %s",
                      unit))
