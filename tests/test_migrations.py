"""Migrations: idempotence, concurrency, drift, naming, schema checks, bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import pgdurable
from pgdurable.foundation import migrations
from pgdurable.foundation.errors import MigrationError, SchemaVersionMismatch

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pgdurable"]


def applied(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as c:
        return [
            (v, n)
            for v, n in c.execute(
                "SELECT version, name FROM pgdurable.schema_migrations ORDER BY version"
            )
        ]


def test_migrate_applies_everything_then_nothing(empty_dsn: str) -> None:
    first = pgdurable.migrate(empty_dsn)
    assert [m.version for m in first] == [m.version for m in migrations.load_migrations()]
    assert pgdurable.migrate(empty_dsn) == []
    assert [v for v, _ in applied(empty_dsn)] == [m.version for m in first]


def test_migrate_accepts_an_open_connection_and_leaves_it_open(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert pgdurable.migrate(c)
        assert not c.closed
        pgdurable.check_schema(c)


def test_checksum_drift_is_detected_and_nothing_applied(empty_dsn: str) -> None:
    pgdurable.migrate(empty_dsn)
    first = migrations.load_migrations()[0]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("UPDATE pgdurable.schema_migrations SET sha256 = 'x' WHERE version = 1")
        last = migrations.required_version()
        if last > 1:
            # Pretend the newest migration is still pending: drift must stop it too.
            c.execute("DELETE FROM pgdurable.schema_migrations WHERE version = %s", (last,))
    with pytest.raises(MigrationError, match=first.name):
        pgdurable.migrate(empty_dsn)
    if last > 1:
        assert last not in [v for v, _ in applied(empty_dsn)]
    states = {s.migration.version: s.status for s in pgdurable.migration_status(empty_dsn)}
    assert states[1] == "drifted"


def test_cli_status_reports_drift_with_exit_1(empty_dsn: str) -> None:
    pgdurable.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("UPDATE pgdurable.schema_migrations SET sha256 = 'x' WHERE version = 1")
    r = subprocess.run([*CLI, "migrate", "--status", "--dsn", empty_dsn], capture_output=True, text=True)
    assert r.returncode == 1
    assert "drifted" in r.stdout


def test_migration_names_are_enforced() -> None:
    folder = ROOT / "sql"
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert all(n.endswith(".sql") for n in names), "sql/ holds only .sql migrations"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["functions", "views"]
    for kind in ("functions", "views"):
        inside = sorted(p.name for p in (folder / kind).iterdir())
        assert inside and all(re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*\.sql", n) for n in inside), inside
    parsed = migrations.parse_migration_names(names)
    assert [v for v, _ in parsed] == list(range(1, len(names) + 1))
    for bad in (["1_x.sql"], ["0001_CamelCase.sql"], ["0001_a.sql", "0003_b.sql"],
                ["0001_a.sql", "0001_b.sql"], ["0001_a-b.sql"], ["0002_a.sql"]):
        with pytest.raises(MigrationError):
            migrations.parse_migration_names(bad)


def test_every_table_and_column_is_commented(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        missing = c.execute(
            """
            SELECT c.relname || coalesce('.' || a.attname, '')
            FROM pg_class c
            JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'pgdurable'
            LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
            WHERE c.relkind IN ('r', 'v')
              AND ((a.attname IS NULL AND obj_description(c.oid, 'pg_class') IS NULL)
                   OR (a.attname IS NOT NULL AND col_description(c.oid, a.attnum) IS NULL))
            """
        ).fetchall()
    assert missing == []


def test_check_schema_refuses_missing_and_old_schemas(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        with pytest.raises(SchemaVersionMismatch, match="pgdurable migrate"):
            pgdurable.check_schema(c)
        pgdurable.migrate(c)
        pgdurable.check_schema(c)
        c.execute(
            "DELETE FROM pgdurable.schema_migrations WHERE version = %s",
            (migrations.required_version(),),
        )
        with pytest.raises(SchemaVersionMismatch, match="pgdurable migrate"):
            pgdurable.check_schema(c)


async def test_async_check_schema(empty_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(empty_dsn) as c:
        with pytest.raises(SchemaVersionMismatch):
            await migrations.acheck_schema(c)
    pgdurable.migrate(empty_dsn)
    async with await psycopg.AsyncConnection.connect(empty_dsn) as c:
        await migrations.acheck_schema(c)


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.slow
def test_eight_concurrent_migrate_processes(empty_dsn: str) -> None:
    procs = [
        subprocess.Popen([*CLI, "migrate", "--dsn", empty_dsn],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(code == 0 for code, _ in results), results
    rows = applied(empty_dsn)
    assert [v for v, _ in rows] == [m.version for m in migrations.load_migrations()]


def test_cli_dry_run_prints_sql_and_applies_nothing(empty_dsn: str) -> None:
    r = _run_cli("migrate", "--dry-run", "--dsn", empty_dsn)
    assert r.returncode == 0, r.stderr
    assert "-- 0001_schema.sql" in r.stdout and "CREATE TABLE pgdurable.runs" in r.stdout
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT to_regnamespace('pgdurable')").fetchone() == (None,)


def test_cli_takes_dsn_from_environment(empty_dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PGDURABLE_DSN", "DATABASE_URL")}
    r = _run_cli("migrate", env={**env, "DATABASE_URL": empty_dsn})
    assert r.returncode == 0, r.stderr
    r = _run_cli("migrate", env={**env, "PGDURABLE_DSN": empty_dsn, "DATABASE_URL": "mysql://x"})
    assert r.returncode == 0 and "up to date" in r.stdout, r.stderr
    r = _run_cli("migrate", "--status", env={**env, "PGDURABLE_DSN": empty_dsn})
    assert r.returncode == 0 and "applied" in r.stdout
    r = _run_cli("migrate", env=env)
    assert r.returncode == 2 and "no database given" in r.stderr


def _one_line_exit_2(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def test_bad_input_nonexistent_database(pg_server: Any) -> None:
    r = _run_cli("migrate", "--dsn", pg_server.dsn_for("pgd_does_not_exist"))
    _one_line_exit_2(r, "pgd_does_not_exist", "does not exist")


def test_bad_input_wrong_port(pg_server: Any) -> None:
    r = _run_cli("migrate", "--dsn", f"postgresql://postgres@127.0.0.1:1/{pg_server.user}")
    _one_line_exit_2(r, "nothing answers at 127.0.0.1:1 (connection refused)")


def test_bad_input_not_a_postgres_dsn() -> None:
    _one_line_exit_2(_run_cli("migrate", "--dsn", "mysql://root@127.0.0.1/test"), "not a PostgreSQL URL")
    _one_line_exit_2(_run_cli("migrate", "--dsn", "this is not a dsn"), "does not parse")


def test_bad_input_role_without_create_rights(empty_dsn: str, pg_server: Any) -> None:
    role = f"pgd_nocreate_{os.getpid()}"
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(f"DROP ROLE IF EXISTS {role}")
        c.execute(f"CREATE ROLE {role} LOGIN")
        c.execute(f"REVOKE CREATE ON DATABASE {c.info.dbname} FROM PUBLIC")
    try:
        r = _run_cli("migrate", "--dsn", make_conninfo(empty_dsn, user=role))
        _one_line_exit_2(r, "permission denied", role)
        with psycopg.connect(empty_dsn) as c:
            assert c.execute("SELECT to_regnamespace('pgdurable')").fetchone() == (None,)
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as c:
            c.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(pg_server.dsn, autocommit=True) as c:
            c.execute(f"DROP ROLE IF EXISTS {role}")


def test_migrate_rejects_wrong_types_and_closed_connections(empty_dsn: str) -> None:
    with pytest.raises(TypeError):
        pgdurable.migrate(42)  # type: ignore[arg-type]
    c = psycopg.connect(empty_dsn, autocommit=True)
    c.close()
    with pytest.raises(pgdurable.DatabaseUnavailable):
        pgdurable.migrate(c)
    with pytest.raises(pgdurable.InvalidInput):
        pgdurable.migrate("")
