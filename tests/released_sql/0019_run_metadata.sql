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

------------------------------------------------------------------------------
-- pgdurable.tag_started_run(id, created, metadata, trace_context) -> uuid
-- Set the metadata and trace context of a run THIS transaction has just
-- inserted (composed with start_run in one statement: SELECT ... FROM
-- start_run(...) s, LATERAL tag_started_run(s.run_id, s.created, ...)).
-- Only a row whose xmin is the current transaction and whose metadata and
-- trace context are still NULL is changed: nobody can relabel an existing run.
-- created = false (idempotent repeat) or both values NULL: nothing changes.
-- metadata must be a JSON object (else PD000). Returns p_id.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.tag_started_run(p_id uuid, p_created boolean, p_metadata jsonb,
                                          p_trace_context jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
    RAISE EXCEPTION 'metadata must be a JSON object' USING ERRCODE = 'PD000';
  END IF;
  IF p_created AND (p_metadata IS NOT NULL OR p_trace_context IS NOT NULL) THEN
    UPDATE pgdurable.runs r SET metadata = p_metadata, trace_context = p_trace_context
     WHERE r.id = p_id AND r.metadata IS NULL AND r.trace_context IS NULL
       AND r.xmin = pg_catalog.xid(pg_catalog.pg_current_xact_id());
  END IF;
  RETURN p_id;
END
$$;
COMMENT ON FUNCTION pgdurable.tag_started_run(uuid, boolean, jsonb, jsonb) IS
  'Set metadata/trace context of a run inserted by this very transaction (composed with start_run).';

------------------------------------------------------------------------------
-- pgdurable._checkpoints_notify(): statement trigger on checkpoints: ONE
-- pg_notify('pgdurable_steps', ids) per statement (a batch of steps), the
-- comma-separated run ids when they fit in 7,000 bytes, else ''. Skipped when
-- the setting pgdurable.live_steps is 'off'.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._checkpoints_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ids text;
BEGIN
  IF coalesce(current_setting('pgdurable.live_steps', true), '') = 'off' THEN
    RETURN NULL;
  END IF;
  SELECT string_agg(DISTINCT n.run_id::text, ',') INTO v_ids FROM new_rows n;
  IF v_ids IS NOT NULL THEN
    PERFORM pg_notify('pgdurable_steps', CASE WHEN length(v_ids) <= 7000 THEN v_ids ELSE '' END);
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._checkpoints_notify() IS
  'Internal: one NOTIFY pgdurable_steps per statement writing checkpoints (live dashboards).';
CREATE TRIGGER checkpoints_notify
  AFTER INSERT ON pgdurable.checkpoints
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._checkpoints_notify();

------------------------------------------------------------------------------
-- pgdurable.run_list: one row per run for searching (list_runs, dashboard).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_list AS
  SELECT r.id,
         r.task,
         r.queue,
         r.status,
         r.step,
         r.attempts,
         r.max_attempts,
         r.lease_owner                                                AS worker,
         (r.status = 'leased' AND r.lease_expires_at <= pgdurable.now()) AS lease_expired,
         r.wait_kind,
         r.wait_ref,
         r.wake_at,
         r.error ->> 'type'                                           AS error_type,
         r.error ->> 'message'                                        AS error_message,
         r.metadata,
         r.parent_run_id,
         r.root_run_id,
         r.created_at,
         r.updated_at,
         r.finished_at
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_list IS
  'Searchable runs (metadata, status, task, queue, time): list_runs and the dashboard read it.';
COMMENT ON COLUMN pgdurable.run_list.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_list.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_list.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.run_list.status IS 'runnable | leased | waiting | completed | failed | cancelled | incompatible.';
COMMENT ON COLUMN pgdurable.run_list.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_list.attempts IS 'Failed attempts so far.';
COMMENT ON COLUMN pgdurable.run_list.max_attempts IS 'Attempts allowed.';
COMMENT ON COLUMN pgdurable.run_list.worker IS 'Worker holding the run (leased), else NULL.';
COMMENT ON COLUMN pgdurable.run_list.lease_expired IS 'Leased but the lease lapsed.';
COMMENT ON COLUMN pgdurable.run_list.wait_kind IS 'Signal kind a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_list.wait_ref IS 'Signal reference a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_list.wake_at IS 'Timer of a parked run.';
COMMENT ON COLUMN pgdurable.run_list.error_type IS 'Type of the last error.';
COMMENT ON COLUMN pgdurable.run_list.error_message IS 'Message of the last error.';
COMMENT ON COLUMN pgdurable.run_list.metadata IS 'Caller labels set at start.';
COMMENT ON COLUMN pgdurable.run_list.parent_run_id IS 'Parent run (child runs).';
COMMENT ON COLUMN pgdurable.run_list.root_run_id IS 'Top-level run of its tree.';
COMMENT ON COLUMN pgdurable.run_list.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.run_list.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.run_list.finished_at IS 'When it reached a terminal status.';

------------------------------------------------------------------------------
-- pgdurable.run_detail: one run for the dashboard, without state or result.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_detail AS
  SELECT r.id,
         r.task,
         r.revision,
         r.queue,
         r.priority,
         r.status,
         r.step,
         r.attempts,
         r.max_attempts,
         r.claims,
         r.reclaims,
         r.lease_owner,
         r.lease_token,
         r.lease_expires_at,
         r.wait_kind,
         r.wait_ref,
         r.wait_since,
         r.wake_at,
         r.deadline_at,
         r.cancel_requested_at IS NOT NULL   AS cancel_requested,
         r.error ->> 'type'                  AS error_type,
         r.error ->> 'message'               AS error_message,
         r.error ->> 'traceback'             AS error_traceback,
         r.metadata,
         r.trace_context ->> 'traceparent'   AS traceparent,
         r.parent_run_id,
         r.root_run_id,
         r.child_key,
         r.created_at,
         r.updated_at,
         r.finished_at
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_detail IS
  'One run for operators: status, lease, wait, error with traceback, metadata, tree (no state or result).';
COMMENT ON COLUMN pgdurable.run_detail.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_detail.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_detail.revision IS 'Task revision.';
COMMENT ON COLUMN pgdurable.run_detail.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.run_detail.priority IS 'Priority within the queue.';
COMMENT ON COLUMN pgdurable.run_detail.status IS 'Run status.';
COMMENT ON COLUMN pgdurable.run_detail.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_detail.attempts IS 'Failed attempts so far.';
COMMENT ON COLUMN pgdurable.run_detail.max_attempts IS 'Attempts allowed.';
COMMENT ON COLUMN pgdurable.run_detail.claims IS 'Claims so far.';
COMMENT ON COLUMN pgdurable.run_detail.reclaims IS 'Lease expiries since the last checkpoint.';
COMMENT ON COLUMN pgdurable.run_detail.lease_owner IS 'Worker holding the run.';
COMMENT ON COLUMN pgdurable.run_detail.lease_token IS 'Fencing token of the current (or last) claim.';
COMMENT ON COLUMN pgdurable.run_detail.lease_expires_at IS 'When the claim lapses.';
COMMENT ON COLUMN pgdurable.run_detail.wait_kind IS 'Signal kind awaited.';
COMMENT ON COLUMN pgdurable.run_detail.wait_ref IS 'Signal reference awaited.';
COMMENT ON COLUMN pgdurable.run_detail.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.run_detail.wake_at IS 'Timer of a parked run.';
COMMENT ON COLUMN pgdurable.run_detail.deadline_at IS 'Deadline.';
COMMENT ON COLUMN pgdurable.run_detail.cancel_requested IS 'A cancel is pending.';
COMMENT ON COLUMN pgdurable.run_detail.error_type IS 'Type of the last error.';
COMMENT ON COLUMN pgdurable.run_detail.error_message IS 'Message of the last error.';
COMMENT ON COLUMN pgdurable.run_detail.error_traceback IS 'Traceback of the last error.';
COMMENT ON COLUMN pgdurable.run_detail.metadata IS 'Caller labels set at start.';
COMMENT ON COLUMN pgdurable.run_detail.traceparent IS 'W3C traceparent of the starter.';
COMMENT ON COLUMN pgdurable.run_detail.parent_run_id IS 'Parent run.';
COMMENT ON COLUMN pgdurable.run_detail.root_run_id IS 'Top-level run of its tree.';
COMMENT ON COLUMN pgdurable.run_detail.child_key IS 'Key within its parent.';
COMMENT ON COLUMN pgdurable.run_detail.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.run_detail.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.run_detail.finished_at IS 'When it reached a terminal status.';

------------------------------------------------------------------------------
-- pgdurable.run_steps: each checkpoint of each run, without its state.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_steps AS
  SELECT c.run_id,
         c.step,
         c.token,
         c.wake ->> 'type'  AS wake_type,
         c.wake ->> 'kind'  AS wake_kind,
         c.wake ->> 'ref'   AS wake_ref,
         c.created_at
    FROM pgdurable.checkpoints c;
COMMENT ON VIEW pgdurable.run_steps IS
  'Checkpoint history without states: step, lease token, the wake that started the step, when.';
COMMENT ON COLUMN pgdurable.run_steps.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_steps.step IS 'Step number (1-based).';
COMMENT ON COLUMN pgdurable.run_steps.token IS 'Lease token under which the step was checkpointed.';
COMMENT ON COLUMN pgdurable.run_steps.wake_type IS 'What woke the run before this step (signal | timeout), else NULL.';
COMMENT ON COLUMN pgdurable.run_steps.wake_kind IS 'Signal kind of that wake.';
COMMENT ON COLUMN pgdurable.run_steps.wake_ref IS 'Signal reference of that wake.';
COMMENT ON COLUMN pgdurable.run_steps.created_at IS 'When the checkpoint was written.';

------------------------------------------------------------------------------
-- pgdurable.run_effects: each recorded effect, without its result.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_effects AS
  SELECT e.run_id,
         e.key,
         e.status,
         e.token,
         e.error ->> 'type'     AS error_type,
         e.error ->> 'message'  AS error_message,
         e.created_at,
         e.updated_at
    FROM pgdurable.effects e;
COMMENT ON VIEW pgdurable.run_effects IS
  'Side effects of runs without their results: key, outcome, lease token, when.';
COMMENT ON COLUMN pgdurable.run_effects.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_effects.key IS 'Effect key.';
COMMENT ON COLUMN pgdurable.run_effects.status IS 'started | succeeded | failed.';
COMMENT ON COLUMN pgdurable.run_effects.token IS 'Lease token under which it was recorded.';
COMMENT ON COLUMN pgdurable.run_effects.error_type IS 'Error type of a failed effect.';
COMMENT ON COLUMN pgdurable.run_effects.error_message IS 'Error message of a failed effect.';
COMMENT ON COLUMN pgdurable.run_effects.created_at IS 'When first recorded.';
COMMENT ON COLUMN pgdurable.run_effects.updated_at IS 'When its status last changed.';
