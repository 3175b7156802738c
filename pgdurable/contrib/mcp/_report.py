"""A durable tool's status reports (``TaskContext.report``), durable before it parks.

A report is written at once, in the background (the body goes on), fenced by
the run's lease (``pgdurable.record_heartbeat``: ``runs.progress``). Parking
gives the lease up, after which such a write is refused; so every wait of a
:class:`~pgdurable.contrib.mcp.TaskContext` first awaits :meth:`Reports.flush`:
the latest report is in the database before the run parks, and ``tasks/get``
shows it from any process while no worker holds the run. One writer per
execution of the body: reports are written in the order they were made and
the latest wins (a report made while a write is in flight is written after it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...foundation.errors import InvalidInput, LeaseLost
from ...foundation.jsonb import dumps
from ...foundation.queries.core import one
from ...foundation.queries.liveness import HEARTBEAT
from ...runs.steps import RunContext

__all__ = ["Reports"]

log = logging.getLogger("pgdurable.mcp")


class Reports:
    """What one execution of a durable tool's body reported (``{"mcp": {...}}``)."""

    def __init__(self, run: RunContext) -> None:
        self._run = run
        self._current: dict[str, Any] = {}
        self._pending: str | None = None  # the latest report not yet sent
        self._unsaved: str | None = None  # a report whose background write failed
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # reports recorded (tests)

    def report(self, values: dict[str, Any]) -> None:
        """Merge ``values`` into what was reported and write it in the background."""
        merged = {**self._current, **values}
        try:
            text = dumps({"mcp": merged}, "task report")
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"report values are not JSON: {exc}") from None
        self._current = merged
        if self._run._app is None or self._run._owner is None:
            return  # not on a worker (a body called directly): nothing to record
        self._pending, self._unsaved = text, None
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _write(self, text: str) -> None:
        run = self._run
        await one(run._app, HEARTBEAT, (run.run_id, run.token, run._owner, text))
        self.writes += 1

    async def _drain(self) -> None:
        while self._pending is not None:
            text, self._pending = self._pending, None
            try:
                await self._write(text)
            except LeaseLost:
                return  # the run is another worker's now: its report is not ours to make
            except Exception as exc:  # the database away: flush() tries again, and raises
                log.info("run %s: task report not recorded yet (%s)", self._run.run_id, exc)
                if self._pending is None:
                    self._unsaved = text

    async def flush(self) -> None:
        """Return once the latest report is recorded (before the body parks).

        A report whose background write failed is written again here, and
        what that raises (the database still away, :class:`LeaseLost`) ends
        the step as any failed write would: the park is not attempted."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
        if self._unsaved is not None:
            text, self._unsaved = self._unsaved, None
            await self._write(text)
