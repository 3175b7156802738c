"""The worker loop, in process, against a real Postgres."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _pgnet import proxied
from _waiting import WAIT_LIMIT, finished, running, until

from pgdurable import (
    Continue,
    Done,
    Durable,
    DurableStep,
    RunContext,
    Sleep,
    ValueTooLarge,
    Wait,
    define_durable_task,
)
from pgdurable.foundation import jsonb
from pgdurable.foundation import run_queries as q
from pgdurable.foundation.affinity import ABSENT, PRESENT, STARTED
from pgdurable.foundation.queries.fork import REGISTER_WORKER, UNREGISTER_WORKER
from pgdurable.models.durable_runs import DurableRunContext


async def status_is(app: Durable, rid: str, status: str) -> None:
    async def check() -> bool:
        return (await app.get_run(rid)).status == status

    await until(check, f"run {rid} status {status}")


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    yield a
    await a.close()


async def test_continue_steps_and_history(app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("count", revision="1")
    async def count(ctx: RunContext, state: dict[str, Any]) -> Any:
        if state["n"] < 3:
            return Continue({"n": state["n"] + 1})
        return Done({"final": state["n"]})

    rid = await app.start("count", {"n": 0})
    async with running(app.worker(concurrency=2, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"final": 3} and info.step == 4
    hist = conn.execute("SELECT step, state, token FROM pgdurable.checkpoints ORDER BY step").fetchall()
    assert [(h[0], h[1]) for h in hist] == [(1, {"n": 1}), (2, {"n": 2}), (3, {"n": 3}), (4, {"n": 3})]
    assert {h[2] for h in hist} == {1}  # one lease did it all


async def test_steps_finishing_together_are_written_in_one_batch(
    app: Durable, conn: psycopg.Connection[Any]
) -> None:
    """20 steps that finish in the same event-loop turn go in ONE write_steps
    statement (then their 20 next steps in one more)."""
    arrived: list[str] = []
    gate = asyncio.Event()

    @app.task("wide", revision="1")
    async def wide(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            arrived.append(ctx.run_id)
            await gate.wait()
            return Continue({"stepped": 1})
        return Done(ctx.step)

    ids = [await app.start("wide", {}) for _ in range(20)]
    worker = app.worker(concurrency=20, poll_interval=60)
    async with running(worker):
        await until(lambda: _true(len(arrived) == 20), "all 20 steps to start")
        gate.set()
        for rid in ids:
            assert (await finished(app, rid)).status == "completed"
        assert worker.write_count == 2
    assert conn.execute("SELECT count(*), count(DISTINCT token) FROM pgdurable.checkpoints"
                        ).fetchone() == (40, 1)


async def _true(value: bool) -> bool:
    return value


async def test_sync_step_runs_in_thread(app: Durable) -> None:
    seen: list[str] = []

    @app.task("sync", revision="1")
    def sync_step(ctx: RunContext, state: dict[str, Any]) -> Any:
        seen.append(threading.current_thread().name)
        return Done(threading.current_thread() is threading.main_thread())

    rid = await app.start("sync", {})
    async with running(app.worker(poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.result is False and seen and seen[0] != threading.main_thread().name


async def test_many_runs_complete(app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("three", revision="1")
    async def three(ctx: RunContext, state: dict[str, Any]) -> Any:
        return Continue(state) if ctx.step < 2 else Done(ctx.step)

    ids = [await app.start("three", {"i": i}) for i in range(60)]
    async with running(app.worker(concurrency=8, poll_interval=0.5)):
        for rid in ids:
            assert (await finished(app, rid)).status == "completed"
    assert conn.execute("SELECT count(*) FROM pgdurable.checkpoints").fetchone() == (180,)
    # no step was checkpointed under two tokens
    assert conn.execute(
        "SELECT count(*) FROM (SELECT run_id, step FROM pgdurable.checkpoints "
        "GROUP BY 1, 2 HAVING count(*) > 1) x").fetchone() == (0,)


async def test_retries_then_failed(app: Durable) -> None:
    calls: list[int] = []

    @app.task("flaky", revision="1", max_attempts=3, retry_base=0.01, retry_cap=0.05)
    async def flaky(ctx: RunContext, state: Any) -> Any:
        calls.append(ctx.attempt)
        raise RuntimeError(f"boom {ctx.attempt}")

    rid = await app.start("flaky", {})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.attempts == 3 and calls == [1, 2, 3]
    assert info.error is not None and info.error["type"] == "RuntimeError"
    assert info.error["message"] == "boom 3" and "Traceback" in info.error["traceback"]


async def test_a_delayed_retry_runs_without_waiting_for_the_poll(app: Durable) -> None:
    """A future retry sends no NOTIFY: the worker that scheduled it wakes for it
    itself (with a one-hour poll the run could otherwise only finish an hour later;
    next_wakeup alone can run before the retry is written, a race seen in the suite)."""
    @app.task("retry-soon", revision="1", max_attempts=3, retry_base=0.2, retry_cap=0.2)
    async def retry_soon(ctx: RunContext, state: Any) -> Any:
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return Done("ok")

    rid = await app.start("retry-soon", {})
    async with running(app.worker(poll_interval=3600)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.attempts == 1


async def test_retry_is_scheduled_with_backoff(app: Durable) -> None:
    @app.task("slowretry", revision="1", max_attempts=5, retry_base=60)
    async def slowretry(ctx: RunContext, state: Any) -> Any:
        raise ValueError("nope")

    rid = await app.start("slowretry", {})
    async with running(app.worker(poll_interval=0.2)):
        async def retried() -> bool:
            return (await app.get_run(rid)).attempts == 1

        await until(retried, "first failure")
    info = await app.get_run(rid)
    assert info.status == "runnable" and info.error is not None
    assert info.error["type"] == "ValueError"
    delay = (info.available_at - info.updated_at).total_seconds()
    assert 25 <= delay <= 95  # 60 s * jitter [0.5, 1.5)


async def test_deadline_and_budget(app: Durable) -> None:
    @app.task("hang", revision="1")
    async def hang(ctx: RunContext, state: Any) -> Any:
        await asyncio.Event().wait()
        return Done()

    @app.task("spender", revision="1")
    async def spender(ctx: RunContext, state: Any) -> Any:
        ctx.spend(2)
        if ctx.step < 5:
            return Continue(state)
        return Done()

    r1 = await app.start("hang", {}, deadline=timedelta(milliseconds=300))
    r2 = await app.start("spender", {}, budget=5)
    async with running(app.worker(poll_interval=0.2)):
        i1 = await finished(app, r1)
        i2 = await finished(app, r2)
    assert i1.status == "failed" and i1.error is not None
    assert i1.error["type"] == "DeadlineExceeded"
    assert i2.status == "failed" and i2.error is not None
    assert i2.error["type"] == "BudgetExceeded" and i2.spent == 6.0 and i2.step == 2


async def test_cancel_leased_run_promptly(app: Durable) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    @app.task("long", revision="1")
    async def long(ctx: RunContext, state: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Done()

    rid = await app.start("long", {})
    # heartbeat every 20 s: the cancel can only arrive through NOTIFY
    async with running(app.worker(poll_interval=5, lease_ttl=timedelta(seconds=60))):
        await asyncio.wait_for(started.wait(), WAIT_LIMIT)
        assert await app.cancel(rid) == "leased"
        info = await finished(app, rid)
        assert cancelled.is_set()
    assert info.status == "cancelled" and info.lease_owner is None
    assert await app.cancel(rid) == "cancelled"


async def test_cancel_runnable_and_waiting(app: Durable) -> None:
    @app.task("waiter", revision="1")
    async def waiter(ctx: RunContext, state: Any) -> Any:
        return Wait(signal=("never", "x"))

    r1 = await app.start("waiter", {})
    assert await app.cancel(r1) == "cancelled"
    r2 = await app.start("waiter", {})
    async with running(app.worker(poll_interval=0.2)):
        await status_is(app, r2, "waiting")
    assert await app.cancel(r2) == "cancelled"
    assert (await app.get_run(r2)).wait_kind is None


async def test_wait_signal_and_sleep_resume_with_wake(app: Durable, conn: psycopg.Connection[Any]) -> None:
    wakes: dict[str, Any] = {}

    @app.task("approve", revision="1")
    async def approve(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            return Wait.approval(state["ref"], state={"ref": state["ref"], "parked": True})
        wakes["approve"] = ctx.wake
        return Done(ctx.wake["payload"] if ctx.wake else None)

    @app.task("nap", revision="1")
    async def nap(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Sleep(seconds=0.2)
        wakes["nap"] = ctx.wake
        return Done()

    @app.task("patience", revision="1")
    async def patience(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Wait(signal=("ci", "slow"), timeout=timedelta(milliseconds=200))
        wakes["patience"] = ctx.wake
        return Done()

    ra = await app.start("approve", {"ref": "pr-1"})
    rn = await app.start("nap", {})
    rp = await app.start("patience", {})
    async with running(app.worker(concurrency=4, poll_interval=5)):
        await status_is(app, ra, "waiting")
        info = await app.get_run(ra)
        assert info.wait_kind == "approval" and info.wait_ref == "pr-1" and info.state["parked"]
        assert info.lease_owner is None and info.wait_since is not None
        assert await app.signal("approval", "pr-1", {"ok": True}) == [ra]
        assert (await finished(app, ra)).result == {"ok": True}
        await finished(app, rn)
        await finished(app, rp)
    assert wakes["approve"]["type"] == "signal" and wakes["approve"]["kind"] == "approval"
    assert wakes["nap"]["type"] == "timeout" and wakes["nap"]["kind"] is None
    assert wakes["patience"]["type"] == "timeout" and wakes["patience"]["ref"] == "slow"
    saw = conn.execute("SELECT wake->>'type' FROM pgdurable.checkpoints WHERE run_id = %s "
                       "AND step = 2", (ra,)).fetchone()
    assert saw == ("signal",)


async def test_signal_sent_before_park_is_delivered(app: Durable) -> None:
    @app.task("late", revision="1")
    async def late(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Wait(signal=("ci", "b9"))
        return Done(ctx.wake)

    assert await app.signal("ci", "b9", {"green": True}) == []
    rid = await app.start("late", {})
    async with running(app.worker(poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.result["type"] == "signal" and info.result["payload"] == {"green": True}


async def test_effect_replay_returns_stored_result(app: Durable) -> None:
    performed: list[int] = []

    def charge() -> dict[str, Any]:
        performed.append(1)
        return {"charge": "ch_1"}

    @app.task("pay", revision="1", max_attempts=3, retry_base=0.01)
    async def pay(ctx: RunContext, state: Any) -> Any:
        got = await ctx.effect("charge", charge)
        if ctx.attempt == 1:
            raise RuntimeError("crash after the effect")
        return Done(got)

    rid = await app.start("pay", {})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"charge": "ch_1"}
    assert performed == [1]


async def test_heartbeat_one_update_renews_all(app: Durable, conn: psycopg.Connection[Any]) -> None:
    gate = asyncio.Event()

    @app.task("hold", revision="1")
    async def hold(ctx: RunContext, state: Any) -> Any:
        await gate.wait()
        return Done()

    ids = [await app.start("hold", {}) for _ in range(3)]
    worker = app.worker(concurrency=3, lease_ttl=timedelta(seconds=1.5), poll_interval=5)
    renews: list[list[Any]] = []
    orig = app.fetchall

    async def spy(sql: str, params: tuple[Any, ...], **kw: Any) -> list[tuple[Any, ...]]:
        if sql == q.RENEW:
            renews.append(list(params[1]))
        return await orig(sql, params, **kw)

    app.fetchall = spy  # type: ignore[method-assign]
    async with running(worker):
        async def all_leased() -> bool:
            return len(worker.active_runs) == 3

        await until(all_leased, "3 runs leased")

        async def renewed_thrice() -> bool:
            return sum(len(r) == 3 for r in renews) >= 3

        await until(renewed_thrice, "three heartbeats")
        gate.set()
        for rid in ids:
            assert (await finished(app, rid)).status == "completed"
    full = [r for r in renews if len(r) == 3]
    assert all(set(map(str, r)) == set(ids) for r in full)
    # leases outlived their 1.5 s TTL only through heartbeats: one token each
    assert conn.execute("SELECT DISTINCT token FROM pgdurable.checkpoints").fetchall() == [(1,)]
    assert worker.heartbeat_count == len(renews)


async def test_lost_lease_stops_step_without_writes(app: Durable, conn: psycopg.Connection[Any]) -> None:
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.task("victim", revision="1")
    async def victim(ctx: RunContext, state: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Done()

    await app.start("victim", {"v": 0})
    async with running(app.worker(lease_ttl=timedelta(seconds=1.5), poll_interval=5)):
        await asyncio.wait_for(started.wait(), WAIT_LIMIT)
        # another worker took over (token bumped)
        conn.execute("UPDATE pgdurable.runs SET lease_token = lease_token + 1, "
                     "lease_owner = 'thief', lease_expires_at = pgdurable.now() + interval '1 h'")
        await asyncio.wait_for(stopped.wait(), WAIT_LIMIT)
    row = conn.execute("SELECT status, lease_owner, state, step FROM pgdurable.runs").fetchone()
    assert row == ("leased", "thief", {"v": 0}, 0)


async def test_graceful_stop_gives_leases_back(app: Durable) -> None:
    started = asyncio.Event()

    @app.task("stuck", revision="1")
    async def stuck(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Continue({"first": True})
        started.set()
        await asyncio.Event().wait()
        return Done()

    rid = await app.start("stuck", {})
    worker = app.worker(poll_interval=5)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), WAIT_LIMIT)
    await worker.stop(grace=0.1)
    await task
    info = await app.get_run(rid)
    assert info.status == "runnable" and info.lease_owner is None and info.step == 1
    assert info.state == {"first": True}


async def test_stopping_worker_hands_its_timer_to_an_idle_worker(dsn: str) -> None:
    """A parks a run on a timer (no NOTIFY: the run is not runnable yet) and
    stops gracefully before it is due. B, idle with a one-hour poll, last read
    ``next_wakeup`` while A's lease still held the run (due: that lease's
    expiry, five minutes out). A's stop notifies its queues, so B re-reads
    and runs the timer; without the hand-off B would sleep past WAIT_LIMIT."""
    in_step, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    def make(label: str) -> Durable:
        app = Durable(dsn, pool_size=2)

        @app.task("nap", revision="1")
        async def nap(ctx: RunContext, state: Any) -> Any:
            ran.append(f"{label}:{ctx.step}")
            if ctx.step == 0:
                in_step.set()
                await release.wait()
                return Sleep(seconds=3)
            return Done({"woke": ctx.wake["type"]})

        return app

    a_app, b_app = make("a"), make("b")
    async with a_app, b_app:
        a = a_app.worker(poll_interval=3600, lease_ttl=300)
        a_task = asyncio.create_task(a.run())
        rid = await a_app.start("nap", {})
        await asyncio.wait_for(in_step.wait(), WAIT_LIMIT)
        b = b_app.worker(poll_interval=3600, lease_ttl=300)
        async with running(b):
            async def b_claimed() -> bool:
                return b.claim_count >= 1

            await until(b_claimed, "B's first claim")
            await asyncio.sleep(0.2)  # B's next_wakeup after that claim (sees A's lease)
            release.set()
            await status_is(a_app, rid, "waiting")
            await a.stop(grace=1)
            await a_task
            info = await finished(b_app, rid)
    assert info.status == "completed" and info.result == {"woke": "timeout"}
    assert ran == ["a:0", "b:1"]


def test_worker_module_entry_point_sigterm(dsn: str, tmp_path: Any) -> None:
    mod = tmp_path / "wapp.py"
    mod.write_text(
        "import gc, pgdurable\n"
        f"app = pgdurable.Durable({dsn!r})\n"
        "@app.task('x', revision='1')\n"
        "async def x(ctx, state):\n"
        "    return pgdurable.Done({**state, 'frozen': gc.get_freeze_count() > 0})\n"
    )
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("LISTEN pgdurable_wake")
        env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgdurable.worker", "wapp:app", "--concurrency", "2",
             "--poll", "0.2"], env=env, cwd=tmp_path)
        try:
            rid = c.execute("SELECT run_id FROM pgdurable.start_run('x','1','{\"a\":1}','default',"
                            "0,3,NULL,NULL,NULL,NULL)").fetchone()[0]  # type: ignore[index]
            for _ in range(int(WAIT_LIMIT / 0.05)):
                st = c.execute("SELECT status, result FROM pgdurable.runs WHERE id = %s",
                               (rid,)).fetchone()
                if st and st[0] == "completed":
                    break
                c.execute("SELECT pg_sleep(0.05)")
            # the command froze its start-up objects (gc.freeze) before running
            assert st == ("completed", {"a": 1, "frozen": True})
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=WAIT_LIMIT) == 0


async def test_idle_worker_wakes_for_expired_leases_and_timers(
    app: Durable, conn: psycopg.Connection[Any]
) -> None:
    """With a 60 s poll, the worker still runs a dead worker's run right after its
    lease expires and a timer right when it is due (next_wakeup)."""

    @app.task("resume", revision="1")
    async def resume(ctx: RunContext, state: Any) -> Any:
        return Done(ctx.wake)

    crashed = await app.start("resume", {})
    timer = await app.start("resume", {})
    conn.execute("UPDATE pgdurable.runs SET status = 'leased', lease_owner = 'dead', "
                 "lease_token = 1, lease_expires_at = pgdurable.now() + interval '1 s' "
                 "WHERE id = %s", (crashed,))
    conn.execute("UPDATE pgdurable.runs SET status = 'waiting', "
                 "wake_at = pgdurable.now() + interval '1.5 s' WHERE id = %s", (timer,))
    async with running(app.worker(poll_interval=60)):
        a = await finished(app, crashed)
        b = await finished(app, timer)
    assert a.status == "completed" and a.lease_token == 2 and a.attempts == 0  # a reclaim, not a failed step
    assert b.status == "completed" and b.result["type"] == "timeout"


async def test_idle_worker_issues_one_query_per_poll(app: Durable) -> None:
    @app.task("noop", revision="1")
    async def noop(ctx: RunContext, state: Any) -> Any:
        return Done()

    seen: list[str] = []
    orig_one, orig_all = app.fetchone, app.fetchall

    async def one(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        seen.append(sql)
        return await orig_one(sql, params, **kw)

    async def many(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        seen.append(sql)
        return await orig_all(sql, params, **kw)

    app.fetchone = one  # type: ignore[method-assign]
    app.fetchall = many  # type: ignore[method-assign]
    worker = app.worker(poll_interval=0.2, listen=False)
    async with running(worker):
        async def polled() -> bool:
            return seen.count(q.NEXT_WAKEUP) >= 6

        await until(polled, "six idle polls")
    # the worker registers its task revisions and announces its presence at start,
    # and removes both at stop (pgdurable/runs/fork.py, engine/presence.py: one
    # statement each, not per poll; the presence is renewed per heartbeat interval,
    # TTL/3 = 20 s here)
    assert seen[:2] == [REGISTER_WORKER.sql, STARTED], seen[:2]
    assert seen[-2:] == [UNREGISTER_WORKER.sql, ABSENT], seen[-2:]
    assert PRESENT not in seen
    seen = seen[2:-2]
    # startup claims once (and asks next_wakeup); afterwards each poll is ONE
    # next_wakeup query and no claim, since nothing is due
    assert seen[0] == q.CLAIM and seen[1] == q.NEXT_WAKEUP
    assert set(seen[2:]) == {q.NEXT_WAKEUP}
    assert worker.claim_count == 1 and worker.heartbeat_count == 0


async def test_lease_window_gives_run_back(app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("longrun", revision="1")
    async def longrun(ctx: RunContext, state: Any) -> Any:
        await asyncio.sleep(0.02)
        return Continue(state) if ctx.step < 4 else Done(ctx.token)

    rid = await app.start("longrun", {})
    async with running(app.worker(poll_interval=5, lease_window=0.01)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.claims == 5
    tokens = [r[0] for r in conn.execute(
        "SELECT token FROM pgdurable.checkpoints WHERE run_id = %s ORDER BY step", (rid,))]
    assert tokens == [1, 2, 3, 4, 5]  # each window: one step, then given back and reclaimed


async def test_app_with_external_pool(dsn: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False)
    await pool.open()
    try:
        app = Durable(pool=pool)

        @app.task("p", revision="1")
        async def p(ctx: RunContext, state: Any) -> Any:
            return Done(state)

        rid = await app.start("p", {"x": 1})
        async with running(app.worker(poll_interval=1)):
            assert (await finished(app, rid)).result == {"x": 1}
        await app.close()
        assert not pool.closed  # not ours to close
    finally:
        await pool.close()


async def test_untrusted_lease_stops_step_when_renewals_fail(
    app: Durable, conn: psycopg.Connection[Any]
) -> None:
    from pgdurable.foundation.errors import DatabaseUnavailable

    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.task("cut", revision="1")
    async def cut(ctx: RunContext, state: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Done()

    orig = app.fetchall

    async def no_renewals(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        if sql == q.RENEW:
            raise DatabaseUnavailable("network cut (test)")
        return await orig(sql, params, **kw)

    app.fetchall = no_renewals  # type: ignore[method-assign]
    rid = await app.start("cut", {"v": 0})
    worker = app.worker(lease_ttl=timedelta(seconds=1.2), poll_interval=30)
    async with running(worker):
        await asyncio.wait_for(started.wait(), WAIT_LIMIT)
        await asyncio.wait_for(stopped.wait(), WAIT_LIMIT)
        # the step was stopped by the local trust deadline (no renewal ever got
        # through, no NOTIFY, no write): nothing was checkpointed
        row = conn.execute("SELECT status, step FROM pgdurable.runs WHERE id = %s",
                           (rid,)).fetchone()
        assert row == ("leased", 0)


# -- error paths that must still settle the run (found by a review). Every test here
# uses a long lease TTL: a run the worker gives up on locally would stay ``leased``
# for the whole TTL (then be reclaimed as a crash), so "settled by the worker" is
# observable without any timing threshold.


LONG_TTL = timedelta(seconds=600)


async def test_done_with_a_non_json_result_fails_the_run(app: Durable) -> None:
    """Done(result=<not JSON>) is a step bug like a non-JSON state: the run
    ends ``failed`` with the TypeError, not left leased until its lease lapses."""

    @app.task("badresult", revision="1")
    async def badresult(ctx: RunContext, state: Any) -> Any:
        return Done(result={"when": object()})

    rid = await app.start("badresult", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "_StepTypeError"
    assert "result" in info.error["message"]
    assert info.attempts == 1  # not retried: the same step gives the same result


async def test_step_error_with_nul_in_its_message_is_recorded(app: Durable) -> None:
    """An exception whose message holds a NUL (binary data in an error text)
    is still recorded (NUL replaced): jsonb cannot store \\x00."""

    @app.task("nul", revision="1", max_attempts=1)
    async def nul(ctx: RunContext, state: Any) -> Any:
        raise ValueError("bad byte \x00 here")

    rid = await app.start("nul", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "ValueError"
    assert info.error["message"].startswith("bad byte ")
    assert "here" in info.error["message"]


async def test_step_error_with_lone_surrogate_in_its_message_is_recorded(app: Durable) -> None:
    @app.task("surrogate", revision="1", max_attempts=1)
    async def surrogate(ctx: RunContext, state: Any) -> Any:
        raise ValueError("undecodable \udcff name")

    rid = await app.start("surrogate", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "ValueError"
    assert info.error["message"].startswith("undecodable ")


async def test_cancelled_error_raised_by_step_code_is_a_step_error(app: Durable) -> None:
    """A CancelledError that the step raises itself (e.g. it awaited a task
    someone else cancelled) is not a cancel of the run: the attempt fails and
    is retried; the worker does not abandon the run to its lease."""

    @app.task("selfcancel", revision="1", max_attempts=2, retry_base=0.01, retry_cap=0.01)
    async def selfcancel(ctx: RunContext, state: Any) -> Any:
        if ctx.attempt == 1:
            inner = asyncio.ensure_future(asyncio.sleep(3600))
            inner.cancel()
            await inner  # raises CancelledError into this step
        return Done({"attempt": ctx.attempt})

    rid = await app.start("selfcancel", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"attempt": 2}


async def test_base_exception_subclass_from_a_step_is_a_step_error(app: Durable) -> None:
    class Abort(BaseException):
        pass

    @app.task("abort", revision="1", max_attempts=1)
    def abort(ctx: RunContext, state: Any) -> Any:  # sync: runs in a thread
        raise Abort("stop it")

    rid = await app.start("abort", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "Abort"


async def test_effect_failure_with_nul_in_its_message_is_recorded(app: Durable) -> None:
    """An effect that fails with a NUL in its error text is recorded failed
    (so a retried step gets EffectFailed and does not perform it again)."""
    calls: list[int] = []

    def charge() -> Any:
        calls.append(1)
        raise RuntimeError("card \x00 declined")

    @app.task("pay", revision="1", max_attempts=2, retry_base=0.01, retry_cap=0.01)
    async def pay(ctx: RunContext, state: Any) -> Any:
        await ctx.effect("charge", charge)
        return Done()

    rid = await app.start("pay", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "EffectFailed"
    assert "declined" in info.error["message"]
    assert calls == [1]


async def test_run_continues_normally_after_errors(app: Durable) -> None:
    """Sanity: a plain Continue/Done run on the same worker still completes."""

    @app.task("plain", revision="1")
    async def plain(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            return Continue({"n": 1})
        return Done(state)

    rid = await app.start("plain", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"n": 1}


SLOTS = 40  # more than the loop's default executor (min(32, cpu_count + 4)) on any machine


class _Gate:
    """Records which runs entered a blocking sync step; holds them until opened."""

    def __init__(self) -> None:
        self.started: set[str] = set()
        self._lock = threading.Lock()
        self.open = threading.Event()

    def enter(self, run_id: str) -> None:
        with self._lock:
            self.started.add(run_id)
        self.open.wait()


async def _all_slots_run_at_once(app: Durable, task: str, gate: _Gate) -> None:
    """Start SLOTS runs of ``task`` on a worker with SLOTS slots: every sync step
    must be running at the same time (each in its own thread), then all complete."""
    ids = [await app.start(task) for _ in range(SLOTS)]
    try:
        async with running(app.worker(concurrency=SLOTS, lease_ttl=LONG_TTL,
                                      poll_interval=0.5)):
            async def all_started() -> bool:
                return len(gate.started) == SLOTS

            await until(all_started, f"{SLOTS} sync steps of {task} to run at once")
            gate.open.set()
            for rid in ids:
                assert (await finished(app, rid)).status == "completed"
    finally:
        gate.open.set()


async def test_sync_steps_of_all_slots_run_at_once(app: Durable) -> None:
    """``concurrency`` sync steps run at the same time, each in its own thread:
    they are not queued behind the event loop's default executor."""
    gate = _Gate()

    @app.task("blocking", revision="1")
    def blocking(ctx: RunContext, state: Any) -> Any:
        gate.enter(ctx.run_id)
        return Done()

    await _all_slots_run_at_once(app, "blocking", gate)


