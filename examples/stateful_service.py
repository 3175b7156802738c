"""A stateful service held by one worker process: a browser session.

A browsing agent keeps its browser open between steps. The browser lives in
the memory of the worker process that opened it, so the step pins the run to
that worker (``ctx.pin``): the run's next steps go to it. When that worker is
SIGKILLed, the run continues on another worker, whose step sees
``ctx.service_lost``, opens a new browser at the page the checkpoint recorded
and pins the run to itself.

Run with a migrated database:
    PGDURABLE_DSN=postgresql://... python examples/stateful_service.py

It starts two worker processes of this file (``... stateful_service.py worker
NAME``), with a 2 s lease TTL: a killed worker's presence lapses within 2 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pgdurable import Done, Durable, RunContext, RunInfo, Wait

app = Durable(os.environ.get("PGDURABLE_DSN"))
PAGES = ["https://example.com/", "https://example.com/search?q=durable", "https://example.com/r/1",
         "https://example.com/r/1/reviews"]


@dataclass
class Browser:
    """Stands in for a real browser session: it exists only in this process."""

    url: str | None = None
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    async def goto(self, url: str) -> str:
        self.url = url
        return f"<title>{url.rsplit('/', 1)[-1] or 'home'}</title>"


BROWSERS: dict[str, Browser] = {}  # run id -> the browser this process holds for it
WORKER = os.environ.get("EXAMPLE_WORKER", "main")


@app.task("browse", revision="1")
async def browse(ctx: RunContext, state: dict[str, Any]) -> Any:
    browser = BROWSERS.get(ctx.run_id)
    lost = ctx.service_lost
    if browser is None or lost:
        if lost:
            assert ctx.affinity is not None
            print(f"[{WORKER}] the browser {ctx.affinity.info} held by worker "
                  f"{ctx.affinity.worker!r} is lost; reopening {state.get('url')}", flush=True)
        browser = Browser(state.get("url"))  # a real one would reopen the page, log in again...
        BROWSERS[ctx.run_id] = browser
        # the next claims of this run go to this worker while it is alive; for up
        # to 5 minutes they wait for it (hard) if it is busy
        await ctx.pin("hard", wait=timedelta(minutes=5),
                      info={"service": "browser", "session": browser.session})
    title = await browser.goto(PAGES[ctx.step])
    print(f"[{WORKER}] step {ctx.step}: {title} (browser {browser.session})", flush=True)
    seen = [*state.get("seen", []), {"step": ctx.step, "worker": WORKER,
                                     "browser": browser.session, "lost": lost}]
    new = {**state, "url": browser.url, "seen": seen}
    if ctx.step + 1 == len(PAGES):
        return Done(seen, state=new)
    return Wait(signal=("next-page", ctx.run_id), state=new)  # e.g. the user clicks "next"


def spawn(name: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "EXAMPLE_WORKER": name}
    return subprocess.Popen([sys.executable, __file__, "worker", name], env=env)


async def run_worker(name: str) -> None:
    worker = app.worker(worker_id=name, lease_ttl=timedelta(seconds=2), poll_interval=0.5)
    async with app:
        await worker.run()  # until SIGTERM (or SIGKILL)


async def until(rid: str, ok: Any) -> RunInfo:
    for _ in range(1200):  # up to a minute
        info = await app.get_run(rid)
        if ok(info):
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(f"run {rid}: {info.status} at step {info.step}")


async def main() -> None:
    a = spawn("a")
    b: subprocess.Popen[bytes] | None = None
    try:
        async with app:
            rid = await app.start("browse", {})
            info = await until(rid, lambda i: i.status == "waiting" and i.step == 1)
            assert info.affinity is not None and info.affinity.worker == "a"
            b = spawn("b")
            await app.signal("next-page", rid)  # a is alive: step 1 goes to a
            await until(rid, lambda i: i.status == "waiting" and i.step == 2)

            a.send_signal(signal.SIGKILL)  # the browser dies with it
            a.wait()
            print("[main] worker a killed", flush=True)
            await app.signal("next-page", rid)  # b takes over once a's presence lapses
            await until(rid, lambda i: i.status == "waiting" and i.step == 3)
            await app.signal("next-page", rid)
            info = await until(rid, lambda i: i.terminal)
            assert info.status == "completed", info.error
            for s in info.result:
                print(f"[main] step {s['step']}: worker {s['worker']}, browser {s['browser']}"
                      f"{', rebuilt (service lost)' if s['lost'] else ''}")
            workers = [s["worker"] for s in info.result]
            assert workers == ["a", "a", "b", "b"], workers
            assert info.result[2]["lost"] and not info.result[3]["lost"]
            assert info.affinity is not None and info.affinity.worker == "b"
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(run_worker(sys.argv[2]))
    else:
        asyncio.run(main())
