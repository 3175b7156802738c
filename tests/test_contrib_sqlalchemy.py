"""pgdurable.contrib.sqlalchemy: transactional start/signal (sync and async), Table drift."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from _waiting import worker_listening
from sqlalchemy import (
    TIMESTAMP,
    BigInteger,
    Column,
    Engine,
    ForeignKey,
    MetaData,
    Table,
    Text,
    create_engine,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import pgdurable
from pgdurable import Done, Durable, RunContext, Wait
from pgdurable.contrib.sqlalchemy import signal, signal_run, start_run, url_from_dsn
from pgdurable.contrib.sqlalchemy import tables as t
from pgdurable.ops.testing import run_until_idle

SENTINEL = "zz-sentinel"


# -- fixtures and helpers ---------------------------------------------------------


@pytest.fixture
def engine(dsn: str, conn: psycopg.Connection[Any]) -> Iterator[Engine]:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer PRIMARY KEY)")
    e = create_engine(url_from_dsn(dsn))
    yield e
    e.dispose()


@pytest_asyncio.fixture
async def aengine(dsn: str, conn: psycopg.Connection[Any]) -> AsyncIterator[AsyncEngine]:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id integer PRIMARY KEY)")
    e = create_async_engine(url_from_dsn(dsn, async_=True))
    yield e
    await e.dispose()


@pytest.fixture
def listener(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A real connection LISTENing on pgdurable_wake (as workers do)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("LISTEN pgdurable_wake")
        yield c


def wake_payloads(listener: psycopg.Connection[Any], dsn: str) -> list[str]:
    """Payloads received on pgdurable_wake so far: a sentinel NOTIFY sent now
    arrives after every notification committed before it, so what precedes it
    is exactly what was sent (deterministic, no sleeping)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_notify('pgdurable_wake', %s)", (SENTINEL,))
    got: list[str] = []
    for n in listener.notifies(timeout=30):
        if n.payload == SENTINEL:
            return got
        got.append(n.payload)
    raise AssertionError(f"sentinel not received; got {got}")


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pgdurable.runs), (SELECT count(*) FROM pgdurable.signals),"
        " (SELECT count(*) FROM orders)"
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def make_app(dsn: str) -> Durable:
    app = Durable(dsn)

    @app.task("order", revision="7", max_attempts=5)
    async def order(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.wake is None:
            return Wait(("paid", str(state["order"])))
        return Done({"order": state["order"], "payment": ctx.wake.get("payload")})

    return app


@pytest_asyncio.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    async with make_app(dsn) as a:
        yield a


async def parked_run(app: Durable, order: int) -> str:
    run_id = await app.start("order", {"order": order})
    await run_until_idle(app)
    info = await app.get_run(run_id)
    assert (info.status, info.wait_kind, info.wait_ref) == ("waiting", "paid", str(order))
    return run_id


# -- start: sync ------------------------------------------------------------------


def test_sync_session_start_commits_with_the_business_row(
    engine: Engine, conn: psycopg.Connection[Any], listener: psycopg.Connection[Any], dsn: str
) -> None:
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders VALUES (1)"))
        run_id = start_run(session, "order", {"order": 1}, revision="7", queue="default")
        assert counts(conn) == (0, 0, 0)  # not visible before commit
        assert wake_payloads(listener, dsn) == []  # NOTIFY is held until commit
        session.commit()
    assert counts(conn) == (1, 0, 1)
    assert wake_payloads(listener, dsn) == ["default"]
    row = conn.execute(
        "SELECT task, revision, status, state FROM pgdurable.runs WHERE id = %s", (run_id,)
    ).fetchone()
    assert row == ("order", "7", "runnable", {"order": 1})


def test_sync_connection_start_rollback_leaves_nothing(
    engine: Engine, conn: psycopg.Connection[Any], listener: psycopg.Connection[Any], dsn: str
) -> None:
    with engine.connect() as c:
        c.execute(text("INSERT INTO orders VALUES (1)"))
        start_run(c, "order", {"order": 1}, revision="7")
        c.rollback()
    assert counts(conn) == (0, 0, 0)
    assert wake_payloads(listener, dsn) == []
    with engine.begin() as c:  # Connection inside engine.begin(): commits at the end
        start_run(c, "order", {"order": 2}, revision="7", queue="q2")
    assert counts(conn)[0] == 1
    assert wake_payloads(listener, dsn) == ["q2"]


def test_sync_session_begin_block_rolls_back_on_error(
    engine: Engine, conn: psycopg.Connection[Any], listener: psycopg.Connection[Any], dsn: str
) -> None:
    with pytest.raises(RuntimeError, match="boom"), Session(engine) as session, session.begin():
        session.execute(text("INSERT INTO orders VALUES (1)"))
        start_run(session, "order", {"order": 1}, revision="7")
        raise RuntimeError("boom")
    assert counts(conn) == (0, 0, 0)
    assert wake_payloads(listener, dsn) == []


def test_start_options_idempotency_task_object_and_app_registry(
    engine: Engine, conn: psycopg.Connection[Any], dsn: str
) -> None:
    app = make_app(dsn)
    with Session(engine) as session:
        a = start_run(session, app.tasks["order"], {"order": 1}, idempotency_key="k1", priority=5)
        b = start_run(session, "order", {"order": 1}, app=app, idempotency_key="k1")
        c = start_run(session, "order", None, revision="8", max_attempts=2, budget=1.5,
                      queue="other")
        session.commit()
    assert a == b != c
    rows = conn.execute(
        "SELECT id::text, revision, priority, max_attempts, budget, queue, state"
        " FROM pgdurable.runs ORDER BY created_at, revision"
    ).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    assert by_id[a] == ("7", 5, 5, None, "default", {"order": 1})
    assert by_id[c] == ("8", 0, 2, 1.5, "other", {})


async def test_scoped_sessions_use_their_current_session(
    engine: Engine, aengine: AsyncEngine, conn: psycopg.Connection[Any]
) -> None:
    scoped = scoped_session(sessionmaker(engine))
    start_run(scoped, "order", {"order": 1}, revision="7")
    scoped.rollback()
    start_run(scoped, "order", {"order": 2}, revision="7")
    scoped.commit()
    scoped.remove()
    ascoped = async_scoped_session(async_sessionmaker(aengine), scopefunc=asyncio.current_task)
    await start_run(ascoped, "order", {"order": 3}, revision="7")
    await ascoped.commit()
    await ascoped.remove()
    states = [r[0] for r in conn.execute("SELECT state FROM pgdurable.runs ORDER BY created_at")]
    assert sorted(x["order"] for x in states) == [2, 3]


# -- start: async -----------------------------------------------------------------


async def test_async_session_start_commit_and_rollback(
    aengine: AsyncEngine, conn: psycopg.Connection[Any], listener: psycopg.Connection[Any],
    dsn: str,
) -> None:
    async with AsyncSession(aengine) as session:
        await session.execute(text("INSERT INTO orders VALUES (1)"))
        await start_run(session, "order", {"order": 1}, revision="7")
        await session.rollback()
    assert counts(conn) == (0, 0, 0)
    assert wake_payloads(listener, dsn) == []

    async with AsyncSession(aengine) as session, session.begin():
        await session.execute(text("INSERT INTO orders VALUES (2)"))
        run_id = await start_run(session, "order", {"order": 2}, revision="7")
    assert counts(conn) == (1, 0, 1)
    assert wake_payloads(listener, dsn) == ["default"]
    assert conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (run_id,)).fetchone() \
        == ("runnable",)


