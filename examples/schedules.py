"""Schedules: a nightly digest and a frequent monitor, one run per tick.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/schedules.py

Schedules are declared in code and written to ``pgdurable.schedules`` when a
worker starts. Whichever worker is up fires each tick, exactly once. The same
from a shell: ``pgdurable schedule list``, ``pgdurable schedule trigger digest``,
``pgdurable schedule runs monitor``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Done, RunContext
from pgdurable.runs.schedules import (
    list_schedules,
    pause_schedule,
    resume_schedule,
    trigger_schedule,
)

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("digest", revision="1")
async def digest(ctx: RunContext, state: dict[str, Any]) -> Any:
    return Done({"sent_to": state["to"]})


@app.task("monitor", revision="1")
async def monitor(ctx: RunContext, state: dict[str, Any]) -> Any:
    return Done({"checked": state["url"], "ok": True})


# weekdays at 07:00 Berlin time; if every worker was down at 07:00, fire it once on return
app.schedule("digest", cron="0 7 * * 1-5", timezone="Europe/Berlin", task="digest",
             state={"to": "team@example.com"}, overlap="skip", catchup="latest")
# every second (a demo; think minutes): a slow check never overlaps itself
app.schedule("monitor", every=timedelta(seconds=1), task="monitor",
             state={"url": "https://example.com/health"}, overlap="skip")


async def ticks_of(name: str) -> list[tuple[Any, ...]]:
    return await app.fetchall(
        "SELECT sr.tick, sr.triggered, r.status FROM pgdurable.schedule_runs sr "
        "JOIN pgdurable.runs r ON r.id = sr.run_id WHERE sr.schedule = %s ORDER BY sr.tick",
        (name,))


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=4, lease_ttl=timedelta(seconds=10))
        running = asyncio.create_task(worker.run())
        # the worker sleeps until the next tick (no polling); wait for two monitor runs
        for _ in range(200):
            if len(await ticks_of("monitor")) >= 2:
                break
            await asyncio.sleep(0.05)
        for s in await list_schedules(app):
            what = f"{s.cron} ({s.timezone})" if s.cron else f"every {s.every}"
            print(f"{s.name:8} {what:32} next {s.next_fire_at:%Y-%m-%d %H:%M:%S %Z} "
                  f"fired {s.fired}")

        # outside the cadence: start a digest now
        run_id = await trigger_schedule(app, "digest")
        print("triggered digest run", run_id)

        # pause the monitor; resuming plans from now (ticks missed while paused are skipped)
        await pause_schedule(app, "monitor")
        await resume_schedule(app, "monitor")

        await worker.stop(grace=2)
        await running
        monitor_ticks = await ticks_of("monitor")
        assert len(monitor_ticks) >= 2, monitor_ticks
        assert len({t for t, _, _ in monitor_ticks}) == len(monitor_ticks)  # one run per tick
        print(f"monitor: {len(monitor_ticks)} tick(s), one run each")


if __name__ == "__main__":
    asyncio.run(main())
