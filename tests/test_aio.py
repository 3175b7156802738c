"""Bounded waits never lose a cancellation (pgdurable/foundation/aio.py).

On Python 3.11, ``asyncio.wait_for(event.wait(), t)`` returns normally when
its task is cancelled within a few loop iterations of the event being set: the
cancel is lost. A worker's heartbeat loop lost its cancel that way when the
LISTEN connection came up (and set ``state.renew_now``) as the worker stopped, and
``stop()`` then waited for the heartbeat's whole interval (a CI suite timed out
on it). These tests set the event and cancel 0..5 loop iterations apart.
"""

from __future__ import annotations

import ast
import asyncio
import pathlib
from collections.abc import Awaitable, Callable

import pytest

import pgdurable
from pgdurable import Durable
from pgdurable.foundation.aio import wait_set

GAPS = range(6)  # loop iterations between the event being set and the cancel


async def _cancel_after_set(event: asyncio.Event, waiter: Callable[[], Awaitable[object]],
                            gap: int) -> asyncio.Task[object]:
    task: asyncio.Task[object] = asyncio.create_task(waiter())  # type: ignore[arg-type]
    await asyncio.sleep(0.01)  # the task waits now
    event.set()
    for _ in range(gap):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait([task], timeout=5.0)
    return task


@pytest.mark.parametrize("gap", GAPS)
async def test_wait_set_keeps_a_cancel_that_comes_as_the_event_is_set(gap: int) -> None:
    event = asyncio.Event()
    waits = 0

    async def loop_until_cancelled() -> None:
        nonlocal waits
        while True:  # like the heartbeat: wait, act, wait again
            await wait_set(event, 600.0)
            waits += 1
            event.clear()

    task = await _cancel_after_set(event, loop_until_cancelled, gap)
    assert task.done(), "the cancel was lost: the loop waits again"
    assert task.cancelled()


async def test_wait_set_answers_whether_the_event_is_set() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    assert await wait_set(event, -1.0) is False  # a past deadline: no wait
    event.set()
    assert await wait_set(event, 0.0) is True
    later = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, later.set)
    assert await wait_set(later, 600.0) is True


@pytest.mark.parametrize("gap", GAPS)
async def test_heartbeat_ends_when_cancelled_as_a_renewal_is_asked(dsn: str, gap: int) -> None:
    """The CI hang itself: the listener asks for a renewal (``state.renew_now``) just
    as ``run()`` cancels the heartbeat; the heartbeat must end, not sleep for
    its interval (200 s with this TTL). No run is held: it sends nothing."""
    app = Durable(dsn)
    try:
        worker = app.worker(lease_ttl=600, listen=False)
        task = await _cancel_after_set(worker.state.renew_now, worker.heartbeat.run, gap)
        assert task.done(), "the heartbeat lost its cancel"
        assert task.cancelled()
    finally:
        await app.close()


def test_no_module_uses_wait_for() -> None:
    """``asyncio.wait_for`` loses cancels on 3.11: the package uses
    ``asyncio.timeout`` or :func:`pgdurable.foundation.aio.wait_set` instead."""
    root = pathlib.Path(pgdurable.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = (isinstance(node, ast.Attribute) and node.attr == "wait_for") or (
                isinstance(node, ast.alias) and node.name == "wait_for")
            if named:
                found.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}")
    assert found == []
