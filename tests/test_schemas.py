"""Several apps or tenants in one database, each in its own schema (issue 46):
``migrate(schema=)`` / ``pgdurable --schema``, ``Durable(schema=)``, channels per
schema, and isolation (a worker of one never claims another's runs).

The databases here have NO ``pgdurable`` schema: a statement that still named it
would fail loudly instead of reading another tenant's rows."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _roles import as_role, cli, roles

import pgdurable
from pgdurable import Done, Durable, DurableClient, InvalidInput, Wait
from pgdurable.foundation.migrations import load_definitions, migrate, migration_status
from pgdurable.foundation.notifier import notifier_for
from pgdurable.foundation.schemas import (
    KEPT,
    canonical_channel,
    check_schema_name,
    in_schema,
    schema_of,
)
from pgdurable.ops.testing import fire_due_timers, run_until_idle

pytestmark = pytest.mark.fleet("_schemas_app:app", ttl=10.0)

A, B = "tenant_a", "tenant_b"


@pytest.fixture
def two(empty_dsn: str) -> str:
    """A database with two pgdurable schemas and no ``pgdurable`` one."""
    migrate(empty_dsn, schema=A)
    migrate(empty_dsn, schema=B)
    return empty_dsn


def _one(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(sql, params or None).fetchone()
        return None if row is None else row[0]


# -- names -------------------------------------------------------------------
def test_the_rewrite_names_the_schema_and_leaves_the_rest() -> None:
    assert in_schema("SELECT pgdurable.claim_runs(%s)", "ten") == "SELECT ten.claim_runs(%s)"
    assert in_schema("LISTEN pgdurable_wake", "ten") == "LISTEN ten_wake"
    assert in_schema("'pgdurable'::regnamespace", "ten") == "'ten'::regnamespace"
    assert in_schema('"pgdurable".runs', "ten") == '"ten".runs'
    # the test clock's and live steps' settings stay global; pgdurable.now() is a function
    assert in_schema("current_setting('pgdurable.now', true)", "ten") == (
        "current_setting('pgdurable.now', true)")
    assert in_schema("SET LOCAL pgdurable.now = '2026-01-01'", "ten") == (
        "SET LOCAL pgdurable.now = '2026-01-01'")
    assert in_schema("pgdurable.now()", "ten") == "ten.now()"
    # a name that merely begins with pgdurable is the user's, not ours
    for mine in ("pgdurable_jobs", "xpgdurable.t", "pgdurable_wakeup", "pgdurable2.t"):
        assert in_schema(mine, "ten") == mine
    assert in_schema("SELECT pgdurable.runs", "pgdurable") == "SELECT pgdurable.runs"
    assert canonical_channel("ten_wake", "ten") == "pgdurable_wake"
    assert canonical_channel("other_wake", "ten") == "other_wake"
    assert canonical_channel("ten_nothing", "ten") == "ten_nothing"


@pytest.mark.parametrize(("name", "error"), [
    ("Tenant", InvalidInput), ("1tenant", InvalidInput), ("ten-ant", InvalidInput),
    ("", InvalidInput), ("public", InvalidInput), ("pg_temp", InvalidInput),
    ("information_schema", InvalidInput), ("x" * 49, InvalidInput), ('a"; drop', InvalidInput),
    (7, TypeError), (b"tenant", TypeError),
])
def test_a_bad_schema_name_is_a_typed_error_and_changes_nothing(
        empty_dsn: str, name: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_schema_name(name)
    with pytest.raises(error):
        migrate(empty_dsn, schema=name)  # type: ignore[arg-type]
    with pytest.raises(error):
        Durable(empty_dsn, schema=name)  # type: ignore[arg-type]
    with pytest.raises(error), psycopg.connect(empty_dsn) as conn:
        pgdurable.use_schema(conn, name)  # type: ignore[arg-type]
    assert _one(empty_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg_%' "
                           "AND nspname NOT IN ('public', 'information_schema')") == 0


# -- migrate -----------------------------------------------------------------
def test_every_object_lands_in_its_schema(two: str) -> None:
    assert _one(two, "SELECT to_regnamespace('pgdurable')") is None
    counts = {s: _one(two, "SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace",
                      (s,)) for s in (A, B)}
    assert counts[A] == counts[B] > 100
    # no function body or setting in a tenant's schema names schema pgdurable: only the
    # global session settings and the wake kinds (schemas.KEPT: pgdurable.now, ...) remain
    kept = r"pgdurable\.(" + "|".join(KEPT) + ")'"
    leaks = _one(two, """
        SELECT count(*) FROM pg_proc p WHERE p.pronamespace = ANY (%s::regnamespace[])
           AND (regexp_replace(p.prosrc, %s, '', 'g') ~ '(^|[^a-z0-9_$])pgdurable([^a-z0-9]|$)'
                OR p.proconfig::text LIKE '%%pgdurable%%')""", ([A, B], kept))
    assert leaks == 0
    assert {m.status for m in migration_status(two, schema=A)} == {"applied"}
    assert migrate(two, schema=A) == []  # nothing left to apply, nothing applied twice
    # the definitions are recorded with the shipped files' sha256 in each schema
    recorded = dict(psycopg.connect(two, autocommit=True).execute(
        f"SELECT path, sha256 FROM {B}.schema_definitions").fetchall())
    assert recorded == {d.path: d.sha256 for d in load_definitions()}


def test_the_cli_migrates_and_lists_one_schema(two: str) -> None:
    env = {**os.environ, "PGDURABLE_DSN": two}
    env.pop("PGDURABLE_SCHEMA", None)

    def cli(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pgdurable", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=120)

    done = cli("--schema", "tenant_c", "migrate")
    assert done.returncode == 0, done.stderr
    assert _one(two, "SELECT to_regclass('tenant_c.runs') IS NOT NULL")
    with DurableClient(two, schema=A) as a:
        rid = a.start("whoami", {}, revision="1")
    listed = cli("--schema", A, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)["runs"]] == [rid]
    from_env = cli("runs", "--json", PGDURABLE_SCHEMA=B)
    assert from_env.returncode == 0, from_env.stderr
    assert json.loads(from_env.stdout)["runs"] == []
    bad = cli("--schema", "Nope", "runs")
    assert bad.returncode != 0 and "lower-case identifier" in bad.stderr
    bad_env = cli("runs", PGDURABLE_SCHEMA="pg_x")
    assert bad_env.returncode != 0 and "PGDURABLE_SCHEMA" in bad_env.stderr
    # the default schema does not exist here: a command without a schema says so
    missing = cli("runs")
    assert missing.returncode != 0


# -- apps --------------------------------------------------------------------
def _app(dsn: str, schema: str) -> Durable:
    app = Durable(dsn, schema=schema)

    @app.task("whoami")
    async def whoami(ctx: pgdurable.RunContext, state: dict[str, Any]) -> Any:
        if "wait_for" in state and not state.get("woken"):
            state["woken"] = True
            return Wait(("go", state["wait_for"]), timeout=120)
        return Done({"schema": schema, "wake": ctx.wake})

    return app


async def test_a_worker_claims_only_its_schemas_runs_and_wakes_on_its_channel(two: str) -> None:
    a, b = _app(two, A), _app(two, B)
    async with a, b:
        ra = await a.start("whoami", {"wait_for": "r"})
        rb = await b.start("whoami", {"wait_for": "r"})
        # poll_interval 60: the wake after the signal can only come by NOTIFY on tenant_a_wake
        worker = a.worker(poll_interval=60)
        running = asyncio.create_task(worker.run())
        try:
            for _ in range(200):
                if (await a.get_run(ra)).status == "waiting":
                    break
                await asyncio.sleep(0.05)
            assert (await a.get_run(ra)).status == "waiting"
            await b.signal("go", "r", {"to": "b"})  # B's signal: A's run must not wake
            await a.signal("go", "r", {"to": "a"})
            result = await a.result(ra, timeout=30)
            assert result["schema"] == A and result["wake"]["payload"] == {"to": "a"}
            assert (await b.get_run(rb)).status == "runnable"  # never claimed by A's worker
            assert (await b.get_run(rb)).attempts == 0
        finally:
            await worker.stop()
            await running
        notifier = a.notifier()
        assert notifier is not None and notifier.schema == A


async def test_the_notifier_listens_on_its_schemas_channels(two: str) -> None:
    got: list[psycopg.Notify] = []
    sub = notifier_for(two, A).subscribe(("pgdurable_wake",), got.append)
    try:
        await asyncio.wait_for(sub.ready.wait(), 10)
        async with await psycopg.AsyncConnection.connect(two, autocommit=True) as c:
            for channel in ("pgdurable_wake", "tenant_b_wake", "tenant_a_wake"):
                await c.execute(f"NOTIFY {channel}, '{channel}'")
        for _ in range(100):
            if got:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the other two, had they been heard, would be here by now
        assert [(n.channel, n.payload) for n in got] == [("pgdurable_wake", "tenant_a_wake")]
    finally:
        await sub.close()


async def test_start_in_the_callers_transaction_lands_in_the_apps_schema(two: str) -> None:
    a = _app(two, A)
    async with a, await psycopg.AsyncConnection.connect(two) as conn:
        before = conn.cursor_factory
        async with conn.transaction():
            rid = await a.start("whoami", {}, conn=conn)
            ids = await a.start_many([pgdurable.Start("whoami", {})], conn=conn)
            sent = await a.send_event("some.event", {"x": 1}, conn=conn)
        assert conn.cursor_factory is before  # the caller's connection is its own again
        assert schema_of(conn) == "pgdurable"
        assert (await a.get_run(rid)).status == "runnable"
        assert (await a.get_run(ids[0])).status == "runnable"
    assert _one(two, "SELECT count(*) FROM tenant_a.runs") == 2
    assert _one(two, "SELECT count(*) FROM tenant_b.runs") == 0
    assert sent is not None
    assert _one(two, "SELECT count(*) FROM tenant_a.events WHERE name = 'some.event'") == 1


async def test_a_pool_of_the_callers_must_speak_the_apps_schema(two: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(two, kwargs={"autocommit": True}, open=False) as pool:
        with pytest.raises(InvalidInput, match="use_schema"):
            await Durable(pool=pool, schema=A).open()

    async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
        pgdurable.use_schema(conn, A)

    async with AsyncConnectionPool(two, kwargs={"autocommit": True}, configure=configure,
                                   open=False) as pool:
        app = Durable(pool=pool, schema=A)
        await app.open()
        assert await app.fetchone("SELECT count(*) FROM pgdurable.runs", ()) == (0,)


def test_the_sync_client_and_its_result_follow_the_schema(two: str) -> None:
    a = _app(two, B)
    with DurableClient(two, app=a) as client:
        assert client.schema == B
        rid = client.start("whoami", {})

    async def run() -> None:
        async with a:
            await run_until_idle(a)

    asyncio.run(run())
    with DurableClient(two, app=a) as client:
        assert client.result(rid, timeout=10)["schema"] == B


# -- processes ---------------------------------------------------------------
@pytest.mark.crash
def test_worker_processes_of_two_schemas_never_cross(two: str, fleet: Any) -> None:
    """Two worker processes per schema, one of A's SIGKILLed mid-way: every run completes
    exactly once, in its own schema, by a worker of that schema."""
    wa1 = fleet.start("a1", env={"PGDURABLE_SCHEMA": A, "PGDURABLE_DSN": two})
    wa2 = fleet.start("a2", env={"PGDURABLE_SCHEMA": A, "PGDURABLE_DSN": two})
    wb1 = fleet.start("b1", env={"PGDURABLE_SCHEMA": B, "PGDURABLE_DSN": two})
    # each LISTENs on its own schema's channel (fleet.ready looks for pgdurable_cancel)
    for w, schema in ((wa1, A), (wa2, A), (wb1, B)):
        for _ in range(600):
            if _one(two, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                         "AND query = %s", (w.app_name, f"LISTEN {schema}_cancel")):
                break
            assert w.poll() is None, w.log()
            time.sleep(0.05)
        else:
            raise AssertionError(f"worker {w.name} never listened:\n{w.log()}")
    with DurableClient(two, schema=A) as a, DurableClient(two, schema=B) as b:
        ra = [a.start("whoami", {"wait_for": f"k{i}"}, revision="1") for i in range(30)]
        rb = [b.start("whoami", {"wait_for": f"k{i}"}, revision="1") for i in range(30)]
        for rid in ra:  # every A run parked on its signal
            for _ in range(400):
                if a.get_run(rid).status == "waiting":
                    break
                time.sleep(0.05)
        wa1.kill()
        for i in range(30):
            a.signal("go", f"k{i}")
            b.signal("go", f"k{i}")
        results_a = [a.result(rid, timeout=60) for rid in ra]
        results_b = [b.result(rid, timeout=60) for rid in rb]
    assert {r["schema"] for r in results_a} == {A}
    assert {r["schema"] for r in results_b} == {B}
    assert {r["worker"] for r in results_a} <= {"a1", "a2"}
    assert {r["worker"] for r in results_b} == {"b1"}
    assert all(r["wake"]["type"] == "signal" for r in results_a + results_b)
    for s in (A, B):
        assert _one(two, f"SELECT count(*) FROM {s}.runs WHERE status = 'completed'") == 30
    assert wa2.terminate() == 0 and wb1.terminate() == 0


def test_an_app_role_granted_in_one_schema_reaches_nothing_of_another(two: str) -> None:
    """`pgdurable --schema A grant`: A's app role starts and reads A's runs, and is refused
    everything of B's (its tables, its functions), as every role is by default."""
    with roles(two, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        done = cli("--schema", A, "grant", "--dsn", two, "--owner-role", owner,
                   "--app-role", app_role, "--readonly-role", ro)
        assert done.returncode == 0, done.stderr
        assert _one(two, "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = %s",
                    (A,)) == owner
        with DurableClient(as_role(two, app_role), schema=A) as mine:
            rid = mine.start("whoami", {}, revision="1")
            assert mine.get_run(rid).status == "runnable"
        with pytest.raises(pgdurable.PermissionDenied, match=f"schema {B}"), DurableClient(
                as_role(two, app_role), schema=B) as theirs:
            theirs.start("whoami", {}, revision="1")
        with psycopg.connect(as_role(two, app_role), autocommit=True) as c:
            for statement in (f"SELECT count(*) FROM {B}.runs",
                              f"SELECT {B}.cancel_run('00000000-0000-0000-0000-000000000000')"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    c.execute(statement)
        assert _one(two, f"SELECT count(*) FROM {B}.runs") == 0


# -- every example, in a schema of its own -------------------------------------
ROOT = Path(__file__).resolve().parent.parent
#: examples that cannot run in another schema as they are, and why
_NOT_IN_A_SCHEMA = {
    "failover.py": "starts its own primary and standby",
    "history_partitions.py": "its own SQL reads pgdurable.history_partitions",
    "operations.py": "its own SQL reads pgdurable.runs",
    "roles.py": "its own SQL calls pgdurable.start_run as the app role",
    "outbox_sqlalchemy.py": "its own queries read the SQLAlchemy tables of schema pgdurable",
    "tenants.py": "migrates its own schemas",
}
_EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py")
                   if not p.name.startswith("test_") and p.name not in _NOT_IN_A_SCHEMA)


@pytest.mark.slow
@pytest.mark.parametrize("script", _EXAMPLES, ids=[p.name for p in _EXAMPLES])
def test_every_example_runs_in_another_schema(script: Path, empty_dsn: str) -> None:
    """The examples, with ``PGDURABLE_SCHEMA=tenant_x`` on a database that has only that
    schema: every path they take (runs, workflows, leases, streams, budgets, events,
    schedules, the frameworks' integrations, the dashboard) speaks to it."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(PGDURABLE_DSN=empty_dsn, PGDURABLE_SCHEMA="tenant_x")
    done = subprocess.run([sys.executable, "-m", "pgdurable", "migrate"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    p = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=180)
    assert p.returncode == 0, f"{script.name} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert _one(empty_dsn, "SELECT to_regnamespace('pgdurable')") is None


def test_the_sqlalchemy_helpers_start_and_signal_in_a_schema(two: str) -> None:
    """contrib.sqlalchemy in the caller's transaction: ``schema=``, else the app's."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from pgdurable.contrib.sqlalchemy import signal, start_run, url_from_dsn

    engine = create_engine(url_from_dsn(two))
    try:
        with Session(engine) as session:
            rid_a = start_run(session, "whoami", {}, revision="1", schema=A)
            rid_b = start_run(session, "whoami", {"wait_for": "x"}, app=_app(two, B))
            assert signal(session, "go", "x", schema=B) == []  # kept for the run that parks
            session.commit()
    finally:
        engine.dispose()
    assert _one(two, f"SELECT count(*) FROM {A}.runs WHERE id = %s", (rid_a,)) == 1
    assert _one(two, f"SELECT count(*) FROM {B}.runs WHERE id = %s", (rid_b,)) == 1
    assert _one(two, f"SELECT count(*) FROM {B}.signals WHERE kind = 'go'") == 1
    assert _one(two, f"SELECT count(*) FROM {A}.signals") == 0


def test_the_metrics_read_their_schemas_queues(two: str) -> None:
    """The Prometheus collectors (``pgdurable worker --metrics-port``, the dashboard's
    /metrics) read the queue and budget gauges of their schema."""
    from pgdurable.foundation.metrics import _BudgetCollector, _QueueCollector

    with DurableClient(two, schema=A) as a:
        a.start("whoami", {}, revision="1", queue="only_in_a")
    for schema, queues in ((A, {"only_in_a"}), (B, set())):
        depth = next(iter(_QueueCollector(two, schema).collect()))
        assert {s.labels["queue"] for s in depth.samples} == queues
        assert list(_BudgetCollector(two, schema).collect())  # it reads (no error)


async def test_fire_due_timers_moves_only_the_apps_schemas_timers(two: str) -> None:
    a, b = _app(two, A), _app(two, B)
    async with a, b:
        ra = await a.start("whoami", {"wait_for": "never"})
        rb = await b.start("whoami", {"wait_for": "never"})
        await run_until_idle(a)
        await run_until_idle(b)  # both parked on a signal with a 120 s timeout
        assert await asyncio.to_thread(fire_due_timers, a) == 1
        await run_until_idle(a)
        assert (await a.result(ra, timeout=10))["wake"]["type"] == "timeout"
        assert (await b.get_run(rb)).status == "waiting"
        assert await asyncio.to_thread(fire_due_timers, b) == 1
