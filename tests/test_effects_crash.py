"""SIGKILL a real worker process at the crash points of effects and of durable
reconcile steps, then resume in another worker.

The subprocess worker runs ``tests/_effects_app.py`` with ``PGD_EFFECTS_HANG=1``:
the code under test writes a marker row and blocks exactly at the crash point;
the parent waits for the marker, SIGKILLs the process (the ``fleet`` fixture,
tests/fix_fleet.py), and a second (in-process)
worker claims the runs once their 2 s leases expire. Every execution is
counted in the scratch table ``public.effect_log`` by the code itself.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, finished
from fix_fleet import Fleet, WorkerProc

from pgdurable import Durable, Worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import _effects_app as fx  # noqa: E402

#: The hanging worker: the code under test blocks at its crash point (its options as
#: before the fleet fixture: the worker's own grace, 30 s).
HANGING = pytest.mark.fleet("_effects_app:app", ttl=2.0, poll=0.2, concurrency=8,
                            env={"PGD_EFFECTS_HANG": "1"})
pytestmark = [pytest.mark.crash, HANGING]


def spawn_hanging_worker(fleet: Fleet, dsn: str) -> WorkerProc:
    return fleet.start("hanging", env={"PGD_EFFECTS_DSN": dsn})


async def wait_for(pred: Callable[[], bool], what: str, proc: WorkerProc) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_LIMIT
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"worker exited ({proc.returncode}) before {what}")
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@asynccontextmanager
async def resumed(dsn: str) -> AsyncIterator[Durable]:
    """A second worker, in this process, with the same code but no hang."""
    app = fx.make_app(dsn)
    worker: Worker = app.worker(poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        yield app
    finally:
        await worker.stop(grace=2)
        await task
        await app.close()


def effect_row(conn: psycopg.Connection[Any], rid: str, key: str) -> tuple[Any, ...] | None:
    return conn.execute("SELECT status, result FROM pgdurable.effects WHERE run_id = %s AND key = %s",
                        (rid, key)).fetchone()


async def test_sigkill_around_effects(dsn: str, conn: psycopg.Connection[Any],
                                     fleet: Fleet) -> None:
    conn.execute(fx.SCRATCH)
    starter = fx.make_app(dsn)
    try:
        after = await starter.start("charge_then_crash")
        safe = await starter.start("crash_inside_effect", {"policy": "safe"})
        rec = await starter.start("crash_inside_effect", {"policy": "reconcile"})
        rec_fail = await starter.start("crash_inside_effect",
                                       {"policy": "reconcile", "reconcile_fails": True})
    finally:
        await starter.close()

    proc = spawn_hanging_worker(fleet, dsn)
    try:
        await wait_for(lambda: fx.count(dsn, "after-effect", after) == 1
                       and all(fx.count(dsn, "send", r) == 1 for r in (safe, rec, rec_fail)),
                       "every run at its crash point", proc)
        # the finished effect is recorded; the in-flight ones are only started
        charge = effect_row(conn, after, "charge")
        assert charge is not None and charge[0] == "succeeded"
        for r in (safe, rec, rec_fail):
            assert effect_row(conn, r, "send") == ("started", None)
    finally:
        proc.kill()  # SIGKILL, reaped

    async with resumed(dsn) as app:
        infos = {r: await finished(app, r) for r in (after, safe, rec, rec_fail)}

    # killed after the effect and before the checkpoint: not executed again
    assert infos[after].status == "completed"
    assert fx.count(dsn, "charge", after) == 1
    assert infos[after].result == effect_row(conn, after, "charge")[1]  # type: ignore[index]
    assert infos[after].claims >= 2

    # killed inside the effect, policy "safe": executed again
    assert infos[safe].status == "completed" and infos[safe].result == {"sent": True}
    assert fx.count(dsn, "send", safe) == 2 and fx.count(dsn, "reconcile", safe) == 0

    # killed inside the effect, policy "reconcile": reconcile, never fn again
    assert infos[rec].status == "completed" and infos[rec].result == {"sent": "reconciled"}
    assert fx.count(dsn, "send", rec) == 1 and fx.count(dsn, "reconcile", rec) == 1
    assert effect_row(conn, rec, "send") == ("succeeded", {"sent": "reconciled"})

    # reconcile raises: the run stops (ReconcileFailed), the effect stays started
    assert infos[rec_fail].status == "failed" and infos[rec_fail].error is not None
    assert infos[rec_fail].error["type"] == "ReconcileFailed"
    assert fx.count(dsn, "send", rec_fail) == 1 and fx.count(dsn, "reconcile", rec_fail) == 1
    assert effect_row(conn, rec_fail, "send") == ("started", None)


async def test_sigkill_inside_a_durable_reconcile_step(dsn: str,
                                                       conn: psycopg.Connection[Any],
                                                       fleet: Fleet) -> None:
    conn.execute(fx.SCRATCH)
    starter = fx.make_app(dsn)
    try:
        ok = await starter.start("commit")  # initial_state {"count": 0}
        bad = await starter.start("commit", {"count": 0, "reconcile_fails": True})
    finally:
        await starter.close()

    proc = spawn_hanging_worker(fleet, dsn)
    try:
        await wait_for(lambda: fx.count(dsn, "commit", ok) == 1 and fx.count(dsn, "commit", bad) == 1,
                       "both runs inside their commit step", proc)
        marks = conn.execute("SELECT run_id::text, step, step_id FROM pgdurable.durable_steps "
                             "ORDER BY run_id").fetchall()
        assert sorted(marks) == sorted([(ok, 1, "commit"), (bad, 1, "commit")])
    finally:
        proc.kill()  # SIGKILL, reaped

    async with resumed(dsn) as app:
        done_ok = await finished(app, ok)
        done_bad = await finished(app, bad)

    # found in flight -> reconcile() instead of run(); then the rest of the steps
    assert done_ok.status == "completed"
    assert done_ok.result == {"count": 11, "reconciled": True, "finished": True}
    assert [fx.count(dsn, w, ok) for w in ("prepare", "commit", "reconcile-commit", "finish")] \
        == [1, 1, 1, 1]

    # reconcile raised: the run stops, the step is never re-run, the mark stays
    assert done_bad.status == "failed" and done_bad.error is not None
    assert done_bad.error["type"] == "ReconcileFailed"
    assert done_bad.step == 1 and done_bad.state == {"count": 1, "reconcile_fails": True}
    assert [fx.count(dsn, w, bad) for w in ("prepare", "commit", "reconcile-commit", "finish")] \
        == [1, 1, 1, 0]
    assert conn.execute("SELECT step, step_id FROM pgdurable.durable_steps WHERE run_id = %s",
                        (bad,)).fetchone() == (1, "commit")
