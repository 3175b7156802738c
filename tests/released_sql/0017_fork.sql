-- 0017_fork: fix a run that went wrong. Fork a run from any recorded step
-- (fork_run, bulk fork_failed), rewind a failed or cancelled run in place
-- (rewind_run, history kept in run_rewinds), step-level heartbeats with
-- progress (record_heartbeat) and a registry of the (task, revision) pairs
-- that started workers serve (worker_revisions), which a fork to another
-- revision checks.
--
-- WHICH STEP AN EFFECT BELONGS TO. effect_begin (0008) records an effect
-- while its run is locked under the lease fence; the BEFORE INSERT trigger
-- effects_step stores the run's step index at that moment (runs.step = the
-- number of checkpoints so far = the 0-based index of the running step).
-- An effect with step < N happened in steps 1..N, i.e. before checkpoint N.
-- Effects recorded before this migration have step NULL: for them, "before
-- checkpoint N" means updated_at <= that checkpoint's created_at.

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN forked_from uuid
  REFERENCES pgdurable.runs (id) ON DELETE SET NULL;
ALTER TABLE pgdurable.runs ADD COLUMN forked_from_step integer
  CHECK (forked_from_step IS NULL OR forked_from_step >= 0);
ALTER TABLE pgdurable.runs ADD COLUMN progress jsonb;
ALTER TABLE pgdurable.runs ADD COLUMN heartbeat_at timestamptz;
COMMENT ON COLUMN pgdurable.runs.forked_from IS
  'The run this one was forked from (fork_run), NULL otherwise (or once the source was pruned).';
COMMENT ON COLUMN pgdurable.runs.forked_from_step IS
  'The source run''s checkpoint this fork continues from (its history 1..N was copied).';
COMMENT ON COLUMN pgdurable.runs.progress IS
  'The last progress a step reported with ctx.heartbeat(progress) (JSON), NULL if none.';
COMMENT ON COLUMN pgdurable.runs.heartbeat_at IS
  'When a step last called ctx.heartbeat (database clock); step-level liveness, '
  'separate from the worker''s lease renewal (lease_expires_at).';
-- "forks of a run" (bulk fork skips sources already forked; ON DELETE SET NULL)
CREATE INDEX runs_forked_from_idx ON pgdurable.runs (forked_from) WHERE forked_from IS NOT NULL;
-- bulk fork: failed runs of a task by finish time
CREATE INDEX runs_failed_task_idx ON pgdurable.runs (task, finished_at) WHERE status = 'failed';

ALTER TABLE pgdurable.effects ADD COLUMN step integer CHECK (step IS NULL OR step >= 0);
COMMENT ON COLUMN pgdurable.effects.step IS
  'The run''s step index (runs.step, 0-based) when the effect was first recorded; NULL for '
  'effects recorded before migration 0012_fork.';

------------------------------------------------------------------------------
-- run_rewinds: the history of rewind_run (what a rewind discarded).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.run_rewinds (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_id      uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  from_step   integer     NOT NULL,
  to_step     integer     NOT NULL,
  status      text        NOT NULL,
  error       jsonb,
  revision    text        NOT NULL,
  checkpoints jsonb       NOT NULL,
  effects     jsonb       NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT pgdurable.now()
);
CREATE INDEX run_rewinds_run_idx ON pgdurable.run_rewinds (run_id, id);
COMMENT ON TABLE pgdurable.run_rewinds IS
  'One row per rewind of a run in place (rewind_run): what it discarded, so the history stays readable.';
COMMENT ON COLUMN pgdurable.run_rewinds.id IS 'Rewind number (global, increasing).';
COMMENT ON COLUMN pgdurable.run_rewinds.run_id IS 'The rewound run.';
COMMENT ON COLUMN pgdurable.run_rewinds.from_step IS 'runs.step before the rewind.';
COMMENT ON COLUMN pgdurable.run_rewinds.to_step IS 'The checkpoint the run continues from.';
COMMENT ON COLUMN pgdurable.run_rewinds.status IS 'The run''s status before the rewind (failed | cancelled).';
COMMENT ON COLUMN pgdurable.run_rewinds.error IS 'The run''s error before the rewind.';
COMMENT ON COLUMN pgdurable.run_rewinds.revision IS 'The run''s revision before the rewind.';
COMMENT ON COLUMN pgdurable.run_rewinds.checkpoints IS
  'The discarded checkpoints (steps > to_step): [{step, token, state, wake, created_at}].';
COMMENT ON COLUMN pgdurable.run_rewinds.effects IS
  'The discarded effects (recorded at step >= to_step), which run again: [{key, status, result, error, step}].';
COMMENT ON COLUMN pgdurable.run_rewinds.created_at IS 'When the rewind happened.';

