"""Spend control (issue 42), the engine's side: a step's settlement is written in the
transaction of its checkpoint (fenced by the lease), the budgets' running totals stay
equal to the ledger and the holds, and the children of start_child / start_many draw
from the budgets they are given or their parent's.

Every assertion reads the database's own record: the ledger's and the checkpoints'
transaction ids (xmin) say which rows one transaction wrote.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg
import pytest
from _waiting import app_running, finished, until

import pgdurable
from pgdurable import Continue, Done, RunContext, Wait

#: Every budget's totals against the ledger and the holds: (key, unit, held, settled,
#: held per the holds, settled per the ledger) where they differ (windowless budgets).
TOTALS_DRIFT = """
SELECT t.budget_key, t.unit, t.held, t.settled,
       coalesce((SELECT sum(h.amount) FROM pgdurable.budget_holds h
                  WHERE h.budget_key = t.budget_key AND h.unit = t.unit), 0) AS holds,
       coalesce((SELECT sum(l.amount) FROM pgdurable.budget_ledger l
                  WHERE l.budget_key = t.budget_key AND l.unit = t.unit
                    AND l.kind = 'settle'), 0) AS ledger
  FROM pgdurable.budget_totals t JOIN pgdurable.budgets b ON b.key = t.budget_key
 WHERE b.window_kind = 'none'
   AND (t.held, t.settled) IS DISTINCT FROM (
       coalesce((SELECT sum(h.amount) FROM pgdurable.budget_holds h
                  WHERE h.budget_key = t.budget_key AND h.unit = t.unit), 0),
       coalesce((SELECT sum(l.amount) FROM pgdurable.budget_ledger l
                  WHERE l.budget_key = t.budget_key AND l.unit = t.unit
                    AND l.kind = 'settle'), 0))
"""


def scalar(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def xmins(conn: psycopg.Connection[Any], rid: str) -> dict[str, set[str]]:
    """The transactions (xmin) that wrote each kind of ledger row of ``rid``, and its
    checkpoints (by step)."""
    out: dict[str, set[str]] = {}
    for what, x in conn.execute(
            "SELECT kind || ':' || step || ':' || rkey, xmin::text FROM pgdurable.budget_ledger "
            "WHERE run_id = %s UNION ALL "
            "SELECT 'checkpoint:' || step, xmin::text FROM pgdurable.checkpoints "
            "WHERE run_id = %s", (rid, rid)).fetchall():
        out.setdefault(what, set()).add(x)
    return out


async def test_settlement_is_written_with_the_steps_checkpoint(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """One extra statement per step: the reservation. The settlement (and the
    release of the rest) is in the transaction of the step's checkpoint."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            if ctx.step == 2:
                return Done("ok")
            async with ctx.reserve(usd=1, calls=1) as r:
                r.settle(usd=0.25)
            return Continue(state)

        await app.budget("b", limit={"usd": 10, "calls": 10})
        rid = await app.start("t", {}, budgets=["b"])
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    x = xmins(conn, rid)
    for step in (0, 1):
        checkpoint = x[f"checkpoint:{step + 1}"]  # the write that ends step `step`
        assert x[f"settle:{step}:r0"] == checkpoint
        assert x[f"release:{step}:r0"] == checkpoint  # usd: 0.75 of 1 returned
        assert x[f"reserve:{step}:r0"] != checkpoint  # before the model call: its own
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_holds") == 0
    assert conn.execute("SELECT settled, held FROM pgdurable.budget_usage "
                        "WHERE budget_key = 'b' AND unit = 'usd'").fetchone() == (
        Decimal("0.50"), 0)
    assert conn.execute(TOTALS_DRIFT).fetchall() == []


