-- 0020_checkpoint_owner: what the dashboard's run timeline and schedules page
-- need that the schema did not keep or did not show to the read-only role.
--
-- * checkpoints.owner: the lease owner (worker id) under which a checkpoint
--   was written, next to the lease token it already recorded. Taken from the
--   fence the write already passes (write_steps: p_owner, which the fence
--   compares with runs.lease_owner; _checkpoint, used by park_run and the
--   children park: the locked run's lease_owner): no trigger, no extra read,
--   one short text per checkpoint. Rows written before this migration, and
--   the history a fork copies (token 0), have owner NULL.
-- * run_steps gains owner and step_name. The step name is read from what a
--   workflow records in its checkpoint (state.workflow.name, as the
--   workflow_steps view does): an @app.task has a single step function and no
--   step names (its steps are numbered, runs.step), so nothing is stored.
-- * run_effects gains step (the 0-based index of the running step when the
--   effect was recorded, 0017), so the timeline can put an effect under the
--   checkpoint that followed it.
-- * schedule_list and schedule_run_list: schedules and the runs their ticks
--   started, without the start state, so the read-only role can see them.
--
-- MERGE NOTE: write_steps and _checkpoint are redefined here in full from
-- their 0003_runs text; the only change is the owner column in their INSERT
-- into pgdurable.checkpoints.

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.checkpoints ADD COLUMN owner text;
COMMENT ON COLUMN pgdurable.checkpoints.owner IS
  'Lease owner (worker id) that wrote the checkpoint under token; NULL for checkpoints '
  'written before migration 0020 and for history copied by fork_run.';
-- the existing partitions got the column without its comment (new ones copy
-- it: _history_partition creates them LIKE the parent INCLUDING COMMENTS)
DO $$
DECLARE
  p regclass;
BEGIN
  FOR p IN SELECT i.inhrelid::regclass FROM pg_inherits i
            WHERE i.inhparent = 'pgdurable.checkpoints'::regclass LOOP
    EXECUTE format('COMMENT ON COLUMN %s.owner IS %L', p,
                   col_description('pgdurable.checkpoints'::regclass,
                                   (SELECT a.attnum FROM pg_attribute a
                                     WHERE a.attrelid = 'pgdurable.checkpoints'::regclass
                                       AND a.attname = 'owner')));
  END LOOP;
END
$$;

------------------------------------------------------------------------------
-- pgdurable._checkpoint(run, token, state): internal, write the step's state:
-- runs.state/step + 1/wake := NULL/reclaims := 0 and the checkpoints history
-- row (with the wake the step saw and the lease owner r holds). Returns the
-- new step number. (0003's definition + owner.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._checkpoint(r pgdurable.runs, p_token bigint,
                                                 p_state jsonb, p_spend numeric)
RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH u AS (
    UPDATE pgdurable.runs SET state = p_state, step = r.step + 1, wake = NULL, reclaims = 0,
           spent = spent + coalesce(p_spend, 0), updated_at = pgdurable.now()
     WHERE id = r.id
    RETURNING id, step)
  INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake, owner)
  SELECT u.id, u.step, p_token, p_state, r.wake, r.lease_owner FROM u
  RETURNING step
$$;
COMMENT ON FUNCTION pgdurable._checkpoint(pgdurable.runs, bigint, jsonb, numeric) IS
  'Internal: write runs.state/step and the checkpoints history row (token, owner) for a locked run.';

