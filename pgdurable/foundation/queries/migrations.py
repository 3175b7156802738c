"""Migrations and the schema's trust (:mod:`pgdurable.foundation.migrations`,
:mod:`pgdurable.foundation.schema_trust`): what ``migrate`` and ``check_schema`` ask of
the catalogs and of ``schema_migrations`` / ``schema_definitions``, and what they run.

Commands (DDL, the records' upserts) answer no rows: they are plain SQL text, run with
``cur.execute``; everything that answers is a :class:`~.core.Query`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .core import Query, Row, record, scalar, statement

__all__ = ["APPLIED", "BOOTSTRAP", "BOOTSTRAP_DEFINITIONS", "CHECK_BODIES_OFF", "CHECK_BODIES_ON",
           "CREATE_SCHEMA", "DEFINED", "DEFINITIONS_ACCESS", "DEFINITIONS_APPLIED", "DROP_VIEWS",
           "EXISTING_VIEWS", "HAS_DEFINITIONS", "HAS_SCHEMA", "HAS_TABLE", "LOCK", "NAMES",
           "OWNER_SWITCH", "RECORD", "RECORD_DEFINITION", "SCHEMA_STATE", "SECURE",
           "AppliedDefinition", "AppliedMigration", "OwnerRow", "RecordedDefinition",
           "RecordedName", "SchemaState"]


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Schema ``pgdurable`` as the catalogs show it (:data:`SCHEMA_STATE`)."""

    exists: bool | None
    #: owned by current_user or a role it is a member of (no superuser bypass)
    mine: bool | None
    owner: str | None
    #: what is wrong with ``schema_migrations`` (None: a plain table of the owner's)
    table: str | None
    #: triggers a stranger may have planted, rules (None: none)
    triggers: str | None
    rules: str | None


@dataclass(frozen=True, slots=True)
class OwnerRow:
    """The schema owner (:data:`OWNER_SWITCH`) and whether this session must become it."""

    role: str
    can_login: bool
    switch: bool


@dataclass(frozen=True, slots=True)
class AppliedMigration:
    """One row of ``schema_migrations``."""

    version: int
    name: str
    sha256: str
    applied_at: datetime


@dataclass(frozen=True, slots=True)
class AppliedDefinition:
    """One row of ``schema_definitions``."""

    path: str
    sha256: str
    applied_at: datetime


@dataclass(frozen=True, slots=True)
class RecordedName:
    """A recorded migration's number and file name."""

    version: int
    name: str


@dataclass(frozen=True, slots=True)
class RecordedDefinition:
    """A recorded definitions file and the sha256 it was applied with."""

    path: str
    sha256: str


def _owner_row(r: Row) -> OwnerRow:
    role, can_login, switch = r
    return OwnerRow(str(role), bool(can_login), bool(switch))


# -- the migrations' lock (transaction-scoped: PgBouncer-safe), key MIGRATION_LOCK_KEY
LOCK = statement("SELECT pg_advisory_xact_lock(%s)")
# -- does schema pgdurable exist?
HAS_SCHEMA = scalar("SELECT to_regnamespace('pgdurable') IS NOT NULL", bool)
# -- does the migrations table exist?
HAS_TABLE = scalar("SELECT to_regclass('pgdurable.schema_migrations') IS NOT NULL", bool)
# -- does the definitions table exist?
HAS_DEFINITIONS = scalar("SELECT to_regclass('pgdurable.schema_definitions') IS NOT NULL", bool)
# -- applied migrations in order (only once the table exists and is trusted)
APPLIED = record("""
SELECT version, name, sha256, applied_at FROM pgdurable.schema_migrations ORDER BY version
""", AppliedMigration)
# -- applied definitions
DEFINITIONS_APPLIED = record(
    "SELECT path, sha256, applied_at FROM pgdurable.schema_definitions", AppliedDefinition)
# -- the views of the definitions that exist now (dropped before the numbered migrations);
# -- one qualified name per row
EXISTING_VIEWS = scalar("""
SELECT c.oid::regclass::text FROM pg_catalog.pg_class c
 WHERE c.relnamespace = 'pgdurable'::regnamespace AND c.relkind = 'v'
   AND c.relname = ANY (%s)
""", str)
# -- the last step (0009's secure_schema exists from the first migrate on)
SECURE = statement("SELECT pgdurable.secure_schema()")
# -- every recorded (version, name) of a trusted schema_migrations
NAMES = record("SELECT version, name FROM pgdurable.schema_migrations", RecordedName)
# -- can this role read the recorded definitions? (absent | readable | unreadable)
DEFINITIONS_ACCESS = scalar("""
SELECT CASE WHEN to_regclass('pgdurable.schema_definitions') IS NULL THEN 'absent'
            WHEN has_table_privilege(to_regclass('pgdurable.schema_definitions'), 'SELECT')
            THEN 'readable' ELSE 'unreadable' END
""", str)
# -- the recorded definitions (asked where DEFINITIONS_ACCESS says readable)
DEFINED = record("SELECT path, sha256 FROM pgdurable.schema_definitions", RecordedDefinition)