async def test_a_second_reservation_gets_the_settled_rest_back(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A step's settlement is buffered until its checkpoint, but the step's next
    reservation writes it first, in its own statement: the capacity is back."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=1) as r:
                r.settle(usd=0.25)
            async with ctx.reserve(usd=0.75) as r:  # fits only with the first settled
                r.settle(usd=0.75)
            return Done("ok")

        await app.budget("b", limit={"usd": 1})  # policy fail: no second chance
        rid = await app.start("t", {}, budgets=["b"])
        async with app_running(app):
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    x = xmins(conn, rid)
    assert x["settle:0:r0"] == x["reserve:0:r1"]  # the first rode the second reservation
    assert x["settle:0:r1"] == x["checkpoint:1"]  # the second rode the completion
    assert scalar(conn, "SELECT sum(amount) FROM pgdurable.budget_ledger "
                        "WHERE kind = 'settle'") == Decimal("1.00")
    assert conn.execute(TOTALS_DRIFT).fetchall() == []


async def test_a_step_that_parks_after_settling_is_charged(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A step that ends by waiting (no checkpoint write of the batch writer) writes its
    settlement before it parks: the spend happened."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            if ctx.wake is not None:
                return Done("woken")
            async with ctx.reserve(tokens=100) as r:
                r.settle(tokens=40)
            return Wait(("go", "x"))

        await app.budget("b", limit={"tokens": 1000})
        rid = await app.start("t", {}, budgets=["b"])
        async with app_running(app):
            async def parked() -> bool:
                return (await app.get_run(rid)).status == "waiting"
            await until(parked, "the run to park")
            assert scalar(conn, "SELECT sum(amount) FROM pgdurable.budget_ledger "
                                "WHERE kind = 'settle'") == 40
            await app.signal("go", "x", {})
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert conn.execute(TOTALS_DRIFT).fetchall() == []


def test_a_zombies_checkpoint_settlement_is_refused(conn: psycopg.Connection[Any]) -> None:
    """write_steps_settling: the settlement of a worker that lost its lease is refused
    with its write ('lost'); the new holder's goes through with its checkpoint."""
    conn.autocommit = True
    conn.execute("SELECT pgdurable.budget_set('b', '{\"calls\": 5}', 'none', NULL, 'fail')")
    rid = scalar(conn, "SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', "
                       "0, 3, NULL, NULL, NULL, NULL)")
    conn.execute("SELECT pgdurable.budget_started_run(%s, '{b}', NULL)", (rid,))

    def claim(owner: str) -> int:
        return int(scalar(conn, "SELECT lease_token FROM pgdurable.claim_runs(%s, '{default}', "
                                "'{t}', '{1}', 1, '1 hour')", owner))

    def reserve(token: int, owner: str) -> str:
        return str(scalar(conn, "SELECT status FROM pgdurable.budget_reserve(%s, %s, %s, 0, "
                                "'r0', '{\"calls\": 2}')", rid, token, owner))

    def write(token: int, owner: str) -> str:
        settle = (f'[{{"run": "{rid}", "token": {token}, "step": 0, "rkey": "r0", '
                  '"amounts": {"calls": 1}, "model": null}]')
        return str(scalar(conn, "SELECT status FROM pgdurable.write_steps_settling(%s, %s, %s, "
                                "ARRAY['{}'::jsonb], ARRAY[0::numeric], ARRAY[false], "
                                "ARRAY[NULL::jsonb], %s::jsonb)",
                          owner, [rid], [token], settle))

    t1 = claim("w1")
    assert reserve(t1, "w1") == "reserved"
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = now() - interval '1 s' "
                 "WHERE id = %s", (rid,))
    t2 = claim("w2")
    assert reserve(t2, "w2") == "reserved"
    before = scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger")
    assert write(t1, "w1") == "lost"  # the zombie: neither its step nor its spend
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger") == before
    assert scalar(conn, "SELECT step FROM pgdurable.runs WHERE id = %s", rid) == 0
    assert write(t2, "w2") == "leased"
    assert conn.execute("SELECT kind, amount, token FROM pgdurable.budget_ledger "
                        "WHERE run_id = %s AND kind = 'settle'", (rid,)).fetchall() == [
        ("settle", 1, t2)]
    assert scalar(conn, "SELECT step FROM pgdurable.runs WHERE id = %s", rid) == 1
    # the replayed write of the same settlement (a lost answer resent) charges nothing more
    conn.execute("SELECT pgdurable.budget_settle_pending(%s, %s, 'w2', %s::jsonb)",
                 (rid, t2, f'[{{"run": "{rid}", "token": {t2}, "step": 0, "rkey": "r0", '
                           '"amounts": {"calls": 1}, "model": null}]'))
    assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger "
                        "WHERE run_id = %s AND kind = 'settle'", rid) == 1
    # the new holder's reservation of the same step replaced the zombie's hold
    assert scalar(conn, "SELECT held FROM pgdurable.budget_totals "
                        "WHERE budget_key = 'b' AND unit = 'calls'") == 0
    assert conn.execute(TOTALS_DRIFT).fetchall() == []


