-- functions/fork.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.json_merge_patch(target, patch) -> jsonb
-- RFC 7396 JSON Merge Patch: a patch that is not an object replaces the
-- target; an object patch sets its members recursively, a null member
-- removes the key. A target that is not an object counts as {}.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.json_merge_patch(p_target jsonb, p_patch jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_out jsonb;
  v_key text;
  v_val jsonb;
BEGIN
  IF p_patch IS NULL OR jsonb_typeof(p_patch) <> 'object' THEN
    RETURN p_patch;
  END IF;
  v_out := CASE WHEN jsonb_typeof(p_target) = 'object' THEN p_target ELSE '{}'::jsonb END;
  FOR v_key, v_val IN SELECT e.key, e.value FROM jsonb_each(p_patch) e LOOP
    IF jsonb_typeof(v_val) = 'null' THEN
      v_out := v_out - v_key;
    ELSE
      v_out := jsonb_set(v_out, ARRAY[v_key],
                         pgdurable.json_merge_patch(v_out -> v_key, v_val), true);
    END IF;
  END LOOP;
  RETURN v_out;
END
$$;
COMMENT ON FUNCTION pgdurable.json_merge_patch(jsonb, jsonb) IS
  'RFC 7396 JSON Merge Patch of target by patch (null members remove keys).';

------------------------------------------------------------------------------
-- pgdurable.fork_run(source, step, state, mode, revision, force) -> uuid
-- As in 0017 (a NEW run continuing the source from checkpoint p_step, its
-- checkpoints and earlier effects copied; the source only read), and:
--   * p_step NULL: from the source's resume point (_resume_step: before a
--     failed step's record that failed it, else its last checkpoint);
--   * the new run's wake is the one that continued from that checkpoint
--     (_wake_at: the outcome of a wait recorded there);
--   * at the resume point, the effects the source recorded after it are
--     copied too, as a retry sees them: succeeded ones kept, failed ones
--     'started' (their replay policy decides), started ones started.
--   * the source's metadata (its labels: tenant, user, ...) is the fork's too,
--     so that the fork is found by the searches that find its source.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.fork_run(p_source uuid, p_step integer, p_state jsonb,
                                              p_mode text, p_revision text,
                                              p_force boolean DEFAULT false)
RETURNS uuid
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs;
  p record;
  v_step integer;
  v_all boolean;
  v_id uuid;
  v_at timestamptz;
BEGIN
  SELECT * INTO r FROM pgdurable.runs x WHERE x.id = p_source FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no run %', p_source USING ERRCODE = 'PD002';
  END IF;
  v_step := coalesce(p_step, pgdurable._resume_step(r));
  v_all := v_step = pgdurable._resume_step(r);
  SELECT * INTO p FROM pgdurable._fork_point(r, v_step, p_state, p_mode, p_revision, p_force);
  INSERT INTO pgdurable.runs (task, revision, queue, priority, state, step, wake, max_attempts,
                              budget, metadata, forked_from, forked_from_step)
  VALUES (r.task, p.revision, r.queue, r.priority, p.state, v_step, p.wake, r.max_attempts,
          r.budget, r.metadata, r.id, v_step)
  RETURNING id INTO v_id;
  INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake, created_at)
  SELECT v_id, c.step, 0, c.state, c.wake, c.created_at
    FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step <= v_step;
  SELECT c.created_at INTO v_at FROM pgdurable.checkpoints c
   WHERE c.run_id = r.id AND c.step = v_step;
  INSERT INTO pgdurable.effects (run_id, key, status, token, result, error, step, created_at,
                                 updated_at)
  SELECT v_id, e.key, CASE WHEN e.status = 'failed' AND NOT x.before THEN 'started'
                           ELSE e.status END,
         0, e.result, CASE WHEN x.before THEN e.error END, e.step, e.created_at, e.updated_at
    FROM pgdurable.effects e
   CROSS JOIN LATERAL (SELECT coalesce(e.step < v_step, e.updated_at <= v_at, false) AS before) x
   WHERE e.run_id = r.id AND (x.before OR v_all);
  PERFORM pg_notify('pgdurable_wake', r.queue);
  RETURN v_id;
