"""Durable task definitions registered with the Durable app and run by leased
workers (in process), ctx.effect replay, and app.with_idempotency."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _waiting import finished, running

from pgdurable import (
    Done,
    Durable,
    DurableCheckpoint,
    DurableClient,
    DurableStep,
    EffectFailed,
    RunContext,
    define_durable_task,
)
from pgdurable.models.durable_runs import DurableRunContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn, pool_size=4)
    yield a
    await a.close()


def is_count(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("count"), int)


def inc(state: Any, _ctx: Any) -> Any:
    return {**state, "count": state["count"] + 1}


def rows(conn: psycopg.Connection[Any], sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return conn.execute(sql, args).fetchall()


# ------------------------------------------------------------ the seed's examples
async def test_seed_count_example_through_the_app(app: Durable,
                                                   conn: psycopg.Connection[Any]) -> None:
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               steps=[DurableStep(id="increment", run=inc)])
    assert app.register(task) is task
    rid = await app.start(task.id, state={"count": 0})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "completed"
    assert info.result == {"count": 1} and info.state == {"count": 1}
    # the checkpoint carries definition id + revision; runs.step = next_step_index
    assert (info.task, info.revision, info.step) == ("count", "1", 1)
    assert info.attempts == 0  # runs.attempts counts failed attempts only
    assert info.max_attempts == task.max_attempts


async def test_seed_reconcile_example_runs_once(app: Durable) -> None:
    committed: dict[str, int] = {}

    def commit(state: Any, ctx: DurableRunContext) -> Any:
        key = ctx.app["key"]
        value = committed.get(key, state["count"] + 1)
        committed[key] = value
        return {"count": value}

    def reconcile(state: Any, ctx: DurableRunContext) -> Any:
        value = committed.get(ctx.app["key"])
        if value is None:
            raise RuntimeError("no verifiable commit")
        return {"count": value}

    task = define_durable_task(id="count", revision="1", is_state=is_count, steps=[
        DurableStep(id="commit", run=commit, replay="reconcile", reconcile=reconcile)])
    app.register(task, context={"key": "demo-task"})
    rid = await app.start(task.id, state={"count": 0}, idempotency_key="demo-task")
    async with running(app.worker(poll_interval=0.2)):
        first = await finished(app, rid)
        # a second start of the same task id is the same (completed) run: no step runs again
        assert await app.start(task.id, state={"count": 0}, idempotency_key="demo-task") == rid
        await asyncio.sleep(0.3)
    assert first.result == {"count": 1}
    assert (await app.get_run(rid)).result == {"count": 1}
    assert len(committed) == 1


async def test_steps_checkpoint_one_by_one(app: Durable, conn: psycopg.Connection[Any]) -> None:
    seen: list[int] = []

    def step(state: Any, ctx: DurableRunContext) -> Any:
        seen.append(ctx.run.step)
        return inc(state, ctx)

    task = define_durable_task(id="three", revision="2", is_state=is_count,
                               initial_state={"count": 0},
                               steps=[DurableStep(id=f"s{i}", run=step) for i in range(3)])
    app.register(task)
    rid = await app.start(task.id)  # initial_state
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.result == {"count": 3} and info.step == 3 and seen == [0, 1, 2]
    hist = rows(conn, "SELECT step, state FROM pgdurable.checkpoints WHERE run_id = %s "
                      "ORDER BY step", rid)
    assert hist == [(1, {"count": 1}), (2, {"count": 2}), (3, {"count": 3})]


# ------------------------------------------------------------ validation
async def test_start_validates_state_and_registration(app: Durable,
                                                      conn: psycopg.Connection[Any]) -> None:
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               steps=[DurableStep(id="increment", run=inc)])
    app.register(task)
    with pytest.raises(ValueError, match="is_state"):
        await app.start(task.id, state={"count": "zero"})
    with pytest.raises(ValueError, match="is_state"):
        await app.start(task.id)  # no state, no initial_state
    with pytest.raises(TypeError):
        await app.start(task.id, state={"count": 1, "tags": {1, 2}})
    assert rows(conn, "SELECT count(*) FROM pgdurable.runs") == [(0,)]
    with pytest.raises(ValueError, match="already registered"):
        app.register(task)
    with pytest.raises(TypeError, match="DurableTask"):
        app.register("count")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        app.register(define_durable_task(id="x", revision="1", is_state=is_count,
                                         steps=[DurableStep(id="a", run=inc)]), retry_base=-1)


async def test_corrupt_state_on_claim_fails_visibly(app: Durable,
                                                    conn: psycopg.Connection[Any]) -> None:
    ran: list[int] = []

    def step(state: Any, _ctx: Any) -> Any:
        ran.append(1)
        return state

    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               steps=[DurableStep(id="a", run=step)])
    app.register(task)
    rid = await app.start(task.id, state={"count": 0})
    conn.execute("UPDATE pgdurable.runs SET state = '{\"count\": \"x\"}' WHERE id = %s", (rid,))
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "CorruptCheckpoint"
    assert info.state == {"count": "x"}  # nothing repaired
    assert ran == [] and info.attempts == 1  # terminal: not retried


async def test_step_index_past_the_end_is_corrupt(app: Durable,
                                                  conn: psycopg.Connection[Any]) -> None:
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               steps=[DurableStep(id="a", run=inc)])
    app.register(task)
    rid = await app.start(task.id, state={"count": 0})
    conn.execute("UPDATE pgdurable.runs SET step = 5 WHERE id = %s", (rid,))
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "CorruptCheckpoint"


# ------------------------------------------------------------ authorize
async def test_authorize_on_every_claim(app: Durable) -> None:
    checks: list[tuple[int, str]] = []

    def authorize(record: DurableCheckpoint, ctx: DurableRunContext) -> None:
        checks.append((record.next_step_index, record.definition_id))

    task = define_durable_task(id="auth", revision="1", is_state=is_count,
                               authorize=authorize,
                               steps=[DurableStep(id=f"s{i}", run=inc) for i in range(3)])
    app.register(task)
    # one lease window per step: every step after the first is a resume
    rid = await app.start(task.id, state={"count": 0})
    async with running(app.worker(poll_interval=0.2, lease_window=0.001)):
        info = await finished(app, rid)
    assert info.result == {"count": 3}
    assert checks == [(0, "auth"), (1, "auth"), (2, "auth")]

    # many steps in one lease window: authorized once (one claim)
    checks.clear()
    rid = await app.start(task.id, state={"count": 0})
    async with running(app.worker(poll_interval=0.2)):
        await finished(app, rid)
    assert checks == [(0, "auth")]


async def test_authorize_denial_stops_before_any_step(app: Durable) -> None:
    ran: list[int] = []

    def step(state: Any, _ctx: Any) -> Any:
        ran.append(1)
        return inc(state, _ctx)

    def authorize(record: DurableCheckpoint, ctx: DurableRunContext) -> bool:
        return record.next_step_index == 0 or ctx.app["allow_resume"]

    task = define_durable_task(id="auth", revision="1", is_state=is_count,
                               authorize=authorize,
                               steps=[DurableStep(id="a", run=step), DurableStep(id="b", run=step)])
    app.register(task, context={"allow_resume": False})
    rid = await app.start(task.id, state={"count": 0})
    async with running(app.worker(poll_interval=0.2, lease_window=0.001)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "PermissionError"
    assert ran == [1]  # the first step ran; the resume was denied before step "b"
    assert info.step == 1 and info.state == {"count": 1}


async def test_authorize_raising_is_recorded(app: Durable) -> None:
    def authorize(record: DurableCheckpoint, ctx: DurableRunContext) -> None:
        raise PermissionError("token revoked")

    task = define_durable_task(id="auth", revision="1", is_state=is_count,
                               authorize=authorize, steps=[DurableStep(id="a", run=inc)])
    app.register(task)
    rid = await app.start(task.id, state={"count": 0})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "PermissionError" and "revoked" in info.error["message"]
    assert info.step == 0


# ------------------------------------------------------------ attempts, deadline
async def test_max_attempts_and_deadline_map_to_the_run(app: Durable) -> None:
    calls: list[int] = []

    def flaky(state: Any, _ctx: Any) -> Any:
        calls.append(1)
        raise RuntimeError("always")

    task = define_durable_task(id="flaky", revision="1", is_state=is_count, max_attempts=2,
                               deadline=timedelta(hours=1), steps=[DurableStep(id="a", run=flaky)])
    app.register(task, retry_base=0.0, retry_cap=0.0)
    rid = await app.start(task.id, state={"count": 0})
    info = await app.get_run(rid)
    assert info.max_attempts == 2
    assert info.deadline_at is not None
    assert timedelta(minutes=59) < info.deadline_at - info.created_at <= timedelta(hours=1)
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.attempts == 2 and len(calls) == 2
    assert info.error is not None and info.error["type"] == "RuntimeError"


async def test_passed_deadline_fails_before_a_step(app: Durable,
                                                   conn: psycopg.Connection[Any]) -> None:
    ran: list[int] = []

    def step(state: Any, _ctx: Any) -> Any:
        ran.append(1)
        return state

    task = define_durable_task(id="late", revision="1", is_state=is_count, deadline=60_000,
                               steps=[DurableStep(id="a", run=step)])
    app.register(task)
    rid = await app.start(task.id, state={"count": 0})
    conn.execute("UPDATE pgdurable.runs SET deadline_at = now() - interval '1 s' WHERE id = %s",
                 (rid,))
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "DeadlineExceeded" and ran == []


# ------------------------------------------------------------ reconcile steps
def _reconcile_task(outcomes: list[str], *, reconcile_fails: bool) -> Any:
    def commit(state: Any, _ctx: Any) -> Any:
        outcomes.append("run")
        raise ConnectionError("reply lost")  # the commit may or may not have happened

    def reconcile(state: Any, _ctx: Any) -> Any:
        outcomes.append("reconcile")
        if reconcile_fails:
            raise LookupError("no trace of the commit")
        return {"count": state["count"] + 1}

    return define_durable_task(id="rec", revision="1", is_state=is_count, steps=[
        DurableStep(id="commit", run=commit, replay="reconcile", reconcile=reconcile)])


async def test_unconfirmed_reconcile_step_is_reconciled_not_rerun(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    outcomes: list[str] = []
    app.register(_reconcile_task(outcomes, reconcile_fails=False), retry_base=0.0)
    rid = await app.start("rec", state={"count": 0})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert outcomes == ["run", "reconcile"]
    assert info.status == "completed" and info.result == {"count": 1} and info.attempts == 1


async def test_reconcile_failure_stops_the_run(app: Durable, conn: psycopg.Connection[Any]) -> None:
    outcomes: list[str] = []
    app.register(_reconcile_task(outcomes, reconcile_fails=True), retry_base=0.0)
    rid = await app.start("rec", state={"count": 0})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert outcomes == ["run", "reconcile"]  # never re-run, reconciled once, then stopped
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "ReconcileFailed" and info.attempts == 2
    # the in-flight mark stays for the application to inspect
    assert rows(conn, "SELECT step, step_id FROM pgdurable.durable_steps WHERE run_id = %s",
                rid) == [(0, "commit")]


async def test_step_marks_are_fenced(app: Durable, conn: psycopg.Connection[Any]) -> None:
    rid = await app.start("t", state={}, revision="1")
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgdurable.durable_step_mark(%s, 1, 0, 'a')", (rid,))
    assert err.value.sqlstate == "PD001"
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM pgdurable.durable_step_enter(%s, 1, 0)", (rid,))
    assert err.value.sqlstate == "PD001"
    assert rows(conn, "SELECT count(*) FROM pgdurable.durable_steps") == [(0,)]


def _lease(conn: psycopg.Connection[Any], rid: str, owner: str) -> int:
    """Simulate a claim by ``owner`` (a new token, an unexpired lease)."""
    row = conn.execute(
        "UPDATE pgdurable.runs SET status = 'leased', lease_owner = %s, "
        "lease_token = lease_token + 1, lease_expires_at = pgdurable.now() + interval '1 min' "
        "WHERE id = %s RETURNING lease_token", (owner, rid)).fetchone()
    assert row is not None
    return int(row[0])


async def test_sql_step_enter_and_mark(app: Durable, conn: psycopg.Connection[Any]) -> None:
    rid = await app.start("t", state={}, revision="1")
    enter = "SELECT first_in_claim, in_flight FROM pgdurable.durable_step_enter(%s, %s, %s)"
    t1 = _lease(conn, rid, "w1")
    assert rows(conn, enter, rid, t1, 0) == [(True, None)]
    assert rows(conn, enter, rid, t1, 0) == [(False, None)]  # same claim
    conn.execute("SELECT pgdurable.durable_step_mark(%s, %s, 0, 'commit')", (rid, t1))
    assert rows(conn, enter, rid, t1, 0) == [(False, None)]  # marked by this very claim
    with pytest.raises(psycopg.Error) as err:  # only the run's next step can be marked
        conn.execute("SELECT pgdurable.durable_step_mark(%s, %s, 3, 'x')", (rid, t1))
    assert err.value.sqlstate == "PD000"
    t2 = _lease(conn, rid, "w2")
    with pytest.raises(psycopg.Error) as err:  # the old token is fenced out
        conn.execute(enter, (rid, t1, 0))
    assert err.value.sqlstate == "PD001"
    assert rows(conn, enter, rid, t2, 0) == [(True, "commit")]  # found in flight
    assert rows(conn, enter, rid, t2, 1) == [(False, None)]  # a mark counts only at its step


async def test_sql_effect_begin_replay_flag(app: Durable,
                                               conn: psycopg.Connection[Any]) -> None:
    rid = await app.start("t", state={}, revision="1")
    begin = "SELECT status, result, error, replay FROM pgdurable.effect_begin(%s, %s, %s, %s)"
    t1 = _lease(conn, rid, "w1")
    assert rows(conn, begin, rid, t1, "w1", "k") == [("started", None, None, False)]
    assert rows(conn, begin, rid, t1, "w1", "k") == [("started", None, None, False)]
    t2 = _lease(conn, rid, "w2")  # the first attempt died without an outcome
    with pytest.raises(psycopg.Error) as err:
        conn.execute(begin, (rid, t1, "w1", "k"))
    assert err.value.sqlstate == "PD001"
    assert rows(conn, begin, rid, t2, "w2", "k") == [("started", None, None, True)]
    conn.execute("SELECT pgdurable.effect_finish(%s, %s, 'w2', 'k', true, '{\"ok\": 1}', NULL)",
                 (rid, t2))
    t3 = _lease(conn, rid, "w3")
    assert rows(conn, begin, rid, t3, "w3", "k") == [("succeeded", {"ok": 1}, None, False)]


# ------------------------------------------------------------ ctx.effect
async def test_retried_step_gets_the_stored_effect(app: Durable,
                                                   conn: psycopg.Connection[Any]) -> None:
    executed: list[int] = []

    @app.task("pay", max_attempts=3, retry_base=0.0, retry_cap=0.0)
    async def pay(ctx: RunContext, state: Any) -> Any:
        def charge() -> Any:
            executed.append(1)
            return {"charge": len(executed)}

        result = await ctx.effect("charge", charge)
        if ctx.attempt == 1:
            raise RuntimeError("crash after the effect")
        return Done(result=result)

    rid = await app.start("pay")
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"charge": 1} and executed == [1]
    assert rows(conn, "SELECT status, result FROM pgdurable.effects WHERE run_id = %s", rid) == [
        ("succeeded", {"charge": 1})]


async def test_effect_reconcile_only_for_an_earlier_attempt(app: Durable) -> None:
    calls: list[str] = []

    @app.task("send", max_attempts=3, retry_base=0.0, retry_cap=0.0)
    async def send(ctx: RunContext, state: Any) -> Any:
        def fn() -> Any:
            calls.append("fn")
            return "fn"

        def reconcile() -> Any:
            calls.append("reconcile")
            return "reconciled"

        return Done(result=await ctx.effect("k", fn, reconcile=reconcile))

    rid = await app.start("send")
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.result == "fn" and calls == ["fn"]  # a fresh effect runs fn


async def test_effect_bad_input(app: Durable) -> None:
    seen: list[str] = []

    @app.task("bad")
    async def bad(ctx: RunContext, state: Any) -> Any:
        with pytest.raises(TypeError):
            await ctx.effect("k", lambda: 1, reconcile=42)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await ctx.effect("", lambda: 1, reconcile=lambda: 2)
        seen.append("ok")
        return Done()

    rid = await app.start("bad")
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "completed" and seen == ["ok"]


async def test_failed_effect_is_not_repeated(app: Durable) -> None:
    calls: list[int] = []

    @app.task("boom", max_attempts=3, retry_base=0.0, retry_cap=0.0)
    async def boom(ctx: RunContext, state: Any) -> Any:
        def fn() -> Any:
            calls.append(1)
            raise RuntimeError("declined")

        await ctx.effect("charge", fn, reconcile=lambda: "never")
        return Done()

    rid = await app.start("boom")
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    # attempt 1: fn raises (recorded failed, step error -> retry); attempt 2: EffectFailed (terminal)
    assert calls == [1] and info.status == "failed" and info.error is not None
    assert info.error["type"] == "EffectFailed"
    assert issubclass(EffectFailed, Exception)


# ------------------------------------------------------------ with_idempotency
async def test_app_with_idempotency(app: Durable, dsn: str) -> None:
    calls: list[int] = []

    async def fn() -> Any:
        calls.append(1)
        return {"n": len(calls)}

    assert await app.with_idempotency("k1", fn, ttl=timedelta(days=1)) == {"n": 1}
    assert await app.with_idempotency("k1", fn) == {"n": 1}
    assert calls == [1]
    with pytest.raises(ValueError):
        await app.with_idempotency("", fn)
    with pytest.raises(TypeError):
        await app.with_idempotency("k2", 42)  # type: ignore[arg-type]

    sync_calls: list[int] = []

    def sync_fn() -> Any:
        sync_calls.append(1)
        return "once"

    with DurableClient(dsn) as client:
        assert client.with_idempotency("k3", sync_fn) == "once"
        assert client.with_idempotency("k3", sync_fn) == "once"
        assert await app.with_idempotency("k3", fn) == "once"  # same table, same key
    assert sync_calls == [1]


GATE = 6006


def _child_env(dsn: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "tests") + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_twenty_processes_race_through_the_app(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE public.effect_log (id serial PRIMARY KEY, what text NOT NULL, "
                 "run_id text)")
    conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
    procs = [
        subprocess.Popen([sys.executable, "-m", "_effects_app", "race", dsn, "race-key", str(GATE)],
                         cwd=ROOT, env=_child_env(dsn), stdout=subprocess.PIPE, text=True)
        for _ in range(20)
    ]
    try:
        # all 20 wait on the gate: release it at once
        for _ in range(3000):
            n = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objid = %s", (GATE,)).fetchone()
            if n is not None and n[0] == 20:
                break
            if any(p.poll() is not None for p in procs):
                raise AssertionError("a child exited early")
            conn.execute("SELECT pg_sleep(0.02)")
        else:
            raise AssertionError("children never reached the gate")
        conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs)
    results = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert rows(conn, "SELECT count(*) FROM public.effect_log WHERE what = 'race'") == [(1,)]
    assert len({json.dumps(r, sort_keys=True) for r in results}) == 1
