"""Schema migrations: numbered SQL files for tables, and one current body per function.

The ``sql/`` folder, shipped inside the wheel (``pgdurable/sql``, loaded with
``importlib.resources``), holds two kinds of file:

* **numbered migrations** ``sql/NNNN_snake_name.sql``, numbered 0001, 0002,
  ... without gaps: tables, indexes, types, data changes and the DROPs of
  objects that are gone. Applied once each, in order; an applied file is never
  edited (its sha256 is recorded; an edit is :class:`MigrationError`).
* **definitions** ``sql/functions/<noun>.sql`` and ``sql/views/<noun>.sql``:
  the one current body of every function, trigger function (with its
  triggers) and view, in a file named for its noun. Applied whenever their
  sha256 differs from the one recorded in ``pgdurable.schema_definitions``
  (Flyway's "repeatable" migrations). A definition changes in place; a
  signature change is a new name (a rolling deploy's older workers keep
  calling the old one until a numbered migration drops it).

One ``migrate`` is ONE transaction under ``pg_advisory_xact_lock`` (or the
caller's, ``in_transaction=True``): it re-reads what is applied (another
process may have migrated meanwhile), then applies, in this order:

1. changed definitions marked ``-- pgdurable:before-migrations`` (the pure
   functions that tables' defaults and CHECKs call: ``now()``, the row checks);
2. when a numbered migration is pending or a view changed: drops the views of
   ``sql/views/`` (they are derived; they come back in step 5);
3. the pending numbered migrations, each recorded with its sha256;
4. the other changed function files (``SET LOCAL check_function_bodies = off``,
   as ``pg_dump`` restores, so that their order does not matter);
5. the view files;
6. ``pgdurable.secure_schema()``: pins ``search_path``, SECURITY DEFINER and
   the grants of the role model on every function (docs/security.md).

Everything commits together or not at all: a failing file leaves the schema
as it was. Databases migrated before definitions existed (whose numbered
files then also held function bodies) are accepted: their recorded sha256 is
one of :data:`RELEASED_SHA256` and is updated to the current file's in the
upgrade's transaction (tests/test_schema_upgrade.py upgrades a database from
every released version and compares it with a fresh one with ``pg_dump``).

The library refuses to work on a schema older than it ships
(:class:`SchemaVersionMismatch`): :func:`check_schema`, which also refuses a
``schema_migrations`` that is not pgdurable's (see ``schema_trust``). An
existing ``pgdurable`` schema is migrated only if it is ours (owned by the
migrating role or its owner role, our version table, no planted triggers or
rules, recorded names that match the shipped files); ``adopt=True`` overrides.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from . import schema_trust as _schema_trust
from .db import connect, validate_dsn
from .errors import DatabaseUnavailable, MigrationError, SchemaVersionMismatch, first_line
from .queries import migrations as mq
from .queries.core import first, first_sync, many, many_sync, one_sync
from .queries.migrations import (
    AppliedDefinition,
    AppliedMigration,
    RecordedDefinition,
    RecordedName,
    SchemaState,
)
from .retry import for_seconds, retry_while, retry_while_sync
from .schemas import DEFAULT as DEFAULT_SCHEMA
from .schemas import resolve_schema, schema_of, use_schema

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = [
    "Definition",
    "DefinitionState",
    "Migration",
    "MigrationState",
    "check_schema",
    "acheck_schema",
    "definition_status",
    "load_definitions",
    "load_migrations",
    "migrate",
    "migration_status",
    "required_version",
]

log = logging.getLogger("pgdurable.migrations")

# Advisory lock key shared by every migrating process ("pgdurab" in ASCII).
MIGRATION_LOCK_KEY = 0x70676475726162

_NAME = re.compile(r"^(\d{4})_([a-z0-9]+(?:_[a-z0-9]+)*)\.sql$")
_DEFINITION_NAME = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*\.sql$")
_BEFORE = re.compile(r"^-- pgdurable:before-migrations\b", re.M)
_VIEW = re.compile(r"^CREATE VIEW pgdurable\.([a-z0-9_]+)", re.M)

#: The sha256 of each numbered migration as it was released before the
#: definitions moved out of them (tests/released_sql/ holds those files). A
#: database that recorded one of these is upgraded in place, and its record
#: takes the current file's sha256.
RELEASED_SHA256: dict[int, str] = {
    1: "67ed4fc11de45ba1940296f57dbd2b212cc81a926c89c225346b3c951db6b119",
    2: "75c580d926b5c5a3c7441d61f75c552de1f1574a6db1ba0107efe948451866d7",
    3: "c832e75a07ea9d07409440bda9dedc7582512de83826c2c3bc10f8bc6f79f4f1",
    4: "c65b6656435391850aae6f94ac706d79cd02304bb06bc3840cfd1351dcab3b6e",
    5: "1d636b2ff2ee9e6023c5282e498159755b8efc8d565ac37759ece7e720bea88a",
    6: "f870932dd37f0f84473fe309090e30077a6c80c624dbd253d1533f3472c1abfd",
    7: "4f1b4853502e78b530035ef1138ec956ad29344a47d02a225215e569ef5d9042",
    8: "b7bb8813fd37eb00ad3106e0580256d07229b3f7e7fce38443cb57a79de5b905",
    9: "fb4d640a67cc8bccdb79e3fac85fadb686d9aedaa6deef3ad737941523080e21",
    10: "f6954bbdb71c2635c4f5ebd7522a23befe115c3cea6329be9fce4498b06099ce",
    11: "dd06ef4ccdc665a908d8387b9d93539a6ade635e4d488857b3b9bcefdebd1806",
    12: "20eb1b472e5d1fe36551bf1d1c021dbc073d004ea8e7eaeafb2096bf60a340a5",
    13: "b41580cfe1426e53e928dc32a50e6e937a1470ec710f8a30d317c63bcbc2e8ae",
    14: "307bfdf38a4e6e4dc90038dda1f09fa86011739ea393dcdf85f4a5625db53536",
    15: "c1b254ffd17ce87596d92290e4e4ff9309ccc36360fa579b8fa3a728db2dce58",
    16: "10ae57915f49d8709b3d7409f041a97591e36305b4bcb794916c83f727bbece3",
    17: "23a6225895f7cf9fb322c4f243e65ab0abd8cfbe4d114f04c48917fb3b877f72",
    18: "543d5c76ab5accfc3c51b020426d801272b277fc52c15aae721ae4631fe49bb7",
    19: "4a4b5c408e447a761317ff257882daea8789dc1a8d8e7ce44bb91bfb0365d9b6",
    20: "6b7d1b3f0670d124b2aa5bac3ac908eb9c2256a391205db804963132eb215daf",
    21: "aca664db75a546bc0a61e5b2e97e89a8bae9cb41dc1d764666f0bfa83f1d1b6e",
    22: "1abb188e5d2bc44a8f864907b11440cbf1bb9e71a8cadcf53200e8630c91f56f",
    23: "2b6d09c56e28e935ad2caf1a21693b7b50a1db32b37cec2f4c5ff6f61110e585",
    24: "7b05b7b00ca9aa760fc66affb2b82e9c80ca6bf5dac6f8dbb4ddb474ab8ca3d0",
    25: "45c56d9df9edbcb8692b95d355cfdc03f2cfc80e83c68332535a05c688457192",
    26: "6dc4a6fb2eb9c304ed0f4a397e2150b64f33542f2716db21850a1342c76bfe77",
    27: "daacb20a9a4af01e50b23de8d18611ff9497b7995e638fa2ef83e76044387046",
    28: "0f507a219536e9f42f187fcd5f901668c52a1253145e34ab314de48d80fd6ce9",
}

# The statements of migrate and check_schema: pgdurable.foundation.queries.migrations.


@dataclass(frozen=True)
class Migration:
    """One numbered migration file: its number, file name, SQL text and sha256."""

    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Definition:
    """One definitions file: ``functions/<noun>.sql`` or ``views/<noun>.sql``."""

    path: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def kind(self) -> Literal["functions", "views"]:
        return "views" if self.path.startswith("views/") else "functions"

    @property
    def before(self) -> bool:
        """Applied before the numbered migrations (tables' defaults and CHECKs call it)."""
        return bool(_BEFORE.search(self.sql))

    @property
    def views(self) -> list[str]:
        """The names of the views it creates."""
        return _VIEW.findall(self.sql)


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


@dataclass(frozen=True)
class DefinitionState:
    """A definitions file and its state in one database: applied, pending or changed
    (applied with another sha256: ``pgdurable migrate`` applies this one)."""

    definition: Definition
    applied_at: datetime | None
    changed: bool

    @property
    def status(self) -> str:
        if self.applied_at is None:
            return "pending"
        return "changed" if self.changed else "applied"


def _sql_dir() -> Any:
    packaged = resources.files("pgdurable").joinpath("sql")
    if packaged.is_dir():
        return packaged
    # Running from a source checkout (editable install): the repository's sql/.
    return Path(__file__).resolve().parents[2] / "sql"


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
    """All numbered migrations shipped with this package, in order."""
    folder = _sql_dir()
    names = [p.name for p in folder.iterdir() if p.name.endswith(".sql")]
    return tuple(
        Migration(version, name, folder.joinpath(name).read_text(encoding="utf-8"))
        for version, name in parse_migration_names(names)
    )


@cache
def load_definitions() -> tuple[Definition, ...]:
    """All definitions files shipped with this package: functions, then views, by name."""
    out: list[Definition] = []
    for kind in ("functions", "views"):
        folder = _sql_dir().joinpath(kind)
        for name in sorted(p.name for p in folder.iterdir()):
            if not _DEFINITION_NAME.match(name):
                raise MigrationError(f"bad definitions file name {kind}/{name!r}: "
                                     "expected snake_name.sql")
            out.append(Definition(f"{kind}/{name}", folder.joinpath(name).read_text(encoding="utf-8")))
    return tuple(out)


def required_version() -> int:
    """The schema version this library needs (its highest migration)."""
    return load_migrations()[-1].version


ConnOrDsn = str | psycopg.Connection[Any]


@contextmanager
def _open(target: ConnOrDsn, schema: str | None) -> Iterator[psycopg.Connection[Any]]:
    """A connection to ``schema`` (else ``PGDURABLE_SCHEMA``, else ``pgdurable``): ``target``'s
    own, closed after, or the caller's, whose cursors are its own again after."""
    in_schema = resolve_schema(schema)
    if isinstance(target, psycopg.Connection):
        if target.closed:
            raise DatabaseUnavailable("the connection is closed")
        if schema_of(target) == in_schema:  # it speaks it already (its cursors stay)
            yield target
            return
        saved = target.cursor_factory, target.server_cursor_factory
        use_schema(target, in_schema)
        try:
            yield target
        finally:
            target.cursor_factory, target.server_cursor_factory = saved
        return
    if isinstance(target, str):
        with connect(validate_dsn(target), schema=in_schema) as conn:
            yield conn
        return
    raise TypeError(
        f"migrate() takes a conninfo string or a psycopg.Connection, not {type(target).__name__}"
    )


def _known(version: int, sha256: str, current: str) -> bool:
    """Whether a recorded sha256 is the file's: the current one or the one it was released as."""
    return sha256 in (current, RELEASED_SHA256.get(version))


def _drift(applied: dict[int, AppliedMigration], migrations: Sequence[Migration]) -> None:
    for m in migrations:
        done = applied.get(m.version)
        if done is not None and not _known(m.version, done.sha256, m.sha256):
            raise MigrationError(
                f"migration {done.name} was edited after it was applied (sha256 differs); "
                "applied migrations are never edited: add a new one. Nothing was applied."
            )


def _shipped_names() -> dict[int, str]:
    return {m.version: m.name for m in load_migrations()}


def _read_applied(cur: psycopg.Cursor[Any], adopt: bool = False) -> dict[int, AppliedMigration]:
    if not adopt and not _schema_trust.check_adoptable(cur, _shipped_names()):
        return {}
    if not first_sync(cur, mq.HAS_TABLE):
        return {}
    return {a.version: a for a in many_sync(cur, mq.APPLIED)}


def _read_definitions(cur: psycopg.Cursor[Any]) -> dict[str, AppliedDefinition]:
    if not first_sync(cur, mq.HAS_DEFINITIONS):
        return {}
    return {d.path: d for d in many_sync(cur, mq.DEFINITIONS_APPLIED)}


@dataclass(frozen=True)
class _Plan:
    """What one migrate applies, judged under the lock."""

    pending: list[Migration]
    changed: list[Definition]
    rerecord: list[Migration]  # applied as released: only their sha256 is recorded anew

    def __bool__(self) -> bool:
        return bool(self.pending or self.changed or self.rerecord)

    @property
    def views_stale(self) -> bool:
        return bool(self.pending) or any(d.kind == "views" for d in self.changed)


def _plan(cur: psycopg.Cursor[Any], adopt: bool) -> _Plan:
    migrations = load_migrations()
    applied = _read_applied(cur, adopt)
    _drift(applied, migrations)
    done = _read_definitions(cur)
    return _Plan(
        pending=[m for m in migrations if m.version not in applied],
        changed=[d for d in load_definitions()
                 if (done[d.path].sha256 if d.path in done else "") != d.sha256],
        rerecord=[m for m in migrations
                  if m.version in applied and applied[m.version].sha256 != m.sha256],
    )


def _apply(cur: psycopg.Cursor[Any], plan: _Plan) -> None:
    """Apply ``plan`` in the current transaction (the order of the module docstring)."""
    definitions = load_definitions()
    cur.execute(mq.BOOTSTRAP_DEFINITIONS)
    for d in plan.changed:
        if d.before:
            cur.execute(d.sql.encode())
    views = [v for d in definitions if d.kind == "views" for v in d.views]
    if plan.views_stale:
        existing = many_sync(cur, mq.EXISTING_VIEWS, (views,))
        if existing:
            cur.execute(mq.DROP_VIEWS.format(", ".join(existing)).encode())
    for m in plan.pending:
        cur.execute(m.sql.encode())
        cur.execute(mq.RECORD, (m.version, m.name, m.sha256))
    for m in plan.rerecord:
        cur.execute(mq.RECORD, (m.version, m.name, m.sha256))
    cur.execute(mq.CHECK_BODIES_OFF)
    for d in plan.changed:
        if d.kind == "functions" and not d.before:
            cur.execute(d.sql.encode())
    cur.execute(mq.CHECK_BODIES_ON)
    for d in definitions:
        if d.kind == "views" and (plan.views_stale or d in plan.changed):
            cur.execute(d.sql.encode())
            cur.execute(mq.RECORD_DEFINITION, (d.path, d.sha256))
    for d in plan.changed:
        if d.kind == "functions":
            cur.execute(mq.RECORD_DEFINITION, (d.path, d.sha256))
    one_sync(cur, mq.SECURE)


def migrate(
    target: ConnOrDsn,
    *,
    dry_run: bool = False,
    on_apply: Callable[[Migration], None] | None = None,
    in_transaction: bool = False,
    adopt: bool = False,
    schema: str | None = None,
) -> list[Migration]:
    """Apply pending migrations and changed definitions in one transaction; return
    the numbered migrations applied (or, with ``dry_run``, pending).

    ``target`` is a conninfo string or an open :class:`psycopg.Connection` (used
    as is and left open; it must not be inside a transaction). Safe to run from
    many processes at once: each file is applied exactly once. ``on_apply`` is
    called for each numbered migration applied, after the commit.

    ``in_transaction=True`` (e.g. from an Alembic revision) works inside the
    caller's transaction on a non-autocommit connection and never commits:
    the advisory lock is taken first and held until the caller's transaction
    ends, and everything commits (or rolls back) with the caller's transaction.

    An existing ``pgdurable`` schema that is not ours (another owner, a
    foreign ``schema_migrations``, planted triggers or rules, other migration
    names) raises :class:`MigrationError` before anything runs;
    ``adopt=True`` takes it over anyway (``pgdurable migrate --adopt``).

    ``schema`` (else ``PGDURABLE_SCHEMA``, else ``pgdurable``) is the schema migrated:
    each app or tenant of a database can have its own (:mod:`pgdurable.foundation.schemas`).
    """
    if in_transaction and not isinstance(target, psycopg.Connection):
        raise TypeError("migrate(in_transaction=True) needs an open psycopg.Connection")
    with _open(target, schema) as conn:
        return _migrate(conn, dry_run, on_apply, in_transaction, adopt)


def _migrate(conn: psycopg.Connection[Any], dry_run: bool,
             on_apply: Callable[[Migration], None] | None, in_transaction: bool,
             adopt: bool) -> list[Migration]:
    if in_transaction and not dry_run:
        _enter_caller_transaction(conn)
    try:
        if dry_run:
            with conn.cursor() as cur:
                return _plan(cur, adopt).pending
        with conn.transaction(), conn.cursor() as cur:
            one_sync(cur, mq.LOCK, (MIGRATION_LOCK_KEY,))
            if adopt:
                exists = bool(first_sync(cur, mq.HAS_SCHEMA))
            else:
                # judged from the catalogs before anything of the schema runs
                exists = _schema_trust.check_adoptable(cur, _shipped_names(), _has_work)
            if not exists:
                cur.execute(mq.CREATE_SCHEMA)
            if not first_sync(cur, mq.HAS_TABLE):
                cur.execute(mq.BOOTSTRAP)
            plan = _plan(cur, adopt=True)
            if plan:
                _apply(cur, plan)
        for m in plan.pending:
            if on_apply is not None:
                on_apply(m)
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
    return plan.pending


def _has_work(cur: psycopg.Cursor[Any]) -> bool:
    """Whether a migrate would change anything (asked of a schema of another owner,
    whose ``schema_migrations`` was judged a plain table of pgdurable's)."""
    return bool(_plan(cur, adopt=True))


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
        # so the transaction() block of migrate becomes a savepoint.
        one_sync(conn, mq.LOCK, (MIGRATION_LOCK_KEY,))
    except psycopg.Error as exc:
        raise MigrationError(f"cannot take the migration lock: {first_line(str(exc))}") from exc


def migration_status(target: ConnOrDsn, *, schema: str | None = None) -> list[MigrationState]:
    """Every shipped numbered migration with its state in the database (in ``schema``,
    else ``PGDURABLE_SCHEMA``, else ``pgdurable``)."""
    applied: dict[int, AppliedMigration] = {}
    try:
        with _open(target, schema) as conn, conn.cursor() as cur:
            if (_schema_trust.check_adoptable(cur, _shipped_names())
                    and first_sync(cur, mq.HAS_TABLE)):
                applied = {a.version: a for a in many_sync(cur, mq.APPLIED)}
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"database went away: {first_line(str(exc))}") from None
    except psycopg.Error as exc:
        raise MigrationError(f"cannot read the migration status: {first_line(str(exc))}") from exc
    out = []
    for m in load_migrations():
        hit = applied.get(m.version)
        if hit is None:
            out.append(MigrationState(m, None, False))
        else:
            out.append(MigrationState(m, hit.applied_at,
                                      not _known(m.version, hit.sha256, m.sha256)))
    return out


