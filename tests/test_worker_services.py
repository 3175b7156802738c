"""Plug-in services (``pgdurable/engine/services.py``): the periodic duties a worker runs
without the engine importing them.

``Durable.worker()`` plugs in the schedule ticker, the writing of the app's event triggers
and the registration of the revisions the worker serves; any object with the protocol's methods can be plugged in the same way.
A real worker on a real database: a service is started (with the worker's id) before the
first claim and stopped after the last, a loop service's probe rides on the one idle
query per poll and its answer reaches ``note``, its ``timeout`` bounds the claim loop's
sleep, and a service that cannot start keeps the worker from starting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _waiting import finished, running, until

from pgdurable import Done, Durable, RunContext, Worker
from pgdurable.engine.services import LoopService, Service
from pgdurable.foundation.queries.claim import next_wakeup
from pgdurable.runs.events import EventTriggers
from pgdurable.runs.fork import ServedRevisions
from pgdurable.runs.schedules import Ticker


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)

    @a.task("quick", revision="1")
    async def quick(ctx: RunContext, state: Any) -> Any:
        return Done(state)

    yield a
    await a.close()


class Recorder:
    """A loop service that records what the worker does with it."""

    #: always answers 3600 s (the parameter is the worker's queues)
    probe: str | None = "(SELECT 3600::float8 WHERE cardinality(%s::text[]) > 0)"

    def __init__(self, bound: float | None = None) -> None:
        self.bound = bound
        self.worker: Worker | None = None
        self.events: list[tuple[str, str, int]] = []  # (what, worker id, claims so far)
        self.notes: list[float | None] = []
        self.wakes = 0

    def _claims(self) -> int:
        assert self.worker is not None
        return self.worker.claim_count

    async def start(self, worker_id: str) -> None:
        self.events.append(("start", worker_id, self._claims()))

    async def stop(self, worker_id: str) -> None:
        assert self.worker is not None
        self.events.append(("stop", worker_id, len(self.worker.active_runs)))

    def note(self, seconds: float | None) -> None:
        self.notes.append(seconds)

    def timeout(self, timeout: float) -> float:
        return timeout if self.bound is None else min(timeout, self.bound)

    async def on_wake(self) -> None:
        self.wakes += 1


def worker_with(app: Durable, *services: Any, **options: Any) -> Worker:
    """A worker of ``app`` built as ``Durable.worker()`` builds it, with ``services``."""
    return Worker(app, app._registry, open=app.open, listen_conninfo=app.listen_conninfo,
                  open_timeout=app.open_timeout, step_app=app, services=services, **options)


async def test_the_app_plugs_in_the_ticker_the_triggers_and_the_revisions(app: Durable) -> None:
    worker = app.worker()
    kinds = [type(s) for s in worker.services]
    assert kinds == [Ticker, EventTriggers, ServedRevisions]
    assert all(isinstance(s, Service) for s in worker.services)
    assert isinstance(worker.services[0], LoopService)  # it rides on the claim loop
    assert not any(isinstance(s, LoopService) for s in worker.services[1:])  # start, stop
    assert worker.claimer.services == [worker.services[0]]


async def test_a_service_is_started_before_the_first_claim_and_stopped_after_the_last(
    app: Durable,
) -> None:
    rec = Recorder()
    worker = worker_with(app, rec, poll_interval=0.2, listen=False)
    rec.worker = worker
    async with running(worker):
        rid = await app.start("quick", {"n": 1})
        assert (await finished(app, rid)).result == {"n": 1}
    wid = worker.worker_id
    assert rec.events == [("start", wid, 0), ("stop", wid, 0)]  # no claim yet; no run held


async def test_a_probe_rides_on_the_one_idle_query_and_reaches_note(app: Durable) -> None:
    rec = Recorder()
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
    worker = worker_with(app, rec, poll_interval=0.2, listen=False)
    rec.worker = worker
    idle = next_wakeup([Recorder.probe or ""]).sql
    async with running(worker):
        await until(lambda: _true(len(rec.notes) >= 4), "four idle polls")
        polls = seen.count(idle)
        claims = worker.claim_count
    assert rec.notes and set(rec.notes) == {3600.0}  # the probe's answer, each poll
    assert polls >= 4 and claims == 1  # one statement per poll, the probe a column of it
    first = seen.index(idle)
    assert set(seen[first:first + polls]) == {idle}
    assert rec.wakes >= 1


async def test_a_loop_service_bounds_the_claim_loops_sleep(app: Durable) -> None:
    rec = Recorder(bound=0.05)
    worker = worker_with(app, rec, poll_interval=3600, listen=False)
    rec.worker = worker
    async with running(worker):
        # nothing else wakes a worker polling hourly with no LISTEN: only the bound
        await until(lambda: _true(rec.wakes >= 5), "five wake-ups")


async def test_a_service_that_cannot_start_keeps_the_worker_from_starting(app: Durable) -> None:
    class Broken(Recorder):
        async def start(self, worker_id: str) -> None:
            raise RuntimeError("cannot start")

    rec = Broken()
    worker = worker_with(app, rec, poll_interval=0.2, listen=False)
    rec.worker = worker
    with pytest.raises(RuntimeError, match="cannot start"):
        await asyncio.wait_for(worker.run(), 60)
    assert worker.claim_count == 0


async def _true(value: bool) -> bool:
    return value
