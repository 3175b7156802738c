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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from .errors import MigrationError
from .queries import migrations as mq
from .queries.core import first_sync, many_sync, one_sync
from .queries.migrations import OWNER_SWITCH, SCHEMA_STATE, SchemaState

NO_TABLE = "it has no pgdurable.schema_migrations table"


def is_no_table(problem: str | None) -> bool:
    """Whether the catalogs' verdict is :data:`NO_TABLE` (in any schema: the statement
    that says it names the schema it looked in)."""
    return problem is not None and problem.startswith("it has no ") and problem.endswith(
        ".schema_migrations table")

def table_problem(state: SchemaState) -> str | None:
    """What makes ``schema_migrations`` untrustworthy (from :data:`SCHEMA_STATE`), if anything."""
    if state.table:
        return str(state.table)
    if state.triggers:
        return f"it has triggers a stranger may have planted ({state.triggers})"
    if state.rules:
        return f"it has rules ({state.rules})"
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
    state = one_sync(cur, SCHEMA_STATE)
    if not state.exists:
        return False
    advice = ("; nothing was applied. If this schema really is pgdurable's, "
              "run `pgdurable migrate --adopt` (migrate(adopt=True))")
    problem = table_problem(state)
    applied: dict[int, str] = {}
    if problem is None:
        # a plain table without rules or triggers: reading it runs nothing planted
        applied = {r.version: r.name for r in many_sync(cur, mq.NAMES)}
        problem = names_problem(applied, shipped)
    complete = problem is None and set(shipped) <= set(applied)
    owner = state.owner
    if not state.mine and not (complete and (has_work is None or not has_work(cur))):
        # nothing to apply in a schema of another owner is fine (an app role's
        # migrate at start-up); applying anything there is adopting it
        raise MigrationError(
            f"schema pgdurable exists and is owned by {owner!r}, not by the migrating role "
            f"or a role it belongs to{advice}"
        )
    if problem is not None:
        raise MigrationError(f"schema pgdurable is not pgdurable's: {problem}{advice}")
    return True


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
    owner = first_sync(conn, OWNER_SWITCH)
    if owner is None or not owner.switch:
        return None
    return OwnerSwitch(role=owner.role, can_login=owner.can_login)
