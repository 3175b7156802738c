"""``start_many`` (``sql/functions/start.sql``: ``start_runs``): N runs in one statement."""

from __future__ import annotations

from .core import scalar

__all__ = ["START_MANY"]

# -- start N runs: one array per argument (see sql/0021_start_many.sql); returns
# -- the run ids in input order, one per row
START_MANY = scalar(
    "SELECT run_id FROM pgdurable.start_runs(%s::text[], %s::text[], %s::text[]::jsonb[], "
    "%s::text[], %s::integer[], %s::integer[], %s::text[], %s::interval[], "
    "%s::timestamptz[], %s::text[]::numeric[], %s::text[], %s::timestamptz[], "
    "%s::interval[], %s::text[]::jsonb[], %s::jsonb) ORDER BY ord", str)
