"""An effect whose first attempt was interrupted before it acted: reconcile
looks the effect up, finds nothing and returns NOT_PERFORMED, so fn runs once.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/effect_reconcile.py
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

from pgdurable import NOT_PERFORMED, Done, Durable, RunContext

outbox: dict[str, str] = {}  # stands in for the mail provider, keyed by idempotency key
first_attempt = asyncio.Event()
attempts: list[str] = []


async def main() -> None:
    app = Durable(os.environ["PGDURABLE_DSN"])

    @app.task("welcome", revision="1")
    async def welcome(ctx: RunContext, state: dict[str, Any]) -> Done:
        key = f"welcome:{ctx.run_id}"

        async def send() -> dict[str, str]:
            attempts.append("fn")
            if len(attempts) == 1:
                first_attempt.set()
                await asyncio.Event().wait()  # stuck before sending: the worker goes away
            outbox[key] = f"Welcome, {state['name']}!"
            return {"sent": key}

        def look_up() -> Any:
            attempts.append("reconcile")
            return {"sent": key} if key in outbox else NOT_PERFORMED

        return Done(await ctx.effect(key, send, reconcile=look_up))

    async with app:
        rid = await app.start("welcome", {"name": "Ada"})
        first = app.worker(lease_ttl=timedelta(seconds=5), poll_interval=0.2)
        running = asyncio.create_task(first.run())
        await first_attempt.wait()
        await first.stop(grace=0)  # the effect is recorded 'started'; nothing was sent
        await running
        second = app.worker(poll_interval=0.2)
        running = asyncio.create_task(second.run())
        for _ in range(600):  # poll the run (a demo; real code reacts to events)
            info = await app.get_run(rid)
            if info.terminal:
                break
            await asyncio.sleep(0.05)
        await second.stop()
        await running
    print(info.status, info.result, attempts, len(outbox))
    # completed {'sent': 'welcome:...'} ['fn', 'reconcile', 'fn'] 1
    assert info.status == "completed" and attempts == ["fn", "reconcile", "fn"]
    assert len(outbox) == 1


if __name__ == "__main__":
    asyncio.run(main())
