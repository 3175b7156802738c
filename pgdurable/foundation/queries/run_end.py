"""A run's end and its release (``sql/functions/run_end.sql``): fenced completion,
failure, release, and the operator's opt-in to end incompatible runs."""

from __future__ import annotations

from .core import scalar

__all__ = ["COMPLETE", "FAIL", "MARK_INCOMPATIBLE", "RELEASE"]

# -- fenced: final checkpoint and completion (id, token, owner, state, result, spend);
# -- the resulting status (completed | cancelled | failed)
COMPLETE = scalar(
    "SELECT pgdurable.complete_run(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::jsonb, "
    "%s::numeric)", str)
# -- fenced: give the run back unchanged (id, token, owner); the resulting status
RELEASE = scalar("SELECT pgdurable.release_run(%s::uuid, %s::bigint, %s::text)", str)
# -- fenced: record a step failure (id, token, owner, error, spend, backoff, final): retry
# -- later (runnable) or fail for good; the resulting status
FAIL = scalar(
    "SELECT pgdurable.fail_run(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::numeric, "
    "%s::interval, %s::boolean)", str)
# -- operator opt-in: end unheld runs of (task, revision, reason) as incompatible; the count
MARK_INCOMPATIBLE = scalar("SELECT pgdurable.mark_incompatible(%s::text, %s::text, %s::text)",
                           int)
