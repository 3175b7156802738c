"""What the command line reads and runs (:mod:`pgdurable.ops.cli`); read-only unless noted.

The listings are shown as they are (tables, ``--json``): :class:`~.core.Listing` rows,
by column name. A role that may not read the tables (the read-only role) gets the
``*_VIEW`` forms, with the same columns, from the views.
"""

from __future__ import annotations

from typing import Any

from .cancel import CANCEL
from .children import RUN_TREE as _RUN_TREE
from .core import Listing, Query, column, scalar
from .retry import RETRY
from .signals import SIGNAL

__all__ = ["BUCKETS", "CANCEL", "CAN_READ", "CHECKPOINTS", "EFFECTS", "EFFECTS_VIEW", "EVENTS",
           "LEASES", "LIMITS", "RETRY", "REWINDS", "RUN", "RUN_LEASES", "RUN_TREE", "RUN_VIEW",
           "SERVED", "SIGNAL", "STATS", "STEPS_VIEW"]

# -- one run, every column (a JSON object; no row: no such run)
RUN: Query[Any] = column("SELECT to_jsonb(r) FROM pgdurable.runs r WHERE r.id = %s::uuid")
# -- a run's checkpoint history
CHECKPOINTS = Listing("""
SELECT step, token, created_at, wake, state FROM pgdurable.checkpoints
 WHERE run_id = %s::uuid ORDER BY step
""")
# -- a run's output events (the last %s)
EVENTS = Listing("""
SELECT seq, created_at, event FROM (
  SELECT seq, created_at, event FROM pgdurable.run_events
   WHERE run_id = %s::uuid ORDER BY seq DESC LIMIT %s) e
 ORDER BY seq
""")
# -- a run's recorded effects
EFFECTS = Listing("""
SELECT key, status, token, result, error, created_at, updated_at FROM pgdurable.effects
 WHERE run_id = %s::uuid ORDER BY created_at, key
""")
# -- a run's rewinds in place and the retries that dropped or reset history (0017, 0030)
REWINDS = Listing("""
SELECT from_step, to_step, status, error, created_at, kind FROM pgdurable.run_rewinds
 WHERE run_id = %s::uuid ORDER BY id
""")
# -- may this role read the tables (states, results, payloads)? The read-only role may
# -- not: `run` then shows what the views hold (the *_VIEW queries, same columns)
CAN_READ = scalar("SELECT has_table_privilege('pgdurable.runs', 'SELECT')", bool)
# -- one run from the views (a JSON object; no row: no such run)
RUN_VIEW: Query[Any] = column("""
SELECT to_jsonb(d) || jsonb_build_object('error', CASE WHEN d.error_type IS NOT NULL THEN
         jsonb_build_object('type', d.error_type, 'message', d.error_message) END)
  FROM pgdurable.run_detail d WHERE d.id = %s::uuid
""")
# -- a run's checkpoints from the views (no state)
STEPS_VIEW = Listing("""
SELECT step, token, created_at, step_name, CASE WHEN wake_type IS NOT NULL THEN
         jsonb_build_object('type', wake_type, 'kind', wake_kind, 'ref', wake_ref) END AS wake
  FROM pgdurable.run_steps WHERE run_id = %s::uuid ORDER BY step
""")
# -- a run's effects from the views (no result)
EFFECTS_VIEW = Listing("""
SELECT key, status, token, NULL::jsonb AS result, CASE WHEN error_type IS NOT NULL THEN
         jsonb_build_object('type', error_type, 'message', error_message) END AS error,
       created_at, updated_at
  FROM pgdurable.run_effects WHERE run_id = %s::uuid ORDER BY created_at, key
""")
# -- the run and its descendants in tree order (run --tree; the columns of run_tree)
RUN_TREE = Listing(_RUN_TREE.sql)
# -- live leases (lease providers)
LEASES = Listing("""
SELECT key, owner, token, acquired_at, expires_at, ttl_remaining
  FROM pgdurable.active_leases ORDER BY expires_at
""")
# -- leased runs, the next lease to expire first
RUN_LEASES = Listing("""
SELECT id, task, queue, worker, lease_expires_at, lease_expired,
       lease_expires_at - pgdurable.now() AS ttl_remaining
  FROM pgdurable.run_overview WHERE status = 'leased' ORDER BY lease_expires_at
""")
# -- per-queue counts
STATS = Listing("""
SELECT s.*, l.concurrency, l.active, l.per_key_concurrency, l.rate_per_second, l.tokens,
       l.keys_queued
  FROM pgdurable.queue_stats s LEFT JOIN pgdurable.queue_limits l ON l.queue = s.queue
 ORDER BY s.queue
""")
# -- the revisions the registered workers serve of a task (newest registration first);
# -- one revision per row (pgdurable start)
SERVED = scalar("""
SELECT revision FROM pgdurable.worker_revisions WHERE task = %s
 GROUP BY revision ORDER BY max(started_at) DESC
""", str)
# -- flow control (docs/flow_control.md): limited queues and token buckets
LIMITS = Listing("SELECT * FROM pgdurable.queue_limits ORDER BY queue")
BUCKETS = Listing("SELECT * FROM pgdurable.bucket_levels ORDER BY name")
# -- writes: one SQL function each, the same statements as the Python API's (CANCEL,
# -- RETRY, SIGNAL: imported above from their nouns)