------------------------------------------------------------------------------
-- pgdurable.write_steps(owner, ids, tokens, states, spends, done, results)
--   -> TABLE(id uuid, status text)
-- FENCED, BATCHED: the hot path. Unchanged from 0003_runs (see the contract
-- there) except that each history row also records p_owner, the lease owner
-- the fence has just matched (runs.lease_owner = p_owner).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.write_steps(p_owner text, p_ids uuid[], p_tokens bigint[],
                                                 p_states jsonb[], p_spends numeric[],
                                                 p_done boolean[], p_results jsonb[])
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  n integer := cardinality(p_ids);
BEGIN
  -- unnest pads shorter arrays with NULL: a missing done[i] would leave run i
  -- 'leased' with no lease owner or expiry (stranded forever), a duplicate id
  -- would report a state as written that was not
  IF n IS NULL OR cardinality(p_tokens) IS DISTINCT FROM n
     OR cardinality(p_states) IS DISTINCT FROM n OR cardinality(p_spends) IS DISTINCT FROM n
     OR cardinality(p_done) IS DISTINCT FROM n OR cardinality(p_results) IS DISTINCT FROM n
     OR array_position(p_ids, NULL) IS NOT NULL OR array_position(p_tokens, NULL) IS NOT NULL
     OR array_position(p_states, NULL) IS NOT NULL OR array_position(p_done, NULL) IS NOT NULL
     OR (SELECT count(DISTINCT x) FROM unnest(p_ids) x) <> n THEN
    RAISE EXCEPTION 'write_steps: ids, tokens, states, spends, done and results must have the '
      'same length, distinct ids and no NULL id, token, state or done' USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  WITH i AS (
    SELECT * FROM unnest(p_ids, p_tokens, p_states, p_spends, p_done, p_results)
                  AS i(id, token, state, spend, done, result)
  ), u AS (
    UPDATE pgdurable.runs r SET
           state = i.state, step = r.step + 1, wake = NULL, reclaims = 0,
           spent = r.spent + coalesce(i.spend, 0),
           status = CASE WHEN pgdurable._verdict(r, i.spend, NOT i.done) IS NULL
                         THEN CASE WHEN i.done THEN 'completed' ELSE 'leased' END
                         WHEN pgdurable._verdict(r, i.spend, NOT i.done)->>'type' = 'RunCancelled'
                         THEN 'cancelled' ELSE 'failed' END,
           result = CASE WHEN i.done AND pgdurable._verdict(r, i.spend, false) IS NULL
                         THEN i.result END,
           error = coalesce(pgdurable._verdict(r, i.spend, NOT i.done), r.error),
           lease_owner = CASE WHEN NOT i.done AND pgdurable._verdict(r, i.spend, true) IS NULL
                              THEN r.lease_owner END,
           lease_expires_at = CASE WHEN NOT i.done AND pgdurable._verdict(r, i.spend, true) IS NULL
                                   THEN r.lease_expires_at END,
           finished_at = CASE WHEN i.done OR pgdurable._verdict(r, i.spend, true) IS NOT NULL
                              THEN pgdurable.now() END,
           updated_at = pgdurable.now()
      FROM i
     WHERE r.id = i.id AND r.lease_token = i.token AND r.lease_owner = p_owner
       AND r.status = 'leased' AND r.lease_expires_at > pgdurable.now()
    RETURNING r.id, r.step, r.status, i.token, i.state
  ), c AS (
    INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake, owner)
    SELECT u.id, u.step, u.token, u.state,
           (SELECT o.wake FROM pgdurable.runs o WHERE o.id = u.id), p_owner
      FROM u
  )
  SELECT i.id, coalesce(u.status, 'lost') FROM i LEFT JOIN u ON u.id = i.id;
END
$$;
COMMENT ON FUNCTION pgdurable.write_steps(text, uuid[], bigint[], jsonb[], numeric[], boolean[], jsonb[]) IS
  'Fenced, batched: checkpoint (and complete) many runs in one statement; fence failures -> lost.';

------------------------------------------------------------------------------
-- pgdurable.run_steps: each checkpoint of each run, without its state (0019's
-- columns, then owner and step_name).
------------------------------------------------------------------------------
CREATE OR REPLACE VIEW pgdurable.run_steps AS
  SELECT c.run_id,
         c.step,
         c.token,
         c.wake ->> 'type'  AS wake_type,
         c.wake ->> 'kind'  AS wake_kind,
         c.wake ->> 'ref'   AS wake_ref,
         c.created_at,
         c.owner,
         c.state -> 'workflow' ->> 'name' AS step_name
    FROM pgdurable.checkpoints c;
COMMENT ON COLUMN pgdurable.run_steps.owner IS
  'Lease owner (worker id) that wrote the checkpoint; NULL before migration 0020 and for history a fork copied.';
COMMENT ON COLUMN pgdurable.run_steps.step_name IS
  'Name of the step a workflow recorded (step name, wait or sleep name, patch id); NULL for '
  'an @app.task, whose steps are numbered, not named.';

------------------------------------------------------------------------------
-- pgdurable.run_effects: each recorded effect, without its result (0019's
-- columns, then step).
------------------------------------------------------------------------------
CREATE OR REPLACE VIEW pgdurable.run_effects AS
  SELECT e.run_id,
         e.key,
         e.status,
         e.token,
         e.error ->> 'type'     AS error_type,
         e.error ->> 'message'  AS error_message,
         e.created_at,
         e.updated_at,
         e.step
    FROM pgdurable.effects e;
