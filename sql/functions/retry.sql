-- functions/retry.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.retry_run(id) -> text (the new status: 'runnable', or 'waiting'
-- when the run waits again on children it retried)
-- A failed or cancelled run continues from its resume point (see the header
-- and _retry): attempts, reclaims and claims reset, its pending wake kept
-- (a wait that timed out waits again), a failed step's record dropped (kept
-- in run_rewinds), failed effects after the resume point 'started' again (their
-- replay policy decides), the failed children of a pending wait on children
-- retried with it. The deadline is kept (a run past its deadline fails
-- again at its next boundary). Unknown id: PD002. Any other status: PD000,
-- nothing changes. A thread run can be retried only while it is its
-- thread's latest run (else PD000). A child whose parent has ended and whose
-- policy is 'cancel': PD000 (retry the parent); a child its parent still
-- waits on is waited for again.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.retry_run(p_id uuid) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._locked_run(p_id);
  v_later uuid;
  p pgdurable.runs;
  v_status text;
BEGIN
  IF r.status NOT IN ('failed', 'cancelled') THEN
    RAISE EXCEPTION 'run % is %: only failed or cancelled runs can be retried', p_id, r.status
      USING ERRCODE = 'PD000';
  END IF;
  IF r.thread_key IS NOT NULL THEN
    SELECT x.id INTO v_later FROM pgdurable.runs x
     WHERE x.thread_key = r.thread_key AND x.thread_no > r.thread_no
     ORDER BY x.thread_no DESC LIMIT 1;
    IF v_later IS NOT NULL THEN
      RAISE EXCEPTION 'run % is not the latest run of its thread (run % is): only the latest '
        'run of a thread can be retried; send the thread a message instead', p_id, v_later
        USING ERRCODE = 'PD000';
    END IF;
  END IF;
  IF r.parent_run_id IS NOT NULL THEN
    SELECT * INTO p FROM pgdurable.runs x WHERE x.id = r.parent_run_id FOR KEY SHARE;
    IF FOUND AND r.parent_policy = 'cancel'
       AND p.status IN ('completed', 'failed', 'cancelled', 'incompatible') THEN
      RAISE EXCEPTION 'run % is a child of run %, which has ended (%): retried alone it would '
        'be cancelled at once; retry run % instead (a retried parent retries the failed '
        'children it waited on)', p_id, p.id, p.status, p.id USING ERRCODE = 'PD000';
    END IF;
  END IF;
  v_status := pgdurable._retry(r);
  IF p.id IS NOT NULL AND p.status = 'waiting' AND p.wait_kind = 'children' THEN
    -- its parent still waits on its children: it waits for this one's new outcome
    UPDATE pgdurable.child_wait_sets s SET remaining = s.remaining + 1
     WHERE s.parent_run_id = p.id AND p_id = ANY (s.ids)
       AND NOT EXISTS (SELECT FROM pgdurable.child_waits w WHERE w.child_run_id = p_id);
    IF FOUND THEN
      INSERT INTO pgdurable.child_waits (child_run_id, parent_run_id) VALUES (p_id, p.id)
      ON CONFLICT (child_run_id) DO UPDATE SET parent_run_id = excluded.parent_run_id;
    END IF;
  END IF;
  RETURN v_status;
END
$$;
COMMENT ON FUNCTION pgdurable.retry_run(uuid) IS
  'Make a failed or cancelled run live again from its resume point (a failed step runs again); '
  'returns runnable, or waiting on the failed children it retried.';

