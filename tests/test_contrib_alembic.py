"""pgdurable.contrib.alembic in a real Alembic environment, and migrate(in_transaction=True)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

import pgdurable
from pgdurable.contrib.alembic import downgrade, upgrade
from pgdurable.contrib.sqlalchemy import url_from_dsn
from pgdurable.foundation.migrations import MIGRATION_LOCK_KEY, load_migrations, required_version

ALL_VERSIONS = [m.version for m in load_migrations()]

ENV_PY = """
import os

from alembic import context
from sqlalchemy import create_engine

engine = create_engine(os.environ["PGD_ALEMBIC_URL"])
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

APP_REVISION = '''
"""the application's own table"""
from alembic import op

revision = "a1"
down_revision = None


def upgrade() -> None:
    op.execute("CREATE TABLE orders (id integer PRIMARY KEY)")


def downgrade() -> None:
    op.execute("DROP TABLE orders")
'''

PGDURABLE_REVISION = '''
"""pgdurable's schema"""
import os

from alembic import op

from pgdurable.contrib.alembic import downgrade as pgdurable_downgrade
from pgdurable.contrib.alembic import upgrade as pgdurable_upgrade

revision = "a2"
down_revision = "a1"


def upgrade() -> None:
    pgdurable_upgrade(op)
    op.execute("INSERT INTO orders SELECT coalesce(max(id), 0) + 1 FROM orders")
    if os.environ.get("PGD_FAIL_AFTER"):
        raise RuntimeError("revision failed after pgdurable_upgrade")


def downgrade() -> None:
    pgdurable_downgrade(op)  # a no-op: pgdurable migrations are up-only
'''


def make_env(root: Path) -> Path:
    (root / "migrations" / "versions").mkdir(parents=True)
    (root / "alembic.ini").write_text(
        "[alembic]\nscript_location = %(here)s/migrations\n", encoding="utf-8"
    )
    (root / "migrations" / "env.py").write_text(ENV_PY, encoding="utf-8")
    (root / "migrations" / "versions" / "a1_app.py").write_text(APP_REVISION, encoding="utf-8")
    (root / "migrations" / "versions" / "a2_pgdurable.py").write_text(
        PGDURABLE_REVISION, encoding="utf-8"
    )
    return root / "alembic.ini"


def alembic(ini: Path, dsn: str, *args: str, fail_after: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGD_ALEMBIC_URL": url_from_dsn(dsn).render_as_string(hide_password=False)}
    if fail_after:
        env["PGD_FAIL_AFTER"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args],
        cwd=ini.parent, env=env, capture_output=True, text=True, timeout=120,
    )


def state(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as c:
        def one(sql: str) -> Any:
            row = c.execute(sql).fetchone()
            return row[0] if row else None

        out: dict[str, Any] = {
            "pgdurable": one("SELECT to_regclass('pgdurable.schema_migrations') IS NOT NULL"),
            "alembic": one("SELECT to_regclass('public.alembic_version') IS NOT NULL"),
        }
        if out["pgdurable"]:
            out["versions"] = [r[0] for r in c.execute(
                "SELECT version FROM pgdurable.schema_migrations ORDER BY version")]
            out["applied_at"] = one("SELECT max(applied_at) FROM pgdurable.schema_migrations")
        if out["alembic"]:
            out["head"] = one("SELECT version_num FROM alembic_version")
            out["orders"] = one("SELECT count(*) FROM orders")
        return out


def test_alembic_upgrade_applies_pgdurable_then_is_a_no_op(empty_dsn: str, tmp_path: Path) -> None:
    ini = make_env(tmp_path)
    r = alembic(ini, empty_dsn, "upgrade", "head")
    assert r.returncode == 0, r.stderr
    first = state(empty_dsn)
    assert first["versions"] == ALL_VERSIONS and first["head"] == "a2" and first["orders"] == 1
    with psycopg.connect(empty_dsn) as c:
        pgdurable.check_schema(c)  # the library accepts this schema

    r = alembic(ini, empty_dsn, "upgrade", "head")  # again: nothing to do
    assert r.returncode == 0, r.stderr
    assert state(empty_dsn) == first

    # downgrade is a documented no-op for pgdurable's schema
    r = alembic(ini, empty_dsn, "downgrade", "a1")
    assert r.returncode == 0, r.stderr
    after = state(empty_dsn)
    assert after["head"] == "a1" and after["versions"] == ALL_VERSIONS
    assert after["applied_at"] == first["applied_at"]

    # re-running the revision applies nothing new (everything is applied)
    r = alembic(ini, empty_dsn, "upgrade", "head")
    assert r.returncode == 0, r.stderr
    again = state(empty_dsn)
    assert again["head"] == "a2" and again["applied_at"] == first["applied_at"]
    assert again["orders"] == 2


def test_a_failing_revision_rolls_back_pgdurable_too(empty_dsn: str, tmp_path: Path) -> None:
    ini = make_env(tmp_path)
    r = alembic(ini, empty_dsn, "upgrade", "head", fail_after=True)
    assert r.returncode != 0 and "revision failed after pgdurable_upgrade" in r.stderr
    # Alembic ran both revisions in one transaction: nothing of it remains.
    assert state(empty_dsn) == {"pgdurable": False, "alembic": False}
    r = alembic(ini, empty_dsn, "upgrade", "head")
    assert r.returncode == 0, r.stderr
    assert state(empty_dsn)["versions"] == ALL_VERSIONS


def test_alembic_on_a_database_already_migrated_by_pgdurable(dsn: str, tmp_path: Path) -> None:
    before = state(dsn)
    r = alembic(make_env(tmp_path), dsn, "upgrade", "head")
    assert r.returncode == 0, r.stderr
    after = state(dsn)
    assert after["versions"] == ALL_VERSIONS and after["applied_at"] == before["applied_at"]


# -- the helper in-process: inside the caller's transaction -----------------------------


def _lock_free(dsn: str) -> bool:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT pg_try_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,)).fetchone()
        return bool(row and row[0])


