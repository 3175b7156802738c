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
# -- flow limits of the limited queues: concurrency cap and live leases, per-key cap,
# -- start rate with its bucket level now, keys with queued runs
QUEUE_LIMITS = """
SELECT queue, concurrency, active, per_key_concurrency, rate_per_second::float8 AS rate,
       burst::float8 AS burst, tokens::float8 AS tokens, keys_queued
  FROM pgdurable.queue_limits ORDER BY queue
"""
# -- the busiest concurrency keys of queues with a per-key cap (at most 20 per queue)
QUEUE_KEYS = """
SELECT k.queue, k.key, k.active, k.queued, k.due, q.per_key_concurrency
  FROM pgdurable.queue_limits q
  CROSS JOIN LATERAL (
    SELECT * FROM pgdurable.queue_keys k
     WHERE k.queue = q.queue AND k.key <> ''
     ORDER BY k.active DESC, k.queued DESC, k.key LIMIT 20) k
 WHERE q.per_key_concurrency IS NOT NULL
 ORDER BY k.queue, k.active DESC, k.queued DESC, k.key
"""
# -- named token buckets and their level now
BUCKETS = """
SELECT name, rate_per_second::float8 AS rate, burst::float8 AS burst, tokens::float8 AS tokens
  FROM pgdurable.bucket_levels ORDER BY name LIMIT 500
"""
# -- schedules (no start state)
SCHEDULES = """
SELECT name, cron, every, timezone, task, queue, overlap, catchup, paused, next_fire_at,
       last_run_id, last_run_status, last_fired_at, fired, skipped, last_error, declared_by,
       undeclared_at, pgdurable.now() AS db_now
  FROM pgdurable.schedule_list ORDER BY name LIMIT 500
"""
# -- the last 5 runs of each of these schedules, newest tick first
SCHEDULE_RUNS = """
SELECT n.name AS schedule, x.tick, x.triggered, x.run_id, x.status
  FROM unnest(%s::text[]) AS n(name)
  CROSS JOIN LATERAL (
    SELECT * FROM pgdurable.schedule_run_list s
     WHERE s.schedule = n.name ORDER BY s.tick DESC LIMIT 5) x
 ORDER BY n.name, x.tick DESC
"""
# -- one run (no state or result)
RUN = "SELECT *, pgdurable.now() AS db_now FROM pgdurable.run_detail WHERE id = %s::uuid"
# -- its checkpoints (no state), oldest first
STEPS = """
SELECT step, step_name, token, owner, wake_type, wake_kind, wake_ref, created_at
  FROM pgdurable.run_steps WHERE run_id = %s::uuid ORDER BY step
"""
# -- its effects (no result)
EFFECTS = """
SELECT key, status, token, step, error_type, error_message, created_at, updated_at
  FROM pgdurable.run_effects WHERE run_id = %s::uuid ORDER BY created_at, key
"""
# -- its children, oldest first
CHILDREN = """
SELECT id, task, status, created_at FROM pgdurable.run_list
 WHERE parent_run_id = %s::uuid ORDER BY created_at, id LIMIT 200
"""
# -- where it was forked from (run and step), how often it was forked and rewound
LINEAGE = """
SELECT forked_from, forked_from_step, forks, rewinds
  FROM pgdurable.run_lineage WHERE id = %s::uuid
"""
# -- the runs forked from it, oldest first (runs_forked_from_idx)
FORKS = """
SELECT l.id, l.status, l.forked_from_step, d.task, d.created_at
  FROM pgdurable.run_lineage l JOIN pgdurable.run_list d ON d.id = l.id
 WHERE l.forked_from = %s::uuid ORDER BY d.created_at, l.id LIMIT 200
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
