"""Review of threads and the output stream: bugs found by a fresh-eyes review, on a real Postgres."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, finished, until
from _waiting import app_running as running

from pgdurable import Continue, Done, Durable, InvalidInput, RunContext
from tests.test_stream import collect
from tests.test_threads import q1

LISTENERS = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND query = 'LISTEN pgdurable_events'")


async def test_a_second_inbox_in_the_same_step_returns_only_new_messages(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """``while msgs := await ctx.inbox()`` used to loop forever on the same messages."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    calls: list[list[Any]] = []
    sent = asyncio.Event()

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        while len(calls) < 5:  # bound: the bug returned "a" on every call
            msgs = await ctx.inbox()
            calls.append([m.payload for m in msgs])
            if not msgs:
                break
            if len(calls) == 1:  # a message that arrives during the step
                await app.send("t", "b")
                sent.set()
        return Done(None)

    async with app:
        d = await app.send("t", "a")
        async with running(app):
            await finished(app, d.run_id)
    assert sent.is_set()
    assert calls == [["a"], ["b"], []]
    # both were consumed by the step's checkpoint, exactly once
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages "
                    "WHERE consumed_by = %s", (d.run_id,)) == 2


async def test_a_retried_step_still_sees_the_messages_a_failed_attempt_took(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """The per-attempt filter must not hide reserved messages from the retry."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    calls: list[list[Any]] = []

    @app.task("chat", max_attempts=3, retry_base=0.01, retry_cap=0.01)
    async def chat(ctx: RunContext, state: Any) -> Any:
        calls.append([m.payload for m in await ctx.inbox()])
        if len(calls) == 1:
            raise RuntimeError("transient")
        return Done(None)

    async with app:
        d = await app.send("t", "a")
        async with running(app):
            info = await finished(app, d.run_id)
    assert info.status == "completed"
    assert calls == [["a"], ["a"]]


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


async def test_a_follow_up_run_takes_the_route_of_the_latest_send(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A deploy: the thread's owner runs revision 1; a sender on the new code
    (revision 2) delivers to it; the owner completes without consuming that
    message. The follow-up run must be revision 2 (the latest send's route),
    which the new workers claim; a revision-1 follow-up would wait forever
    once the old workers are gone."""
    old, new = Durable(dsn), Durable(dsn)
    old.thread_task("", "chat", revision="1")
    new.thread_task("", "chat", revision="2")
    in_step, release = asyncio.Event(), asyncio.Event()
    seen: dict[str, list[Any]] = {"1": [], "2": []}

    @old.task("chat", revision="1")
    async def chat_v1(ctx: RunContext, state: Any) -> Any:
        seen["1"] += [m.payload for m in await ctx.inbox()]
        in_step.set()
        await release.wait()
        return Done()  # the message sent meanwhile stays pending: a follow-up

    @new.task("chat", revision="2")
    async def chat_v2(ctx: RunContext, state: Any) -> Any:
        seen["2"] += [m.payload for m in await ctx.inbox()]
        return Done()

    async with old, new:
        async with running(old):
            first = await old.send("t", "hello")
            await asyncio.wait_for(in_step.wait(), WAIT_LIMIT)
            second = await new.send("t", "after the deploy")
            assert (first.action, second.action) == ("wake", "deliver")
            assert second.run_id == first.run_id
            release.set()
            assert (await finished(old, first.run_id)).status == "completed"
        follow_up = q1(conn, "SELECT id::text FROM pgdurable.runs WHERE thread_key = 't' "
                             "AND thread_no = 2")
        assert follow_up is not None
        assert q1(conn, "SELECT revision FROM pgdurable.runs WHERE id = %s", (follow_up,)) == "2"
        async with running(new):
            assert (await finished(new, follow_up)).status == "completed"
    assert seen == {"1": ["hello"], "2": ["after the deploy"]}
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages "
                    "WHERE consumed_at IS NULL") == 0


async def test_only_the_latest_run_of_a_thread_can_be_retried(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Reviving an older run of a thread would give the thread two live runs
    competing for it: refused (InvalidInput, nothing changes). The latest run
    can be retried, takes the thread again and consumes what waits."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    broken = True

    @app.task("chat", max_attempts=1)
    async def chat(ctx: RunContext, state: Any) -> Any:
        if broken:
            raise RuntimeError("broken tool")
        await ctx.inbox()
        return Done()

    async with app:
        async with running(app):
            first = await app.send("t", "one")
            # each failed run hands the pending message to a follow-up, until
            # max_unproductive_runs (3) runs in a row failed
            await until(lambda: _failed_runs(app, conn, 3), "three failed runs of the thread")
        ids = [r[0] for r in conn.execute("SELECT id::text FROM pgdurable.runs "
                                          "WHERE thread_key = 't' ORDER BY thread_no")]
        assert len(ids) == 3 and ids[0] == first.run_id
        for older in ids[:2]:
            with pytest.raises(InvalidInput, match="not the latest run of its thread"):
                await app.retry(older)
            assert (await app.get_run(older)).status == "failed"  # unchanged
        broken = False
        assert await app.retry(ids[2]) == "runnable"
        async with running(app):
            assert (await finished(app, ids[2])).status == "completed"
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages "
                    "WHERE consumed_at IS NULL") == 0


async def _failed_runs(app: Durable, conn: psycopg.Connection[Any], n: int) -> bool:
    return bool(q1(conn, "SELECT count(*) FROM pgdurable.runs WHERE thread_key = 't' "
                         "AND status = 'failed'") == n)


async def test_a_message_taken_by_a_failed_attempt_is_not_consumed_by_a_later_one(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Attempt 1 of step 0 takes "m1" and fails; attempt 2 of step 0 does not
    call inbox() and checkpoints. "m1" must not be consumed by that checkpoint
    (the code that checkpointed never saw it): step 1 receives it."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    got: list[tuple[int, int, list[Any]]] = []

    @app.task("chat", max_attempts=3, retry_base=0.0, retry_cap=0.0)
    async def chat(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0 and ctx.attempt == 1:
            got.append((ctx.step, ctx.attempt, [m.payload for m in await ctx.inbox()]))
            raise RuntimeError("tool failed after reading the inbox")
        if ctx.step == 0:
            return Continue({"skipped_inbox": True})  # this attempt never reads it
        got.append((ctx.step, ctx.attempt, [m.payload for m in await ctx.inbox()]))
        return Done()

    async with app:
        async with running(app):
            d = await app.send("t", "m1")
            assert (await finished(app, d.run_id)).status == "completed"
    assert [(s, m) for s, _, m in got] == [(0, ["m1"]), (1, ["m1"])]
    assert q1(conn, "SELECT consumed_step FROM pgdurable.thread_messages "
                    "WHERE message_id IS NOT NULL") == 1
