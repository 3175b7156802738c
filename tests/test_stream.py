"""The output stream (ctx.emit, app.stream, app.stream_thread): CONTRACT S16 on a real Postgres."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import LISTENING, WAIT_LIMIT, finished, until, until_sync
from _waiting import app_running as running
from fix_fleet import Fleet

from pgdurable import Continue, Done, Durable, RunContext, RunNotFound
from pgdurable.runs.stream import StreamEvent
from tests._thread_procs import EVENTS_PER_STEP, STEPS, create_scratch
from tests.test_threads import FLEET, q1, worker_proc

ROOT = Path(__file__).resolve().parent.parent
#: How many of this database's backends LISTEN (a process's notifier: the one of
#: the test, shared by its worker and its streams).
LISTENERS = LISTENING


async def collect(it: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    out = []
    async for ev in it:
        out.append(ev)
    return out


async def test_s16_events_in_order_then_completion(dsn: str) -> None:
    app = Durable(dsn)

    @app.task("talk")
    async def talk(ctx: RunContext, state: Any) -> Any:
        for i in range(5):
            await ctx.emit({"step": ctx.step, "i": i})
        return Continue(state) if ctx.step < 3 else Done("ok")

    async with app:
        rid = await app.start("talk")
        follower = asyncio.create_task(collect(app.stream(rid, poll=0.2)))
        async with running(app):
            events = await asyncio.wait_for(follower, WAIT_LIMIT)
        assert [e.seq for e in events] == list(range(1, 22))
        assert [e.event for e in events[:-1]] == [{"step": s, "i": i} for s in range(4) for i in range(5)]
        end = events[-1]
        assert end.final and end.event["type"] == "end" and end.event["status"] == "completed"
        assert end.event["result"] == "ok"
        assert not any(e.final for e in events[:-1])
        # replay from a cursor
        tail = await collect(app.stream(rid, after=18))
        assert [e.seq for e in tail] == [19, 20, 21]
        assert await collect(app.stream(rid, after=21)) == []


async def test_a_retried_step_does_not_duplicate_its_events(dsn: str) -> None:
    app = Durable(dsn)
    calls = {"n": 0}

    @app.task("flaky", max_attempts=3, retry_base=0.01, retry_cap=0.01)
    async def flaky(ctx: RunContext, state: Any) -> Any:
        calls["n"] += 1
        for i in range(3):
            await ctx.emit(f"token-{i}")
        if calls["n"] == 1:
            raise RuntimeError("transient")
        return Done(None)

    async with app:
        rid = await app.start("flaky")
        async with running(app):
            events = await asyncio.wait_for(collect(app.stream(rid, poll=0.2)), WAIT_LIMIT)
    assert calls["n"] == 2
    assert [e.event for e in events[:-1]] == ["token-0", "token-1", "token-2"]
    assert [e.seq for e in events] == [1, 2, 3, 4] and events[-1].final


def test_emit_sql_overwrites_a_retried_steps_events_and_is_fenced(conn: psycopg.Connection[Any]) -> None:
    rid = q1(conn, "SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 5, NULL, "
                   "NULL, NULL, NULL)")
    claim = ("SELECT lease_token FROM pgdurable.claim_runs(%s, '{default}', '{t}', '{1}', 1, "
             "'30 s')")
    emit = "SELECT pgdurable.emit_event(%s, %s, %s, %s, %s)"
    t1 = q1(conn, claim, ("w1",))
    assert [q1(conn, emit, (rid, t1, "w1", i, json.dumps(f"a{i}"))) for i in range(2)] == [1, 2]
    conn.execute("SELECT pgdurable.fail_run(%s, %s, 'w1', '{}', 0, '0', false)", (rid, t1))
    t2 = q1(conn, claim, ("w2",))
    assert [q1(conn, emit, (rid, t2, "w2", i, json.dumps(f"b{i}"))) for i in range(3)] == [1, 2, 3]
    rows = conn.execute("SELECT seq, event, token FROM pgdurable.run_events ORDER BY seq").fetchall()
    assert rows == [(1, "b0", t2), (2, "b1", t2), (3, "b2", t2)]
    with pytest.raises(psycopg.Error) as ei:  # the stale attempt is fenced
        conn.execute(emit, (rid, t1, "w1", 5, '"late"'))
    assert ei.value.sqlstate == "PD001"
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(emit, (rid, t2, "w2", -1, '"bad"'))
    assert ei.value.sqlstate == "PD000"
    conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w2', '{}', 0)", (rid, t2))
    assert q1(conn, emit, (rid, t2, "w2", 0, '"next step"')) == 4
    conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w2', '{}', '1', 0)", (rid, t2))
    final = conn.execute("SELECT seq, final, event->>'status' FROM pgdurable.run_events "
                         "ORDER BY seq DESC LIMIT 1").fetchone()
    assert final == (5, True, "completed")


async def test_a_run_without_events_ends_with_a_synthesized_end(dsn: str) -> None:
    app = Durable(dsn)
    app.task("quiet")(lambda ctx, s: Done(7))
    async with app:
        rid = await app.start("quiet")
        async with running(app):
            events = await asyncio.wait_for(collect(app.stream(rid, poll=0.2)), WAIT_LIMIT)
        assert len(events) == 1 and events[0].final
        assert events[0].event == {"type": "end", "status": "completed", "result": 7, "error": None}
        with pytest.raises(RunNotFound):
            await collect(app.stream("00000000-0000-0000-0000-000000000000"))
        with pytest.raises(ValueError):
            await collect(app.stream(rid, after=-1))
        with pytest.raises(ValueError):
            await collect(app.stream_thread("t", after="x"))


async def test_stream_thread_follows_every_run_of_the_thread(dsn: str) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    release = asyncio.Event()
    in_first = asyncio.Event()

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        msgs = await ctx.inbox()
        for m in msgs:
            await ctx.emit({"echo": m.payload})
        if msgs and msgs[0].payload == "first":
            in_first.set()
            await release.wait()
        return Done(None)

    async with app:
        got: list[StreamEvent] = []

        async def follow() -> None:
            async for ev in app.stream_thread("th", poll=0.2):
                got.append(ev)
                if sum(e.final for e in got) == 2:
                    return

        follower = asyncio.create_task(follow())
        async with running(app):
            d1 = await app.send("th", "first")
            await asyncio.wait_for(in_first.wait(), WAIT_LIMIT)
            d2 = await app.send("th", "second")  # queued for the run that is busy
            release.set()
            await asyncio.wait_for(follower, WAIT_LIMIT)
        assert (d2.action, d2.run_id) == ("deliver", d1.run_id)
        assert [(e.thread_no, e.event.get("echo"), e.final) for e in got] == [
            (1, "first", False), (1, None, True), (2, "second", False), (2, None, True)]
        assert got[0].run_id == d1.run_id and got[2].run_id != d1.run_id
        # replay after a cursor, without following
        rest = await collect(app.stream_thread("th", after=got[0].cursor, follow=False))
        assert [(e.run_id, e.seq) for e in rest] == [(e.run_id, e.seq) for e in got[1:]]


@pytest.mark.slow
@pytest.mark.crash
@FLEET
def test_a_follower_in_another_process_sees_every_event_once_across_a_worker_crash(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, fleet: Fleet
) -> None:
    create_scratch(dsn)
    block = tmp_path / "block"
    block.write_text("1")
    rid = q1(conn, "SELECT run_id::text FROM pgdurable.start_run('talker', '1', '{}', 'default', "
                   "0, 10, NULL, NULL, NULL, NULL)")
    # a follower, not a worker: a raw process, read line by line from its stdout as it runs
    follower = subprocess.Popen(
        [sys.executable, "-m", "tests._thread_procs", "follow", dsn, rid], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    assert follower.stdout is not None
    assert json.loads(follower.stdout.readline()) == "ready"
    lines: list[Any] = []

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            lines.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    a = worker_proc(fleet, ttl=1.5, env={"PGD_BLOCK_FILE": str(block)})
    try:
        # worker A is inside step 2 after emitting 3 of its events
        until_sync(lambda: len(lines) >= 2 * EVENTS_PER_STEP + 3, "events of step 2")
    finally:
        a.kill()  # SIGKILL, reaped
    block.unlink()
    b = worker_proc(fleet, ttl=1.5)
    try:
        follower.wait(timeout=WAIT_LIMIT)
        reader.join(timeout=WAIT_LIMIT)
    finally:
        b.terminate()
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, follower.stderr.read() if follower.stderr else ""
    n = STEPS * EVENTS_PER_STEP
    assert [ln["seq"] for ln in lines] == list(range(1, n + 2))
    assert [ln["event"] for ln in lines[:-1]] == [
        {"step": s, "i": i} for s in range(STEPS) for i in range(EVENTS_PER_STEP)]
    assert lines[-1]["final"] and lines[-1]["event"]["status"] == "completed"
    assert q1(conn, "SELECT count(*) FROM public.t_steps WHERE step = 2") == 2  # step 2 re-ran
    assert q1(conn, "SELECT count(*) FROM pgdurable.run_events") == n + 1


async def test_a_stream_survives_its_listener_being_killed(
    dsn: str, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgdurable.notifier")
    app = Durable(dsn)
    gate = asyncio.Event()

    @app.task("talk")
    async def talk(ctx: RunContext, state: Any) -> Any:
        await ctx.emit("before")
        await gate.wait()
        for i in range(3):
            await ctx.emit(f"after-{i}")
        return Done(None)

    async with app:
        rid = await app.start("talk")
        got: list[StreamEvent] = []
        first = asyncio.Event()

        async def follow() -> None:
            async for ev in app.stream(rid, poll=0.2):
                got.append(ev)
                first.set()

        async with running(app):
            follower = asyncio.create_task(follow())
            await asyncio.wait_for(first.wait(), WAIT_LIMIT)
            # the process's one LISTEN connection (the worker's and the stream's)
            killed = q1(conn, LISTENING.replace("count(*)", "count(pg_terminate_backend(pid))"))
            assert killed == 1
            gate.set()
            await asyncio.wait_for(follower, WAIT_LIMIT)
    assert [e.event for e in got[:-1]] == ["before", "after-0", "after-1", "after-2"]
    assert [e.seq for e in got] == [1, 2, 3, 4, 5] and got[-1].final
    assert "listener connection lost" in caplog.text  # it noticed, reconnected and re-read


async def test_streams_of_one_app_share_one_listen_connection(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    app = Durable(dsn)
    gate = asyncio.Event()

    @app.task("talk")
    async def talk(ctx: RunContext, state: Any) -> Any:
        await ctx.emit("hi")
        await gate.wait()
        return Done(None)

    async with app:
        ids = [await app.start("talk") for _ in range(3)]
        seen = [asyncio.Event() for _ in ids]

        async def follow(i: int) -> list[StreamEvent]:
            out = []
            async for ev in app.stream(ids[i], poll=0.2):
                out.append(ev)
                seen[i].set()
            return out

        async with running(app):
            followers = [asyncio.create_task(follow(i)) for i in range(3)]
            for ev in seen:
                await asyncio.wait_for(ev.wait(), WAIT_LIMIT)
            assert q1(conn, LISTENERS) == 1
            gate.set()
            results = await asyncio.wait_for(asyncio.gather(*followers), WAIT_LIMIT)
        assert all([e.event for e in r] == ["hi", r[-1].event] and r[-1].final for r in results)
        for _ in range(100):  # the last stream closed the shared connection
            if q1(conn, LISTENERS) == 0:
                break
            await asyncio.sleep(0.02)
        assert q1(conn, LISTENERS) == 0


# -- found by a review: a revived run's stream, a bad poll


async def test_the_stream_of_a_retried_run_does_not_end_at_its_first_end(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """app.stream() of a run revived by retry_run used to end at once, at the
    end event of its failed life ("failed"), though the run went on."""
    app = Durable(dsn)
    gate = asyncio.Event()
    calls = {"n": 0}

    @app.task("t", max_attempts=1)
    async def t(ctx: RunContext, state: Any) -> Any:
        calls["n"] += 1
        if ctx.step == 0:
            await ctx.emit("s0")
            return Continue(state)
        if calls["n"] == 2:
            await ctx.emit("s1-first")
            raise RuntimeError("boom")
        await gate.wait()
        await ctx.emit("s1-again")  # same (step, idx): overwrites seq 2 in place
        await ctx.emit("s1-more")
        return Done("ok")

    async with app:
        rid = await app.start("t")
        async with running(app):
            assert (await finished(app, rid)).status == "failed"
            first = await collect(app.stream(rid, poll=0.2))
            assert [(e.seq, e.final) for e in first] == [(1, False), (2, False), (3, True)]
            assert await app.retry(rid) == "runnable"
            follower = asyncio.create_task(collect(app.stream(rid, poll=0.2)))
            await until(lambda: asyncio.sleep(0, calls["n"] == 3), "the retry to run")
            assert not follower.done()
            gate.set()
            got = await asyncio.wait_for(follower, WAIT_LIMIT)
        assert [e.seq for e in got] == [1, 2, 3, 4, 5]
        assert got[2].event["status"] == "failed" and not got[2].final  # the old end
        assert got[3].event == "s1-more"
        assert got[-1].final and got[-1].event["status"] == "completed"
        assert [e.final for e in got] == [False, False, False, False, True]
        # replay after the run ended: the same, and a cursor past the old end
        assert [(e.seq, e.final) for e in await collect(app.stream(rid))] == [
            (e.seq, e.final) for e in got]
        assert [e.seq for e in await collect(app.stream(rid, after=3))] == [4, 5]


async def test_bad_poll_is_a_typed_error_before_any_listen(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """poll=0 used to busy-poll the database (no error); a non-number failed late."""
    app = Durable(dsn)
    app.task("quiet")(lambda ctx, s: Done(None))
    async with app:
        rid = await app.start("quiet")
        async with running(app):
            await finished(app, rid)  # so that a stream that accepts a bad poll ends
        for bad in (0, -1, 0.0, float("nan"), float("inf")):
            with pytest.raises(ValueError):
                await collect(app.stream(rid, poll=bad))
            with pytest.raises(ValueError):
                await collect(app.stream_thread("t", follow=False, poll=bad))
        for wrong in ("1", None, True):
            with pytest.raises(TypeError):
                await collect(app.stream(rid, poll=wrong))  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await collect(app.stream_thread("t", follow=False, poll=wrong))  # type: ignore[arg-type]
        assert q1(conn, LISTENERS) == 0
        assert await collect(app.stream_thread("t", follow=False, poll=1)) == []
