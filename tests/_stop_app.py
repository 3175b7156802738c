"""A Durable app whose steps do not stop when asked (tests/test_worker_stop.py).

Run as ``python -m pgdurable.worker _stop_app:app --worker-id NAME`` by the
``fleet`` fixture. On worker ``a`` (``FLEET_WORKER``) each task's step first
writes the file ``$STOP_DIR/<run id>`` (the test waits for it: the step runs),
then misbehaves; on any other worker it completes with ``{"by": worker}``.

* ``sync_sleeper`` -- a sync step: ``time.sleep(120)`` in its thread, which no
  cancellation reaches;
* ``swallower`` -- an async step that swallows every ``CancelledError`` and
  keeps sleeping;
* ``blocker`` -- an async step that, once cancelled, blocks the event loop
  (``time.sleep(120)``): nothing of the worker runs any more but its watchdog
  thread;
* ``polite`` -- an async step that sleeps and lets a cancellation end it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pgdurable
from pgdurable import Done, RunContext

app = pgdurable.Durable()
WORKER = os.environ.get("FLEET_WORKER", "")


def _started(ctx: RunContext) -> bool:
    """Mark the step as running; True on worker ``a`` (where it misbehaves)."""
    if WORKER != "a":
        return False
    Path(os.environ["STOP_DIR"], ctx.run_id).write_text(WORKER)
    return True


@app.task("sync_sleeper", revision="1")
def sync_sleeper(ctx: RunContext, state: Any) -> Any:
    if _started(ctx):
        time.sleep(120)
    return Done({"by": WORKER})


@app.task("swallower", revision="1")
async def swallower(ctx: RunContext, state: Any) -> Any:
    if _started(ctx):
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                pass  # swallowed: the step goes on
    return Done({"by": WORKER})


@app.task("blocker", revision="1")
async def blocker(ctx: RunContext, state: Any) -> Any:
    if _started(ctx):
        try:
            await asyncio.sleep(120)
        except asyncio.CancelledError:
            time.sleep(120)  # noqa: ASYNC251 -- blocks the event loop: the point
    return Done({"by": WORKER})


@app.task("polite", revision="1")
async def polite(ctx: RunContext, state: Any) -> Any:
    if _started(ctx):
        await asyncio.sleep(120)
    return Done({"by": WORKER})