async def test_async_connection_start_commit_and_rollback(
    aengine: AsyncEngine, conn: psycopg.Connection[Any], listener: psycopg.Connection[Any],
    dsn: str,
) -> None:
    async with aengine.connect() as c:
        await start_run(c, "order", {"order": 1}, revision="7")
        await c.rollback()
        assert counts(conn) == (0, 0, 0)
        await start_run(c, "order", {"order": 2}, revision="7", queue="aq")
        await c.commit()
    assert counts(conn)[0] == 1
    assert wake_payloads(listener, dsn) == ["aq"]


async def test_rolled_back_start_is_never_seen_by_a_listening_worker(
    app: Durable, engine: Engine, aengine: AsyncEngine, conn: psycopg.Connection[Any],
    listener: psycopg.Connection[Any], dsn: str,
) -> None:
    # A real worker, polling only once an hour: it claims on NOTIFY.
    worker = app.worker(queues=["default"], poll_interval=3600)
    running = asyncio.create_task(worker.run())
    try:
        await worker_listening(conn)  # its listener is really listening

        with Session(engine) as session:
            session.execute(text("INSERT INTO orders VALUES (1)"))
            ghost = start_run(session, "order", {"order": 1}, revision="7")
            session.rollback()
        # Nothing was notified, nothing exists, so nothing can have been claimed.
        assert wake_payloads(listener, dsn) == []
        assert counts(conn) == (0, 0, 0)
        with pytest.raises(pgdurable.RunNotFound):
            await app.get_run(ghost)
        assert worker.active_runs == []

        async with AsyncSession(aengine) as asession, asession.begin():
            await asession.execute(text("INSERT INTO orders VALUES (2)"))
            real = await start_run(asession, "order", {"order": 2}, app=app)
        for _ in range(600):  # the NOTIFY of the commit wakes the worker
            info = await app.get_run(real)
            if info.status == "waiting":
                break
            await asyncio.sleep(0.05)
        assert (info.status, info.wait_ref, info.step) == ("waiting", "2", 1)
        assert conn.execute("SELECT array_agg(id::text) FROM pgdurable.runs").fetchone() \
            == ([real],)

        async with AsyncSession(aengine) as asession, asession.begin():
            assert await signal(asession, "paid", "2", {"amount": 10}) == [real]
        for _ in range(600):
            info = await app.get_run(real)
            if info.terminal:
                break
            await asyncio.sleep(0.05)
        assert (info.status, info.result) == (
            "completed", {"order": 2, "payment": {"amount": 10}}
        )
    finally:
        await worker.stop(grace=5)
        await running


