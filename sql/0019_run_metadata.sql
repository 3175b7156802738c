-- run_metadata: what operators search and watch runs by.
--
-- * runs.metadata: caller labels set at start (tenant, user, ...), JSONB,
--   searched by containment (@>) through a GIN index.
-- * runs.trace_context: the W3C trace context (traceparent/tracestate) of
--   the code that started the run, so that every step of the run joins the
--   starter's trace, whichever worker runs it.
-- * keyset indexes for list_runs (newest first, per task, per queue).
-- * read-only views for the dashboard: run_list, run_steps, run_effects,
--   run_detail (no states, results or payloads: the read-only role may read
--   them).
-- * pgdurable_steps: one NOTIFY per statement that writes checkpoints (not
--   per row), so a dashboard shows a finished step live; off with
--   SET pgdurable.live_steps = off (e.g. ALTER DATABASE ... SET).
-- start_run is NOT redefined: tag_started_run is composed with it in one
-- statement (see pgdurable/_runs_sql.py START_TAGGED).
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN metadata jsonb;
ALTER TABLE pgdurable.runs ADD COLUMN trace_context jsonb;
COMMENT ON COLUMN pgdurable.runs.metadata IS
  'Caller labels set at start (a JSON object, e.g. {"tenant": "acme"}); searched with @> (GIN).';
COMMENT ON COLUMN pgdurable.runs.trace_context IS
  'W3C trace context of the starter ({"traceparent": ..., "tracestate": ...}); steps join that trace.';

-- metadata never changes after start: the GIN index costs nothing on the hot path.
CREATE INDEX runs_metadata_idx ON pgdurable.runs USING gin (metadata jsonb_path_ops)
  WHERE metadata IS NOT NULL;
-- list_runs keyset order (created_at DESC, id DESC); created_at, id, task and
-- queue never change, so these indexes keep heartbeats and claims HOT-able.
CREATE INDEX runs_created_idx ON pgdurable.runs (created_at, id);
CREATE INDEX runs_task_created_idx ON pgdurable.runs (task, created_at, id);
CREATE INDEX runs_queue_created_idx ON pgdurable.runs (queue, created_at, id);
