"""``start_many`` (``sql/functions/start.sql``: ``start_runs``): N runs in one statement."""

from __future__ import annotations

from .core import scalar

__all__ = ["START_MANY", "START_MANY_BUDGETED"]

# -- start N runs: one array per argument (see sql/0021_start_many.sql); returns
# -- the run ids in input order, one per row
START_MANY = scalar(
    "SELECT run_id FROM pgdurable.start_runs(%s::text[], %s::text[], %s::text[]::jsonb[], "
    "%s::text[], %s::integer[], %s::integer[], %s::text[], %s::interval[], "
    "%s::timestamptz[], %s::text[]::numeric[], %s::text[], %s::timestamptz[], "
    "%s::interval[], %s::text[]::jsonb[], %s::jsonb) ORDER BY ord", str)
# -- the same, and attach each run's budgets (sql/functions/budgets.sql:
# -- budget_started_run) from one more parameter: a JSON array, in input order, of
# -- {"keys": [...], "own": {unit: limit}} ({} for none); PD016 for an unknown key
START_MANY_BUDGETED = scalar(
    "SELECT pgdurable.budget_started_run(s.run_id, "
    "ARRAY(SELECT jsonb_array_elements_text(coalesce(j.e -> 'keys', '[]'::jsonb))), "
    "j.e -> 'own') "
    "FROM pgdurable.start_runs(%s::text[], %s::text[], %s::text[]::jsonb[], "
    "%s::text[], %s::integer[], %s::integer[], %s::text[], %s::interval[], "
    "%s::timestamptz[], %s::text[]::numeric[], %s::text[], %s::timestamptz[], "
    "%s::interval[], %s::text[]::jsonb[], %s::jsonb) s "
    "JOIN jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS j(e, n) ON j.n = s.ord "
    "ORDER BY s.ord", str)
