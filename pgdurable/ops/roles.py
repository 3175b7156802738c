"""The role model: a NOLOGIN owner, an app role with EXECUTE + SELECT, a read-only role.

:func:`grant_roles` (``pgdurable grant``) calls ``pgdurable.grant_roles`` (migration
0009) on roles that already exist (roles are cluster-wide: their names are
yours, pgdurable creates none):

* **owner** (``NOLOGIN``): owns the schema and every object in it; the state
  transitions are ``SECURITY DEFINER`` functions with a pinned ``search_path``
  and run as it. Migrations run as it: ``PGOPTIONS='-c role=<owner>' pgdurable
  migrate`` (or ``SET ROLE <owner>`` before ``migrate(conn)``), from a login role
  that is a member of it.
* **app** (the application and its workers): ``USAGE`` on the schema,
  ``SELECT`` on the tables and views, ``EXECUTE`` on the functions, and no
  ``INSERT``/``UPDATE``/``DELETE``/``TRUNCATE``: a run changes only through
  the fenced functions (a completion needs the lease token).
* **readonly** (operators, dashboards): ``USAGE`` and ``SELECT`` on the views.

Run it as a superuser (or as a member of the current schema owner and of the
new owner). It is idempotent; ``pgdurable migrate`` re-applies the function
grants after each migration it applies. See SECURITY.md and docs/security.md.
"""

from __future__ import annotations

from typing import Any

import psycopg

from ..foundation.db import connect, translated, validate_dsn
from ..foundation.queries import roles as Q
from ..foundation.queries.core import many_sync, one_sync
from ..foundation.schemas import caller_schema, resolve_schema

__all__ = ["grant_roles"]



def _check(name: str | None, what: str) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a role name (str) or None, not {type(name).__name__}")
    if not name or "\x00" in name:
        raise ValueError(f"{what} must be a non-empty role name without NUL")
    return name


def grant_roles(
    target: str | psycopg.Connection[Any],
    *,
    owner_role: str | None = None,
    app_role: str | None = None,
    readonly_role: str | None = None,
    schema: str | None = None,
) -> None:
    """Apply the role model to existing roles (see the module docstring).

    ``target`` is a conninfo string or an open autocommit-or-idle connection.
    Unknown roles are a :class:`ValueError` and nothing changes. ``schema`` (else
    ``PGDURABLE_SCHEMA``, else ``pgdurable``): the schema whose roles they become.
    """
    in_schema = resolve_schema(schema)
    names = [_check(owner_role, "owner_role"), _check(app_role, "app_role"),
             _check(readonly_role, "readonly_role")]
    if not any(names):
        raise ValueError("give at least one of owner_role, app_role, readonly_role")
    conn = connect(validate_dsn(target), schema=in_schema) if isinstance(target, str) else target
    try:
        with translated(), caller_schema(conn, in_schema), conn.transaction():
            missing = many_sync(conn, Q.MISSING, (names,))
            if missing:
                raise ValueError(f"no such role: {', '.join(missing)} (create it first: "
                                 "roles are cluster-wide, pgdurable creates none)")
            one_sync(conn, Q.GRANT,
                     tuple(None if n is None else one_sync(conn, Q.IDENT, (n,)) for n in names))
    finally:
        if isinstance(target, str):
            conn.close()
