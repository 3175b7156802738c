"""Schema migrations: numbered SQL files shipped inside the package.

Contract:

* Files are ``sql/NNNN_snake_name.sql``, numbered 0001, 0002, ... without gaps.
  They ship inside the wheel (``pgdurable/sql``) and load via ``importlib.resources``.
* Each pending file is applied in its own transaction that first takes
  ``pg_advisory_xact_lock``, then re-reads what is applied (another process may
  have applied it meanwhile), then executes the file and records version, name
  and sha256 in ``pgdurable.schema_migrations`` -- all in that one transaction.
* An applied file whose checksum changed raises :class:`MigrationError` naming
  the file, before anything is applied.
* The library refuses to work on a schema older than it ships
  (:class:`SchemaVersionMismatch`): :func:`check_schema`, which also refuses a
  ``schema_migrations`` that is not pgdurable's (see ``_schema_trust``).
* An existing ``pgdurable`` schema is migrated only if it is ours (owned by the
  migrating role or its owner role, our version table, no planted triggers or
  rules, recorded names that match the shipped files); ``adopt=True`` overrides.
* After applying anything, ``pgdurable.secure_schema()`` (0009) re-pins
  ``search_path``, SECURITY DEFINER and grants on every function, so functions
  added by later migrations follow the role model (docs/security.md).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from . import _schema_trust
from ._db import connect, validate_dsn
from ._retry import for_seconds, retry_while, retry_while_sync
from .errors import DatabaseUnavailable, MigrationError, SchemaVersionMismatch, first_line

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = [
    "Migration",
    "MigrationState",
    "check_schema",
    "acheck_schema",
    "load_migrations",
    "migrate",
    "migration_status",
    "required_version",
]

# Advisory lock key shared by every migrating process ("pgdurab" in ASCII).
MIGRATION_LOCK_KEY = 0x70676475726162

_NAME = re.compile(r"^(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)*)\.sql$")

# -- first install only (an existing schema is judged by _schema_trust first)
_CREATE_SCHEMA = "CREATE SCHEMA pgdurable"
_HAS_SCHEMA = "SELECT to_regnamespace('pgdurable') IS NOT NULL"
_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS pgdurable.schema_migrations (
  version    integer     PRIMARY KEY,
  name       text        NOT NULL,
  sha256     text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgdurable.schema_migrations IS
  'Applied pgdurable migrations (pgdurable migrate): one row per sql/NNNN_name.sql file.';
COMMENT ON COLUMN pgdurable.schema_migrations.version IS 'Migration number (NNNN).';
COMMENT ON COLUMN pgdurable.schema_migrations.name IS 'File name of the migration.';
COMMENT ON COLUMN pgdurable.schema_migrations.sha256 IS 'sha256 of the file as applied; an edit is detected.';
COMMENT ON COLUMN pgdurable.schema_migrations.applied_at IS 'When it was applied.';
"""

# -- applied migrations, or none if the table does not exist yet
_APPLIED = """
SELECT version, name, sha256, applied_at FROM pgdurable.schema_migrations ORDER BY version
"""
# -- does the migrations table exist?
_HAS_TABLE = "SELECT to_regclass('pgdurable.schema_migrations') IS NOT NULL"


@dataclass(frozen=True)
class Migration:
    """One migration file: its number, file name, SQL text and sha256."""

    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class MigrationState:
    """A migration and its state in one database: applied, pending or drifted."""

    migration: Migration
    applied_at: datetime | None
    drifted: bool

    @property
    def status(self) -> str:
        if self.drifted:
            return "drifted"
        return "applied" if self.applied_at else "pending"


def _sql_dir() -> Any:
    packaged = resources.files("pgdurable").joinpath("sql")
    if packaged.is_dir():
        return packaged
    # Running from a source checkout (editable install): the repository's sql/.
    return Path(__file__).resolve().parent.parent / "sql"