------------------------------------------------------------------------------
-- worker_revisions: the (task, revision) pairs that started workers serve.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.worker_revisions (
  worker_id  text        NOT NULL,
  task       text        NOT NULL,
  revision   text        NOT NULL,
  started_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (worker_id, task)
);
CREATE INDEX worker_revisions_task_idx ON pgdurable.worker_revisions (task, revision);
COMMENT ON TABLE pgdurable.worker_revisions IS
  'Task revisions registered by workers when they start (removed when they stop cleanly; a '
  'crashed worker''s rows stay until a worker with the same id starts or they are deleted). '
  'fork_run/rewind_run to another revision require a row here unless forced.';
COMMENT ON COLUMN pgdurable.worker_revisions.worker_id IS 'The worker''s id (lease owner name).';
COMMENT ON COLUMN pgdurable.worker_revisions.task IS 'A task the worker runs.';
COMMENT ON COLUMN pgdurable.worker_revisions.revision IS 'The revision of that task it runs.';
COMMENT ON COLUMN pgdurable.worker_revisions.started_at IS 'When the worker registered it.';

------------------------------------------------------------------------------
-- pgdurable._effects_step() -> trigger (BEFORE INSERT ON effects)
-- Stamp a new effect with its run's current step index (see the header).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._effects_step() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF NEW.step IS NULL THEN
    SELECT r.step INTO NEW.step FROM pgdurable.runs r WHERE r.id = NEW.run_id;
  END IF;
  RETURN NEW;
END
$$;
COMMENT ON FUNCTION pgdurable._effects_step() IS
  'Trigger: stamp a new effect with its run''s step index (which step performed it).';
CREATE TRIGGER effects_step BEFORE INSERT ON pgdurable.effects
  FOR EACH ROW EXECUTE FUNCTION pgdurable._effects_step();

------------------------------------------------------------------------------
-- pgdurable.json_merge_patch(target, patch) -> jsonb
-- RFC 7396 JSON Merge Patch: a patch that is not an object replaces the
-- target; an object patch sets its members recursively, a null member
-- removes the key. A target that is not an object counts as {}.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.json_merge_patch(p_target jsonb, p_patch jsonb) RETURNS jsonb
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
-- pgdurable._fork_point(r, step, state, mode, revision, force)
--   -> TABLE(state jsonb, revision text)
-- Internal, shared by fork_run and rewind_run: the state a run continues
-- with from checkpoint p_step of run r, and the revision it runs on.
-- p_step must be a recorded checkpoint of r (1..r.step), or 0 when r has
-- none yet (its state is then the start state): else PDF01, StepNotRecorded.
-- p_mode: 'keep' (the checkpoint's state), 'merge' (RFC 7396 merge patch
-- p_state onto it) or 'replace' (p_state). A thread run: PD000 (a thread has
-- one owner; send it a message instead). p_revision NULL keeps r.revision;
-- another revision needs a worker_revisions row for (r.task, p_revision)
-- unless p_force: else PDF02, RevisionNotServed.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._fork_point(r pgdurable.runs, p_step integer, p_state jsonb,
                                      p_mode text, p_revision text, p_force boolean)
RETURNS TABLE (state jsonb, revision text)
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
  IF p_step = 0 AND r.step = 0 THEN
    v_state := r.state;
  ELSE
    SELECT c.state INTO v_state FROM pgdurable.checkpoints c
     WHERE c.run_id = r.id AND c.step = p_step AND p_step >= 1 AND p_step <= r.step;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'run % has no recorded step % (its checkpoints: 1..%)', r.id, p_step,
        r.step USING ERRCODE = 'PDF01';
    END IF;
  END IF;
  IF p_revision IS NOT NULL AND p_revision IS DISTINCT FROM r.revision AND NOT p_force
     AND NOT EXISTS (SELECT 1 FROM pgdurable.worker_revisions w
                      WHERE w.task = r.task AND w.revision = p_revision) THEN
    RAISE EXCEPTION 'no worker has registered task % revision % (pass force to use it anyway)',
      r.task, p_revision USING ERRCODE = 'PDF02';
  END IF;
  RETURN QUERY SELECT CASE p_mode WHEN 'keep' THEN v_state
                                  WHEN 'merge' THEN pgdurable.json_merge_patch(v_state, p_state)
                                  ELSE p_state END,
                      coalesce(p_revision, r.revision);
END
$$;
COMMENT ON FUNCTION pgdurable._fork_point(pgdurable.runs, integer, jsonb, text, text, boolean) IS
  'Internal: the state and revision a fork or rewind of run r continues with from checkpoint p_step.';