def hold(conn: psycopg.Connection[Any], amounts: str) -> tuple[Any, int]:
    """A run of another queue (``held``) drawing from budget ``b``, claimed by worker
    ``h`` and holding ``amounts`` (reservation ``r0`` of its step 0): (its id, its token)."""
    holder = scalar(conn, "SELECT run_id FROM pgdurable.start_run('x', '1', '{}', 'held', "
                          "0, 3, NULL, NULL, NULL, NULL)")
    conn.execute("SELECT pgdurable.budget_started_run(%s, '{b}', NULL)", (holder,))
    token = scalar(conn, "SELECT lease_token FROM pgdurable.claim_runs('h', '{held}', "
                         "'{x}', '{1}', 1, '1 hour')")
    assert scalar(conn, "SELECT status FROM pgdurable.budget_reserve(%s, %s, 'h', 0, 'r0', "
                        "%s)", holder, token, amounts) == "reserved"
    return holder, int(token)


async def test_a_release_wakes_a_run_parked_on_held_capacity(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A run parked because another run holds the capacity is made runnable by the
    transaction that gives it back, not by its fallback timer: the wake its step saw
    (the checkpoints' record) is stamped with the release's own time, before the timer."""
    conn.autocommit = True
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(calls=1) as r:
                r.settle(calls=1)
            return Done(ctx.wake)

        await app.budget("b", limit={"calls": 1}, policy="park")
        # the holder: a run of another queue, claimed and reserving outside the worker
        holder, token = hold(conn, '{"calls": 1}')
        rid = await app.start("t", {}, budgets=["b"])
        async with app_running(app):
            async def parked() -> bool:
                row = conn.execute("SELECT wait_kind FROM pgdurable.runs WHERE id = %s "
                                   "AND status = 'waiting'", (rid,)).fetchone()
                return row is not None and row[0] == "pgdurable.budget"
            await until(parked, "the run to park on the budget")
            timer = scalar(conn, "SELECT wake_at FROM pgdurable.runs WHERE id = %s", rid)
            assert timer is not None  # the fallback (5 s): not what wakes it
            assert scalar(conn, "SELECT pgdurable.budget_release(%s, %s, 'h', 0, 'r0')",
                          holder, token) == 1
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert info.result["payload"] == {"budget": "b", "freed": True}
    released = scalar(conn, "SELECT at FROM pgdurable.budget_ledger WHERE run_id = %s "
                            "AND kind = 'release'", holder)
    woken = scalar(conn, "SELECT (wake ->> 'at')::timestamptz FROM pgdurable.checkpoints "
                         "WHERE run_id = %s AND wake ->> 'kind' = 'pgdurable.budget'", rid)
    assert woken == released < timer  # the release's transaction made it runnable


async def test_a_settlement_below_its_reservation_wakes_a_parked_run(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """The rest of a reservation returned at its settlement (here riding the holder's
    checkpoint) wakes the run parked on it in that transaction."""
    conn.autocommit = True
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=1) as r:
                r.settle(usd=0.5)
            return Done(ctx.wake)

        await app.budget("b", limit={"usd": 1.5}, policy="park")
        holder, token = hold(conn, '{"usd": 1}')
        rid = await app.start("t", {}, budgets=["b"])
        async with app_running(app):
            async def parked() -> bool:
                return scalar(conn, "SELECT status FROM pgdurable.runs WHERE id = %s",
                              rid) == "waiting"
            await until(parked, "the run to park on the budget")
            settle = (f'[{{"run": "{holder}", "token": {token}, "step": 0, "rkey": "r0", '
                      '"amounts": {"usd": 0.25}, "model": null}]')
            assert scalar(conn, "SELECT status FROM pgdurable.write_steps_settling('h', %s, %s, "
                                "ARRAY['{}'::jsonb], ARRAY[0::numeric], ARRAY[false], "
                                "ARRAY[NULL::jsonb], %s::jsonb)",
                          [holder], [token], settle) == "leased"
            info = await finished(app, rid)
    assert info.status == "completed", info.error
    woken = scalar(conn, "SELECT (wake ->> 'at')::timestamptz FROM pgdurable.checkpoints "
                         "WHERE run_id = %s AND wake ->> 'kind' = 'pgdurable.budget'", rid)
    assert woken == scalar(conn, "SELECT created_at FROM pgdurable.checkpoints "
                                 "WHERE run_id = %s", holder)
    assert conn.execute(TOTALS_DRIFT).fetchall() == []


async def test_children_draw_from_their_parents_budget_unless_given_their_own(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """ctx.start_child takes budgets= and budget= like start: a child given neither is
    charged to its parent's budgets, one given a named budget or its own to those."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("parent")
        async def parent(ctx: RunContext, state: Any) -> Any:
            return Done([
                await ctx.start_child("child", key="inherits", policy="abandon"),
                await ctx.start_child("child", key="named", budgets=["other"],
                                      policy="abandon"),
                await ctx.start_child("child", key="own", budget={"usd": 0.5},
                                      policy="abandon"),
            ])

        @app.task("child")
        async def child(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=0.25) as r:
                r.settle(usd=0.25)
            return Done("ok")

        await app.budget("other", limit={"usd": 10})
        rid = await app.start("parent", {}, budget={"usd": 3})
        async with app_running(app):
            info = await finished(app, rid)
            assert info.status == "completed", info.error
            inherits, named, own = info.result
            for c in info.result:
                assert (await finished(app, c)).status == "completed"
    charged = dict(conn.execute(
        "SELECT run_id::text, string_agg(budget_key, ',') FROM pgdurable.budget_ledger "
        "WHERE kind = 'settle' GROUP BY 1").fetchall())
    assert charged == {inherits: f"run:{rid}", named: "other", own: f"run:{own}"}


async def test_start_many_attaches_each_runs_budgets(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """start_many takes budgets= and budget= per Start, in its one statement; an
    unknown budget key starts nothing (BudgetNotFound)."""
    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            return Done(None)

        await app.budget("shared", limit={"calls": 10})
        ids = await app.start_many([
            pgdurable.Start("t", {}),
            pgdurable.Start("t", {}, budgets=["shared"]),
            {"task": "t", "budget": {"calls": 2}, "budgets": ["shared"]},
            pgdurable.Start("t", {}, budget=5.0),  # the old spend limit: no ledger budget
        ])
        attached = conn.execute("SELECT run_id::text, array_agg(budget_key ORDER BY budget_key) "
                                "FROM pgdurable.run_budgets GROUP BY 1").fetchall()
        assert dict(attached) == {ids[1]: ["shared"], ids[2]: [f"run:{ids[2]}", "shared"]}
        assert scalar(conn, "SELECT budget FROM pgdurable.runs WHERE id = %s", ids[3]) == 5
        runs = scalar(conn, "SELECT count(*) FROM pgdurable.runs")
        with pytest.raises(pgdurable.BudgetNotFound):
            await app.start_many([pgdurable.Start("t", {}),
                                  pgdurable.Start("t", {}, budgets=["nope"])])
        with pytest.raises(pgdurable.InvalidInput):
            await app.start_many([pgdurable.Start("t", {}, budgets=["shared", ""])])
        assert scalar(conn, "SELECT count(*) FROM pgdurable.runs") == runs


async def test_ledger_retention_keeps_usage_and_limits_exact(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """prune deletes the ledger rows of the runs it pruned (batch by batch), folding
    their settlements first: the usage, the per-model spend and the limit are the same
    after as before."""
    from pgdurable.ops.retention import prune

    async with pgdurable.Durable(dsn) as app:
        @app.task("t")
        async def t(ctx: RunContext, state: Any) -> Any:
            async with ctx.reserve(usd=state["usd"]) as r:
                r.settle(model="m", tokens_in=100, tokens_out=50)  # usd 0.2 by the price
            return Done(None)

        await app.set_price("m", usd_per_token_in=Decimal("0.001"),
                            usd_per_token_out=Decimal("0.002"))
        await app.budget("b", limit={"usd": 1})
        ids = [await app.start("t", {"usd": 0.3}, budgets=["b"]) for _ in range(3)]
        async with app_running(app):
            for rid in ids:
                assert (await finished(app, rid)).status == "completed"
        usage = ("SELECT unit, settled, held FROM pgdurable.budget_usage "
                 "WHERE budget_key = 'b' ORDER BY unit")
        model = ("SELECT model, budget_key, unit, settled, settlements "
                 "FROM pgdurable.budget_model_spend ORDER BY 1, 2, 3")
        before_usage = conn.execute(usage).fetchall()
        before_model = conn.execute(model).fetchall()
        rows = scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger")
        assert before_usage[-1] == ("usd", Decimal("0.600"), 0)
        result = await prune(dsn, "0s", batch=4)
        assert result.runs == 3 and result.budget_ledger == rows
        assert scalar(conn, "SELECT count(*) FROM pgdurable.budget_ledger") == 0
        assert conn.execute(usage).fetchall() == before_usage
        assert conn.execute(model).fetchall() == before_model
        # the limit still counts the pruned spend: 0.4 of 1 is left
        over = await app.start("t", {"usd": 0.45}, budgets=["b"])
        fits = await app.start("t", {"usd": 0.4}, budgets=["b"])
        async with app_running(app):
            assert (await finished(app, over)).status == "failed"
            assert (await finished(app, fits)).status == "completed"