END
$$;
COMMENT ON FUNCTION pgdurable.fork_run(uuid, integer, jsonb, text, text, boolean) IS
  'Fork a run from its checkpoint N (NULL: where a retry would continue) into a new run '
  '(history and effects 1..N copied); returns its id.';

------------------------------------------------------------------------------
-- pgdurable.fork_failed(task, error_type, since, revision, force, limit)
--   -> TABLE(source uuid, fork uuid)
-- BULK FORK, as in 0017, each failed run forked from its resume point
-- (fork_run with step NULL): a run failed by a step's recorded error runs
-- that step again in its fork.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.fork_failed(p_task text, p_error_type text,
                                                 p_since timestamptz, p_revision text,
                                                 p_force boolean DEFAULT false,
                                                 p_limit integer DEFAULT 1000)
RETURNS TABLE (source uuid, fork uuid)
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_src uuid;
BEGIN
  IF p_task IS NULL OR p_since IS NULL OR p_limit IS NULL OR p_limit < 1 THEN
    RAISE EXCEPTION 'fork_failed: task and since are required and limit must be >= 1'
      USING ERRCODE = 'PD000';
  END IF;
  FOR v_src IN
    SELECT r.id FROM pgdurable.runs r
     WHERE r.status = 'failed' AND r.task = p_task AND r.finished_at >= p_since
       AND (p_error_type IS NULL OR r.error ->> 'type' = p_error_type)
       AND r.thread_key IS NULL
       AND NOT EXISTS (SELECT 1 FROM pgdurable.runs f WHERE f.forked_from = r.id)
     ORDER BY r.finished_at, r.id
     LIMIT p_limit
  LOOP
    source := v_src;
    fork := pgdurable.fork_run(v_src, NULL, NULL, 'keep', p_revision, p_force);
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.fork_failed(text, text, timestamptz, text, boolean, integer) IS
  'Bulk fork: fork every failed run of a task (by error type, since a time) not forked yet, from '
  'where a retry would continue.';