async def test_sync_durable_task_steps_of_all_slots_run_at_once(app: Durable) -> None:
    """The same for the sync steps of a registered durable task definition."""
    gate = _Gate()

    def block(state: Any, context: DurableRunContext) -> Any:
        gate.enter(context.run.run_id)
        return {**state, "done": True}

    app.register(define_durable_task(
        id="blocking-durable", revision="1", is_state=lambda v: isinstance(v, dict),
        initial_state={}, steps=[DurableStep(id="block", run=block)],
    ))
    await _all_slots_run_at_once(app, "blocking-durable", gate)


async def test_broken_exception_str_is_still_recorded(app: Durable) -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    @app.task("weird", revision="1", max_attempts=1)
    async def weird(ctx: RunContext, state: Any) -> Any:
        raise Weird()

    rid = await app.start("weird", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert info.error is not None and info.error["type"] == "Weird"


class ToolError(Exception):
    pass


def register_cancel_wrapper(app: Durable, name: str, max_attempts: int) -> asyncio.Event:
    """A task whose step turns its cancellation into its own error
    (``except CancelledError: raise ToolError``); returns the "in step" event."""
    started = asyncio.Event()

    @app.task(name, revision="1", max_attempts=max_attempts)
    async def wrapping(ctx: RunContext, state: Any) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            raise ToolError("tool call interrupted") from exc
        return Done()

    return started


async def test_shutdown_of_a_step_that_turns_cancel_into_an_error_releases_it(
    app: Durable,
) -> None:
    """A step that converts the worker's cancellation into its own exception
    is still a stop, not a failed attempt: a graceful shutdown gives the run
    back at its checkpoint."""
    started = register_cancel_wrapper(app, "wrapping", max_attempts=1)
    rid = await app.start("wrapping", {"v": 1})
    worker = app.worker(lease_ttl=LONG_TTL, poll_interval=5)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), WAIT_LIMIT)
    await worker.stop(grace=0.1)
    await task
    info = await app.get_run(rid)
    assert (info.status, info.attempts, info.lease_owner) == ("runnable", 0, None)
    assert info.error is None


