"""Testing your own pgdurable tasks with the pgdurable pytest plugin.

With pgdurable installed the plugin is active: ``pgdurable_dsn`` is a fresh,
migrated database per test (on ``PGDURABLE_TEST_DSN``, default
``postgresql://postgres@127.0.0.1:5432/postgres``, or an embedded server).
Run with::

    pytest examples/test_with_pgdurable.py

``run_until_idle(app)`` runs a real worker in-process until nothing is left to
do now; ``afire_due_timers(app)`` (test-only) makes sleeping runs and wait
timeouts due at once, so a one-day timer is tested in milliseconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio

from pgdurable import Continue, Done, Durable, RunContext, Sleep, Wait
from pgdurable.testing import afire_due_timers, run_until_idle


def register_tasks(app: Durable) -> None:
    """Your application's tasks (in real code, in your own module)."""

    @app.task("checkout", revision="1")
    async def checkout(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            return Continue({**state, "charged": True})
        if ctx.wake is None:
            return Wait.approval(state["order"], timeout=timedelta(days=1))
        approved = ctx.wake["type"] == "signal" and bool((ctx.wake["payload"] or {}).get("ok"))
        return Done({"order": state["order"], "approved": approved, "by": ctx.wake["type"]})

    @app.task("reminder", revision="1")
    async def reminder(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.wake is None:
            return Sleep(timedelta(hours=24))
        return Done({"reminded": state["user"]})


@pytest_asyncio.fixture
async def app(pgdurable_dsn: str) -> AsyncIterator[Durable]:
    """The app on this test's own database."""
    app = Durable(pgdurable_dsn)
    register_tasks(app)
    async with app:
        yield app


@pytest.mark.asyncio
async def test_checkout_waits_for_approval_then_completes(app: Durable) -> None:
    run_id = await app.start("checkout", {"order": "o-1"})
    await run_until_idle(app)
    info = await app.get_run(run_id)
    assert (info.status, info.wait_kind, info.wait_ref) == ("waiting", "approval", "o-1")
    assert info.state["charged"] is True

    await app.signal("approval", "o-1", {"ok": True})
    await run_until_idle(app)
    info = await app.get_run(run_id)
    assert info.status == "completed"
    assert info.result == {"order": "o-1", "approved": True, "by": "signal"}


@pytest.mark.asyncio
async def test_approval_timeout_fires_without_waiting_a_day(app: Durable) -> None:
    run_id = await app.start("checkout", {"order": "o-2"})
    await run_until_idle(app)
    assert await afire_due_timers(app) == 1
    await run_until_idle(app)
    info = await app.get_run(run_id)
    assert info.status == "completed"
    assert info.result == {"order": "o-2", "approved": False, "by": "timeout"}


@pytest.mark.asyncio
async def test_sleep_is_not_waited_for_until_fired(app: Durable) -> None:
    run_id = await app.start("reminder", {"user": "ada"})
    await run_until_idle(app)  # returns although a 24 h timer is pending
    assert (await app.get_run(run_id)).status == "waiting"
    assert await afire_due_timers(app, advance=timedelta(hours=1)) == 0  # 23 h left
    assert await afire_due_timers(app, advance=timedelta(hours=23)) == 1
    await run_until_idle(app)
    assert (await app.get_run(run_id)).result == {"reminded": "ada"}