# -- signal: sync and async -------------------------------------------------------


async def test_sync_signal_rollback_then_commit(
    app: Durable, engine: Engine, conn: psycopg.Connection[Any],
    listener: psycopg.Connection[Any], dsn: str,
) -> None:
    run_id = await parked_run(app, 5)
    wake_payloads(listener, dsn)  # drop what the setup notified
    with Session(engine) as session:
        assert signal(session, "paid", "5", {"amount": 1}, signal_id="s-1") == [run_id]
        session.rollback()
    assert (await app.get_run(run_id)).status == "waiting"
    assert counts(conn)[1] == 0
    assert wake_payloads(listener, dsn) == []

    with engine.connect() as c:
        assert signal(c, "paid", "5", {"amount": 2}, signal_id="s-1") == [run_id]
        c.commit()
    assert wake_payloads(listener, dsn) == ["default"]
    assert (await app.get_run(run_id)).status == "runnable"
    await run_until_idle(app)
    assert (await app.get_run(run_id)).result == {"order": 5, "payment": {"amount": 2}}
    # the same signal again is ignored; the same id with another payload is refused
    # (the app's semantics, contract S15), translated to SignalConflict
    with Session(engine) as session, session.begin():
        signal(session, "paid", "5", {"amount": 2}, signal_id="s-1")
    assert (await app.get_run(run_id)).status == "completed"  # not woken twice
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders VALUES (5)"))
        with pytest.raises(pgdurable.SignalConflict):
            signal(session, "paid", "5", {"amount": 3}, signal_id="s-1")
        session.rollback()
    assert counts(conn) == (1, 1, 0)


