"""Every query the dashboard (:mod:`pgdurable.ops.dashboard`) issues. The read-only ones
touch only views (the read-only role may run them); the FULL_* ones read tables and run
only when the connected role may SELECT them (the app role or the owner). The pages'
rows are :class:`~.core.Listing` rows (dicts for the templates, by column name); the
actions answer one typed value each."""

from __future__ import annotations

from .cancel import CANCEL
from .core import Listing, scalar
from .fork import FORK, FORKED_AT
from .retry import RETRY
from .schedules import PAUSE, TRIGGER
from .signals import SIGNAL_RUN

__all__ = ["BUCKETS", "BUDGETS", "CANCEL", "CAN_READ_TABLES", "CHILDREN", "EFFECTS", "FORK", "FORKED_AT",
           "FORKS", "FULL_CHANGES", "FULL_EVENTS", "FULL_RESULT", "LEASED_RUNS", "LEASES", "LINEAGE", "PAUSE",
           "QUEUES", "QUEUE_KEYS", "QUEUE_LIMITS", "RETRY", "RUN", "RUN_SPEND", "EVENTS", "SCHEDULES", "SCHEDULE_RUNS",
           "SIGNAL_RUN", "STEPS", "THREADS", "TRIGGER", "WORKERS"]

# -- can this role read states, results and payloads (the tables)?
CAN_READ_TABLES = scalar("SELECT has_table_privilege('pgdurable.checkpoints', 'SELECT')", bool)
# -- the actions (CANCEL, RETRY, FORK, FORKED_AT, SIGNAL_RUN, PAUSE, TRIGGER): imported
# -- above from their nouns
# -- per-queue counts and the oldest due runnable age (seconds)
QUEUES = Listing("""
SELECT queue, runnable, due, leased, expired_leases, waiting, completed, failed, cancelled,
       extract(epoch FROM oldest_runnable_age)::float8 AS oldest_age
  FROM pgdurable.queue_stats ORDER BY queue
""")
# -- flow limits of the limited queues: concurrency cap and live leases, per-key cap,
# -- start rate with its bucket level now, keys with queued runs
QUEUE_LIMITS = Listing("""
SELECT queue, concurrency, active, per_key_concurrency, rate_per_second::float8 AS rate,
       burst::float8 AS burst, tokens::float8 AS tokens, keys_queued
  FROM pgdurable.queue_limits ORDER BY queue
""")
# -- the busiest concurrency keys of queues with a per-key cap (at most 20 per queue)
QUEUE_KEYS = Listing("""
SELECT k.queue, k.key, k.active, k.queued, k.due, q.per_key_concurrency
  FROM pgdurable.queue_limits q
  CROSS JOIN LATERAL (
    SELECT * FROM pgdurable.queue_keys k
     WHERE k.queue = q.queue AND k.key <> ''
     ORDER BY k.active DESC, k.queued DESC, k.key LIMIT 20) k
 WHERE q.per_key_concurrency IS NOT NULL
 ORDER BY k.queue, k.active DESC, k.queued DESC, k.key
""")
# -- named token buckets and their level now
BUCKETS = Listing("""
SELECT name, rate_per_second::float8 AS rate, burst::float8 AS burst, tokens::float8 AS tokens
  FROM pgdurable.bucket_levels ORDER BY name LIMIT 500
""")
# -- schedules (no start state)
SCHEDULES = Listing("""
SELECT name, cron, every, timezone, task, queue, overlap, catchup, paused, next_fire_at,
       last_run_id, last_run_status, last_fired_at, fired, skipped, last_error, declared_by,
       undeclared_at, pgdurable.now() AS db_now
  FROM pgdurable.schedule_list ORDER BY name LIMIT 500
""")
# -- the newest 200 events (of one name, or all: NULL), each with the trigger windows
# -- and runs it joined (the view event_list; docs/events.md)
EVENTS = Listing("""
SELECT id, name, event_key, created_at, data, triggered FROM pgdurable.event_list
 WHERE %s::text IS NULL OR name = %s::text
 ORDER BY id DESC LIMIT 200
""")
# -- the last 5 runs of each of these schedules, newest tick first
SCHEDULE_RUNS = Listing("""
SELECT n.name AS schedule, x.tick, x.triggered, x.run_id, x.status
  FROM unnest(%s::text[]) AS n(name)
  CROSS JOIN LATERAL (
    SELECT * FROM pgdurable.schedule_run_list s
     WHERE s.schedule = n.name ORDER BY s.tick DESC LIMIT 5) x
 ORDER BY n.name, x.tick DESC
""")
# -- one run (no state or result)
RUN = Listing(
    "SELECT *, pgdurable.now() AS db_now FROM pgdurable.run_detail WHERE id = %s::uuid")
