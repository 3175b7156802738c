"""A Durable app for the real-process affinity tests (tests/test_affinity_procs.py).

Run as ``python -m pgdurable.worker _affinity_app:app ...`` with
``PYTHONPATH=tests`` and ``PGDURABLE_DSN`` set. The stateful service is a fake
browser session: an object in this process's memory (:data:`BROWSERS`), keyed by
run id, which no other process can see. Every step records, durably and before
it returns, in the scratch table ``test_affinity_log`` that the test creates:
which process ran it, whether the step was told its service was lost, whether it
had to build the browser (and from which page), and the browser's session id.

Task ``browse`` (state: ``mode``, ``wait``, ``n``; optional ``hang_at``): step
``i`` finds this run's browser here or builds one (restoring ``state["url"]``)
and pins the run (``ctx.pin(mode, wait=...)``) when it built it, "visits"
``page-i``, then parks until the signal ``("next", run id)``; after ``n``
steps it completes. At step ``hang_at`` the holder hangs (SIGKILL tests); run
again elsewhere (service lost) it goes on. Task ``gate`` waits for the advisory
lock ``state["key"]`` (a slot kept busy while the test holds it); task
``probe`` records which process ran it and completes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Wait

app = pgdurable.Durable()

LOG = ("INSERT INTO test_affinity_log (run_id, step, pid, worker, lost, built, restored, "
       "session, event) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)")


@dataclass
class FakeBrowser:
    """Stands in for a browser session: lives only in this process."""

    url: str | None
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    visited: list[str] = field(default_factory=list)

    def goto(self, url: str) -> None:
        self.url = url
        self.visited.append(url)


BROWSERS: dict[str, FakeBrowser] = {}


@app.task("browse", revision="1")
async def browse(ctx: RunContext, state: dict[str, Any]) -> Any:
    """A step of a browsing agent that keeps its browser between steps."""
    lost = ctx.service_lost  # read before this step pins the run here
    browser = BROWSERS.get(ctx.run_id)
    built = browser is None or lost
    if built:
        # first step, or the browser is in another process (or in none): rebuild it
        # from what the checkpoint recorded
        browser = FakeBrowser(state.get("url"))
        BROWSERS[ctx.run_id] = browser
        await ctx.pin(state["mode"], wait=state["wait"], info={"service": "browser",
                                                               "session": browser.session})
    assert browser is not None
    async with app.pool.connection() as conn:
        await conn.execute(LOG, (ctx.run_id, ctx.step, os.getpid(),
                                 os.environ.get("FLEET_WORKER", "?"), lost, built,
                                 browser.url if built else None, browser.session, "step"))
    if state.get("hang_at") == ctx.step and not lost:
        await asyncio.sleep(3600)  # the holder is SIGKILLed here
    browser.goto(f"page-{ctx.step}")
    new = {**state, "url": browser.url}
    if ctx.step + 1 >= int(state["n"]):
        return Done({"visited": browser.visited, "session": browser.session}, state=new)
    return Wait(signal=("next", ctx.run_id), state=new)


@app.task("gate", revision="1")
async def gate(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Holds a worker slot until the test releases the advisory lock."""
    async with app.pool.connection() as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (state["key"],))
        await conn.execute("SELECT pg_advisory_unlock(%s)", (state["key"],))
    return Done()


@app.task("probe", revision="1")
async def probe(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Records which worker claimed it."""
    return Done({"worker": os.environ.get("FLEET_WORKER", "?"), "pid": os.getpid()})