def definition_status(target: ConnOrDsn, *, adopt: bool = False,
                      schema: str | None = None) -> list[DefinitionState]:
    """Every shipped definitions file with its state in the database (``adopt``: read
    them from a schema that does not look like ours, as ``migrate(adopt=True)`` would;
    ``schema``: as :func:`migrate`'s)."""
    with _open(target, schema) as conn, conn.cursor() as cur:
        trusted = adopt or _schema_trust.check_adoptable(cur, _shipped_names())
        done = _read_definitions(cur) if trusted else {}
    return [DefinitionState(d, done[d.path].applied_at if d.path in done else None,
                            d.path in done and done[d.path].sha256 != d.sha256)
            for d in load_definitions()]


def _judge(version: int | None, dbname: str, schema: str = DEFAULT_SCHEMA) -> None:
    need = required_version()
    if version is None:
        if schema != DEFAULT_SCHEMA:
            raise SchemaVersionMismatch(
                f"database {dbname!r} has no pgdurable schema {schema!r}; run "
                f"`pgdurable --schema {schema} migrate`")
        raise SchemaVersionMismatch(
            f"database {dbname!r} has no pgdurable schema; run `pgdurable migrate`"
        )
    if version < need:
        raise SchemaVersionMismatch(
            f"database {dbname!r} has pgdurable schema version {version}, this library "
            f"needs {need}; run `pgdurable migrate`"
        )