def parse_migration_names(names: Sequence[str]) -> list[tuple[int, str]]:
    """Validate migration file names; return ``(version, name)`` in order.

    Names must match ``NNNN_snake_name.sql`` and number 1..N without gaps or
    duplicates. Anything else is a :class:`MigrationError`.
    """
    parsed: list[tuple[int, str]] = []
    for name in names:
        m = _NAME.match(name)
        if not m:
            raise MigrationError(
                f"bad migration file name {name!r}: expected NNNN_snake_name.sql"
            )
        parsed.append((int(m.group(1)), name))
    parsed.sort()
    for expected, (version, name) in enumerate(parsed, start=1):
        if version != expected:
            raise MigrationError(
                f"migration numbering broken at {name!r}: expected {expected:04d}"
            )
    return parsed


@cache
def load_migrations() -> tuple[Migration, ...]:
    """All migrations shipped with this package, in order."""
    folder = _sql_dir()
    names = [p.name for p in folder.iterdir() if p.name.endswith(".sql")]
    return tuple(
        Migration(version, name, folder.joinpath(name).read_text(encoding="utf-8"))
        for version, name in parse_migration_names(names)
    )


def required_version() -> int:
    """The schema version this library needs (its highest migration)."""
    return load_migrations()[-1].version


ConnOrDsn = str | psycopg.Connection[Any]


def _open(target: ConnOrDsn) -> tuple[psycopg.Connection[Any], bool]:
    if isinstance(target, psycopg.Connection):
        if target.closed:
            raise DatabaseUnavailable("the connection is closed")
        return target, False
    if isinstance(target, str):
        return connect(validate_dsn(target)), True
    raise TypeError(
        f"migrate() takes a conninfo string or a psycopg.Connection, not {type(target).__name__}"
    )


def _drift(applied: dict[int, tuple[str, str]], migrations: Sequence[Migration]) -> None:
    for m in migrations:
        row = applied.get(m.version)
        if row is not None and row[1] != m.sha256:
            raise MigrationError(
                f"migration {row[0]} was edited after it was applied (sha256 differs); "
                "applied migrations are never edited: add a new one. Nothing was applied."
            )


def _shipped_names() -> dict[int, str]:
    return {m.version: m.name for m in load_migrations()}


# -- does pgdurable.secure_schema() (0009) exist yet?
_HAS_SECURE = "SELECT to_regprocedure('pgdurable.secure_schema()') IS NOT NULL"


def _read_applied(cur: psycopg.Cursor[Any], adopt: bool = False) -> dict[int, tuple[str, str]]:
    if not adopt and not _schema_trust.check_adoptable(cur, _shipped_names()):
        return {}
    cur.execute(_HAS_TABLE)
    row = cur.fetchone()
    if not row or not row[0]:
        return {}
    cur.execute(_APPLIED)
    return {v: (n, s) for v, n, s, _ in cur.fetchall()}