async def test_async_signal_rollback_then_commit(
    app: Durable, aengine: AsyncEngine, conn: psycopg.Connection[Any],
    listener: psycopg.Connection[Any], dsn: str,
) -> None:
    run_id = await parked_run(app, 6)
    wake_payloads(listener, dsn)
    async with aengine.connect() as c:
        assert await signal(c, "paid", "6", {"amount": 1}) == [run_id]
        await c.rollback()
    assert (await app.get_run(run_id)).status == "waiting"
    assert counts(conn)[1] == 0
    assert wake_payloads(listener, dsn) == []

    async with AsyncSession(aengine) as session:
        assert await signal(session, "paid", "6", {"amount": 2}) == [run_id]
        await session.commit()
    assert wake_payloads(listener, dsn) == ["default"]
    await run_until_idle(app)
    assert (await app.get_run(run_id)).result == {"order": 6, "payment": {"amount": 2}}


async def test_signal_run_sync_and_async_rollback_then_commit(
    app: Durable, engine: Engine, aengine: AsyncEngine, conn: psycopg.Connection[Any],
    listener: psycopg.Connection[Any], dsn: str,
) -> None:
    first = await parked_run(app, 11)
    second = await parked_run(app, 12)
    wake_payloads(listener, dsn)
    with Session(engine) as session:
        assert signal_run(session, first, "paid", {"amount": 1}) == [first]
        session.rollback()
    async with AsyncSession(aengine) as asession:
        assert await signal_run(asession, second, "paid", {"amount": 1}) == [second]
        await asession.rollback()
    assert counts(conn)[1] == 0
    assert wake_payloads(listener, dsn) == []
    assert {(await app.get_run(r)).status for r in (first, second)} == {"waiting"}

    with engine.begin() as c:
        assert signal_run(c, first, "paid", {"amount": 5}) == [first]
    async with aengine.begin() as ac:
        assert await signal_run(ac, second, "paid", {"amount": 6}) == [second]
    assert wake_payloads(listener, dsn) == ["default", "default"]
    await run_until_idle(app)
    assert (await app.get_run(first)).result == {"order": 11, "payment": {"amount": 5}}
    assert (await app.get_run(second)).result == {"order": 12, "payment": {"amount": 6}}

    # an unknown run is the app's RunNotFound; the caller rolls back
    with Session(engine) as session:
        with pytest.raises(pgdurable.RunNotFound):
            signal_run(session, "00000000-0000-0000-0000-000000000000", "paid")
        session.rollback()
    with pytest.raises(ValueError, match="run_id"):
        signal_run(Session(engine), "not-a-uuid", "paid")