------------------------------------------------------------------------------
-- pgdurable._resume_step(r) -> integer
-- Internal: the checkpoint a retry (or a fork with no step) of run r
-- continues from: r.step - 1 when r failed with the error recorded by its
-- last checkpoint (r.error.checkpoint = r.step, and that checkpoint is a
-- workflow step's error record), else r.step.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._resume_step(r pgdurable.runs) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE WHEN r.status = 'failed' AND r.step >= 1
               AND jsonb_typeof(r.error -> 'checkpoint') = 'number'
               AND r.error ->> 'checkpoint' = r.step::text
               AND EXISTS (SELECT FROM pgdurable.checkpoints c
                            WHERE c.run_id = r.id AND c.step = r.step
                              AND c.state -> 'workflow' ->> 'kind' = 'step'
                              AND c.state -> 'workflow' ? 'error')
              THEN r.step - 1 ELSE r.step END
$$;
COMMENT ON FUNCTION pgdurable._resume_step(pgdurable.runs) IS
  'Internal: where a retry of run r continues (before a failed step''s record that failed it).';

------------------------------------------------------------------------------
-- pgdurable._state_at(r, step) -> jsonb
-- Internal: the state run r continues with from its checkpoint p_step:
-- that checkpoint's state (1..r.step); for 0, the start state: r.state when
-- r has no checkpoint, else a workflow's input (checkpoint 1 holds it).
-- Otherwise PDF01 (StepNotRecorded).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._state_at(r pgdurable.runs, p_step integer) RETURNS jsonb
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_state jsonb;
BEGIN
  IF p_step = 0 AND r.step = 0 THEN
    RETURN r.state;
  ELSIF p_step = 0 THEN
    SELECT c.state -> 'input' INTO v_state FROM pgdurable.checkpoints c
     WHERE c.run_id = r.id AND c.step = 1 AND c.state ? 'workflow' AND c.state ? 'input';
  ELSE
    SELECT c.state INTO v_state FROM pgdurable.checkpoints c
     WHERE c.run_id = r.id AND c.step = p_step AND p_step >= 1 AND p_step <= r.step;
  END IF;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % has no recorded step % (its checkpoints: 1..%)', r.id, p_step,
      r.step USING ERRCODE = 'PDF01';
  END IF;
  RETURN v_state;
END
$$;
COMMENT ON FUNCTION pgdurable._state_at(pgdurable.runs, integer) IS
  'Internal: the state run r continues with from checkpoint N (0: its start state), or PDF01.';

------------------------------------------------------------------------------
-- pgdurable._wake_at(r, step) -> jsonb
-- Internal: the wake run r continues with from its checkpoint p_step: the
-- wake recorded with checkpoint p_step + 1 (what started that step: a
-- signal's payload, a timer, children's outcomes), or, from the last
-- checkpoint, the run's pending wake, except that a failed or cancelled run
-- whose last wait timed out (a signal or inbox wait, not a sleep or a
-- rate-limit park) waits again: NULL.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._wake_at(r pgdurable.runs, p_step integer) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE
    WHEN p_step < r.step THEN (SELECT c.wake FROM pgdurable.checkpoints c
                                WHERE c.run_id = r.id AND c.step = p_step + 1)
    WHEN r.status IN ('failed', 'cancelled') AND r.wake ->> 'type' = 'timeout'
         AND r.wake ->> 'kind' IS NOT NULL AND r.wake ->> 'kind' <> 'pgdurable.acquire'
         AND NOT r.wake ? 'children' THEN NULL
    ELSE r.wake END
$$;
COMMENT ON FUNCTION pgdurable._wake_at(pgdurable.runs, integer) IS
  'Internal: the wake run r continues with from checkpoint N (a timed-out last wait: NULL).';

------------------------------------------------------------------------------
-- pgdurable._retry(r) -> text (the new status: 'runnable' or 'waiting')
-- Internal: retry the locked failed or cancelled run r by the rules in the
-- header (the caller checked its status, thread and parent). In order:
--  1. from the resume point: a dropped failed step's record goes to
--     run_rewinds (kind 'retry') with the failed effects made 'started';
--  2. the run becomes runnable (attempts, reclaims, claims reset; error,
--     result, wait, lease, cancel request, finished_at cleared; available
--     now; its end event no longer final);
--  3. a pending wake on children: its failed children are retried (locked
--     NOWAIT: a child another transaction holds -> PD000, nothing changes)
--     and the run waits until every live one has finished again (wake.children
--     is then their outcomes); with none live it gets their current outcomes;
--  4. NOTIFY pgdurable_wake(queue) when runnable.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._retry(r pgdurable.runs) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_to integer := pgdurable._resume_step(r);
  v_state jsonb := r.state;
  v_wake jsonb := pgdurable._wake_at(r, pgdurable._resume_step(r));
  v_at timestamptz;
  v_dropped jsonb;
  v_reset jsonb;
  v_ids uuid[];
  v_kid pgdurable.runs;
  v_live integer;
BEGIN
  IF v_to < r.step THEN
    v_state := pgdurable._state_at(r, v_to);
    SELECT jsonb_agg(jsonb_build_object('step', c.step, 'token', c.token, 'state', c.state,
                                        'wake', c.wake, 'created_at', c.created_at)
                     ORDER BY c.step)
      INTO v_dropped FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step > v_to;
    DELETE FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step > v_to;
  END IF;
  SELECT c.created_at INTO v_at FROM pgdurable.checkpoints c
   WHERE c.run_id = r.id AND c.step = v_to;
  SELECT jsonb_agg(jsonb_build_object('key', e.key, 'status', e.status, 'result', e.result,
                                      'error', e.error, 'step', e.step)
                   ORDER BY e.created_at, e.key)
    INTO v_reset FROM pgdurable.effects e
   WHERE e.run_id = r.id AND e.status = 'failed'
     AND NOT coalesce(e.step < v_to, e.updated_at <= v_at, false);
  IF v_reset IS NOT NULL THEN
    UPDATE pgdurable.effects e SET status = 'started', result = NULL, error = NULL,
           updated_at = pgdurable.now()
     WHERE e.run_id = r.id AND e.status = 'failed'
       AND NOT coalesce(e.step < v_to, e.updated_at <= v_at, false);
  END IF;
  IF v_dropped IS NOT NULL OR v_reset IS NOT NULL THEN
    INSERT INTO pgdurable.run_rewinds (run_id, from_step, to_step, status, error, revision,
                                       checkpoints, effects, kind)
    VALUES (r.id, r.step, v_to, r.status, r.error, r.revision, coalesce(v_dropped, '[]'),
            coalesce(v_reset, '[]'), 'retry');
  END IF;
  UPDATE pgdurable.runs SET status = 'runnable', state = v_state, step = v_to,
         attempts = 0, reclaims = 0, claims = 0, error = NULL, wake = v_wake, result = NULL,
         wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
         lease_owner = NULL, lease_expires_at = NULL, cancel_requested_at = NULL,
         available_at = pgdurable.now(), finished_at = NULL, updated_at = pgdurable.now()
   WHERE id = r.id;
  -- its end event is no longer its end: streams follow the revived run past it
  UPDATE pgdurable.run_events SET final = false WHERE run_id = r.id AND final;
  IF jsonb_typeof(v_wake -> 'children') = 'object' THEN
    SELECT array_agg(k::uuid) INTO v_ids FROM jsonb_object_keys(v_wake -> 'children') k;
    FOR v_kid IN
      SELECT * FROM pgdurable.runs c
       WHERE c.id = ANY (v_ids) AND c.parent_run_id = r.id AND c.status = 'failed'
       ORDER BY c.id
    LOOP
      BEGIN
        PERFORM FROM pgdurable.runs c WHERE c.id = v_kid.id FOR UPDATE NOWAIT;
      EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'run %: its failed child % is held by another transaction; nothing '
          'changed, retry again', r.id, v_kid.id USING ERRCODE = 'PD000';
      END;
      SELECT * INTO v_kid FROM pgdurable.runs c WHERE c.id = v_kid.id;
      IF v_kid.status = 'failed' THEN
        PERFORM pgdurable._retry(v_kid);
      END IF;
    END LOOP;
    SELECT count(*) INTO v_live FROM pgdurable.runs c
     WHERE c.id = ANY (v_ids)
       AND c.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible');
    IF v_live > 0 THEN
      INSERT INTO pgdurable.child_wait_sets AS s (parent_run_id, remaining, ids)
      VALUES (r.id, v_live, v_ids)
      ON CONFLICT (parent_run_id) DO UPDATE SET remaining = excluded.remaining, ids = excluded.ids;
      DELETE FROM pgdurable.child_waits w WHERE w.parent_run_id = r.id;
      INSERT INTO pgdurable.child_waits (child_run_id, parent_run_id)
      SELECT c.id, r.id FROM pgdurable.runs c
       WHERE c.id = ANY (v_ids)
         AND c.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible')
      ON CONFLICT (child_run_id) DO UPDATE SET parent_run_id = excluded.parent_run_id;
      UPDATE pgdurable.runs x SET status = 'waiting', wake = NULL, wait_kind = 'children',
             wait_ref = r.id::text, wait_since = pgdurable.now(), wake_at = r.deadline_at,
             updated_at = pgdurable.now()
       WHERE x.id = r.id;
      RETURN 'waiting';
    END IF;
    UPDATE pgdurable.runs x
       SET wake = v_wake || jsonb_build_object('children', pgdurable._children_outcomes(v_ids))
     WHERE x.id = r.id;
  END IF;
  PERFORM pg_notify('pgdurable_wake', r.queue);
  RETURN 'runnable';
END
$$;
COMMENT ON FUNCTION pgdurable._retry(pgdurable.runs) IS
  'Internal: retry a locked failed/cancelled run from its resume point (failed effects started '
  'again, failed children of a pending children wake retried); returns its new status.';
