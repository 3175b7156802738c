"""``ctx.start_children`` (issue 45: a wake fan-in's starts bounded by the parent's row
lock): many children in one fenced statement, each exactly as ``start_child`` would
start it, all or nothing, one NOTIFY per queue."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _waiting import app_running

from pgdurable import (
    Child,
    Done,
    Durable,
    InvalidInput,
    LeaseLost,
    RunContext,
    UnknownTask,
    Wait,
    WorkflowContext,
)
from pgdurable.runs.children import start_child, start_children


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)

    @a.task("leaf")
    async def leaf(ctx: RunContext, state: Any) -> Any:
        return Done({"i": state["i"], "sq": state["i"] ** 2})

    @a.task("fan", max_attempts=1)
    async def fan(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            ids = await ctx.start_children(
                [Child("leaf", {"i": i}, key=f"k{i}") for i in range(state["n"])])
            # a replayed start (same keys) gets the same children back
            assert await ctx.start_children(
                [{"task": "leaf", "state": {"i": i}, "key": f"k{i}"}
                 for i in range(state["n"])]) == ids
            return Wait.children(ids, state={"ids": ids})
        return Done({"wake": ctx.wake, "ids": state["ids"]})

    @a.task("fan_sync", max_attempts=1)
    def fan_sync(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            ids = ctx.start_children_sync([Child("leaf", {"i": i}, key=f"s{i}") for i in range(3)])
            return Wait.children(ids, state={"ids": ids})
        return Done(sorted(v["result"]["sq"] for v in ctx.wake["children"].values()))

    await a.open()
    yield a
    await a.close()


def _lease(conn: psycopg.Connection[Any], rid: str) -> None:
    """Lease run ``rid`` by hand (token 1, deadline in an hour), as a worker's claim would."""
    conn.execute("UPDATE pgdurable.runs SET status = 'leased', lease_owner = 'w', lease_token = 1, "
                 "lease_expires_at = pgdurable.now() + interval '1 hour', "
                 "deadline_at = pgdurable.now() + interval '1 hour' WHERE id = %s", (rid,))