async def test_cancel_of_a_step_that_turns_cancel_into_an_error_is_a_cancel(
    app: Durable,
) -> None:
    started = register_cancel_wrapper(app, "wrapping2", max_attempts=3)
    rid = await app.start("wrapping2", {})
    async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=5)):
        await asyncio.wait_for(started.wait(), WAIT_LIMIT)
        await app.cancel(rid)
        info = await finished(app, rid)
    assert info.status == "cancelled" and info.attempts == 0


async def test_stop_does_not_hang_on_a_step_that_swallows_cancellation(app: Durable) -> None:
    """After the grace period and ``settle_limit``, stop() returns even if a step
    ignores its cancellation; the run keeps its lease until the TTL lapses."""
    in_step, release = asyncio.Event(), asyncio.Event()

    @app.task("stubborn", revision="1")
    async def stubborn(ctx: RunContext, state: Any) -> Any:
        in_step.set()
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue  # swallowed (a bug of the step; the worker must not hang on it)
        return Done()

    rid = await app.start("stubborn", {})
    worker = app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)
    worker.settle_limit = 0.5
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(in_step.wait(), WAIT_LIMIT)
        await asyncio.wait_for(worker.stop(grace=0.1), WAIT_LIMIT)
        await asyncio.wait_for(task, WAIT_LIMIT)
        info = await app.get_run(rid)
        assert info.status == "leased"  # not released: its lease lapses (crash recovery)
    finally:
        release.set()
        left = [a.task for a in worker.state.active.values() if a.task is not None]
        if left:  # let the abandoned step end before the app closes
            await asyncio.wait(left, timeout=WAIT_LIMIT)


