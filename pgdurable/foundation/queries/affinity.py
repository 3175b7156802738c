"""Affinity (``sql/functions/affinity.sql``): pin a run to its worker, worker presence, and
a start that inherits another run's affinity (:mod:`pgdurable.foundation.affinity`)."""

from __future__ import annotations

from typing import Any

from .core import Query, column, scalar

__all__ = ["ABSENT", "AFFINE_STARTED", "PIN", "PRESENT", "STARTED"]

# -- fenced: pin the run to its lease holder (mode, wait, info) or unpin (mode NULL);
# -- returns the affinity record (a JSON object: parse_affinity) or NULL
PIN: Query[Any] = column(
    "SELECT pgdurable.pin_run(%s::uuid, %s::bigint, %s::text, %s::text, %s::text, "
    "%s::interval, %s::jsonb)")
# -- worker presence: this instance is alive for ttl (returns until)
PRESENT: Query[Any] = column("SELECT pgdurable.worker_present(%s::text, %s::text, %s::interval)")
# -- a starting worker's presence, with where and how it runs: host, pid, queues,
# -- concurrency (returns until)
STARTED: Query[Any] = column(
    "SELECT pgdurable.worker_started(%s::text, %s::text, %s::interval, %s::text, "
    "%s::integer, %s::text[], %s::integer)")
# -- a clean stop: remove this instance's presence and wake its queues (its reserved runs
# -- are anybody's now); returns whether it was there
ABSENT = scalar("SELECT pgdurable.worker_absent(%s::text, %s::text, %s::text[])", bool)
# -- wraps a start statement (its first two columns: run id, created): the run
# -- started gets the affinity of run %s (same statement: no worker can claim it
# -- first); returns (run_id, created), decoded as the start it wraps. Composed by
# -- runs.metadata.start_statement and runs.children.start_child
AFFINE_STARTED = (
    "SELECT a.id, s.created FROM ({start}) AS s(run_id, created), "
    "LATERAL (SELECT pgdurable.affine_started_run(s.run_id, %s::uuid) AS id) a"
)