# -- its checkpoints lo..hi (no state), oldest first (a page of the timeline)
STEPS = Listing("""
SELECT step, step_name, token, owner, wake_type, wake_kind, wake_ref, created_at
  FROM pgdurable.run_steps WHERE run_id = %s::uuid AND step BETWEEN %s AND %s ORDER BY step
""")
# -- the effects (no result) recorded while steps lo..hi ran (effects.step is the
# -- 0-based index of the running step), and those recorded before 0017 (step NULL)
# -- that settled after since and up to until (NULL: no bound); at most 1000
EFFECTS = Listing("""
SELECT key, status, token, step, error_type, error_message, created_at, updated_at
  FROM pgdurable.run_effects
 WHERE run_id = %s::uuid
   AND (step BETWEEN %s AND %s
        OR step IS NULL AND updated_at > coalesce(%s::timestamptz, '-infinity')
                        AND updated_at <= coalesce(%s::timestamptz, 'infinity'))
 ORDER BY created_at, key LIMIT 1000
""")
# -- its children, oldest first
CHILDREN = Listing("""
SELECT id, task, status, created_at FROM pgdurable.run_list
 WHERE parent_run_id = %s::uuid ORDER BY created_at, id LIMIT 200
""")
# -- where it was forked from (run, step, and when that run started: the base of the
# -- copied steps' durations), how often it was forked and rewound
LINEAGE = Listing("""
SELECT l.forked_from, l.forked_from_step, l.forks, l.rewinds, s.created_at AS source_created_at
  FROM pgdurable.run_lineage l LEFT JOIN pgdurable.run_list s ON s.id = l.forked_from
 WHERE l.id = %s::uuid
""")
# -- the runs forked from it, oldest first (runs_forked_from_idx)
FORKS = Listing("""
SELECT l.id, l.status, l.forked_from_step, d.task, d.created_at
  FROM pgdurable.run_lineage l JOIN pgdurable.run_list d ON d.id = l.id
 WHERE l.forked_from = %s::uuid ORDER BY d.created_at, l.id LIMIT 200
""")
# -- FULL: the state change of each of its steps lo..hi, computed here and cut to
# -- 200 characters (what the page shows): the top-level keys whose value differs
# -- from the step before (their new value, null when removed; a missing key and
# -- null are the same), or {"value": new}
# -- when either state is not an object; the states themselves never leave the server
FULL_CHANGES = Listing("""
SELECT c.step, left((CASE
         WHEN jsonb_typeof(c.before) = 'object' AND jsonb_typeof(c.state) = 'object' THEN (
           SELECT coalesce(jsonb_object_agg(k.key, c.state -> k.key), '{}'::jsonb)
             FROM (SELECT jsonb_object_keys(c.before) UNION SELECT jsonb_object_keys(c.state)) AS k(key)
            WHERE coalesce(c.before -> k.key, 'null') <> coalesce(c.state -> k.key, 'null'))
         WHEN c.before = c.state THEN '{}'::jsonb
         ELSE jsonb_build_object('value', c.state) END)::text, 200) AS change
  FROM (SELECT step, state,
               coalesce(CASE WHEN lag(step) OVER w = step - 1 THEN lag(state) OVER w END,
                        '{}'::jsonb) AS before
          FROM pgdurable.checkpoints
         WHERE run_id = %s::uuid AND step BETWEEN %s - 1 AND %s
        WINDOW w AS (ORDER BY step)) AS c
 WHERE c.step >= %s
""")
# -- FULL: its result as JSON text, cut to 4000 characters (NULL: none yet), and its length
FULL_RESULT = Listing("""
SELECT left(result::text, 4000) AS result, length(result::text) AS length
  FROM pgdurable.runs WHERE id = %s::uuid
""")
# -- FULL: the last 200 events of its output stream, each cut to 400 characters
FULL_EVENTS = Listing("""
SELECT seq, created_at, left(event::text, 400) AS event FROM (
  SELECT seq, created_at, event FROM pgdurable.run_events
   WHERE run_id = %s::uuid ORDER BY seq DESC LIMIT 200) e ORDER BY seq
""")
# -- live leases and leased runs
LEASES = Listing("""
SELECT key, owner, token, acquired_at, expires_at,
       extract(epoch FROM ttl_remaining)::float8 AS ttl
  FROM pgdurable.active_leases ORDER BY expires_at LIMIT 500
""")
# -- the leased runs, the next lease to expire first
LEASED_RUNS = Listing("""
SELECT id, task, queue, worker, lease_expires_at, lease_expired
  FROM pgdurable.run_overview WHERE status = 'leased' ORDER BY lease_expires_at LIMIT 500
""")
# -- the threads, their owning run and lease, and how many messages wait
THREADS = Listing("""
SELECT thread_key, run_id, lease_owner, lease_token, lease_expires_at, owned, inbox_depth
  FROM pgdurable.thread_owners ORDER BY thread_key LIMIT 500
""")
# -- the workers that announced themselves (alive first, then the lapsed of the last
# -- hour): where and how each runs, runs held, last heartbeat, revisions
WORKERS = Listing("""
SELECT worker_id, host, pid, queues, concurrency, since, renewed_at, until, alive, runs_held,
       revisions, extract(epoch FROM pgdurable.now() - renewed_at)::float8 AS heartbeat_age
  FROM pgdurable.worker_list ORDER BY alive DESC, worker_id LIMIT 500
""")
# -- the named budgets per unit: limit, window, settled in the window, held now (views only)
BUDGETS = Listing("""
SELECT budget_key, unit, limit_amount::float8 AS limit_amount, window_kind, window_length,
       policy, settled::float8 AS settled, held::float8 AS held
  FROM pgdurable.budget_usage WHERE budget_key NOT LIKE 'run:%%'
 ORDER BY budget_key, unit LIMIT 500
""")
# -- what one run was charged, per budget and unit
RUN_SPEND = Listing("""
SELECT budget_key, unit, settled::float8 AS settled, settlements
  FROM pgdurable.budget_run_spend WHERE run_id = %s ORDER BY budget_key, unit
""")
