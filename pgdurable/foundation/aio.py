"""Waiting for an event, bounded, without ever losing a cancellation.

Not ``asyncio.wait_for``: on Python 3.11 it runs the awaited thing in a task
of its own, and when the waiting task is cancelled just as that inner task
finishes (an event set up to a few loop iterations before the cancel), it
returns the inner result and the cancellation is lost (CPython gh-86296,
fixed in 3.12). A loop that then waits again never ends: a worker's heartbeat
did exactly that when its LISTEN connection came up as the worker stopped, and
``Worker.stop()`` hung for the heartbeat's whole interval.

``asyncio.timeout`` waits in the task itself: a cancel always raises, and the
deadline's own cancellation is told apart from an outside one. The package
bounds its waits with ``asyncio.timeout`` (directly, or through
:func:`wait_set` for an event); ``tests/test_aio.py`` checks that no module
uses ``wait_for``.

:func:`through_cancel` is the other half: work that must not be left half
done (recording an effect's outcome) is awaited to its end, and the caller's
cancellation is kept to be raised after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["through_cancel", "wait_set"]

T = TypeVar("T")


async def wait_set(event: asyncio.Event, timeout: float) -> bool:  # noqa: ASYNC109
    """Wait up to ``timeout`` seconds for ``event``; whether it is set.

    (A ``timeout`` parameter, against ruff's ASYNC109: the answer is whether
    the event is set, which ``asyncio.timeout`` around ``event.wait()`` does
    not give; this is that wrapper, once, for the package's many waits.)"""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, timeout)):
            await event.wait()
    return event.is_set()


async def through_cancel(aw: Awaitable[T], deferred: Callable[[BaseException], None]) -> T:
    """Await ``aw`` to its end even if the awaiting task is cancelled meanwhile.

    ``aw`` runs in a task of its own behind ``asyncio.shield``; each
    cancellation of the caller while it runs is handed to ``deferred`` (which
    keeps it for the caller to raise once it has done what must not be left
    half done) instead of abandoning ``aw``. If ``aw`` itself ends cancelled,
    that is raised.
    """
    inner = asyncio.ensure_future(aw)
    while True:
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError as exc:
            if inner.cancelled():
                raise
            deferred(exc)