# -- the schema's state: one SchemaState (exists, owned by current_user or a role it is
# -- a member of (pg_auth_members, no superuser bypass), owner name, schema_migrations
# -- problem or NULL, planted triggers, rules)
SCHEMA_STATE = record("""
WITH RECURSIVE mine(oid) AS (
  SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user
  UNION
  SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN mine ON m.member = mine.oid
), n AS (
  SELECT oid, nspowner FROM pg_catalog.pg_namespace WHERE nspname = 'pgdurable'
)
SELECT n.oid IS NOT NULL,
       n.nspowner IN (SELECT oid FROM mine),
       (SELECT rolname FROM pg_catalog.pg_roles WHERE oid = n.nspowner)::text,
       (SELECT CASE
          WHEN c.oid IS NULL THEN 'it has no pgdurable.schema_migrations table'
          WHEN c.relkind <> 'r' THEN 'pgdurable.schema_migrations is not an ordinary table'
          WHEN c.relowner <> n.nspowner THEN 'pgdurable.schema_migrations has another owner than the schema'
        END
          FROM (SELECT 1) one
          LEFT JOIN pg_catalog.pg_class c
            ON c.relnamespace = n.oid AND c.relname = 'schema_migrations'),
       (SELECT string_agg(format('%s on %s', t.tgname, t.tgrelid::regclass), ', ')
          FROM pg_catalog.pg_trigger t
          JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
          JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
         WHERE c.relnamespace = n.oid AND NOT t.tgisinternal
           AND (p.pronamespace <> n.oid OR p.proowner <> n.nspowner
                OR c.relname = 'schema_migrations')),
       (SELECT string_agg(format('%s on %s', r.rulename, r.ev_class::regclass), ', ')
          FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_class c ON c.oid = r.ev_class
         WHERE c.relnamespace = n.oid AND r.rulename <> '_RETURN')
  FROM (SELECT 1) one LEFT JOIN n ON true
""", SchemaState)

# -- whose code a session would run: one OwnerRow (the schema owner's name, whether it
# -- may log in, and whether this session is a superuser that is neither that owner nor a
# -- member of it while the owner is no superuser: then the owner's functions, which it
# -- may have changed, would run with superuser rights); no row when there is no schema
OWNER_SWITCH: Query[OwnerRow] = Query("""
WITH RECURSIVE mine(oid) AS (
  SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user
  UNION
  SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN mine ON m.member = mine.oid
)
SELECT o.rolname::text, o.rolcanlogin,
       me.rolsuper AND NOT o.rolsuper AND o.oid NOT IN (SELECT oid FROM mine)
  FROM pg_catalog.pg_namespace n
  JOIN pg_catalog.pg_roles o ON o.oid = n.nspowner
  JOIN pg_catalog.pg_roles me ON me.rolname = current_user
 WHERE n.nspname = 'pgdurable'
""", _owner_row)

# -- commands (no rows) ----------------------------------------------------------------
# -- first install only (an existing schema is judged by schema_trust first)
CREATE_SCHEMA = "CREATE SCHEMA pgdurable"
BOOTSTRAP = """
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
# -- the definitions' record (also added to schemas migrated before it existed)
BOOTSTRAP_DEFINITIONS = """
CREATE TABLE IF NOT EXISTS pgdurable.schema_definitions (
  path       text        PRIMARY KEY,
  sha256     text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgdurable.schema_definitions IS
  'Applied pgdurable definitions (pgdurable migrate): one row per sql/functions/ or sql/views/ '
  'file, re-applied whenever its sha256 changes.';
COMMENT ON COLUMN pgdurable.schema_definitions.path IS 'functions/<noun>.sql or views/<noun>.sql.';
COMMENT ON COLUMN pgdurable.schema_definitions.sha256 IS 'sha256 of the file as last applied.';
COMMENT ON COLUMN pgdurable.schema_definitions.applied_at IS 'When it was last applied.';
"""
# -- record a numbered migration / a definition
RECORD = ("INSERT INTO pgdurable.schema_migrations (version, name, sha256) VALUES (%s, %s, %s)"
          " ON CONFLICT (version) DO UPDATE SET sha256 = excluded.sha256")
# -- record a definition file's sha256, applied now (excluded.applied_at: the column's
# -- default, not a call in DO UPDATE, which Citus refuses in a cell); answers nothing
RECORD_DEFINITION = (
    "INSERT INTO pgdurable.schema_definitions (path, sha256) VALUES (%s, %s)"
    " ON CONFLICT (path) DO UPDATE SET sha256 = excluded.sha256,"
    " applied_at = excluded.applied_at")
# -- drop these views (their qualified names, from EXISTING_VIEWS: catalog names only)
DROP_VIEWS = "DROP VIEW {}"
# -- functions are created before the views they may name: bodies checked when called
CHECK_BODIES_OFF = "SET LOCAL check_function_bodies = off"
CHECK_BODIES_ON = "RESET check_function_bodies"