async def test_cancelling_run_stops_the_steps_and_gives_the_runs_back(app: Durable) -> None:
    """Cancelling the run() task (a TaskGroup, wait_for, a server's lifespan)
    instead of calling stop(): the steps are cancelled and the runs released,
    never left executing without heartbeats."""
    in_step = asyncio.Event()
    step_cancelled = asyncio.Event()

    @app.task("long", revision="1")
    async def long(ctx: RunContext, state: Any) -> Any:
        in_step.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            step_cancelled.set()
            raise
        return Done()

    rid = await app.start("long", {})
    worker = app.worker(lease_ttl=LONG_TTL, poll_interval=0.5)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(in_step.wait(), WAIT_LIMIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert step_cancelled.is_set()
    info = await app.get_run(rid)
    assert info.status == "runnable" and info.lease_owner is None  # given back at once


async def test_a_cancel_sent_before_the_listener_is_up_is_acted_on(dsn: str) -> None:
    """A worker claims at once, while its LISTEN connection may still be
    connecting: a cancel NOTIFY sent in that window is lost. The listener
    checks the runs it holds for cancel requests whenever it (re)connects, so
    the cancel is acted on then, not at the next heartbeat (minutes away here)."""
    with proxied(dsn) as (gate, via_gate):  # the LISTEN connection goes through the gate
        app = Durable(dsn, listen_dsn=via_gate)
        try:
            started = register_cancel_wrapper(app, "wrapping3", max_attempts=3)
            rid = await app.start("wrapping3", {})
            async with running(app.worker(lease_ttl=LONG_TTL, poll_interval=5)):
                await asyncio.wait_for(started.wait(), WAIT_LIMIT)
                await app.cancel(rid)  # nobody is listening yet: the NOTIFY is lost
                gate.forwarding = True
                info = await finished(app, rid)
            assert info.status == "cancelled" and info.attempts == 0
        finally:
            await app.close()


async def test_worker_logs_its_start_and_each_run_that_fails_for_good(
    app: Durable, caplog: pytest.LogCaptureFixture
) -> None:
    """INFO through ``logging`` (logger pgdurable.worker): one line when the worker
    starts, one per run that fails for good; a failure that will be retried logs none."""

    @app.task("boom", revision="7", max_attempts=2)
    async def boom(ctx: RunContext, state: Any) -> Any:
        raise KeyError("no such thing")

    @app.task("fine", revision="2")
    async def fine(ctx: RunContext, state: Any) -> Any:
        return Done()

    caplog.set_level(logging.INFO, logger="pgdurable")
    worker = app.worker(queues=["default", "other"], concurrency=3, poll_interval=0.2,
                        worker_id="w-logs")
    rid = await app.start("boom", {})
    async with running(worker):
        async def said_started() -> bool:
            return any("started:" in r.getMessage() for r in caplog.records)

        await until(said_started, "the start line")
        started = [r.getMessage() for r in caplog.records if "started:" in r.getMessage()]
        assert started == ["worker w-logs started: queues default,other, concurrency 3, "
                           "tasks boom@7, fine@2, pooler none, LISTEN"]
        assert [r.levelno for r in caplog.records if "started:" in r.getMessage()] == [logging.INFO]
        info = await finished(app, rid)
    assert info.status == "failed" and info.attempts == 2
    failed = [r for r in caplog.records if "failed:" in r.getMessage()]
    # the first attempt was retried (no line); the second ended the run
    assert [r.getMessage() for r in failed] == [f"run {rid} of task boom failed: KeyError (attempt 2)"]
    assert failed[0].name == "pgdurable.worker" and failed[0].levelno == logging.INFO


def test_worker_process_logs_at_info_on_stderr_unless_quieted(dsn: str, tmp_path: Any) -> None:
    """``python -m pgdurable.worker`` shows the INFO lines by default (stderr, with
    time, level and logger); ``--log-level WARNING`` and ``PGDURABLE_LOG=WARNING``
    quiet them."""
    mod = tmp_path / "logapp.py"
    mod.write_text(
        "import pgdurable\n"
        f"app = pgdurable.Durable({dsn!r})\n"
        "@app.task('bad', revision='3', max_attempts=1)\n"
        "async def bad(ctx, state):\n"
        "    raise RuntimeError('broken')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PGDURABLE_LOG"}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{os.getcwd()}"

    def one_worker(name: str, *args: str, **extra_env: str) -> str:
        err = tmp_path / f"{name}.err"
        with psycopg.connect(dsn, autocommit=True) as c, open(err, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgdurable.worker", "logapp:app", "--poll", "0.2",
                 "--worker-id", name, *args], env={**env, **extra_env}, cwd=tmp_path,
                stdout=subprocess.DEVNULL, stderr=out)
            try:
                row = c.execute("SELECT run_id FROM pgdurable.start_run('bad','3','{}','default',"
                                "0,1,NULL,NULL,NULL,NULL)").fetchone()
                assert row is not None
                for _ in range(int(WAIT_LIMIT / 0.05)):
                    st = c.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                                   (row[0],)).fetchone()
                    if st and st[0] == "failed":
                        break
                    c.execute("SELECT pg_sleep(0.05)")
                assert st == ("failed",)
            finally:
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(timeout=WAIT_LIMIT) == 0, err.read_text()
        text = err.read_text()
        if "started:" in text:
            assert "failed: RuntimeError (attempt 1)" in text and str(row[0]) in text, text
        return text

    loud = one_worker("loud")
    start = [line for line in loud.splitlines() if "started:" in line]
    assert len(start) == 1, loud
    assert " INFO pgdurable.worker: worker loud started: queues default, concurrency 16, " \
           "tasks bad@3, pooler none, LISTEN" in start[0]
    assert "failed: RuntimeError" in loud
    for quiet in (one_worker("q1", "--log-level", "warning"),
                  one_worker("q2", PGDURABLE_LOG="WARNING")):
        assert "started:" not in quiet and "failed:" not in quiet, quiet


