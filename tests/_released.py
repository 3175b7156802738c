"""Databases as a released pgdurable left them, to upgrade with today's ``migrate``.

``tests/released_sql/`` holds the numbered migrations 0001-0028 exactly as they
were released, when each file still restated the functions it changed (their
sha256 are ``pgdurable.migrations.RELEASED_SHA256``). :func:`migrate_released`
applies the first ``upto`` of them the way the ``migrate`` of those releases
did: each file in its own transaction under the migration lock, recorded with
its version, name and sha256, then ``secure_schema()``. What it leaves is what
an installation of that release has; ``pgdurable.migrate`` then upgrades it in
place (tests/test_schema_upgrade.py, and the tests of a migration that moves
data: they build the schema before it, add rows, and upgrade).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import psycopg

from pgdurable.foundation.migrations import MIGRATION_LOCK_KEY, RELEASED_SHA256

RELEASED = Path(__file__).resolve().parent / "released_sql"

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


def released_files() -> list[Path]:
    """The released migration files, in order."""
    return sorted(RELEASED.glob("[0-9][0-9][0-9][0-9]_*.sql"))


def migrate_released(target: str | psycopg.Connection[object], upto: int) -> None:
    """Apply released migrations 0001..``upto`` as their release's ``migrate`` did."""
    conn = psycopg.connect(target, autocommit=True) if isinstance(target, str) else target
    try:
        for path in released_files()[:upto]:
            text = path.read_text(encoding="utf-8")
            version = int(path.name[:4])
            sha = hashlib.sha256(text.encode()).hexdigest()
            assert RELEASED_SHA256[version] == sha, f"{path.name} is not the released file"
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
                cur.execute("CREATE SCHEMA IF NOT EXISTS pgdurable")
                cur.execute(_BOOTSTRAP)
                if cur.execute("SELECT 1 FROM pgdurable.schema_migrations WHERE version = %s",
                               (version,)).fetchone():
                    continue
                cur.execute(text.encode())
                cur.execute("INSERT INTO pgdurable.schema_migrations (version, name, sha256)"
                            " VALUES (%s, %s, %s)", (version, path.name, sha))
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            if cur.execute("SELECT to_regprocedure('pgdurable.secure_schema()') IS NOT NULL"
                           ).fetchone() == (True,):
                cur.execute("SELECT pgdurable.secure_schema()")
    finally:
        if isinstance(target, str):
            conn.close()
