"""Workflows (pgdurable.workflows): recorded steps, inline waits, replay, the
determinism guard and bad input, with in-process workers on a real Postgres.
Crash tests with real processes are in tests/test_workflows_crash.py."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _waiting import app_running, finished, until
from typer.testing import CliRunner

import pgdurable
from pgdurable import NonDeterministicWorkflow, StepFailed, StepPolicy, WaitTimeout, WorkflowContext
from pgdurable.models.workflows import LOAD_HISTORY
from pgdurable.ops.cli import app as cli_app


def _names(dsn: str, rid: str) -> list[str]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints "
            "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    return [r[0] for r in rows]


async def _status(app: pgdurable.Durable, rid: str, status: str) -> None:
    async def check() -> bool:
        return (await app.get_run(rid)).status == status

    await until(check, f"run {rid} {status}")


async def test_steps_waits_and_replay(dsn: str) -> None:
    app = pgdurable.Durable(dsn)
    calls: dict[str, int] = {}

    def tool(name: str, value: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return value

    async def atool(value: int) -> int:
        calls["async"] = calls.get("async", 0) + 1
        return value * 2

    @app.workflow("agent", revision="1")
    async def agent(ctx: WorkflowContext, topic: str) -> dict[str, Any]:
        await ctx.emit({"topic": topic})
        sources = await ctx.step("search", tool, "search", [f"{topic}-a", f"{topic}-b"])
        notes = [await ctx.step(f"read:{s}", tool, f"read:{s}", s.upper()) for s in sources]
        doubled = await ctx.step("double", atool, 21)
        ci = await ctx.wait_signal("ci", f"build-{topic}", timeout=timedelta(hours=1))
        await ctx.sleep(0.05)
        ok = await ctx.approval(f"report:{topic}")
        return {"notes": notes, "doubled": doubled, "ci": ci, "ok": ok}

    async with app, app_running(app):
        rid = await app.start("agent", "pg")
        await app.signal("ci", "build-pg", {"green": True})      # kept: sent before the wait
        await _status(app, rid, "waiting")
        info = await app.get_run(rid)
        while info.wait_kind != "approval":
            await _status(app, rid, "waiting")
            info = await app.get_run(rid)
        await app.signal("approval", "report:pg", {"by": "alice"})
        info = await finished(app, rid)
        events = [e async for e in app.stream(rid)]  # emitted once, not once per replay
    assert info.status == "completed", info.error
    assert info.result == {"notes": ["PG-A", "PG-B"], "doubled": 42, "ci": {"green": True},
                           "ok": {"by": "alice"}}
    assert calls == {"search": 1, "read:pg-a": 1, "read:pg-b": 1, "async": 1}
    assert _names(dsn, rid) == ["search", "read:pg-a", "read:pg-b", "double",
                                "signal:ci#1", "sleep#1", "signal:approval#1", "return"]
    assert [e.event for e in events if not e.final] == [{"topic": "pg"}]
    with psycopg.connect(dsn) as c:  # the operator view names every entry and outcome
        view = c.execute("SELECT kind, name, result, outcome FROM pgdurable.workflow_steps "
                         "WHERE run_id = %s ORDER BY position", (rid,)).fetchall()
    assert view[0] == ("step", "search", ["pg-a", "pg-b"], None)
    assert view[4][:2] == ("wait", "signal:ci#1") and view[4][3]["payload"] == {"green": True}
    assert view[5][:2] == ("sleep", "sleep#1") and view[5][3]["type"] == "timeout"
    assert view[7][:2] == ("return", "return")
    shown = CliRunner().invoke(cli_app, ["run", rid, "--dsn", dsn], catch_exceptions=False)
    assert shown.exit_code == 0
    for line in ("step search", "step read:pg-a", "wait signal:ci#1", "sleep sleep#1"):
        assert line in shown.output, shown.output


def _kind_of(sql: str) -> str:
    if sql == LOAD_HISTORY.sql:
        return "history"
    for name in ("claim_runs", "write_steps", "get_run", "next_wakeup", "renew_runs"):
        if name in sql:
            return name
    return sql.split("(")[0]


async def test_history_is_one_query_per_claim(dsn: str) -> None:
    """A run resumed after N recorded steps issues the same statements as one
    resumed after 1: claim, ONE history load, the new step, completion."""
    app = pgdurable.Durable(dsn)

    @app.workflow("long", revision="1")
    async def long(ctx: WorkflowContext, n: int) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(f"s{i}", lambda i=i: i)
        await ctx.wait_signal("go", f"long-{n}")
        return await ctx.step("after", lambda: total)

    counted: list[str] = []
    fetchone, fetchall = app.fetchone, app.fetchall

    async def one(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        counted.append(sql)
        return await fetchone(sql, params, **kw)

    async def many(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        counted.append(sql)
        return await fetchall(sql, params, **kw)

    app.fetchone, app.fetchall = one, many  # type: ignore[method-assign]
    per_resume: dict[int, list[str]] = {}
    async with app, app_running(app, poll_interval=60):
        for n in (1, 60):
            rid = await app.start("long", n)
            await _status(app, rid, "waiting")
            counted.clear()
            await app.signal("go", f"long-{n}")
            info = await finished(app, rid)
            assert info.status == "completed" and info.result == sum(range(n))
            per_resume[n] = [k for k in map(_kind_of, counted)  # the worker's, not ours
                             if k in ("history", "write_steps")]
    assert per_resume[1] == per_resume[60]
    assert per_resume[60].count("history") == 1
    assert per_resume[60].count("write_steps") == 2  # the new step, then the completion
    assert long.workflow.history_loads == 2  # type: ignore[attr-defined]


async def test_finish_is_the_last_step_and_the_completion_in_one_write(dsn: str) -> None:
    """ctx.finish: the final step's checkpoint IS the completion (one write_steps
    after the resume, as a task's Done; ctx.step + return is two); the code after
    it never runs; the steps before it replay without running again."""
    app = pgdurable.Durable(dsn)
    calls: list[str] = []

    def tool(name: str, value: int) -> int:
        calls.append(name)
        return value

    @app.workflow("fin", revision="1")
    async def fin(ctx: WorkflowContext, n: int) -> int:
        a = await ctx.step("a", tool, "a", n + 1)
        await ctx.wait_signal("go", f"fin-{n}")
        await ctx.finish("b", tool, "b", a * 10)
        calls.append("after finish")  # never runs
        return -1

    writes: list[str] = []
    fetchall = app.fetchall

    async def many(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        writes.append(_kind_of(sql))
        return await fetchall(sql, params, **kw)

    app.fetchall = many  # type: ignore[method-assign]
    async with app, app_running(app, poll_interval=60):
        rid = await app.start("fin", 4)
        await _status(app, rid, "waiting")
        writes.clear()
        await app.signal("go", "fin-4")
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == 50, info.error
    assert writes.count("write_steps") == 1
    assert calls == ["a", "b"]
    assert _names(dsn, rid) == ["a", "signal:go#1", "b"]  # no separate completion row


async def test_nondeterminism_is_detected(dsn: str) -> None:
    app = pgdurable.Durable(dsn)
    flip = {"v": "a"}

    @app.workflow("nd", revision="1")
    async def nd(ctx: WorkflowContext, _: Any) -> str:
        await ctx.step(flip["v"], lambda: 1)
        await ctx.wait_signal("go", "nd")
        return "done"

    async with app, app_running(app):
        rid = await app.start("nd", None)
        await _status(app, rid, "waiting")
        flip["v"] = "b"  # the code changed under a running revision
        await app.signal("go", "nd")
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "NonDeterministicWorkflow"
    assert "'b'" in info.error["message"] and "'a'" in info.error["message"]
    assert issubclass(NonDeterministicWorkflow, pgdurable.PgDurableError)


async def test_patched_keeps_old_runs_on_the_old_path(dsn: str) -> None:
    app = pgdurable.Durable(dsn)
    patched = {"on": False}

    @app.workflow("p", revision="1")
    async def p(ctx: WorkflowContext, tag: str) -> str:
        await ctx.wait_signal("go", tag)
        if patched["on"] and await ctx.patched("v2"):
            return await ctx.step("new", lambda: "new")
        return await ctx.step("old", lambda: "old")

    async with app, app_running(app):
        old = await app.start("p", "old")
        await _status(app, old, "waiting")
        await app.signal("go", "old")
        assert (await finished(app, old)).result == "old"
        # an old run parked before the patch, resumed after it
        parked = await app.start("p", "parked")
        await _status(app, parked, "waiting")
        patched["on"] = True
        new = await app.start("p", "new")
        await _status(app, new, "waiting")
        await app.signal("go", "parked")
        await app.signal("go", "new")
        assert (await finished(app, parked)).result == "new"  # past its history: new path
        assert (await finished(app, new)).result == "new"
    assert "v2" in _names(dsn, new)


async def test_step_retries_then_records_failure(dsn: str) -> None:
    app = pgdurable.Durable(dsn)
    tries = {"n": 0}

    def flaky() -> str:
        tries["n"] += 1
        if tries["n"] < 3:
            raise ConnectionError(f"try {tries['n']}")
        return "ok"

    def broken() -> None:
        raise KeyError("nope")

    @app.workflow("r", revision="1")
    async def r(ctx: WorkflowContext, _: Any) -> Any:
        fast = StepPolicy(max_attempts=3, retry_base=0.01)
        got = await ctx.step("flaky", flaky, policy=fast)
        try:
            await ctx.step("broken", broken, policy=StepPolicy(max_attempts=2, retry_base=0.01))
        except StepFailed as exc:
            return [got, exc.step, exc.error_type]
        return None

    async with app, app_running(app):
        info = await finished(app, await app.start("r", None))
    assert info.result == ["ok", "broken", "KeyError"]
    assert tries["n"] == 3


async def test_bad_input_changes_nothing(dsn: str) -> None:
    app = pgdurable.Durable(dsn)

    @app.workflow("nonjson", revision="1")
    async def nonjson(ctx: WorkflowContext, _: Any) -> Any:
        await ctx.step("ok", lambda: 1)
        return await ctx.step("bad", lambda: {"when": {1, 2}})

    @app.workflow("dup", revision="1")
    async def dup(ctx: WorkflowContext, _: Any) -> Any:
        await ctx.step("same", lambda: 1)
        a = await ctx.step("same", lambda: 2, repeat=True)   # explicit: recorded as same#2
        return [a, await ctx.step("same", lambda: 3)]         # not explicit: ValueError

    async with app, app_running(app):
        bad = await finished(app, await app.start("nonjson", None))
        d = await finished(app, await app.start("dup", None))
    assert bad.status == "failed" and bad.error is not None
    assert bad.error["type"] == "TypeError"
    assert "step 'bad' result['when']" in bad.error["message"]
    assert _names(dsn, bad.id) == ["ok"]                     # nothing checkpointed for 'bad'
    assert d.status == "failed" and d.error is not None and d.error["type"] == "ValueError"
    assert "'same'" in d.error["message"]
    assert _names(dsn, d.id) == ["same", "same#2"]
    with pytest.raises(TypeError):
        app.workflow("sync")(lambda ctx, x: x)
    with pytest.raises(ValueError):
        StepPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        StepPolicy(replay="reconcile")


async def test_wait_timeout_and_budget_and_cancel(dsn: str) -> None:
    app = pgdurable.Durable(dsn)

    @app.workflow("t", revision="1")
    async def t(ctx: WorkflowContext, _: Any) -> Any:
        try:
            await ctx.wait_signal("never", "x", timeout=0.05)
        except WaitTimeout:
            return "timed out"
        return "signalled"

    @app.workflow("spender", revision="1")
    async def spender(ctx: WorkflowContext, _: Any) -> Any:
        for i in range(10):
            ctx.spend(1)
            await ctx.step(f"s{i}", lambda: None)
        return "never"

    @app.workflow("forever", revision="1")
    async def forever(ctx: WorkflowContext, _: Any) -> Any:
        await ctx.step("first", lambda: 1)
        await ctx.wait_signal("never", "y")

    async with app, app_running(app):
        assert (await finished(app, await app.start("t", None))).result == "timed out"
        s = await finished(app, await app.start("spender", None, budget=3))
        f = await app.start("forever", None)
        await _status(app, f, "waiting")
        assert await app.cancel(f) == "cancelled"
    assert s.status == "failed" and s.error is not None and s.error["type"] == "BudgetExceeded"


async def test_wait_inbox_parks_a_thread_run_until_messages_come(dsn: str) -> None:
    app = pgdurable.Durable(dsn)
    seen: list[Any] = []

    @app.workflow("chat", revision="1")
    async def chat(ctx: WorkflowContext, _: Any) -> list[Any]:
        got: list[Any] = []
        while len(got) < 3:
            msgs = await ctx.wait_inbox()
            got += [m.payload["text"] for m in msgs]
            await ctx.step("reply", seen.append, got[-1], repeat=True)
        return got

    app.thread_task("chat:", "chat")
    async with app, app_running(app):
        first = await app.send("chat:1", {"text": "hi"})
        await _status(app, first.run_id, "waiting")          # drained 'hi', parked on its inbox
        await app.send("chat:1", {"text": "more"})
        await app.send("chat:1", {"text": "bye"})
        info = await finished(app, first.run_id)
    assert info.status == "completed", info.error
    assert info.result == ["hi", "more", "bye"]
    assert seen in (["hi", "bye"], ["hi", "more", "bye"])  # each reply recorded once
    kinds = [n for n in _names(dsn, first.run_id) if n.startswith("inbox")]
    assert kinds[0] == "inbox#1" and "inbox-wait#1" in kinds


async def test_lease_window_gives_the_run_back_at_step_boundaries(dsn: str) -> None:
    """With a lease window used up after every step, the run is given back at
    each boundary and replayed by the next claim: every fn still runs once."""
    app = pgdurable.Durable(dsn)
    calls: list[int] = []

    @app.workflow("windowed", revision="1")
    async def windowed(ctx: WorkflowContext, n: int) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(f"s{i}", lambda i=i: calls.append(i) or i)
        return total

    async with app, app_running(app, lease_window=0.001):
        info = await finished(app, await app.start("windowed", 5))
    assert info.status == "completed" and info.result == 10
    assert calls == [0, 1, 2, 3, 4]
    assert windowed.workflow.history_loads == 5  # type: ignore[attr-defined]
    assert info.claims == 6  # the last release comes before the return


async def test_cancel_and_deadline_stop_a_running_workflow(dsn: str) -> None:
    """A cancel reaches a workflow mid-step (NOTIFY: the coroutine is cancelled,
    the run recorded cancelled); a deadline passing mid-step fails the run."""
    app = pgdurable.Durable(dsn)
    entered: list[str] = []

    async def hang(tag: str) -> None:
        entered.append(tag)
        await asyncio.Event().wait()

    @app.workflow("hang", revision="1")
    async def hanging(ctx: WorkflowContext, tag: str) -> None:
        await ctx.step("first", lambda: 1)
        await ctx.step("hang", hang, tag)

    async with app, app_running(app):
        c = await app.start("hang", "c")
        await until(lambda: asyncio.sleep(0, "c" in entered), "the step to start")
        assert await app.cancel(c) == "leased"
        cancelled = await finished(app, c)
        d = await app.start("hang", "d", deadline=timedelta(milliseconds=300))
        late = await finished(app, d)
    assert cancelled.status == "cancelled"
    assert late.status == "failed" and late.error is not None
    assert late.error["type"] == "DeadlineExceeded"
    assert _names(dsn, c) == ["first"]


async def test_children_start_once_and_gather_wakes_the_parent_once(dsn: str) -> None:
    """ctx.start_child / ctx.gather: sub-agents from a workflow. Each child is a
    recorded step (the replay after the park starts none again), the fan-in
    parks the parent and wakes it once, and a failed child is reported."""
    app = pgdurable.Durable(dsn)
    started: list[str] = []

    @app.task("summarize")
    async def summarize(ctx: pgdurable.RunContext, state: Any) -> pgdurable.Done:
        if state == "bad":
            raise RuntimeError("cannot summarize")
        return pgdurable.Done(str(state).upper())

    @app.workflow("research", revision="1")
    async def research(ctx: WorkflowContext, notes: list[str]) -> dict[str, Any]:
        kids = [await ctx.start_child("summarize", n) for n in notes]
        started.extend(kids)
        outcomes = await ctx.gather(kids)
        return {"out": [[o["status"], o["result"]] for o in outcomes]}

    with pytest.raises(ValueError):
        await ctx_less_gather()
    async with app, app_running(app):
        rid = await app.start("research", ["a", "b", "bad"])
        info = await finished(app, rid)
        tree = await app.run_tree(rid)
    assert info.status == "completed", info.error
    assert info.result == {"out": [["completed", "A"], ["completed", "B"], ["failed", None]]}
    assert len(tree) == 4  # the parent and exactly three children (the replay started none)
    assert set(started) == {str(n.id) for n in tree[1:]}
    assert _names(dsn, rid) == ["child:1", "child:2", "child:3", "children#1", "return"]
    with psycopg.connect(dsn) as c:
        claims = c.execute("SELECT claims FROM pgdurable.runs WHERE id = %s",
                           (rid,)).fetchone()
    assert claims is not None and claims[0] == 2  # before the park, once after the fan-in


async def ctx_less_gather() -> None:
    """Wait.children refuses a bad id list before anything parks."""
    pgdurable.Wait.children(["not-a-uuid"])


async def test_fork_of_a_workflow_replays_recorded_steps_up_to_the_fork_point(dsn: str) -> None:
    """app.fork on a workflow run: the fork's history is the source's first
    checkpoints, so its recorded steps return without calling fn again and only
    the steps after the fork point run (pgdurable.fork + pgdurable.workflows)."""
    app = pgdurable.Durable(dsn)
    calls: dict[str, int] = {}

    def tool(name: str) -> str:
        calls[name] = calls.get(name, 0) + 1
        return name.upper()

    @app.workflow("pipeline", revision="1")
    async def pipeline(ctx: WorkflowContext, _input: Any) -> list[str]:
        return [await ctx.step(n, tool, n) for n in ("a", "b", "c", "d")]

    async with app, app_running(app):
        rid = await app.start("pipeline", {})
        source = await finished(app, rid)
        assert _names(dsn, rid) == ["a", "b", "c", "d", "return"]
        fork_id = await app.fork(rid, from_step=2)   # after "a" and "b" were recorded
        forked = await finished(app, fork_id)
    assert source.status == forked.status == "completed"
    assert forked.result == source.result == ["A", "B", "C", "D"]
    assert calls == {"a": 1, "b": 1, "c": 2, "d": 2}
    assert _names(dsn, fork_id) == ["a", "b", "c", "d", "return"]
    assert _names(dsn, rid) == ["a", "b", "c", "d", "return"]  # the source is untouched
