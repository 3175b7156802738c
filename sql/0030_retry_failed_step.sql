-- 0030_retry_failed_step: retrying or forking a failed run runs its failure
-- again instead of replaying it (issue 37).
--
-- A workflow (@app.workflow) records a step's last error as a checkpoint, so
-- that code which catches it and goes on replays the same error later. When
-- nobody catches it, that record is what failed the run: the worker says so
-- in runs.error ("checkpoint": N, the checkpoint that records the error; see
-- pgdurable/workflows.py). Before this migration retry_run, fork_failed and
-- a fork at the last step kept that record, and the run failed again at once
-- with the recorded error, without calling the step. THE RULES:
--
-- * THE RESUME POINT (_resume_step): a failed run whose error names its last
--   checkpoint as the failed step's record continues from the checkpoint
--   before it (the step runs again); any other run from its last checkpoint.
--   A step error the workflow caught stays history (it is not the last
--   checkpoint when the run fails, or not what the run failed with).
-- * RETRY (retry_run) continues from the resume point. The dropped record is
--   kept in run_rewinds (kind 'retry'). The wake that started the failed step
--   (a signal's payload, a sleep that ended) is its wake again. When nothing
--   is dropped the run's pending wake is kept too (before, retry cleared it
--   and a received signal was lost), except a wait that timed out right
--   before the failure: the retried run waits again.
-- * EFFECTS recorded after the resume point that FAILED are no longer taken
--   as their outcome: a retry makes them 'started' again (the previous
--   outcome kept in run_rewinds), so they follow their replay policy: "safe"
--   runs fn again, "reconcile" asks reconcile first (never re-run blindly).
--   Succeeded effects stay recorded (never performed twice). This holds for
--   every kind of run (tasks, durable tasks, workflows: a reconcile step's
--   attempts are such effects).
-- * CHILDREN: when the pending wake is the outcome of a wait on children, a
--   retried parent retries the failed children in it (recursively, by the
--   same rules) and waits for them again; it then sees their new outcomes. A
--   child whose parent has ended cannot be retried alone when its policy is
--   'cancel' (it would be cancelled at once): PD000 names the parent. A child
--   retried while its parent still waits on it is waited for again.
-- * FORK (fork_run) with step NULL forks from the resume point; a fork at the
--   resume point also gets the effects the source recorded after it, as a
--   retry sees them. A fork or rewind at any step carries the wake that
--   continued from that checkpoint (the outcome of a wait recorded there),
--   and step 0 of a workflow run is its start (the input in checkpoint 1).
-- * fork_failed forks every failed run from its resume point.
--
-- LOCK ORDER: retry_run locks the run, then (a child) its parent FOR KEY
-- SHARE, as a child's transitions do. A parent's retry locks its failed
-- children after itself, with NOWAIT: those are terminal, so only another
-- operator action can hold one, and then nothing changes (PD000, try again)
-- instead of a wait that could deadlock with it.

------------------------------------------------------------------------------
-- run_rewinds.kind: a rewind in place, or what a retry dropped or reset.
------------------------------------------------------------------------------
ALTER TABLE pgdurable.run_rewinds ADD COLUMN kind text NOT NULL DEFAULT 'rewind'
  CHECK (kind IN ('rewind', 'retry'));
COMMENT ON COLUMN pgdurable.run_rewinds.kind IS
  'rewind (rewind_run) or retry (retry_run dropped the failed step''s record and/or made '
  'failed effects started again).';
COMMENT ON TABLE pgdurable.run_rewinds IS
  'One row per rewind of a run in place (rewind_run), or per retry that dropped or reset history '
  '(retry_run): what it discarded, so the history stays readable.';
COMMENT ON COLUMN pgdurable.run_rewinds.effects IS
  'A rewind: the discarded effects (recorded at step >= to_step), which run again. A retry: the '
  'failed effects it made started again, with their previous outcome: [{key, status, result, '
  'error, step}].';

------------------------------------------------------------------------------
-- pgdurable._resume_step(r) -> integer
-- Internal: the checkpoint a retry (or a fork with no step) of run r
-- continues from: r.step - 1 when r failed with the error recorded by its
-- last checkpoint (r.error.checkpoint = r.step, and that checkpoint is a
-- workflow step's error record), else r.step.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._resume_step(r pgdurable.runs) RETURNS integer
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
CREATE FUNCTION pgdurable._state_at(r pgdurable.runs, p_step integer) RETURNS jsonb
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
CREATE FUNCTION pgdurable._wake_at(r pgdurable.runs, p_step integer) RETURNS jsonb
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
-- pgdurable._fork_point(r, step, state, mode, revision, force)
--   -> TABLE(state jsonb, wake jsonb, revision text)
-- Internal, shared by fork_run and rewind_run, as in 0017 (thread runs:
-- PD000; mode; step; revision: PDF02), now with the wake the run continues
-- with (_wake_at) and step 0 of a workflow run (_state_at).
------------------------------------------------------------------------------
DROP FUNCTION pgdurable._fork_point(pgdurable.runs, integer, jsonb, text, text, boolean);
CREATE FUNCTION pgdurable._fork_point(r pgdurable.runs, p_step integer, p_state jsonb,
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
CREATE FUNCTION pgdurable._retry(r pgdurable.runs) RETURNS text
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
                              budget, forked_from, forked_from_step)
  VALUES (r.task, p.revision, r.queue, r.priority, p.state, v_step, p.wake, r.max_attempts,
          r.budget, r.id, v_step)
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
BEGIN
  IF r.status NOT IN ('failed', 'cancelled') THEN
    RAISE EXCEPTION 'run % is %: only failed or cancelled runs can be rewound', p_id, r.status
      USING ERRCODE = 'PD000';
  END IF;
  SELECT * INTO p FROM pgdurable._fork_point(r, p_step, p_state, p_mode, p_revision, p_force);
  SELECT c.created_at INTO v_at FROM pgdurable.checkpoints c
   WHERE c.run_id = r.id AND c.step = p_step;
  INSERT INTO pgdurable.run_rewinds (run_id, from_step, to_step, status, error, revision,
                                     checkpoints, effects)
  VALUES (r.id, r.step, p_step, r.status, r.error, r.revision,
          coalesce((SELECT jsonb_agg(jsonb_build_object('step', c.step, 'token', c.token,
                                       'state', c.state, 'wake', c.wake,
                                       'created_at', c.created_at) ORDER BY c.step)
                      FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step > p_step),
                   '[]'),
          coalesce((SELECT jsonb_agg(jsonb_build_object('key', e.key, 'status', e.status,
                                       'result', e.result, 'error', e.error, 'step', e.step)
                                     ORDER BY e.created_at, e.key)
                      FROM pgdurable.effects e
                     WHERE e.run_id = r.id AND NOT coalesce(e.step < p_step, e.updated_at <= v_at, false)),
                   '[]'));
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
