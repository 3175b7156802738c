"""Worker.stop() returns whatever the database does (a claim waiting on a lock), in
process: the bounds of engine/worker.py itself (tests/test_worker_stop.py tests the
bounds of the ``pgdurable worker`` process around it).

These tests were tests/test_worker_stop.py until that file became the process tests
(c6cf024, issue 38); the engine's guarantees they check still hold, so they live on
here with the same assertions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, finished, running, until

from pgdurable import Done, Durable, RunContext


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)

    @a.task("one", revision="1")
    async def one(ctx: RunContext, state: Any) -> Any:
        return Done({"ok": True})

    yield a
    await a.close()


async def _claim_waits_for_a_lock(dsn: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%claim_runs%'")
        row = await cur.fetchone()
        return row is not None and row[0] > 0


async def test_stop_returns_while_a_claim_waits_on_a_lock(
        app: Durable, dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    # a queue with a concurrency limit: its claim locks the queue's row first
    await app.set_queue("default", concurrency=2)
    rid = await app.start("one", {})
    with psycopg.connect(dsn) as holder:  # a transaction holding that row
        holder.execute("SELECT 1 FROM pgdurable.queues WHERE name = 'default' FOR UPDATE")
        worker = app.worker(poll_interval=0.2)
        worker.settle_limit = 0.5
        task = asyncio.create_task(worker.run())
        await until(lambda: _claim_waits_for_a_lock(dsn), "the claim to wait for the row lock")
        with caplog.at_level(logging.WARNING, logger="pgdurable"):
            await asyncio.wait_for(worker.stop(grace=0.1), WAIT_LIMIT)
            await asyncio.wait_for(task, WAIT_LIMIT)  # run() ended, without an error
        assert any("claim statement has not returned" in r.getMessage() for r in caplog.records)
        # the claim was cancelled on the server: it no longer waits, it leased nothing
        assert not await _claim_waits_for_a_lock(dsn)
        holder.rollback()
    info = await app.get_run(rid)
    assert info.status == "runnable" and info.lease_owner is None
    async with running(app.worker(poll_interval=0.2)):  # and the next worker runs it
        assert (await finished(app, rid)).result == {"ok": True}


async def test_cancelling_run_still_raises_cancelled(app: Durable) -> None:
    worker = app.worker(poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    await until(lambda: _true_after_claims(worker), "the worker to claim once")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_LIMIT)


async def _true_after_claims(worker: Any) -> bool:
    return bool(worker.claim_count)


async def test_stop_returns_when_the_heartbeat_loses_its_cancel(app: Durable) -> None:
    """On Python 3.11 a cancel can be lost inside psycopg_pool's checkout (its
    ``asyncio.wait_for``, CPython gh-86296). A renewal that swallows the cancel
    stands in for it here: run() cancels its helpers again until they end, so
    stop() returns instead of waiting on a heartbeat that renews forever."""
    started, release = asyncio.Event(), asyncio.Event()

    @app.task("held", revision="1")
    async def held(ctx: RunContext, state: Any) -> Any:
        started.set()
        await release.wait()
        return Done(None)

    worker = app.worker(poll_interval=0.2, lease_ttl=300)  # renewals 100 s apart
    in_renew = asyncio.Event()
    swallowed: list[bool] = []
    real_renew = worker.heartbeat.renew

    async def renew_losing_the_cancel(live: Any, ttl: Any) -> Any:
        in_renew.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # lost in the library: the renewal goes on
            swallowed.append(True)
        return await real_renew(live, ttl)

    worker.heartbeat.renew = renew_losing_the_cancel  # type: ignore[method-assign]
    rid = await app.start("held", {})
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), WAIT_LIMIT)  # the run is held: a renewal has work
    async with asyncio.timeout(WAIT_LIMIT):
        while not in_renew.is_set():  # ask until the heartbeat has entered the renewal
            worker.state.renew_now.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(in_renew.wait(), 0.5)
    release.set()
    await finished(app, rid)
    await asyncio.wait_for(worker.stop(grace=1), WAIT_LIMIT)
    await asyncio.wait_for(task, WAIT_LIMIT)
    assert swallowed == [True]  # the first cancel was lost; a second one ended it
