"""A fresh install and an upgrade from every release give the same schema.

The numbered migrations hold tables, indexes, types and data changes; every
function, trigger function and view has one current body in ``sql/functions/``
or ``sql/views/`` (pgdurable/foundation/migrations.py). A database of any earlier release
(``tests/released_sql/``, whose files still restated the functions they changed)
must upgrade in place to exactly what a fresh install makes: compared with
``pg_dump --schema-only`` (procrastinate's migration test and Absurd's
``validate-psql`` do the same). The daily history partitions are left out:
which days exist depends on the day a database was made, not on its release.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _released import migrate_released, released_files
from psycopg.conninfo import conninfo_to_dict

import pgdurable
from pgdurable.foundation import migrations
from pgdurable.foundation.errors import SchemaVersionMismatch

ROOT = Path(__file__).resolve().parent.parent


def _pg_dump_for(dsn: str) -> str:
    """A pg_dump at least as new as the server (the embedded server's own, else the machine's)."""
    with psycopg.connect(dsn) as c:
        server = c.info.server_version // 10000
    candidates = []
    try:
        import pgserver  # type: ignore[import-not-found]

        candidates.append(Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_dump")
    except ImportError:
        pass
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_dump"), reverse=True)
    if found := shutil.which("pg_dump"):
        candidates.append(Path(found))
    for path in candidates:
        if not path.exists():
            continue
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout
        m = re.search(r"(\d+)\.", out)
        if m and int(m.group(1)) >= server:
            return str(path)
    pytest.fail(f"no pg_dump of version >= {server} on this machine (tried {candidates})")


def _schema(dsn: str) -> str:
    params = conninfo_to_dict(dsn)
    cmd = [_pg_dump_for(dsn), "--schema-only", "--no-owner", "--no-privileges",
           "--schema=pgdurable", "--exclude-table=pgdurable.*_p2[0-9][0-9][0-9][0-9][0-9][0-9][0-9]",
           "-h", str(params.get("host", "")), "-p", str(params.get("port", 5432)),
           "-U", str(params.get("user", "")), "-d", str(params["dbname"])]
    env = {"PATH": "/usr/bin:/bin"}
    if params.get("password"):
        env["PGPASSWORD"] = str(params["password"])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    # pg_dump 17+ prints a random \restrict key per dump; some servers stamp every new
    # column with an attribute option of their own (pg_attver=<a counter>)
    out = re.sub(r"^\\(un)?restrict \S+$", "", out, flags=re.M)
    return re.sub(r"^ALTER TABLE ONLY \S+ ALTER COLUMN \S+ SET \(pg_attver=\d+\);\n", "", out,
                  flags=re.M)


@pytest.fixture(scope="module")
def fresh_schema(pg_server: Any, _supplies: dict[str | None, Any]) -> Iterator[str]:
    """The schema of a fresh install (a database of its own for the module)."""
    name = _supplies[None].take()
    try:
        dsn = pg_server.dsn_for(name)
        pgdurable.migrate(dsn)
        yield _schema(dsn)
    finally:
        _supplies[None].give_back(name)


def test_released_files_are_the_released_ones() -> None:
    files = released_files()
    assert [int(p.name[:4]) for p in files] == sorted(migrations.RELEASED_SHA256)
    names = {m.version: m.name for m in migrations.load_migrations()}
    assert all(names[int(p.name[:4])] == p.name for p in files), "a released file was renamed"


@pytest.mark.slow
@pytest.mark.parametrize("release", range(1, len(released_files()) + 1))
def test_upgrade_from_every_release_equals_a_fresh_install(
    release: int, fresh_schema: str, empty_dsn: str
) -> None:
    dsn = empty_dsn
    migrate_released(dsn, release)
    pgdurable.migrate(dsn)
    upgraded = _schema(dsn)
    assert upgraded == fresh_schema, _first_difference(fresh_schema, upgraded)
    states = {s.migration.version: s.status for s in pgdurable.migration_status(dsn)}
    assert set(states.values()) == {"applied"}, states
    assert pgdurable.migrate(dsn) == []


def _first_difference(a: str, b: str) -> str:
    import difflib

    diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "fresh", "upgraded",
                                     lineterm="", n=2))
    return "\n".join(diff[:60])


def test_every_function_and_view_has_one_current_body(dsn: str) -> None:
    """Each function, trigger function and view of the schema is defined in exactly one
    definitions file, and no numbered migration defines one."""
    defined: dict[str, list[str]] = {}
    for d in migrations.load_definitions():
        for name in re.findall(r"^CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE|VIEW) "
                               r"pgdurable\.([a-z0-9_]+)", d.sql, flags=re.M):
            defined.setdefault(name, []).append(d.path)
    with psycopg.connect(dsn) as c:
        live = {n for (n,) in c.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'pgdurable'::regnamespace"
            " UNION SELECT relname FROM pg_class WHERE relnamespace = 'pgdurable'::regnamespace"
            " AND relkind = 'v'")}
    assert live == set(defined), (sorted(live - set(defined)), sorted(set(defined) - live))
    # an overload is defined once too: one file per name
    assert {n: p for n, p in defined.items() if len(set(p)) > 1} == {}
    for m in migrations.load_migrations():
        found = re.findall(r"^\s*CREATE (?:OR REPLACE )?(?:FUNCTION|PROCEDURE|VIEW|TRIGGER) "
                           r"(pgdurable\.\w+|\w+)", m.sql, flags=re.M | re.I)
        assert not found, f"{m.name} defines {found}: it belongs in sql/functions/ or sql/views/"


def _record(dsn: str, sql: str, params: tuple[object, ...] = ()) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql, params)


def test_a_changed_definition_is_applied_again_and_only_it(empty_dsn: str) -> None:
    pgdurable.migrate(empty_dsn)
    claim = next(d for d in migrations.load_definitions() if d.path == "functions/claim.sql")
    # as if an older library had applied another body of claim_runs
    _record(empty_dsn, "UPDATE pgdurable.schema_definitions SET sha256 = 'older' WHERE path = %s",
            (claim.path,))
    _record(empty_dsn, "COMMENT ON FUNCTION pgdurable.next_wakeup(text[], text[], text[], text) IS 'old'")
    states = {s.definition.path: s.status for s in migrations.definition_status(empty_dsn)}
    assert states[claim.path] == "changed"
    assert {p for p, s in states.items() if s != "applied"} == {claim.path}
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        before = dict(c.execute("SELECT path, applied_at FROM pgdurable.schema_definitions"))
    assert pgdurable.migrate(empty_dsn) == []  # no numbered migration, one definitions file
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        after = dict(c.execute("SELECT path, applied_at FROM pgdurable.schema_definitions"))
        comment = c.execute("SELECT obj_description('pgdurable.next_wakeup(text[], text[], "
                            "text[], text)'::regprocedure)").fetchone()
    assert [p for p in after if after[p] != before[p]] == [claim.path]
    assert comment is not None and comment[0] != "old"
    assert {s.status for s in migrations.definition_status(empty_dsn)} == {"applied"}


def test_check_schema_refuses_a_schema_without_a_definition_and_warns_on_another_body(
        empty_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    pgdurable.migrate(empty_dsn)
    _record(empty_dsn, "UPDATE pgdurable.schema_definitions SET sha256 = 'other'"
                       " WHERE path = 'functions/steps.sql'")
    migrations._warned.discard(psycopg.conninfo.conninfo_to_dict(empty_dsn)["dbname"])
    with psycopg.connect(empty_dsn) as c, caplog.at_level("WARNING", "pgdurable.migrations"):
        pgdurable.check_schema(c)
    assert "functions/steps.sql differ" in caplog.text
    _record(empty_dsn, "DELETE FROM pgdurable.schema_definitions WHERE path = 'views/runs.sql'")
    with psycopg.connect(empty_dsn) as c, pytest.raises(SchemaVersionMismatch, match="views/runs"):
        pgdurable.check_schema(c)


def test_a_release_before_definitions_is_refused_until_migrated(empty_dsn: str) -> None:
    migrate_released(empty_dsn, len(released_files()))
    with psycopg.connect(empty_dsn) as c, pytest.raises(SchemaVersionMismatch, match="migrate"):
        pgdurable.check_schema(c)


def test_one_failing_file_applies_nothing(empty_dsn: str) -> None:
    """An upgrade is one transaction: a numbered migration that fails leaves the
    release's schema as it was, its views and functions included."""
    migrate_released(empty_dsn, 21)
    before = _schema(empty_dsn)
    # a table in the way of 0022 (partitioned signals) makes it fail
    _record(empty_dsn, "CREATE TABLE pgdurable.signal_history (x int)")
    with pytest.raises(pgdurable.MigrationError, match="signal_history"):
        pgdurable.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("DROP TABLE pgdurable.signal_history")
        assert c.execute("SELECT max(version) FROM pgdurable.schema_migrations").fetchone() == (21,)
        assert c.execute("SELECT to_regclass('pgdurable.schema_definitions')").fetchone() == (None,)
    assert _schema(empty_dsn) == before


