"""Apply pgdurable's migrations from inside an Alembic revision.

Create one revision (``alembic revision -m "pgdurable"``) and call the helper::

    from alembic import op
    from pgdurable.contrib.alembic import upgrade as pgdurable_upgrade

    def upgrade() -> None:
        pgdurable_upgrade(op)

    def downgrade() -> None:
        pass  # pgdurable migrations are up-only: downgrading is not supported

Contract:

* It runs pgdurable's own runner (:func:`pgdurable.migrate` with
  ``in_transaction=True``) on the psycopg connection under Alembic's
  ``op.get_bind()``, inside Alembic's transaction: the migration advisory lock
  is taken first and held until Alembic commits; each pending file is applied
  in a savepoint and recorded in ``pgdurable.schema_migrations``. Nothing is
  committed here: Alembic commits the revision and pgdurable's schema
  together, or rolls both back. Concurrent ``pgdurable migrate`` runs and
  other Alembic runs wait for the lock; each file is applied exactly once.
* It applies whatever is pending, so running it again is a no-op. When a new
  pgdurable release ships new migrations, add another Alembic revision that
  calls :func:`upgrade` again (or run ``pgdurable migrate``).
* :func:`downgrade` is a documented no-op: pgdurable migrations are up-only.
* Needs a sync ``postgresql+psycopg`` engine in ``env.py``; an async engine,
  another driver or Alembic's offline (``--sql``) mode raise
  :class:`~pgdurable.InvalidInput` before anything runs (for offline SQL use
  ``pgdurable migrate --dry-run``).
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..foundation.errors import InvalidInput
from ..foundation.migrations import Migration, migrate

__all__ = ["downgrade", "upgrade"]


def _psycopg_connection(op_or_bind: Any) -> psycopg.Connection[Any]:
    try:
        from sqlalchemy.engine import Connection
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError(
            "pgdurable.contrib.alembic needs SQLAlchemy and Alembic: "
            "pip install 'pgdurable[sqlalchemy]'"
        ) from exc
    bind = op_or_bind.get_bind() if hasattr(op_or_bind, "get_bind") else op_or_bind
    if not isinstance(bind, Connection):
        raise InvalidInput(
            "pgdurable.contrib.alembic.upgrade needs a live connection (Alembic online mode); "
            f"got {type(bind).__name__}. For offline SQL run `pgdurable migrate --dry-run`."
        )
    dialect = bind.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise InvalidInput(
            "pgdurable.contrib.alembic.upgrade needs the postgresql+psycopg dialect; "
            f"env.py uses {dialect.name}+{dialect.driver}. Nothing was applied."
        )
    raw = bind.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidInput(
            "pgdurable.contrib.alembic.upgrade needs a sync engine (postgresql+psycopg); "
            f"the driver connection is {type(raw).__name__}. Nothing was applied."
        )
    if not bind.in_transaction():
        bind.begin()  # Alembic normally runs revisions inside its own transaction
    return raw


def upgrade(op: Any) -> list[Migration]:
    """Apply pgdurable's pending migrations inside Alembic's transaction.

    ``op`` is ``alembic.op`` (or a SQLAlchemy ``Connection``). Returns the
    migrations applied (empty when the schema was already current).
    """
    return migrate(_psycopg_connection(op), in_transaction=True)


def downgrade(op: Any) -> None:
    """Do nothing: pgdurable migrations are up-only (a downgrade keeps the schema).

    Dropping pgdurable's tables would lose runs; if you really mean it, run
    ``DROP SCHEMA pgdurable CASCADE`` yourself.
    """
    del op