------------------------------------------------------------------------------
-- pgdurable.rewind_run(id, step, state, mode, revision, force) -> text
-- REWIND IN PLACE, as in 0017, now continuing with the wake recorded after
-- checkpoint p_step (_wake_at: a wait's outcome is not lost) and able to
-- rewind a workflow run to step 0 (its start).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.rewind_run(p_id uuid, p_step integer, p_state jsonb,
                                                p_mode text, p_revision text,
                                                p_force boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._locked_run(p_id);
  p record;
  v_at timestamptz;
  v_checkpoints jsonb;
  v_effects jsonb;
BEGIN
  IF r.status NOT IN ('failed', 'cancelled') THEN
    RAISE EXCEPTION 'run % is %: only failed or cancelled runs can be rewound', p_id, r.status
      USING ERRCODE = 'PD000';
  END IF;
  SELECT * INTO p FROM pgdurable._fork_point(r, p_step, p_state, p_mode, p_revision, p_force);
  SELECT c.created_at INTO v_at FROM pgdurable.checkpoints c
   WHERE c.run_id = r.id AND c.step = p_step;
  -- what the rewind takes away, read first: one INSERT ... VALUES without a subquery
  -- (Citus, a cell: "subqueries are not supported within INSERT queries")
  SELECT coalesce(jsonb_agg(jsonb_build_object('step', c.step, 'token', c.token,
                                               'state', c.state, 'wake', c.wake,
                                               'created_at', c.created_at) ORDER BY c.step), '[]')
    INTO v_checkpoints
    FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step > p_step;
  SELECT coalesce(jsonb_agg(jsonb_build_object('key', e.key, 'status', e.status,
                                               'result', e.result, 'error', e.error,
                                               'step', e.step)
                            ORDER BY e.created_at, e.key), '[]')
    INTO v_effects
    FROM pgdurable.effects e
   WHERE e.run_id = r.id AND NOT coalesce(e.step < p_step, e.updated_at <= v_at, false);
  INSERT INTO pgdurable.run_rewinds (run_id, from_step, to_step, status, error, revision,
                                     checkpoints, effects)
  VALUES (r.id, r.step, p_step, r.status, r.error, r.revision, v_checkpoints, v_effects);
  DELETE FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step > p_step;
  DELETE FROM pgdurable.effects e
   WHERE e.run_id = r.id AND NOT coalesce(e.step < p_step, e.updated_at <= v_at, false);
  UPDATE pgdurable.runs SET status = 'runnable', state = p.state, step = p_step,
         revision = p.revision, attempts = 0, reclaims = 0, claims = 0,
         error = NULL, wake = p.wake, result = NULL, progress = NULL, heartbeat_at = NULL,
         wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
         lease_owner = NULL, lease_expires_at = NULL, cancel_requested_at = NULL,
         available_at = pgdurable.now(), finished_at = NULL, updated_at = pgdurable.now()
   WHERE id = p_id;
  UPDATE pgdurable.run_events SET final = false WHERE run_id = p_id AND final;
  PERFORM pg_notify('pgdurable_wake', r.queue);
  RETURN 'runnable';
END
$$;
COMMENT ON FUNCTION pgdurable.rewind_run(uuid, integer, jsonb, text, text, boolean) IS
  'Rewind a failed or cancelled run in place to checkpoint N (discarded history kept in run_rewinds).';

CREATE OR REPLACE FUNCTION pgdurable._fork_point(r pgdurable.runs, p_step integer, p_state jsonb,
                                      p_mode text, p_revision text, p_force boolean)
RETURNS TABLE (state jsonb, wake jsonb, revision text)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_state jsonb;
BEGIN
  IF r.thread_key IS NOT NULL THEN
    RAISE EXCEPTION 'run % belongs to thread %: thread runs cannot be forked or rewound '
      '(send the thread a message instead)', r.id, r.thread_key USING ERRCODE = 'PD000';
  END IF;
  IF p_mode IS NULL OR p_mode NOT IN ('keep', 'merge', 'replace')
     OR (p_mode <> 'keep' AND p_state IS NULL) THEN
    RAISE EXCEPTION 'state mode must be keep, merge or replace (merge/replace need a state), '
      'not %', coalesce(p_mode, 'NULL') USING ERRCODE = 'PD000';
  END IF;
  IF p_step IS NULL OR p_step < 0 THEN
    RAISE EXCEPTION 'step must be >= 0, not %', coalesce(p_step::text, 'NULL')
      USING ERRCODE = 'PD000';
  END IF;
  v_state := pgdurable._state_at(r, p_step);
  IF p_revision IS NOT NULL AND p_revision IS DISTINCT FROM r.revision AND NOT p_force
     AND NOT EXISTS (SELECT 1 FROM pgdurable.worker_revisions w
                      WHERE w.task = r.task AND w.revision = p_revision) THEN
    RAISE EXCEPTION 'no worker has registered task % revision % (pass force to use it anyway)',
      r.task, p_revision USING ERRCODE = 'PDF02';
  END IF;
  RETURN QUERY SELECT CASE p_mode WHEN 'keep' THEN v_state
                                  WHEN 'merge' THEN pgdurable.json_merge_patch(v_state, p_state)
                                  ELSE p_state END,
                      pgdurable._wake_at(r, p_step),
                      coalesce(p_revision, r.revision);
END
$$;
COMMENT ON FUNCTION pgdurable._fork_point(pgdurable.runs, integer, jsonb, text, text, boolean) IS
  'Internal: the state, wake and revision a fork or rewind of run r continues with from checkpoint p_step.';
