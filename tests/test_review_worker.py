"""Review of the worker loop: error paths that must still settle the run.

Every test uses a long lease TTL: a run the worker gives up on locally would
stay ``leased`` for the whole TTL (then be reclaimed as a crash), so "settled
by the worker" is observable without any timing threshold.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from _pgnet import proxied
from _waiting import WAIT_LIMIT, finished, running, until

from pgdurable import Continue, Done, Durable, DurableStep, RunContext, define_durable_task
from pgdurable.models.durable_runs import DurableRunContext

LONG_TTL = timedelta(seconds=600)


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    yield a
    await a.close()


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
        left = [a.task for a in worker._active.values() if a.task is not None]
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