def _trusted_version(
    state: SchemaState | None, names: Sequence[RecordedName] | None, dbname: str
) -> int | None:
    """The schema version, None when there is no schema, or SchemaVersionMismatch
    when ``schema_migrations`` is not pgdurable's (never trust a foreign one)."""
    if state is None or not state.exists or _schema_trust.is_no_table(state.table):
        return None
    problem = _schema_trust.table_problem(state)
    if problem is None and names is not None:
        problem = _schema_trust.names_problem({n.version: n.name for n in names},
                                              _shipped_names())
    if problem is not None:
        raise SchemaVersionMismatch(
            f"database {dbname!r}: the pgdurable schema's version cannot be trusted: {problem}"
        )
    return max((n.version for n in names or ()), default=0)


def _needs_names(state: SchemaState | None) -> bool:
    return bool(state and state.exists and state.table is None)


_warned: set[str] = set()


def _judge_definitions(recorded: Sequence[RecordedDefinition] | None, dbname: str) -> None:
    """A shipped definitions file never applied means an older schema (raise); one
    applied with another sha256 is an older or a newer library's (say so, once).
    ``None``: this role may not read them (a role granted only the version table)."""
    if recorded is None:
        return
    done = {r.path: r.sha256 for r in recorded}
    missing = [d.path for d in load_definitions() if d.path not in done]
    if missing:
        raise SchemaVersionMismatch(
            f"database {dbname!r} lacks the pgdurable definitions {', '.join(missing[:3])}"
            f"{' and more' if len(missing) > 3 else ''}; run `pgdurable migrate`")
    changed = [d.path for d in load_definitions() if done[d.path] != d.sha256]
    if changed and dbname not in _warned:
        _warned.add(dbname)
        log.warning("database %r: %s differ from this library's (an older or newer pgdurable "
                    "migrated it; `pgdurable migrate` applies this one's)", dbname,
                    ", ".join(changed))


