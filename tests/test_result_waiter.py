"""``await app.result()`` across a connection lost under its read.

The pool replaces a connection the server closed while it sat idle
(``acheck_connection``), but a read in flight when the server goes away (a
crash, a failover: tests/test_failover.py) fails with DatabaseUnavailable. The
waiter then reads again, on the pool's next connection, for at most
``RECONNECT`` seconds after the loss and never past its timeout, as the sync
waiter does; a first read that fails is raised (nothing was ever reachable).

The losses are made by an app whose reads fail on cue (the moment a server
dies under a read cannot be chosen in a real one); the real failover is
tests/test_failover.py.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

import pgdurable
from pgdurable.runs import results

RUNNING = ("running", None, None)
DONE = ("completed", {"ok": 1}, None)
LOST = pgdurable.DatabaseUnavailable("consuming input failed: server closed the connection")


class Scripted:
    """An app whose reads answer ``script`` in order (a row, or an error to raise)."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.reads = 0

    def notifier(self) -> None:
        return None  # no LISTEN: the waiter polls

    async def fetchone(self, sql: str, params: tuple[Any, ...], *,
                       prepare: bool | None = True) -> tuple[Any, ...] | None:
        self.reads += 1
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, Exception):
            raise step
        return tuple(step)


@pytest.fixture(autouse=True)
def fast_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "POLL", 0.02)


async def test_a_read_lost_after_one_answered_is_read_again() -> None:
    app = Scripted(RUNNING, LOST, LOST, DONE)
    assert await results.await_result(app, uuid.uuid4(), 30) == {"ok": 1}  # type: ignore[arg-type]
    assert app.reads == 4


async def test_a_first_read_that_fails_is_raised() -> None:
    app = Scripted(LOST, DONE)
    with pytest.raises(pgdurable.DatabaseUnavailable):
        await results.await_result(app, uuid.uuid4(), 30)  # type: ignore[arg-type]
    assert app.reads == 1


async def test_losses_past_reconnect_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "RECONNECT", 0.5)
    app = Scripted(RUNNING, LOST)  # lost for good
    began = time.monotonic()
    with pytest.raises(pgdurable.DatabaseUnavailable):
        await results.await_result(app, uuid.uuid4(), 30)  # type: ignore[arg-type]
    assert time.monotonic() - began < 30  # given up after RECONNECT, not the timeout
    assert app.reads > 2


async def test_losses_never_outlast_the_timeout() -> None:
    app = Scripted(RUNNING, LOST)
    with pytest.raises((pgdurable.DatabaseUnavailable, pgdurable.ResultTimeout)):
        await results.await_result(app, uuid.uuid4(), 0.5)  # type: ignore[arg-type]
