"""Run metadata (``sql/functions/start.sql``: ``tag_started_run``): labels and the trace
context stored by the statement that starts the run."""

from __future__ import annotations

__all__ = ["TAG_STARTED"]

# -- wraps a start statement (SELECT run_id, created FROM pgdurable.start_run(...) or
# -- start_run_flow(...)): starts the run and labels it in the same statement;
# -- returns (run_id, created), decoded as the start it wraps; extra params:
# -- (metadata, trace_context)
TAG_STARTED = (
    "SELECT t.id, s.created FROM ({start}) s, "
    "LATERAL (SELECT pgdurable.tag_started_run(s.run_id, s.created, %s::jsonb, %s::jsonb)"
    " AS id) t"
)