def test_upgrade_commits_only_with_the_callers_transaction(empty_dsn: str) -> None:
    engine = create_engine(url_from_dsn(empty_dsn))
    try:
        with engine.connect() as c:
            applied = upgrade(c)
            assert [m.version for m in applied] == ALL_VERSIONS
            assert state(empty_dsn)["pgdurable"] is False  # not committed yet
            assert not _lock_free(empty_dsn)  # the lock is held until the caller ends
            c.rollback()
        assert state(empty_dsn)["pgdurable"] is False
        assert _lock_free(empty_dsn)
        with engine.begin() as c:
            c.execute(text("SELECT 1"))  # the caller's transaction is already open
            assert len(upgrade(c)) == len(ALL_VERSIONS)
        assert state(empty_dsn)["versions"] == ALL_VERSIONS
        with engine.begin() as c:
            assert upgrade(c) == []
            downgrade(c)
        assert state(empty_dsn)["versions"] == ALL_VERSIONS
    finally:
        engine.dispose()


def test_upgrade_rejects_what_it_cannot_run_in(empty_dsn: str) -> None:
    sqlite = create_engine("sqlite://")
    with sqlite.connect() as c, pytest.raises(pgdurable.InvalidInput, match="postgresql\\+psycopg"):
        upgrade(c)
    with pytest.raises(pgdurable.InvalidInput, match="online mode"):
        upgrade(object())

    async def via_async_engine() -> None:
        engine = create_async_engine(url_from_dsn(empty_dsn, async_=True))
        try:
            async with engine.connect() as ac:
                await ac.run_sync(upgrade)
        finally:
            await engine.dispose()

    with pytest.raises(pgdurable.InvalidInput, match="sync engine"):
        asyncio.run(via_async_engine())
    assert state(empty_dsn)["pgdurable"] is False


def test_migrate_in_transaction_bad_input(empty_dsn: str) -> None:
    with pytest.raises(TypeError, match=r"open psycopg\.Connection"):
        pgdurable.migrate(empty_dsn, in_transaction=True)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        with pytest.raises(pgdurable.MigrationError, match="non-autocommit"):
            pgdurable.migrate(c, in_transaction=True)
    with psycopg.connect(empty_dsn) as c:
        with pytest.raises(psycopg.errors.DivisionByZero):
            c.execute("SELECT 1/0")
        with pytest.raises(pgdurable.MigrationError, match="INERROR"):
            pgdurable.migrate(c, in_transaction=True)
    assert state(empty_dsn)["pgdurable"] is False


def test_migrate_in_transaction_failing_file_leaves_the_transaction_usable(
    empty_dsn: str,
) -> None:
    # A conflicting object makes 0001 fail inside its savepoint; the caller's
    # transaction survives (its own write commits) and nothing of pgdurable remains.
    with psycopg.connect(empty_dsn) as c:
        c.execute("CREATE TABLE mine (x int)")
        c.execute("CREATE SCHEMA pgdurable")
        c.execute("CREATE TABLE pgdurable.leases (x int)")
        # (adopt: a pgdurable schema without our version table is refused otherwise)
        with pytest.raises(pgdurable.MigrationError, match="--adopt"):
            pgdurable.migrate(c, in_transaction=True)
        with pytest.raises(pgdurable.MigrationError, match="already exists"):
            pgdurable.migrate(c, in_transaction=True, adopt=True)
        c.execute("INSERT INTO mine VALUES (1)")
        c.commit()
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM mine").fetchone() == (1,)
        assert c.execute("SELECT to_regclass('pgdurable.runs')").fetchone() == (None,)
    assert required_version() == ALL_VERSIONS[-1]



def test_upgrade_and_pgdurable_migrate_share_the_advisory_lock(empty_dsn: str) -> None:
    """An Alembic transaction applying pgdurable holds the runner's lock: a concurrent
    `pgdurable migrate` waits for it, then finds nothing left to apply."""
    engine = create_engine(url_from_dsn(empty_dsn))
    result: dict[str, Any] = {}
    try:
        with engine.connect() as c:
            assert len(upgrade(c)) == len(ALL_VERSIONS)

            def other() -> None:
                result["applied"] = pgdurable.migrate(empty_dsn)

            t = threading.Thread(target=other)
            t.start()
            with psycopg.connect(empty_dsn, autocommit=True) as watch:
                for _ in range(1200):  # until the other migrate waits on the advisory lock
                    row = watch.execute(
                        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                        " WHERE l.locktype = 'advisory' AND NOT l.granted"
                        " AND a.datname = current_database()"
                    ).fetchone()
                    if row and row[0]:
                        break
                    t.join(0.05)
                else:
                    raise AssertionError("the concurrent migrate never waited for the lock")
            assert t.is_alive()
            c.commit()  # Alembic commits: the waiter proceeds
            t.join(60)
        assert result["applied"] == []
        assert state(empty_dsn)["versions"] == ALL_VERSIONS
    finally:
        engine.dispose()
