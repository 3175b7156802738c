"""Private: is an existing ``pgdurable`` schema ours? (``migrate`` adoption, ``check_schema``)

``migrate`` never runs anything a stranger planted: before it touches an
existing ``pgdurable`` schema (and before it reads ``schema_migrations``, which
could be a view) it checks the catalogs only:

* the schema is owned by the migrating role (``current_user``) or by a role it
  is a member of through ``pg_auth_members`` (its owner role, entered with
  ``SET ROLE``); superuser rights do not count as membership here, so a
  superuser's ``migrate`` refuses a schema a squatter created (a schema of
  another owner that is complete and consistent passes when nothing is to be
  applied: an app role's ``migrate`` at start-up changes nothing);
* ``schema_migrations`` is an ordinary table owned by the schema's owner;
* no rules on any table of the schema, and every trigger on them calls a
  function of the schema owned by the schema's owner;
* the applied ``(version, name)`` rows match the shipped files.

``migrate(adopt=True)`` (``pgdurable migrate --adopt``) skips the checks.
``check_schema`` applies the table checks (not the role check: the app role
does not own the schema) so that it never trusts a foreign ``schema_migrations``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from .errors import MigrationError

NO_TABLE = "it has no pgdurable.schema_migrations table"

# -- the schema's state: (exists, owned by current_user or a role it is a member of
# -- (pg_auth_members, no superuser bypass), owner name, schema_migrations problem or NULL)
SCHEMA_STATE = """
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
"""


def table_problem(row: Sequence[Any]) -> str | None:
    """What makes ``schema_migrations`` untrustworthy (from a SCHEMA_STATE row), if anything."""
    _exists, _mine, _owner, table, triggers, rules = row
    if table:
        return str(table)
    if triggers:
        return f"it has triggers a stranger may have planted ({triggers})"
    if rules:
        return f"it has rules ({rules})"
    return None


def names_problem(applied: Mapping[int, str], shipped: Mapping[int, str]) -> str | None:
    """A recorded migration whose name is not the shipped file of that number."""
    for version, name in sorted(applied.items()):
        want = shipped.get(version)
        if want is not None and want != name:
            return f"migration {version:04d} is recorded as {name!r}, pgdurable ships {want!r}"
    return None


def check_adoptable(
    cur: psycopg.Cursor[Any],
    shipped: Mapping[int, str],
    has_work: Callable[[psycopg.Cursor[Any]], bool] | None = None,
) -> bool:
    """Raise :class:`MigrationError` unless the database has no pgdurable schema or ours.

    Returns whether the schema exists. A complete schema of another owner passes
    when ``has_work`` (asked once its ``schema_migrations`` is judged a plain table
    of pgdurable's) says that a migrate would change nothing there. Reads only catalogs until the schema is
    judged ours; then ``schema_migrations`` for the names.
    """
    cur.execute(SCHEMA_STATE)
    row = cur.fetchone()
    assert row is not None
    exists, mine, owner = row[0], row[1], row[2]
    if not exists:
        return False
    advice = ("; nothing was applied. If this schema really is pgdurable's, "
              "run `pgdurable migrate --adopt` (migrate(adopt=True))")
    problem = table_problem(row)
    applied: dict[int, str] = {}
    if problem is None:
        # a plain table without rules or triggers: reading it runs nothing planted
        cur.execute("SELECT version, name FROM pgdurable.schema_migrations")
        applied = {v: n for v, n in cur.fetchall()}
        problem = names_problem(applied, shipped)
    complete = problem is None and set(shipped) <= set(applied)
    if not mine and not (complete and (has_work is None or not has_work(cur))):
        # nothing to apply in a schema of another owner is fine (an app role's
        # migrate at start-up); applying anything there is adopting it
        raise MigrationError(
            f"schema pgdurable exists and is owned by {owner!r}, not by the migrating role "
            f"or a role it belongs to{advice}"
        )
    if problem is not None:
        raise MigrationError(f"schema pgdurable is not pgdurable's: {problem}{advice}")
    return True


# -- whose code a session would run: the schema owner's name, whether it may log in, and
# -- whether this session is a superuser that is neither that owner nor a member of it
# -- while the owner is no superuser (then the owner's functions, which it may have
# -- changed, would run with superuser rights); no row when there is no schema
OWNER_SWITCH = """
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
"""


@dataclass(frozen=True)
class OwnerSwitch:
    """The role a superuser's session should become, and whether it may log in
    (a login owner is likely an app role that ran ``migrate``, worth a warning;
    a ``NOLOGIN`` one the owner role of the role model)."""

    role: str
    can_login: bool


def owner_to_assume(conn: psycopg.Connection[Any]) -> OwnerSwitch | None:
    """The schema owner a superuser's session should become (``SET ROLE``), or None.

    A superuser that is neither the owner of schema ``pgdurable`` nor a member
    of it, while the owner is not a superuser (the quickstart's app role that
    ran ``migrate``, or the role model's owner role): every function of the
    schema is the owner's and may have been redefined by it (or by a member of
    it), ``SECURITY INVOKER`` ones included, so calling them would run that code
    with superuser rights. Running as the owner runs it with the owner's rights,
    which it has anyway. Catalogs only.
    """
    row = conn.execute(OWNER_SWITCH).fetchone()
    if row is None or not row[2]:
        return None
    return OwnerSwitch(role=str(row[0]), can_login=bool(row[1]))
