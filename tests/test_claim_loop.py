"""When the claim loop claims (pgdurable/engine/claim.py).

* Under a trickle of starts: a wake-up that comes within ``claim_delay`` of a
  claim that found runs (fewer than its free slots) waits out the rest of that window, so that one claim
  takes every run started meanwhile; a start after a quiet spell is claimed at
  once. ``claim_delay`` is made long here (2 s) so that the window is
  unmistakable on a loaded machine.
* At full concurrency: a run whose last write of its lease is being sent (its
  completion, its park, its failure) frees its slot, so the next claim overlaps that write
  instead of waiting for its commit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _waiting import finished, running, until

from pgdurable import Done, Durable, RunContext, Sleep, Worker
from pgdurable.foundation import run_queries as q

WINDOW = 2.0


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)

    @a.task("quick", revision="1")
    async def quick(ctx: RunContext, state: Any) -> Any:
        return Done(state)

    yield a
    await a.close()


def claims_seen(app: Durable) -> list[int]:
    """The number of runs each claim statement of ``app`` returned, in order."""
    found: list[int] = []
    orig = app.fetchall

    async def fetchall(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        rows = await orig(sql, params, **kw)
        if sql == q.CLAIM:
            found.append(len(rows))
        return rows

    app.fetchall = fetchall  # type: ignore[method-assign]
    return found


def slow_window_worker(app: Durable) -> Worker:
    worker = app.worker(concurrency=8, poll_interval=30)
    worker.claim_delay = WINDOW
    return worker


async def test_starts_within_the_window_of_a_claim_that_found_runs_are_claimed_together(
    app: Durable,
) -> None:
    found = claims_seen(app)
    async with running(slow_window_worker(app)) as worker:
        first = await app.start("quick", {"n": 0})
        began = time.monotonic()  # the claim that finds it comes after this
        await finished(app, first)
        await asyncio.sleep(0.2)  # past the worker's own re-check 50 ms after that claim
        base = worker.claim_count
        claims = len(found)
        later = [await app.start("quick", {"n": i}) for i in (1, 2, 3)]
        # each start NOTIFYs; within the window none of them is claimed
        await asyncio.sleep(0.5)
        assert time.monotonic() - began < WINDOW, "the machine was too slow to test the window"
        assert worker.claim_count == base
        assert {(await app.get_run(r)).status for r in later} == {"runnable"}
        infos = [await finished(app, r) for r in later]
    assert [i.result for i in infos] == [{"n": 1}, {"n": 2}, {"n": 3}]
    # one claim, at the window's end, took all three (the worker's re-check
    # 50 ms after it finds nothing)
    assert [n for n in found[claims:] if n] == [3]


async def test_a_start_after_a_quiet_spell_is_claimed_at_once(app: Durable) -> None:
    found = claims_seen(app)
    async with running(slow_window_worker(app)):
        first = await app.start("quick", {"n": 0})
        await finished(app, first)
        await asyncio.sleep(WINDOW + 0.2)  # the window of the claim that found it is over
        claims = len(found)
        started = time.monotonic()
        rid = await app.start("quick", {"n": 1})
        info = await finished(app, rid)
        took = time.monotonic() - started
    assert info.result == {"n": 1}
    assert found[claims] == 1  # the first claim after the start took it
    # claimed on its NOTIFY, not at the end of another window (2 s): the
    # margin is wide, this checks which path ran, not how fast
    assert took < WINDOW / 2


@pytest.mark.parametrize("last", ["completion", "park", "failure"])
async def test_the_next_claim_overlaps_the_last_write_being_sent(app: Durable, last: str) -> None:
    """Concurrency 1 and a backlog of two runs: the second is claimed while the
    first one's last write of its lease is still in flight: its completion
    (``write_steps`` with done), its park (a ``Sleep``) or its failure (a step
    that raises, no attempts left). That write is held until a claim has been
    sent since the worker began it (``WorkerState.finishing_now``, which frees the slot), at
    most 10 s (without the overlap the claim would wait for the write: the order
    of the events shows it). A completion goes through the batch writer's own
    task, so under load the claim may even be sent before the statement is."""

    @app.task("nap", revision="1")
    async def nap(ctx: RunContext, state: Any) -> Any:
        return Sleep(3600) if ctx.step == 0 else Done(state)

    @app.task("boom", revision="1", max_attempts=1)
    async def boom(ctx: RunContext, state: Any) -> Any:
        raise RuntimeError("no attempts left")

    events: list[str] = []
    claim_sent = asyncio.Event()
    orig_all, orig_one = app.fetchall, app.fetchone

    def is_last(sql: str, params: tuple[Any, ...]) -> bool:
        if last == "completion":
            return sql == q.WRITE_STEPS and "t" in params[5]  # a batch with a completion
        if last == "park":
            return sql == q.PARK
        return sql == q.FAIL

    async def held(call: Any, sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        if sql == q.CLAIM:
            events.append("claim")
            claim_sent.set()
            return await call(sql, params, **kw)
        if is_last(sql, params):
            events.append("last write sent")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await claim_sent.wait()
            result = await call(sql, params, **kw)
            events.append("last write done")
            return result
        return await call(sql, params, **kw)

    async def fetchall(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        return await held(orig_all, sql, params, **kw)

    async def fetchone(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        return await held(orig_one, sql, params, **kw)

    app.fetchall = fetchall  # type: ignore[method-assign]
    app.fetchone = fetchone  # type: ignore[method-assign]
    task, want = {"completion": ("quick", "completed"), "park": ("nap", "waiting"),
                  "failure": ("boom", "failed")}[last]
    first = await app.start(task, {"n": 1})
    second = await app.start(task, {"n": 2})
    worker = app.worker(concurrency=1, poll_interval=30)
    finishing_now = worker.state.finishing_now

    def begin_last_write(a: Any) -> None:
        events.append("last write begun")
        claim_sent.clear()  # the held write waits for a claim sent from now on
        finishing_now(a)

    worker.state.finishing_now = begin_last_write  # type: ignore[method-assign]
    async with running(worker):
        for rid in (first, second):
            await until(lambda rid=rid: _status_is(app, rid, want), f"run {rid} {want}")
    # a run was claimed after the first run's last write was begun and before that
    # write was done (parks and failures are separate statements: the second
    # run's may be sent in between too)
    i, j = events.index("last write begun"), events.index("last write done")
    assert "last write sent" in events[i:j], events
    assert "claim" in events[i:j], events


async def _status_is(app: Durable, rid: str, status: str) -> bool:
    return (await app.get_run(rid)).status == status