------------------------------------------------------------------------------
-- pgdurable.fork_run(source, step, state, mode, revision, force) -> uuid
-- A NEW run continuing the source run from its checkpoint p_step (see
-- _fork_point for step, state mode, revision and their errors). In one
-- transaction: the new run is inserted runnable (same task, queue,
-- priority, max_attempts, budget; spent 0, no deadline, top-level), with
-- step = p_step, forked_from = source, forked_from_step = p_step; the
-- source's checkpoints 1..p_step are copied (token 0: written before this
-- run's first claim); the source's effects recorded in steps 1..p_step are
-- copied, so they are returned from the record, not performed again
-- (effects of later steps are not copied and run again). NOTIFY
-- pgdurable_wake(queue). The source run is only read (FOR KEY SHARE).
-- Unknown source: PD002. Any status of the source can be forked.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.fork_run(p_source uuid, p_step integer, p_state jsonb, p_mode text,
                                   p_revision text, p_force boolean DEFAULT false)
RETURNS uuid
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs;
  p record;
  v_id uuid;
  v_at timestamptz;
BEGIN
  SELECT * INTO r FROM pgdurable.runs x WHERE x.id = p_source FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no run %', p_source USING ERRCODE = 'PD002';
  END IF;
  SELECT * INTO p FROM pgdurable._fork_point(r, p_step, p_state, p_mode, p_revision, p_force);
  INSERT INTO pgdurable.runs (task, revision, queue, priority, state, step, max_attempts,
                              budget, forked_from, forked_from_step)
  VALUES (r.task, p.revision, r.queue, r.priority, p.state, p_step, r.max_attempts,
          r.budget, r.id, p_step)
  RETURNING id INTO v_id;
  INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake, created_at)
  SELECT v_id, c.step, 0, c.state, c.wake, c.created_at
    FROM pgdurable.checkpoints c WHERE c.run_id = r.id AND c.step <= p_step;
  SELECT c.created_at INTO v_at FROM pgdurable.checkpoints c
   WHERE c.run_id = r.id AND c.step = p_step;
  INSERT INTO pgdurable.effects (run_id, key, status, token, result, error, step, created_at,
                                 updated_at)
  SELECT v_id, e.key, e.status, 0, e.result, e.error, e.step, e.created_at, e.updated_at
    FROM pgdurable.effects e
   WHERE e.run_id = r.id
     AND coalesce(e.step < p_step, e.updated_at <= v_at, false);
  PERFORM pg_notify('pgdurable_wake', r.queue);
  RETURN v_id;
END
$$;
COMMENT ON FUNCTION pgdurable.fork_run(uuid, integer, jsonb, text, text, boolean) IS
  'Fork a run from its checkpoint N into a new run (history and effects 1..N copied); returns its id.';

------------------------------------------------------------------------------
-- pgdurable.fork_failed(task, error_type, since, revision, force, limit)
--   -> TABLE(source uuid, fork uuid)
-- BULK FORK. Every run of p_task that is 'failed' with error->>'type' =
-- p_error_type (any type when NULL) and finished_at >= p_since, and that
-- has no fork yet (so calling it again forks only new failures), is forked
-- from its LAST checkpoint with its state kept (fork_run(id, step, NULL,
-- 'keep', p_revision, p_force)), oldest first, at most p_limit runs. One
-- transaction: a revision no worker serves (PDF02) forks nothing. Thread
-- runs are skipped.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.fork_failed(p_task text, p_error_type text, p_since timestamptz,
                                      p_revision text, p_force boolean DEFAULT false,
                                      p_limit integer DEFAULT 1000)
RETURNS TABLE (source uuid, fork uuid)
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_src uuid;
  v_step integer;
BEGIN
  IF p_task IS NULL OR p_since IS NULL OR p_limit IS NULL OR p_limit < 1 THEN
    RAISE EXCEPTION 'fork_failed: task and since are required and limit must be >= 1'
      USING ERRCODE = 'PD000';
  END IF;
  FOR v_src, v_step IN
    SELECT r.id, r.step FROM pgdurable.runs r
     WHERE r.status = 'failed' AND r.task = p_task AND r.finished_at >= p_since
       AND (p_error_type IS NULL OR r.error ->> 'type' = p_error_type)
       AND r.thread_key IS NULL
       AND NOT EXISTS (SELECT 1 FROM pgdurable.runs f WHERE f.forked_from = r.id)
     ORDER BY r.finished_at, r.id
     LIMIT p_limit
  LOOP
    source := v_src;
    fork := pgdurable.fork_run(v_src, v_step, NULL, 'keep', p_revision, p_force);
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.fork_failed(text, text, timestamptz, text, boolean, integer) IS
  'Bulk fork: fork every failed run of a task (by error type, since a time) not forked yet, from its last checkpoint.';

