"""Forged ``pgdurable_cancel`` notifications (issue 36): anyone who can connect
may NOTIFY, and each notification naming a run the worker holds made it ask
the database whether a cancel was requested (300 forged gave 88 checks). The
checks are coalesced and rate-limited now, as wake-up claims are: a flood
costs at most ``burst + rate x elapsed`` checks, however many runs it names,
and a real cancel sent during the flood still stops its step through the
notification (the heartbeat, the other way a cancel is read, is 200 s away in
these tests)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from _waiting import finished, running, until, worker_listening
from test_security_boundary import _as, roles

from pgdurable import Done, Durable, RunContext

FLOOD = 300


def _blocking_app(dsn: str, started: dict[str, asyncio.Event]) -> Durable:
    app = Durable(dsn)

    @app.task("victim", revision="1")
    async def victim(ctx: RunContext, state: Any) -> Any:
        started[str(ctx.run_id)].set()
        await asyncio.Event().wait()  # until cancelled (or the test ends)
        return Done("finished")

    return app


def _limits(worker: Any) -> tuple[float, float]:
    limiter = worker.listener.cancel_limit
    return float(limiter.burst), float(limiter.rate)


async def _checks_settled(worker: Any, conn: psycopg.Connection[Any],
                          evil: psycopg.AsyncConnection[Any]) -> None:
    """Wait until the worker has read every notification ``evil`` sent and no
    cancel check is pending: a wake-up after them is read after them (one
    listener, commit order), and the worker claims for it."""
    before = worker.claim_count
    await evil.execute("NOTIFY pgdurable_wake, 'default'")

    async def settled() -> bool:
        return worker.claim_count > before and not worker.listener.checks_pending

    await until(settled, "the worker to read the notifications and finish its checks")


@asynccontextmanager
async def _held_runs(dsn: str, conn: psycopg.Connection[Any], n: int) -> AsyncIterator[
        tuple[Durable, Any, list[str], psycopg.AsyncConnection[Any]]]:
    """``n`` runs held by a listening worker, each in a step that waits to be
    cancelled, and a connection of a stranger role: (app, worker, run ids,
    the stranger's connection). The worker's heartbeat is 200 s away: only
    the notification path reads cancels while this holds."""
    started: dict[str, asyncio.Event] = {}
    app = _blocking_app(dsn, started)
    with roles(dsn, "LOGIN") as (stranger,):
        try:
            rids = [await app.start("victim", {}) for _ in range(n)]
            for rid in rids:
                started[rid] = asyncio.Event()
            # a free slot: the wake-up that _checks_settled sends makes it claim
            worker = app.worker(poll_interval=600, lease_ttl=600, concurrency=n + 1)
            async with running(worker):
                for rid in rids:
                    await asyncio.wait_for(started[rid].wait(), 60)
                await worker_listening(conn)
                async with await psycopg.AsyncConnection.connect(
                    _as(dsn, stranger), autocommit=True
                ) as evil:
                    yield app, worker, rids, evil
        finally:
            await app.close()


async def test_a_flood_of_forged_cancels_costs_bounded_checks(
    dsn: str, conn: psycopg.Connection[Any],
) -> None:
    async with _held_runs(dsn, conn, 1) as (app, worker, [rid], evil):
        burst, rate = _limits(worker)
        base = worker.cancel_check_count
        t0 = time.monotonic()
        for _ in range(FLOOD):
            await evil.execute("SELECT pg_notify('pgdurable_cancel', %s)", (rid,))
        await _checks_settled(worker, conn, evil)
        checks = worker.cancel_check_count - base
        elapsed = time.monotonic() - t0
        print(f"{FLOOD} forged cancels: {checks} database checks in {elapsed:.2f} s")
        # a bound that holds at any instant, whatever the machine's speed
        assert 1 <= checks <= burst + rate * elapsed + 1, (checks, elapsed)
        assert (await app.get_run(rid)).status == "leased", "forged: nothing cancelled"
        # a real cancel right after the flood is read from its notification
        await app.cancel(rid)
        assert (await finished(app, rid)).status == "cancelled"


async def test_real_cancels_amid_a_forged_flood_stop_their_steps(
    dsn: str, conn: psycopg.Connection[Any],
) -> None:
    """Three held runs, forged cancels for all three while the real cancels of
    two of them commit: one check covers every run named since the last one, so
    the two stop (through notifications: the heartbeat is 200 s away), the third
    runs on, and the checks stay within the limiter's bound."""
    async with _held_runs(dsn, conn, 3) as (app, worker, rids, evil):
        burst, rate = _limits(worker)
        base = worker.cancel_check_count
        t0 = time.monotonic()

        async def flood() -> None:
            for i in range(FLOOD):
                await evil.execute("SELECT pg_notify('pgdurable_cancel', %s)", (rids[i % 3],))

        async def cancel_two() -> None:
            for rid in rids[:2]:
                await app.cancel(rid)

        await asyncio.gather(flood(), cancel_two())
        for rid in rids[:2]:
            assert (await finished(app, rid)).status == "cancelled"
        await _checks_settled(worker, conn, evil)
        checks = worker.cancel_check_count - base
        elapsed = time.monotonic() - t0
        print(f"{FLOOD} forged + 2 real cancels: {checks} checks in {elapsed:.2f} s")
        assert checks <= burst + rate * elapsed + 1, (checks, elapsed)
        assert (await app.get_run(rids[2])).status == "leased"
        assert worker.active_runs == [rids[2]]