async def test_many_children_one_statement_parent_woken_once(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    pid = await app.start("fan", {"n": 200})
    sid = await app.start("fan_sync")
    async with app_running(app, concurrency=16):
        out = await app.result(pid, timeout=120)
        assert await app.result(sid, timeout=120) == [0, 1, 4]
    kids = out["wake"]["children"]
    assert len(out["ids"]) == len(set(out["ids"])) == 200 and set(kids) == set(out["ids"])
    assert all(v["status"] == "completed" for v in kids.values())
    assert [kids[i]["result"]["i"] for i in out["ids"]] == list(range(200))  # input order
    assert (await app.get_run(pid)).claims == 2  # started, then woken once
    # all 200 were inserted by one transaction (one statement, one commit), as children
    row = conn.execute("SELECT count(*), count(DISTINCT created_xact), "
                       "bool_and(root_run_id = parent_run_id AND parent_policy = 'cancel'), "
                       "count(DISTINCT child_key) FROM pgdurable.runs WHERE parent_run_id = %s",
                       (pid,)).fetchone()
    assert row == (200, 1, True, 200)


async def test_once_per_key_fenced_all_or_nothing(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    pid = await app.start("leaf", {"i": 0})
    _lease(conn, pid)
    first = await start_child(app, pid, 1, "leaf", {"i": 1}, key="a")

    def children() -> int:
        row = conn.execute("SELECT count(*) FROM pgdurable.runs WHERE parent_run_id = %s",
                           (pid,)).fetchone()
        assert row is not None
        return int(row[0])

    # nothing started for: a stale token, a key of another task, bad input anywhere
    with pytest.raises(LeaseLost):
        await start_children(app, pid, 2, [Child("leaf", {"i": 2}, key="b")])
    with pytest.raises(InvalidInput):
        await start_children(app, pid, 1, [Child("leaf", {"i": 2}, key="b"),
                                           Child("other", key="a", revision="1")])
    with pytest.raises(UnknownTask) as ei:
        await start_children(app, pid, 1, [Child("leaf", {"i": 2}, key="b"),
                                           Child("nope", key="c")])
    assert "start_children: child #1" in (ei.value.__notes__ or [])
    with pytest.raises(ValueError):
        await start_children(app, pid, 1, [Child("leaf", {"i": 2}, key="b"),
                                           Child("leaf", {"i": 3}, key="b")])
    with pytest.raises(ValueError):
        await start_children(app, pid, 1, [Child("leaf", key="b", policy="orphan")])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await start_children(app, pid, 1, [{"task": "leaf", "key": "b", "colour": 1}])
    with pytest.raises(TypeError):
        await start_children(app, pid, 1, [Child("leaf", key="b", budget={"usd": 1.0})])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await start_children(app, pid, 1, "leaf")  # type: ignore[arg-type]
    assert children() == 1
    assert await start_children(app, pid, 1, []) == []

    # an existing key returns its child; the new ones are started as start_child would,
    # with one NOTIFY per queue (read up to a sentinel sent after the call's commit)
    with psycopg.connect(conn.info.dsn, autocommit=True) as lc:
        lc.execute("LISTEN pgdurable_wake")
        ids = await start_children(app, pid, 1, [
            Child("leaf", {"i": 1}, key="a"),
            Child("leaf", {"i": 2}, key="b", queue="q1", priority=5, budget=2.5,
                  deadline=timedelta(hours=2), policy="abandon"),
            Child("leaf", {"i": 3}, key="c", queue="q1"),
            Child("leaf", {"i": 4}, key="d", queue="q2"),
        ])
        conn.execute("NOTIFY pgdurable_wake, 'sentinel'")
        got: list[str] = []
        for n in lc.notifies(timeout=60):
            if n.payload == "sentinel":
                break
            got.append(n.payload)
    assert ids[0] == first and len(set(ids)) == 4
    assert sorted(got) == ["q1", "q2"]
    rows = conn.execute(
        "SELECT child_key, queue, priority, budget, parent_policy, state->>'i', "
        "deadline_at <= (SELECT deadline_at FROM pgdurable.runs WHERE id = %s), "
        "root_run_id::text, id::text FROM pgdurable.runs WHERE parent_run_id = %s "
        "ORDER BY child_key", (pid, pid)).fetchall()
    assert [r[:8] for r in rows] == [
        ("a", "default", 0, None, "cancel", "1", True, pid),
        ("b", "q1", 5, 2.5, "abandon", "2", True, pid),  # the deadline capped by the parent's
        ("c", "q1", 0, None, "cancel", "3", True, pid),
        ("d", "q2", 0, None, "cancel", "4", True, pid),
    ]
    assert [r[8] for r in rows] == ids
    # a start_child of a key start_children made gets the same child
    assert await start_child(app, pid, 1, "leaf", key="c") == ids[2]


async def test_workflow_starts_children_as_one_recorded_step(dsn: str) -> None:
    """WorkflowContext.start_children: one recorded step (the replay after the fan-in
    starts none again), the parent parked and woken once."""
    app = Durable(dsn)

    @app.task("leaf")
    async def leaf(ctx: RunContext, state: Any) -> Any:
        return Done(state * 2)

    @app.workflow("doubles", revision="1")
    async def doubles(ctx: WorkflowContext, xs: list[int]) -> list[Any]:
        ids = await ctx.start_children([Child("leaf", x, key=f"x{x}") for x in xs])
        return [o["result"] for o in await ctx.gather(ids)]

    async with app, app_running(app):
        rid = await app.start("doubles", [1, 2, 3])
        assert await app.result(rid, timeout=60) == [2, 4, 6]
        tree = await app.run_tree(rid)
        info = await app.get_run(rid)
    assert len(tree) == 4 and info.claims == 2  # three children, started once; woken once
    with psycopg.connect(dsn) as c:
        names = [r[0] for r in c.execute(
            "SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints WHERE run_id = %s "
            "ORDER BY step", (rid,)).fetchall()]
    assert names == ["start-children:1", "children#1", "return"]
