"""The role model (``sql/functions/security.sql``: ``grant_roles``) applied to existing roles
(:mod:`pgdurable.ops.roles`, ``pgdurable grant``)."""

from __future__ import annotations

from .core import scalar, statement

__all__ = ["GRANT", "IDENT", "MISSING"]

# -- set up the role model on existing roles (any may be NULL); see sql/0009
GRANT = statement("SELECT pgdurable.grant_roles(%s::regrole, %s::regrole, %s::regrole)")
# -- roles that do not exist (regrole would fail with a less clear message); one name per row
MISSING = scalar(
    "SELECT r FROM unnest(%s::text[]) AS r WHERE r IS NOT NULL AND to_regrole(quote_ident(r)) IS NULL",
    str)
# -- a role name as an identifier (quoted where it must be)
IDENT = scalar("SELECT quote_ident(%s)", str)
