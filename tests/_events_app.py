"""A Durable app for the event fleet test (tests/test_events_procs.py).

Two triggers on ``msg`` keyed by ``data.k``: ``burst`` debounces (0.3 s, at most
1.5 s after a window's first event) and ``batch`` takes at most 20 events (or what
came within 0.5 s). Each handler logs every event it got, with its run id, to the
scratch table ``events_seen`` (created by the test), then sleeps a little: a
SIGKILL can land while it runs, and the run's retry logs the same events again
under the same run id.

Worker processes run it as ``python -m pgdurable.worker _events_app:app`` with
``PYTHONPATH=tests``.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta

from pgdurable import Durable, Event, RunContext

BATCH = 20  # (tests/test_events_procs.py checks this bound and creates events_seen)

app = Durable(os.environ.get("PGDURABLE_DSN"))


async def _log(trigger: str, ctx: RunContext, events: list[Event]) -> int:
    async with app.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO events_seen (trigger, event_id, run_id, batch_size) "
            "SELECT %s, unnest(%s::bigint[]), %s::uuid, %s",
            (trigger, [e.id for e in events], ctx.run_id, len(events)))
    await asyncio.sleep(0.05)
    return len(events)


@app.on_event("msg", key="data.k", debounce=timedelta(seconds=0.3),
              max_wait=timedelta(seconds=1.5))
async def burst(ctx: RunContext, events: list[Event]) -> int:
    return await _log("burst", ctx, events)


@app.on_event("msg", key="data.k", batch=BATCH, batch_timeout=timedelta(seconds=0.5))
async def batch(ctx: RunContext, events: list[Event]) -> int:
    return await _log("batch", ctx, events)