# async-to-sync: source (aname -> name)
async def acheck_schema(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise :class:`SchemaVersionMismatch` unless the schema is new enough (and ours)."""
    state = await first(conn, mq.SCHEMA_STATE)
    names = await many(conn, mq.NAMES) if _needs_names(state) else None
    _judge(_trusted_version(state, names, conn.info.dbname), conn.info.dbname,
           schema_of(conn))
    access = await first(conn, mq.DEFINITIONS_ACCESS) or "absent"
    recorded = (await many(conn, mq.DEFINED) if access == "readable"
                else [] if access == "absent" else None)
    _judge_definitions(recorded, conn.info.dbname)


async def acheck_pool_schema(pool: AsyncConnectionPool[Any], within: float) -> None:
    """:func:`check_schema` on a connection of ``pool``.

    A connection lost during the check (a restart of the server or of a pooler
    just as the pool opened) is discarded by the pool, and the check is asked
    again on another connection, with a short backoff, for up to ``within``
    seconds; so is the check after another transient error (``retry.is_transient``:
    a statement timeout, a lack of resources). Any other error, a version
    mismatch included, is raised at once.
    """
    deadline = for_seconds(within)

    async def check() -> None:
        async with pool.connection(timeout=deadline.left()) as conn:
            await acheck_schema(conn)

    await retry_while(check, deadline)
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Raise :class:`SchemaVersionMismatch` unless the schema is new enough (and ours)."""
    state = first_sync(conn, mq.SCHEMA_STATE)
    names = many_sync(conn, mq.NAMES) if _needs_names(state) else None
    _judge(_trusted_version(state, names, conn.info.dbname), conn.info.dbname,
           schema_of(conn))
    access = first_sync(conn, mq.DEFINITIONS_ACCESS) or "absent"
    recorded = (many_sync(conn, mq.DEFINED) if access == "readable"
                else [] if access == "absent" else None)
    _judge_definitions(recorded, conn.info.dbname)


def check_pool_schema(pool: ConnectionPool[Any], within: float) -> None:
    """:func:`check_schema` on a connection of ``pool``.

    A connection lost during the check (a restart of the server or of a pooler
    just as the pool opened) is discarded by the pool, and the check is asked
    again on another connection, with a short backoff, for up to ``within``
    seconds; so is the check after another transient error (``retry.is_transient``:
    a statement timeout, a lack of resources). Any other error, a version
    mismatch included, is raised at once.
    """
    deadline = for_seconds(within)

    def check() -> None:
        with pool.connection(timeout=deadline.left()) as conn:
            check_schema(conn)

    retry_while_sync(check, deadline)
# async-to-sync: end


def pending_sql(migrations: Sequence[Migration], definitions: Sequence[Definition] = ()) -> str:
    """The SQL a dry run prints: each pending file under a header comment."""
    return ("".join(f"-- {m.name}\n{m.sql}\n" for m in migrations)
            + "".join(f"-- {d.path}\n{d.sql}\n" for d in definitions))