def test_check_schema_of_a_role_that_may_read_only_the_version(dsn: str) -> None:
    """A role granted SELECT on schema_migrations alone (as before definitions existed)
    is judged by the version: its check neither fails on schema_definitions nor skips
    the version."""
    import os
    import uuid

    from psycopg import sql
    from psycopg.conninfo import make_conninfo

    role = f"pgd_version_only_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        c.execute(sql.SQL("GRANT USAGE ON SCHEMA pgdurable TO {0}; GRANT SELECT ON "
                          "pgdurable.schema_migrations TO {0}").format(sql.Identifier(role)))
    try:
        with psycopg.connect(make_conninfo(dsn, user=role)) as c:
            pgdurable.check_schema(c)
        _record(dsn, "DELETE FROM pgdurable.schema_migrations WHERE version = %s",
                (migrations.required_version(),))
        with psycopg.connect(make_conninfo(dsn, user=role)) as c, \
                pytest.raises(SchemaVersionMismatch):
            pgdurable.check_schema(c)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(sql.Identifier(role)))


def test_no_definitions_file_restates_a_function(dsn: str) -> None:
    """Each function has one body: a file creates a name no more often than the
    schema has overloads of it (two bodies of one signature would both be applied,
    the later silently winning)."""
    with psycopg.connect(dsn) as c:
        overloads = dict(c.execute(
            "SELECT proname, count(*) FROM pg_proc WHERE pronamespace = "
            "'pgdurable'::regnamespace GROUP BY 1").fetchall())
    restated = {}
    for d in migrations.load_definitions():
        names = re.findall(r"^CREATE (?:OR REPLACE )?FUNCTION pgdurable\.([a-z0-9_]+)\(",
                           d.sql, flags=re.M)
        for name in set(names):
            if names.count(name) > overloads.get(name, 0):
                restated[f"{d.path}: {name}"] = names.count(name)
    assert restated == {}
