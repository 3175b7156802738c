"""Child runs (issue 14), in one process: fan-out/fan-in, any/at_least/timeout,
failure reporting, cancel propagation, deadline cap, run_tree, result(),
bad input. The real-process tests are in tests/test_children_procs.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _waiting import app_running, finished, until
from typer.testing import CliRunner

from pgdurable import (
    Done,
    Durable,
    DurableClient,
    InvalidInput,
    LeaseLost,
    ResultTimeout,
    RunCancelled,
    RunContext,
    RunFailed,
    RunNotFound,
    UnknownTask,
    Wait,
)
from pgdurable.foundation.errors import translate
from pgdurable.ops.cli import app as cli_app
from pgdurable.runs.children import start_child


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    await a.open()
    yield a
    await a.close()


def _register(app: Durable) -> None:
    @app.task("leaf")
    async def leaf(ctx: RunContext, state: Any) -> Any:
        if state.get("fail"):
            raise RuntimeError(f"leaf {state['i']} failed")
        if state.get("wait"):
            if ctx.wake is None:
                return Wait(signal=("go", ctx.run_id))
        return Done({"i": state["i"], "sq": state["i"] ** 2})

    @app.task("fan", max_attempts=1)
    async def fan(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            ids = [await ctx.start_child("leaf", {"i": i, **state.get("extra", {})}, key=f"k{i}")
                   for i in range(state["n"])]
            return Wait.children(ids, any=state.get("any", False),
                                 at_least=state.get("at_least"), timeout=state.get("timeout"),
                                 state={"ids": ids})
        return Done({"wake": ctx.wake, "ids": state["ids"]})


async def test_fan_out_fan_in_wakes_parent_once(app: Durable, conn: psycopg.Connection[Any]) -> None:
    _register(app)
    pid = await app.start("fan", {"n": 20})
    async with app_running(app, concurrency=8):
        out = await app.result(pid, timeout=60)
    assert out["wake"]["type"] == "children"
    kids = out["wake"]["children"]
    assert set(kids) == set(out["ids"]) and len(kids) == 20
    for v in kids.values():
        assert v["status"] == "completed" and v["result"]["sq"] == v["result"]["i"] ** 2
    info = await app.get_run(pid)
    assert info.claims == 2  # started, then woken once
    assert set(info.children) == set(out["ids"])
    child = await app.get_run(out["ids"][0])
    assert child.parent_run_id == pid and child.root_run_id == pid
    assert child.child_key == "k0" and child.parent_policy == "cancel"
    # nothing left behind by the wait
    assert conn.execute("SELECT count(*) FROM pgdurable.child_waits").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM pgdurable.child_wait_sets").fetchone() == (0,)


async def test_failed_child_is_reported_not_propagated(app: Durable) -> None:
    _register(app)
    pid = await app.start("fan", {"n": 3, "extra": {"fail": True}})
    async with app_running(app):
        out = await app.result(pid, timeout=60)
    for v in out["wake"]["children"].values():
        assert v["status"] == "failed"
        assert v["error"]["type"] == "RuntimeError" and "traceback" not in v["error"]
    assert (await app.get_run(pid)).status == "completed"
    with pytest.raises(RunFailed) as ei:
        await app.result(out["ids"][0])
    assert ei.value.error is not None and ei.value.error["type"] == "RuntimeError"


async def test_any_and_at_least(app: Durable) -> None:
    _register(app)
    p_any = await app.start("fan", {"n": 3, "any": True, "extra": {"wait": True}})
    p_two = await app.start("fan", {"n": 3, "at_least": 2, "extra": {"wait": True}})
    async with app_running(app):
        for pid in (p_any, p_two):
            await until(lambda pid=pid: _status(app, pid, "waiting"), "parent parked")
        kids_any = (await app.get_run(p_any)).children
        kids_two = (await app.get_run(p_two)).children
        await app.signal_run(kids_any[1], "go")
        out = await app.result(p_any, timeout=60)
        done = {k: v["status"] for k, v in out["wake"]["children"].items()}
        assert done[kids_any[1]] == "completed"
        assert sorted(done.values()).count("completed") == 1
        await app.signal_run(kids_two[0], "go")
        await finished(app, kids_two[0])
        assert (await app.get_run(p_two)).status == "waiting"  # one of two is not enough
        await app.signal_run(kids_two[2], "go")
        out = await app.result(p_two, timeout=60)
        assert [out["wake"]["children"][k]["status"] for k in kids_two].count("completed") == 2


async def _status(app: Durable, rid: str, status: str) -> bool:
    return (await app.get_run(rid)).status == status


async def test_timeout_reports_partial_outcomes(app: Durable) -> None:
    _register(app)
    pid = await app.start("fan", {"n": 2, "timeout": 0.5, "extra": {"wait": True}})
    async with app_running(app):
        out = await app.result(pid, timeout=60)
    assert out["wake"]["type"] == "timeout"
    assert {v["status"] for v in out["wake"]["children"].values()} <= {"waiting", "runnable",
                                                                         "leased"}
    # the parent completed first: its children (policy cancel) were cancelled
    for k in out["ids"]:
        assert (await app.get_run(k)).status == "cancelled"


async def test_children_already_done_wake_at_park(app: Durable) -> None:
    @app.task("leaf")
    async def leaf(ctx: RunContext, state: Any) -> Any:
        return Done(state)

    @app.task("slowpark")
    async def slowpark(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            cid = await ctx.start_child("leaf", 7, key="a")
            await finished(app, cid)  # the child ends before this step parks
            return Wait.children([cid], state=cid)
        return Done(ctx.wake)

    pid = await app.start("slowpark")
    async with app_running(app, concurrency=4):
        out = await app.result(pid, timeout=60)
    assert out["type"] == "children"
    assert list(out["children"].values()) == [{"status": "completed", "result": 7, "error": None}]
    assert (await app.get_run(pid)).claims == 2


async def test_start_child_once_per_key_and_fenced(app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("leaf")
    async def leaf(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    pid = await app.start("leaf")
    # lease the parent by hand (token 1) so that start_child can be fenced
    conn.execute("UPDATE pgdurable.runs SET status = 'leased', lease_owner = 'w', lease_token = 1, "
                 "lease_expires_at = pgdurable.now() + interval '1 hour', "
                 "deadline_at = pgdurable.now() + interval '1 hour' WHERE id = %s", (pid,))
    a = await start_child(app, pid, 1, "leaf", {"x": 1}, key="k")
    b = await start_child(app, pid, 1, "leaf", {"x": 2}, key="k")
    assert a == b
    with pytest.raises(InvalidInput):
        await start_child(app, pid, 1, "other", revision="1", key="k")
    with pytest.raises(LeaseLost):
        await start_child(app, pid, 2, "leaf", key="k2")
    # capped deadline, tree columns
    row = conn.execute("SELECT deadline_at <= (SELECT deadline_at FROM pgdurable.runs WHERE id = %s), "
                       "root_run_id::text, parent_policy FROM pgdurable.runs WHERE id = %s",
                       (pid, a)).fetchone()
    assert row == (True, pid, "cancel")
    n = conn.execute("SELECT count(*) FROM pgdurable.runs WHERE parent_run_id = %s", (pid,)).fetchone()
    assert n == (1,)


async def test_bad_input_changes_nothing(app: Durable, conn: psycopg.Connection[Any]) -> None:
    _register(app)
    pid = await app.start("leaf", {"i": 1})
    conn.execute("UPDATE pgdurable.runs SET status = 'leased', lease_owner = 'w', lease_token = 1, "
                 "lease_expires_at = pgdurable.now() + interval '1 hour' WHERE id = %s", (pid,))

    def count() -> Any:
        return conn.execute("SELECT count(*) FROM pgdurable.runs").fetchone()

    before = count()
    with pytest.raises(UnknownTask):
        await start_child(app, pid, 1, "nope", key="k")
    with pytest.raises(ValueError):
        await start_child(app, pid, 1, "leaf", key="")
    with pytest.raises(TypeError):
        await start_child(app, pid, 1, "leaf", key=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await start_child(app, pid, 1, "leaf", key="k", policy="orphan")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await start_child(app, pid, 1, "leaf", {"bad": object()}, key="k")
    assert count() == before
    with pytest.raises(ValueError):
        Wait.children([])
    with pytest.raises(ValueError):
        Wait.children(["not-a-uuid"])
    u = str(uuid.uuid4())
    with pytest.raises(ValueError):
        Wait.children([u, u])
    with pytest.raises(ValueError):
        Wait.children([u], at_least=2)
    with pytest.raises(ValueError):
        Wait.children([u], any=True, at_least=1)
    with pytest.raises(TypeError):
        Wait.children("abc")
    # park on ids that are not children, or on itself: InvalidInput, nothing written
    for ids in ([u], [pid]):
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT * FROM pgdurable.park_children(%s, 1, 'w', '{\"x\": 1}', 0, "
                         "%s::uuid[], 1)", (pid, ids))
        assert isinstance(translate(ei.value), InvalidInput)
    assert conn.execute("SELECT status, step FROM pgdurable.runs WHERE id = %s",
                        (pid,)).fetchone() == ("leased", 0)


async def test_wait_children_in_step_and_bad_ids_fail_run(app: Durable) -> None:
    other = await app.start("leaf2", revision="1")
    seen: dict[str, Any] = {}

    @app.task("leaf2")
    async def leaf2(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    @app.task("checks", max_attempts=1)
    async def checks(ctx: RunContext, state: Any) -> Any:
        for ids in ([other], [ctx.run_id]):
            try:
                await ctx.wait_children(ids)
            except ValueError as exc:
                seen.setdefault("errors", []).append(str(exc))
        return Wait.children([other])  # not checked in the step: the run fails at park

    pid = await app.start("checks")
    async with app_running(app):
        with pytest.raises(RunFailed) as ei:
            await app.result(pid, timeout=60)
    assert ei.value.error is not None and ei.value.error["type"] == "InvalidInput"
    assert len(seen["errors"]) == 2 and "itself" in seen["errors"][1]


async def test_cancel_propagates_three_levels_and_abandon(app: Durable) -> None:
    @app.task("node")
    async def node(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0 and state["depth"] < 2:
            a = await ctx.start_child("node", {"depth": state["depth"] + 1}, key="a")
            b = await ctx.start_child("node", {"depth": state["depth"] + 1}, key="b",
                                      policy="abandon" if state["depth"] == 0 else "cancel")
            return Wait.children([a, b])
        if ctx.step == 0:
            return Wait(signal=("never", ctx.run_id))
        return Done(None)

    root = await app.start("node", {"depth": 0})
    async with app_running(app, concurrency=8):
        async def grown() -> bool:
            tree = await app.run_tree(root)
            return len(tree) == 7 and all(n.status == "waiting" for n in tree)

        await until(grown, "tree of 7 parked runs")
        await app.cancel(root)
        with pytest.raises(RunCancelled):
            await app.result(root, timeout=60)
        tree = {n.child_key and (n.depth, n.child_key, n.parent_run_id): n
                for n in await app.run_tree(root)}
        nodes = await app.run_tree(root)
    by_id = {n.id: n for n in nodes}
    assert nodes[0].id == root and nodes[0].depth == 0 and len(tree) == 7
    for n in nodes[1:]:
        # the abandoned branch (b under the root) and its children live on
        top = n if n.depth == 1 else by_id[n.parent_run_id or ""]
        expect = "waiting" if top.child_key == "b" else "cancelled"
        assert n.status == expect, (n.depth, n.child_key, n.status)
    assert max(n.depth for n in nodes) == 2


async def test_result_timeout_not_found_and_sync(app: Durable, dsn: str) -> None:
    _register(app)
    rid = await app.start("leaf", {"i": 3})
    with pytest.raises(ResultTimeout):
        await app.result(rid, timeout=0.2)
    with pytest.raises(RunNotFound):
        await app.result(str(uuid.uuid4()), timeout=1)
    with pytest.raises(ValueError):
        await app.result(rid, timeout=-1)
    with pytest.raises(TypeError):
        await app.result(rid, timeout="1")  # type: ignore[arg-type]
    client = DurableClient(dsn, app=app)
    try:
        async with app_running(app):
            got = await asyncio.to_thread(client.result, rid, 60)
        assert got == {"i": 3, "sq": 9}
        assert [n.id for n in client.run_tree(rid)] == [rid]
        with pytest.raises(RunNotFound):
            client.run_tree(str(uuid.uuid4()))
        assert client.result(rid, 0) == {"i": 3, "sq": 9}  # already final: at once
        cancelled = await app.start("leaf", {"i": 1})
        await app.cancel(cancelled)
        with pytest.raises(RunCancelled):
            client.result(cancelled)
        with pytest.raises(ResultTimeout):
            client.result(await app.start("leaf", {"i": 1}), timeout=0.2)
    finally:
        client.close()


async def test_child_deadline_capped_and_tree_sql(
    app: Durable, conn: psycopg.Connection[Any], dsn: str
) -> None:
    @app.task("leaf")
    async def leaf(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    @app.task("p")
    async def p(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            c = await ctx.start_child("leaf", key="x", deadline=timedelta(days=30))
            return Wait.children([c])
        return Done(None)

    pid = await app.start("p", deadline=timedelta(hours=1))
    async with app_running(app):
        await app.result(pid, timeout=60)
    row = conn.execute("SELECT c.deadline_at = p.deadline_at FROM pgdurable.runs c "
                       "JOIN pgdurable.runs p ON p.id = c.parent_run_id WHERE p.id = %s",
                       (pid,)).fetchone()
    assert row == (True,)
    rows = conn.execute("SELECT depth, task, status FROM pgdurable.run_tree(%s)", (pid,)).fetchall()
    assert rows == [(0, "p", "completed"), (1, "leaf", "completed")]
    with pytest.raises(RunNotFound):
        await app.run_tree(str(uuid.uuid4()))
    # the command line: pgdurable run ID --tree
    res = CliRunner().invoke(cli_app, ["run", pid, "--tree", "--json", "--dsn", dsn],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    tree = json.loads(res.output)["tree"]
    assert [(n["depth"], n["task"], n["child_key"]) for n in tree] == [(0, "p", None),
                                                                       (1, "leaf", "x")]
    res = CliRunner().invoke(cli_app, ["run", pid, "--tree", "--dsn", dsn], catch_exceptions=False)
    assert res.exit_code == 0 and "leaf" in res.output
    res = CliRunner().invoke(cli_app, ["run", str(uuid.uuid4()), "--tree", "--dsn", dsn],
                             catch_exceptions=False)
    assert res.exit_code == 3


async def test_sync_step_starts_children(app: Durable) -> None:
    @app.task("leaf")
    def leaf(ctx: RunContext, state: Any) -> Any:
        return Done(state * 2)

    @app.task("syncparent")
    def syncparent(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            ids = [ctx.start_child_sync("leaf", i, key=str(i)) for i in range(3)]
            assert ids == [ctx.start_child_sync("leaf", i, key=str(i)) for i in range(3)]
            return Wait.children(ids, state=ids)
        assert ctx.wake is not None
        return Done([ctx.wake["children"][i]["result"] for i in state])

    pid = await app.start("syncparent")
    async with app_running(app):
        assert await app.result(pid, timeout=60) == [0, 2, 4]