COMMENT ON COLUMN pgdurable.run_effects.step IS
  'runs.step when the effect was first recorded (0-based index of the running step: it '
  'belongs to checkpoint step + 1); NULL for effects recorded before migration 0017.';

------------------------------------------------------------------------------
-- pgdurable.schedule_list: every schedule, without its start state.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.schedule_list AS
  SELECT s.name,
         s.cron,
         s.every,
         s.timezone,
         s.task,
         s.queue,
         s.overlap,
         s.catchup,
         s.paused,
         s.next_fire_at,
         s.last_tick,
         s.last_run_id,
         (SELECT r.status FROM pgdurable.runs r WHERE r.id = s.last_run_id) AS last_run_status,
         s.last_fired_at,
         s.fired,
         s.skipped,
         s.last_error,
         s.declared_by,
         s.undeclared_at
    FROM pgdurable.schedules s;
COMMENT ON VIEW pgdurable.schedule_list IS
  'Schedules for operators (no start state): cadence, next tick, paused, last run, counters.';
COMMENT ON COLUMN pgdurable.schedule_list.name IS 'Schedule name.';
COMMENT ON COLUMN pgdurable.schedule_list.cron IS 'Cron expression (NULL when every is set).';
COMMENT ON COLUMN pgdurable.schedule_list.every IS 'Fixed interval (NULL when cron is set).';
COMMENT ON COLUMN pgdurable.schedule_list.timezone IS 'Time zone the cron expression is read in.';
COMMENT ON COLUMN pgdurable.schedule_list.task IS 'Task each tick starts.';
COMMENT ON COLUMN pgdurable.schedule_list.queue IS 'Queue of its runs.';
COMMENT ON COLUMN pgdurable.schedule_list.overlap IS 'skip | allow | cancel_previous.';
COMMENT ON COLUMN pgdurable.schedule_list.catchup IS 'none | latest | all.';
COMMENT ON COLUMN pgdurable.schedule_list.paused IS 'Paused: fires nothing until resumed.';
COMMENT ON COLUMN pgdurable.schedule_list.next_fire_at IS 'The next tick (database clock).';
COMMENT ON COLUMN pgdurable.schedule_list.last_tick IS 'The last tick fired or skipped.';
COMMENT ON COLUMN pgdurable.schedule_list.last_run_id IS 'Its latest run (may name a pruned run).';
COMMENT ON COLUMN pgdurable.schedule_list.last_run_status IS 'Status of that run (NULL if pruned).';
COMMENT ON COLUMN pgdurable.schedule_list.last_fired_at IS 'When a tick last started a run.';
COMMENT ON COLUMN pgdurable.schedule_list.fired IS 'Runs started by ticks and triggers.';
COMMENT ON COLUMN pgdurable.schedule_list.skipped IS 'Ticks the overlap policy skipped.';
COMMENT ON COLUMN pgdurable.schedule_list.last_error IS 'Why a worker paused it (could not plan it).';
COMMENT ON COLUMN pgdurable.schedule_list.declared_by IS '''code'' (app.schedule) or NULL (CLI, SQL).';
COMMENT ON COLUMN pgdurable.schedule_list.undeclared_at IS 'When the code stopped declaring it.';

------------------------------------------------------------------------------
-- pgdurable.schedule_run_list: the runs schedules started, with their status.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.schedule_run_list AS
  SELECT sr.schedule,
         sr.tick,
         sr.triggered,
         sr.run_id,
         r.status,
         r.created_at,
         r.finished_at
    FROM pgdurable.schedule_runs sr
    JOIN pgdurable.runs r ON r.id = sr.run_id;
COMMENT ON VIEW pgdurable.schedule_run_list IS
  'Runs started by schedule ticks and triggers, with their status (schedule_runs + runs).';
COMMENT ON COLUMN pgdurable.schedule_run_list.schedule IS 'Schedule name.';
COMMENT ON COLUMN pgdurable.schedule_run_list.tick IS 'The tick it was started for (trigger: when).';
COMMENT ON COLUMN pgdurable.schedule_run_list.triggered IS 'Started by trigger_schedule, outside the cadence.';
COMMENT ON COLUMN pgdurable.schedule_run_list.run_id IS 'The run.';
COMMENT ON COLUMN pgdurable.schedule_run_list.status IS 'Its status.';
COMMENT ON COLUMN pgdurable.schedule_run_list.created_at IS 'When it was started.';
COMMENT ON COLUMN pgdurable.schedule_run_list.finished_at IS 'When it ended (NULL while going).';