def migrate(
    target: ConnOrDsn,
    *,
    dry_run: bool = False,
    on_apply: Callable[[Migration], None] | None = None,
    in_transaction: bool = False,
    adopt: bool = False,
) -> list[Migration]:
    """Apply pending migrations; return those applied (or, with ``dry_run``, pending).

    ``target`` is a conninfo string or an open :class:`psycopg.Connection` (used
    as is and left open; it must not be inside a transaction). Safe to run from
    many processes at once: each file is applied exactly once.

    ``in_transaction=True`` (e.g. from an Alembic revision) works inside the
    caller's transaction on a non-autocommit connection and never commits:
    the advisory lock is taken first and held until the caller's transaction
    ends, each file runs in a savepoint, and everything commits (or rolls
    back) with the caller's transaction.

    An existing ``pgdurable`` schema that is not ours (another owner, a
    foreign ``schema_migrations``, planted triggers or rules, other migration
    names) raises :class:`MigrationError` before anything runs;
    ``adopt=True`` takes it over anyway (``pgdurable migrate --adopt``).
    """
    migrations = load_migrations()
    if in_transaction and not isinstance(target, psycopg.Connection):
        raise TypeError("migrate(in_transaction=True) needs an open psycopg.Connection")
    conn, owned = _open(target)
    applied_now: list[Migration] = []
    if in_transaction and not dry_run:
        _enter_caller_transaction(conn)
    try:
        if dry_run:
            with conn.cursor() as cur:
                applied = _read_applied(cur, adopt)
            _drift(applied, migrations)
            return [m for m in migrations if m.version not in applied]
        for m in migrations:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
                if adopt:
                    cur.execute(_HAS_SCHEMA)
                    exists = bool((cur.fetchone() or (False,))[0])
                else:
                    # judged from the catalogs before anything of the schema runs
                    exists = _schema_trust.check_adoptable(cur, _shipped_names())
                if not exists:
                    cur.execute(_CREATE_SCHEMA)
                cur.execute(_HAS_TABLE)
                if not (cur.fetchone() or (False,))[0]:
                    cur.execute(_BOOTSTRAP)
                applied = _read_applied(cur, adopt=True)
                _drift(applied, migrations)
                if m.version in applied:
                    continue
                cur.execute(m.sql.encode())
                cur.execute(
                    "INSERT INTO pgdurable.schema_migrations (version, name, sha256)"
                    " VALUES (%s, %s, %s)",
                    (m.version, m.name, m.sha256),
                )
            applied_now.append(m)
            if on_apply is not None:
                on_apply(m)
        if applied_now:
            _secure(conn)
    except psycopg.errors.InsufficientPrivilege as exc:
        who = conn.info.user if not conn.closed else "this role"
        raise MigrationError(
            f"permission denied: role {who!r} cannot create the pgdurable schema "
            f"({first_line(exc.diag.message_primary or str(exc))}); "
            "grant CREATE on the database or migrate as its owner"
        ) from None
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database went away: {first_line(str(exc))}") from None
    except psycopg.Error as exc:
        raise MigrationError(
            f"migration failed: {first_line(str(exc))}"
        ) from exc
    finally:
        if owned:
            conn.close()
    return applied_now


def _secure(conn: psycopg.Connection[Any]) -> None:
    """Re-apply the function rules of 0009 to every function (later migrations' too)."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        cur.execute(_HAS_SECURE)
        row = cur.fetchone()
        if row and row[0]:
            cur.execute("SELECT pgdurable.secure_schema()")


def _enter_caller_transaction(conn: psycopg.Connection[Any]) -> None:
    """Join the caller's transaction (opening it if idle) under the migration lock."""
    status = conn.info.transaction_status
    if conn.autocommit:
        raise MigrationError(
            "migrate(in_transaction=True) needs a non-autocommit connection "
            "(its transaction is the caller's)"
        )
    if status not in (psycopg.pq.TransactionStatus.IDLE, psycopg.pq.TransactionStatus.INTRANS):
        raise MigrationError(
            f"migrate(in_transaction=True): the caller's transaction is {status.name}; nothing applied"
        )
    try:
        # Opens the caller's transaction if it was idle; the lock lasts until it ends,
        # so the per-file transaction() blocks below become savepoints.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
    except psycopg.Error as exc:
        raise MigrationError(f"cannot take the migration lock: {first_line(str(exc))}") from exc


