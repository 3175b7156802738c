"""Every query the dashboard issues. The read-only ones touch only views (the
read-only role may run them); the FULL_* ones read tables and run only when
the connected role may SELECT them (the app role or the owner)."""

from __future__ import annotations

# -- can this role read states, results and payloads (the tables)?
CAN_READ_TABLES = "SELECT has_table_privilege('pgdurable.checkpoints', 'SELECT')"
# -- per-queue counts and the oldest due runnable age (seconds)
QUEUES = """
SELECT queue, runnable, due, leased, expired_leases, waiting, completed, failed, cancelled,
       extract(epoch FROM oldest_runnable_age)::float8 AS oldest_age
  FROM pgdurable.queue_stats ORDER BY queue
"""
# -- one run (no state or result)
RUN = "SELECT *, pgdurable.now() AS db_now FROM pgdurable.run_detail WHERE id = %s::uuid"
# -- its checkpoints (no state), oldest first
STEPS = """
SELECT step, token, wake_type, wake_kind, wake_ref, created_at
  FROM pgdurable.run_steps WHERE run_id = %s::uuid ORDER BY step
"""
# -- its effects (no result)
EFFECTS = """
SELECT key, status, token, error_type, error_message, created_at, updated_at
  FROM pgdurable.run_effects WHERE run_id = %s::uuid ORDER BY created_at, key
"""
# -- its children, oldest first
CHILDREN = """
SELECT id, task, status, created_at FROM pgdurable.run_list
 WHERE parent_run_id = %s::uuid ORDER BY created_at, id LIMIT 200
"""
# -- FULL: checkpoint states, for the state change of each step
FULL_STATES = "SELECT step, state FROM pgdurable.checkpoints WHERE run_id = %s::uuid ORDER BY step"
# -- FULL: the last 200 events of its output stream
FULL_EVENTS = """
SELECT seq, created_at, event FROM (
  SELECT seq, created_at, event FROM pgdurable.run_events
   WHERE run_id = %s::uuid ORDER BY seq DESC LIMIT 200) e ORDER BY seq
"""
# -- live leases and leased runs
LEASES = """
SELECT key, owner, token, acquired_at, expires_at,
       extract(epoch FROM ttl_remaining)::float8 AS ttl
  FROM pgdurable.active_leases ORDER BY expires_at LIMIT 500
"""
LEASED_RUNS = """
SELECT id, task, queue, worker, lease_expires_at, lease_expired
  FROM pgdurable.run_overview WHERE status = 'leased' ORDER BY lease_expires_at LIMIT 500
"""
THREADS = """
SELECT thread_key, run_id, lease_owner, lease_token, lease_expires_at, owned, inbox_depth
  FROM pgdurable.thread_owners ORDER BY thread_key LIMIT 500
"""