async def test_signal_before_park_is_kept_on_commit_only(
    app: Durable, engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        assert signal(session, "paid", "9", {"early": True}) == []
        session.rollback()
    assert counts(conn)[1] == 0
    with Session(engine) as session, session.begin():
        assert signal(session, "paid", "9", {"early": True}) == []
    run_id = await app.start("order", {"order": 9})
    await run_until_idle(app)
    assert (await app.get_run(run_id)).result == {"order": 9, "payment": {"early": True}}


# -- bad input ----------------------------------------------------------------------


def _stub_dbapi(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.paramstyle = "format"  # type: ignore[attr-defined]
    module.__version__ = "1.31.2"  # type: ignore[attr-defined]
    return module


def test_bad_targets_raise_before_anything_is_written(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    sqlite = create_engine("sqlite://")
    pg8000 = create_engine("postgresql+pg8000://postgres@127.0.0.1/x", module=_stub_dbapi("pg8000"))
    for bad in (Session(sqlite), Session(pg8000)):
        with pytest.raises(pgdurable.InvalidInput, match="postgresql\\+psycopg"):
            start_run(bad, "order", {}, revision="7")
        with pytest.raises(pgdurable.InvalidInput, match="postgresql\\+psycopg"):
            signal(bad, "paid", "1")
        assert not bad.in_transaction()
    with sqlite.connect() as c, pytest.raises(pgdurable.InvalidInput, match="sqlite"):
        start_run(c, "order", {}, revision="7")
    with pytest.raises(pgdurable.InvalidInput, match="no bind"):
        start_run(Session(), "order", {}, revision="7")
    with pytest.raises(TypeError, match="not an Engine"):
        start_run(engine, "order", {}, revision="7")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="Session, Connection"):
        signal("postgresql://", "paid", "1")  # type: ignore[call-overload]
    assert counts(conn) == (0, 0, 0)


def test_bad_arguments_are_the_apps_errors_and_change_nothing(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        session.execute(text("INSERT INTO orders VALUES (1)"))
        with pytest.raises(pgdurable.UnknownTask, match="revision="):
            start_run(session, "order", {})
        with pytest.raises(ValueError, match=r"(?i)nan"):
            start_run(session, "order", {"x": math.nan}, revision="7")
        with pytest.raises(ValueError, match="task"):
            start_run(session, "", {}, revision="7")
        with pytest.raises(TypeError, match="priority"):
            start_run(session, "order", {}, revision="7", priority="high")  # type: ignore[call-overload]
        with pytest.raises(ValueError, match="max_attempts"):
            start_run(session, "order", {}, revision="7", max_attempts=0)
        with pytest.raises(TypeError, match="app must be"):
            start_run(session, "order", {}, app="app")  # type: ignore[call-overload]
        with pytest.raises(ValueError, match="signal kind"):
            signal(session, "", "1")
        with pytest.raises(TypeError, match="payload"):
            signal(session, "paid", "1", {1, 2})
        with pytest.raises(ValueError, match="payload"):
            signal(session, "paid", "1", "x" * 100, max_payload=10)
        # the caller's transaction is untouched and still usable
        session.execute(text("INSERT INTO orders VALUES (2)"))
        session.commit()
    assert counts(conn) == (0, 0, 2)


def test_database_without_pgdurable_schema_is_refused(empty_dsn: str) -> None:
    e = create_engine(url_from_dsn(empty_dsn))
    try:
        with Session(e) as session:
            session.execute(text("CREATE TABLE orders (id integer)"))
            with pytest.raises(pgdurable.SchemaVersionMismatch, match="migrate"):
                start_run(session, "order", {}, revision="7")
            session.rollback()
        with Session(e) as session:
            with pytest.raises(pgdurable.SchemaVersionMismatch):
                signal(session, "paid", "1")
    finally:
        e.dispose()


def test_importing_pgdurable_does_not_import_sqlalchemy() -> None:
    code = (
        "import sys, pgdurable, pgdurable.contrib, pgdurable.testing\n"
        "assert 'sqlalchemy' not in sys.modules, 'sqlalchemy imported'\n"
        "sys.modules['sqlalchemy'] = None\n"
        "try:\n"
        "    import pgdurable.contrib.sqlalchemy\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'pgdurable[sqlalchemy]'" in out.stdout


# -- Table objects ------------------------------------------------------------------


def _type(sqltype: Any) -> str:
    return str(sqltype.compile(dialect=PGDialect()))  # type: ignore[no-untyped-call]


def drift(insp: Any, table: Table) -> list[str]:
    """Differences between ``table`` and the real relation of the same name."""
    name = table.name
    is_view = name in t.views
    real_names = insp.get_view_names(schema="pgdurable") if is_view else insp.get_table_names(
        schema="pgdurable")
    if name not in real_names:
        return [f"{name} is not a {'view' if is_view else 'table'} in the database"]
    problems: list[str] = []
    real = {c["name"]: c for c in insp.get_columns(name, schema="pgdurable")}
    if list(real) != [c.name for c in table.columns]:
        problems.append(f"{name}: columns {list(real)} != {[c.name for c in table.columns]}")
    for col in table.columns:
        r = real.get(col.name)
        if r is None:
            continue
        where = f"{name}.{col.name}"
        if _type(col.type) != _type(r["type"]):
            problems.append(f"{where}: type {_type(col.type)} != {_type(r['type'])}")
        if is_view:
            continue  # view columns are always reported nullable, without defaults
        if col.nullable != r["nullable"]:
            problems.append(f"{where}: nullable {col.nullable} != {r['nullable']}")
        has_default = (r["default"] is not None or r.get("identity") is not None
                       or r.get("computed") is not None)
        defined = (col.server_default is not None or col.identity is not None
                   or col.computed is not None)
        if defined != has_default:
            problems.append(f"{where}: server default {defined} != {has_default}")
    if is_view:
        return problems
    pk = insp.get_pk_constraint(name, schema="pgdurable")["constrained_columns"]
    if pk != [c.name for c in table.primary_key.columns]:
        problems.append(f"{name}: primary key {pk}")
    real_fks = {
        (tuple(fk["constrained_columns"]), fk["referred_table"], tuple(fk["referred_columns"]))
        for fk in insp.get_foreign_keys(name, schema="pgdurable")
    }
    fks = {
        (tuple(c.name for c in fk.columns), fk.referred_table.name,
         tuple(e.column.name for e in fk.elements))
        for fk in table.foreign_key_constraints
    }
    if fks != real_fks:
        problems.append(f"{name}: foreign keys {fks} != {real_fks}")
    return problems


def test_tables_match_the_migrated_schema(engine: Engine) -> None:
    """Every Table/view defined in tables.py equals the real schema (no drift)."""
    insp = inspect(engine)
    assert t.metadata.schema == "pgdurable"
    defined = {table.name for table in t.metadata.tables.values()}
    assert t.views <= defined
    assert {"runs", "leases", "checkpoints", "signals", "run_events", "effects",
            "active_leases"} <= defined
    real = set(insp.get_table_names(schema="pgdurable")) | set(
        insp.get_view_names(schema="pgdurable"))
    # Not a failure (a new relation may come before its Table), but say so.
    if real - defined:
        print(f"relations without a Table in tables.py: {sorted(real - defined)}")
    for table in t.metadata.tables.values():
        assert table.schema == "pgdurable"
        assert drift(insp, table) == [], (
            f"{table.name}: pgdurable/contrib/sqlalchemy/tables.py must follow the migrations"
        )


def test_drift_check_catches_differences(engine: Engine) -> None:
    """The drift check is not vacuous: wrong definitions are reported."""
    insp = inspect(engine)
    md = MetaData(schema="pgdurable")
    wrong = Table(
        "run_events", md,
        Column("run_id", Text, ForeignKey("pgdurable.runs.id"), primary_key=True),  # type
        Column("seq", BigInteger, primary_key=True),
        Column("event", JSONB),  # nullability
        Column("created_at", TIMESTAMP(timezone=True), nullable=False),  # default missing
        Column("extra", Text),  # no such column
    )
    Table("runs", md, Column("id", UUID, primary_key=True))
    problems = drift(insp, wrong)
    assert any("columns" in p for p in problems)
    assert any("run_events.run_id: type" in p for p in problems)
    assert any("run_events.event: nullable" in p for p in problems)
    assert any("run_events.created_at: server default" in p for p in problems)
    assert drift(insp, Table("nope", md, Column("x", Text))) == [
        "nope is not a table in the database"
    ]


async def test_tables_query_run_state_with_core(
    app: Durable, engine: Engine
) -> None:
    run_id = await parked_run(app, 3)
    with engine.connect() as c:
        rows = c.execute(
            select(t.runs.c.status, func.count()).group_by(t.runs.c.status)
        ).all()
        assert rows == [("waiting", 1)]
        row = c.execute(
            select(t.runs.c.wait_kind, t.runs.c.state, t.checkpoints.c.step)
            .join(t.checkpoints, t.checkpoints.c.run_id == t.runs.c.id)
            .where(t.runs.c.id == run_id)
        ).one()
        assert row == ("paid", {"order": 3}, 1)
        assert c.execute(select(func.count()).select_from(t.active_leases)).scalar() == 0


def test_outbox_example_runs(dsn: str) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "outbox_sqlalchemy.py"
    env = {**os.environ, "PGDURABLE_DSN": dsn}
    out = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "woken: True",
        "result: {'order': 1, 'amount': 42, 'shipped': True}",
        "orders: [(1, True)] runs: 1",
    ]