def migration_status(target: ConnOrDsn) -> list[MigrationState]:
    """Every shipped migration with its state in the database."""
    conn, owned = _open(target)
    try:
        with conn.cursor() as cur:
            rows: dict[int, tuple[str, datetime]] = {}
            if _schema_trust.check_adoptable(cur, _shipped_names()):
                cur.execute(_HAS_TABLE)
                row = cur.fetchone()
            else:
                row = None
            if row and row[0]:
                cur.execute(_APPLIED)
                rows = {v: (s, at) for v, _n, s, at in cur.fetchall()}
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database went away: {first_line(str(exc))}") from None
    except psycopg.Error as exc:
        raise MigrationError(f"cannot read the migration status: {first_line(str(exc))}") from exc
    finally:
        if owned:
            conn.close()
    out = []
    for m in load_migrations():
        hit = rows.get(m.version)
        if hit is None:
            out.append(MigrationState(m, None, False))
        else:
            out.append(MigrationState(m, hit[1], hit[0] != m.sha256))
    return out


def _judge(version: int | None, dbname: str) -> None:
    need = required_version()
    if version is None:
        raise SchemaVersionMismatch(
            f"database {dbname!r} has no pgdurable schema; run `pgdurable migrate`"
        )
    if version < need:
        raise SchemaVersionMismatch(
            f"database {dbname!r} has pgdurable schema version {version}, this library "
            f"needs {need}; run `pgdurable migrate`"
        )


# -- every recorded (version, name) of a trusted schema_migrations
_NAMES = "SELECT version, name FROM pgdurable.schema_migrations"


def _trusted_version(
    state: Sequence[Any] | None, names: Sequence[tuple[int, str]] | None, dbname: str
) -> int | None:
    """The schema version, None when there is no schema, or SchemaVersionMismatch
    when ``schema_migrations`` is not pgdurable's (never trust a foreign one)."""
    if state is None or not state[0] or state[3] == _schema_trust.NO_TABLE:
        return None
    problem = _schema_trust.table_problem(state)
    if problem is None and names is not None:
        problem = _schema_trust.names_problem(dict(names), _shipped_names())
    if problem is not None:
        raise SchemaVersionMismatch(
            f"database {dbname!r}: the pgdurable schema's version cannot be trusted: {problem}"
        )
    return max((v for v, _ in names or ()), default=0)


def _needs_names(state: Sequence[Any] | None) -> bool:
    return bool(state and state[0] and state[3] is None)


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`SchemaVersionMismatch` unless the schema is new enough (and ours)."""
    state = conn.execute(_schema_trust.SCHEMA_STATE).fetchone()
    names = conn.execute(_NAMES).fetchall() if _needs_names(state) else None
    _judge(_trusted_version(state, names, conn.info.dbname), conn.info.dbname)


async def acheck_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Async twin of :func:`check_schema` (same queries, same judgement)."""
    state = await (await conn.execute(_schema_trust.SCHEMA_STATE)).fetchone()
    names = await (await conn.execute(_NAMES)).fetchall() if _needs_names(state) else None
    _judge(_trusted_version(state, names, conn.info.dbname), conn.info.dbname)


def check_pool_schema(pool: ConnectionPool[Any], within: float) -> None:
    """:func:`check_schema` on a connection of ``pool``.

    A connection lost during the check (a restart of the server or of a pooler
    just as the pool opened) is discarded by the pool, and the check is asked
    again on another connection, with a short backoff, for up to ``within``
    seconds; so is the check after another transient error (``_retry.is_transient``:
    a statement timeout, a lack of resources). Any other error, a version
    mismatch included, is raised at once.
    """
    deadline = for_seconds(within)

    def check() -> None:
        with pool.connection(timeout=deadline.left()) as conn:
            check_schema(conn)

    retry_while_sync(check, deadline)


async def acheck_pool_schema(pool: AsyncConnectionPool[Any], within: float) -> None:
    """Async twin of :func:`check_pool_schema`."""
    deadline = for_seconds(within)

    async def check() -> None:
        async with pool.connection(timeout=deadline.left()) as conn:
            await acheck_schema(conn)

    await retry_while(check, deadline)


def pending_sql(migrations: Sequence[Migration]) -> str:
    """The SQL a dry run prints: each pending file under a header comment."""
    return "".join(f"-- {m.name}\n{m.sql}\n" for m in migrations)
