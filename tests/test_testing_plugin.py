"""pgdurable.testing: the pytest plugin used by test suites of its own (pytester),
the example in examples/, run_until_idle and fire_due_timers against real workers."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator
from datetime import timedelta
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from pgdurable import Continue, Done, Durable, RunContext, Sleep
from pgdurable.ops.testing import afire_due_timers, fire_due_timers, run_until_idle

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


def plugin_args() -> list[str]:
    """Load the plugin explicitly only if this environment lacks the entry point
    (a checkout not reinstalled since it was added); loading it twice is an error."""
    if entry_points(group="pytest11", name="pgdurable"):
        return []
    return ["-p", "pgdurable.ops.testing"]


def run_suite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error::pytest.PytestUnraisableExceptionWarning\n"
    )
    return pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", *args,
                                         timeout=300)


def test_pyproject_registers_the_plugin() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert meta["project"]["entry-points"]["pytest11"] == {"pgdurable": "pgdurable.ops.testing"}


def test_the_example_suite_passes_with_the_plugin(pytester: pytest.Pytester) -> None:
    example = (ROOT / "examples" / "test_with_pgdurable.py").read_text(encoding="utf-8")
    pytester.makepyfile(test_with_pgdurable=example)
    result = run_suite(pytester, "-v")
    result.assert_outcomes(passed=3)


def test_plugin_databases_are_migrated_fresh_per_test_and_dropped(
    pytester: pytest.Pytester, pg_server: Any
) -> None:
    names = pytester.path / "names.txt"
    pytester.makepyfile(
        test_users_suite=f"""
        import psycopg
        import pgdurable

        NAMES = {str(names)!r}

        def _record(dsn):
            with psycopg.connect(dsn) as c:
                pgdurable.check_schema(c)  # migrated to the required version
                name = c.info.dbname
                c.execute("CREATE TABLE mine (x int)")  # would clash if shared
            with open(NAMES, "a") as f:
                f.write(name + "\\n")

        def test_one(pgdurable_dsn):
            _record(pgdurable_dsn)

        def test_two(pgdurable_dsn, pgdurable_template, pgdurable_server):
            _record(pgdurable_dsn)
            with open(NAMES, "a") as f:
                f.write(pgdurable_template + "\\n")
            assert "dbname=x" in pgdurable_server.dsn_for("x")
        """
    )
    run_suite(pytester).assert_outcomes(passed=2)
    created = names.read_text(encoding="utf-8").split()
    assert len(set(created)) == 3  # two clones and the template
    with psycopg.connect(pg_server.dsn) as c:
        left = c.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY (%s)", (created,)
        ).fetchall()
    assert left == []  # every database was dropped


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x(pgdurable_dsn):\n    pass\n")
    if plugin_args():
        pytest.skip("the entry point is not installed in this environment")
    result = pytester.runpytest_subprocess("-p", "no:pgdurable", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'pgdurable_dsn' not found*"])


# -- run_until_idle and fire_due_timers against a real worker ----------------------------


def make_app(dsn: str) -> Durable:
    app = Durable(dsn)
    failed: set[str] = set()

    @app.task("hop", revision="1")
    async def hop(ctx: RunContext, state: dict[str, Any]) -> Any:
        if state.get("next"):  # start a follow-up run in another queue
            child = await app.start("hop", {}, queue=state["next"])
            return Done({"child": child})
        return Done({"queue_step": ctx.step})

    @app.task("forever", revision="1")
    async def forever(ctx: RunContext, state: dict[str, Any]) -> Any:
        return Continue({"n": ctx.step})

    @app.task("flaky", revision="1", retry_base=3600, retry_cap=3600)
    async def flaky(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.run_id not in failed:
            failed.add(ctx.run_id)
            raise RuntimeError("first attempt fails")
        return Done({"attempt": ctx.attempt})

    @app.task("nap", revision="1")
    async def nap(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.wake is None:
            return Sleep(timedelta(days=3))
        return Done(ctx.wake["type"])

    return app


@pytest_asyncio.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    async with make_app(dsn) as a:
        yield a


async def test_run_until_idle_follows_runs_into_new_queues(app: Durable) -> None:
    parent = await app.start("hop", {"next": "b"}, queue="a")
    await run_until_idle(app)
    info = await app.get_run(parent)
    assert info.status == "completed"
    child = await app.get_run(info.result["child"])
    assert (child.queue, child.status) == ("b", "completed")


async def test_run_until_idle_serves_only_the_queues_given(app: Durable) -> None:
    in_a = await app.start("hop", {}, queue="a")
    in_b = await app.start("hop", {}, queue="b")
    await run_until_idle(app, queues=["a"])
    assert (await app.get_run(in_a)).status == "completed"
    assert (await app.get_run(in_b)).status == "runnable"


async def test_run_until_idle_ignores_runs_of_other_tasks_and_revisions(
    app: Durable, conn: psycopg.Connection[Any]
) -> None:
    other = await app.start("unknown", {}, revision="1")
    old = await app.start("hop", {}, revision="0")
    await run_until_idle(app)  # returns: nothing here is this app's work
    assert (await app.get_run(other)).status == "runnable"
    assert (await app.get_run(old)).status == "runnable"


async def test_run_until_idle_times_out_on_endless_work_and_gives_it_back(app: Durable) -> None:
    run_id = await app.start("forever", {})
    with pytest.raises(TimeoutError, match="work left"):
        await run_until_idle(app, timeout=1.0)
    info = await app.get_run(run_id)
    assert info.status == "runnable" and info.step > 0  # checkpointed, lease given back


async def test_run_until_idle_needs_tasks(dsn: str) -> None:
    async with Durable(dsn) as empty:
        with pytest.raises(ValueError, match="no registered tasks"):
            await run_until_idle(empty)


async def test_retry_backoff_is_not_waited_for_until_fired(
    app: Durable, dsn: str
) -> None:
    run_id = await app.start("flaky", {})
    await run_until_idle(app)  # the first attempt failed; the retry is an hour away
    info = await app.get_run(run_id)
    assert (info.status, info.attempts) == ("runnable", 1)
    assert fire_due_timers(dsn) == 1  # the sync helper, by conninfo
    await run_until_idle(app)
    assert (await app.get_run(run_id)).result == {"attempt": 2}


async def test_fire_due_timers_advances_sleeps_and_notifies(
    app: Durable, conn: psycopg.Connection[Any], dsn: str
) -> None:
    run_id = await app.start("nap", {})
    await run_until_idle(app)
    before = await app.get_run(run_id)
    assert before.status == "waiting" and before.wake_at is not None
    conn.execute("LISTEN pgdurable_wake")
    assert await afire_due_timers(app, advance=timedelta(days=1)) == 0
    moved = await app.get_run(run_id)
    assert moved.wake_at == before.wake_at - timedelta(days=1)
    assert fire_due_timers(app, advance=timedelta(days=2)) == 1  # a Durable works too
    assert [n.payload for n in conn.notifies(timeout=30, stop_after=1)] == ["default"]
    await run_until_idle(app)
    assert (await app.get_run(run_id)).result == "timeout"


async def test_fire_due_timers_bad_input_changes_nothing(app: Durable, dsn: str) -> None:
    run_id = await app.start("nap", {})
    await run_until_idle(app)
    before = await app.get_run(run_id)
    with pytest.raises(TypeError, match="advance"):
        fire_due_timers(dsn, advance=timedelta(seconds=-1))
    with pytest.raises(TypeError, match="advance"):
        await afire_due_timers(app, advance=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="conninfo"):
        fire_due_timers(42)  # type: ignore[arg-type]
    assert (await app.get_run(run_id)).wake_at == before.wake_at