------------------------------------------------------------------------------
-- pgdurable.rewind_run(id, step, state, mode, revision, force) -> text
-- REWIND IN PLACE (same run id) of a 'failed' or 'cancelled' run (else
-- PD000; unknown id PD002) to its checkpoint p_step (see _fork_point for
-- step, state mode, revision and their errors). One transaction: a
-- run_rewinds row keeps what is discarded (checkpoints after p_step,
-- effects recorded at step >= p_step, previous status, error, revision);
-- those checkpoints and effects are deleted (the effects run again); the
-- run becomes runnable like retry_run (attempts, reclaims, claims reset)
-- with step = p_step and the chosen state and revision; NOTIFY
-- pgdurable_wake(queue). Returns 'runnable'.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.rewind_run(p_id uuid, p_step integer, p_state jsonb, p_mode text,
                                     p_revision text, p_force boolean DEFAULT false)
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
         error = NULL, wake = NULL, result = NULL, progress = NULL, heartbeat_at = NULL,
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

------------------------------------------------------------------------------
-- pgdurable.record_heartbeat(id, token, owner, progress) -> void
-- FENCED (PD001). A step's heartbeat: progress and heartbeat_at = now().
-- Step-level liveness only: it does not renew the lease (renew_runs does).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.record_heartbeat(p_id uuid, p_token bigint, p_owner text,
                                           p_progress jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  UPDATE pgdurable.runs SET progress = coalesce(p_progress, progress),
         heartbeat_at = pgdurable.now()
   WHERE id = r.id;
END
$$;
COMMENT ON FUNCTION pgdurable.record_heartbeat(uuid, bigint, text, jsonb) IS
  'Fenced: record a step heartbeat (progress, heartbeat_at); does not renew the lease.';

------------------------------------------------------------------------------
-- pgdurable.register_worker(worker_id, tasks, revisions) -> void
-- A starting worker registers the (task, revision) pairs it serves
-- (replacing its earlier rows). Arrays of different lengths: PD000.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.register_worker(p_worker text, p_tasks text[], p_revisions text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_worker IS NULL OR cardinality(p_tasks) IS DISTINCT FROM cardinality(p_revisions) THEN
    RAISE EXCEPTION 'register_worker: a worker id and tasks/revisions of the same length'
      USING ERRCODE = 'PD000';
  END IF;
  DELETE FROM pgdurable.worker_revisions w WHERE w.worker_id = p_worker;
  INSERT INTO pgdurable.worker_revisions (worker_id, task, revision)
  SELECT p_worker, t, v FROM unnest(p_tasks, p_revisions) AS u(t, v)
  ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION pgdurable.register_worker(text, text[], text[]) IS
  'Register the task revisions a starting worker serves (checked by fork_run to another revision).';

------------------------------------------------------------------------------
-- pgdurable.unregister_worker(worker_id) -> void
-- A worker that stops cleanly removes its worker_revisions rows.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.unregister_worker(p_worker text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  DELETE FROM pgdurable.worker_revisions w WHERE w.worker_id = p_worker
$$;
COMMENT ON FUNCTION pgdurable.unregister_worker(text) IS
  'Remove the task revisions of a worker that stopped cleanly.';

------------------------------------------------------------------------------
-- pgdurable.run_lineage: lineage, rewinds and step liveness per run (a view:
-- readable by the read-only operator role too).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_lineage AS
  SELECT r.id,
         r.task,
         r.revision,
         r.status,
         r.step,
         r.forked_from,
         r.forked_from_step,
         (SELECT count(*) FROM pgdurable.runs f WHERE f.forked_from = r.id)    AS forks,
         (SELECT count(*) FROM pgdurable.run_rewinds w WHERE w.run_id = r.id)  AS rewinds,
         r.progress,
         r.heartbeat_at,
         pgdurable.now() - r.heartbeat_at                                      AS heartbeat_age
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_lineage IS
  'Per run: where it was forked from, how often it was forked and rewound, its last step heartbeat.';
COMMENT ON COLUMN pgdurable.run_lineage.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_lineage.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_lineage.revision IS 'Task revision.';
COMMENT ON COLUMN pgdurable.run_lineage.status IS 'Run status.';
COMMENT ON COLUMN pgdurable.run_lineage.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_lineage.forked_from IS 'The run it was forked from, if any.';
COMMENT ON COLUMN pgdurable.run_lineage.forked_from_step IS 'The source checkpoint it continues from.';
COMMENT ON COLUMN pgdurable.run_lineage.forks IS 'How many runs were forked from it.';
COMMENT ON COLUMN pgdurable.run_lineage.rewinds IS 'How many times it was rewound in place (pgdurable.run_rewinds).';
COMMENT ON COLUMN pgdurable.run_lineage.progress IS 'Last progress reported by ctx.heartbeat.';
COMMENT ON COLUMN pgdurable.run_lineage.heartbeat_at IS 'When a step last called ctx.heartbeat.';
COMMENT ON COLUMN pgdurable.run_lineage.heartbeat_age IS 'pgdurable.now() - heartbeat_at.';