@pytest.mark.parametrize("where", ["state", "result"])
async def test_a_step_state_or_result_over_the_size_limit_fails_the_run_as_value_too_large(
    app: Durable, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A checkpoint over the limit (64 MiB; 4 KiB here) ends the run ``failed`` at once
    (not retried: the same step makes the same value) with the public
    ``ValueTooLarge`` recorded as itself, naming the size and the limit; the last
    checkpoint stays the one before."""
    monkeypatch.setattr(jsonb, "DEFAULT_MAX_BYTES", 4096)

    @app.task("big", revision="1", max_attempts=3)
    async def big(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            return Continue({"small": True})
        blob = "x" * 5000
        return Continue({"blob": blob}) if where == "state" else Done({"blob": blob})

    rid = await app.start("big", {})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed" and info.attempts == 1, info
    assert info.error is not None and info.error["type"] == "ValueTooLarge", info.error
    assert info.error["message"] == f"{where} is 5011 bytes of JSON; the limit is 4096 bytes"
    assert info.state == {"small": True} and info.step == 1


async def test_a_start_over_64_mib_raises_value_too_large_and_writes_nothing(
    app: Durable, conn: psycopg.Connection[Any]
) -> None:
    """The real limit, with a real 64 MiB + 1 byte state: ``ValueTooLarge`` (a
    ``ValueError``) before any SQL, and no run."""
    state = {"blob": "x" * (64 * 1024 * 1024)}  # 64 MiB of x plus the 11 bytes of JSON around it
    with pytest.raises(ValueTooLarge, match=r"^state is 67108875 bytes of JSON; the limit is "
                       r"67108864 bytes \(64 MiB\)$"):
        await app.start("anything", state, revision="1")
    with pytest.raises(ValueError, match="the limit is"):  # the builtin it also is
        await app.start("anything", state, revision="1")
    assert conn.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)
