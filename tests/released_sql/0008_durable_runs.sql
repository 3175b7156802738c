-- 0008_durable_runs: durable task definitions (issue 6) run by leased workers,
-- and effect_begin, whose replay flag serves the "reconcile" replay policy of
-- ctx.effect.
--
-- A DurableTask registered with the Durable app runs as an ordinary run:
-- runs.task/revision = definition id/revision, runs.step = next_step_index,
-- runs.state = the task state. What a run row cannot hold is kept here, one
-- row per run in pgdurable.durable_steps: the lease token of the last claim
-- that entered a step (so the engine knows the first step of every claim,
-- where authorize is re-checked) and the "in flight" mark of a reconcile step.
--
-- FENCE (same as 0003, by token): a write applies only while
--   id = p_id AND lease_token = p_token AND status = 'leased'
--   AND lease_expires_at > pgdurable.now()
-- (the token is unique per claim, so it also names the owner); otherwise
-- SQLSTATE PD001 (LeaseLost) and nothing changes.

------------------------------------------------------------------------------
-- durable_steps: per-run bookkeeping of durable task definitions.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.durable_steps (
  run_id       uuid        PRIMARY KEY REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  entered_token bigint     NOT NULL,
  step         integer     CHECK (step IS NULL OR step >= 0),
  step_id      text,
  marked_token bigint,
  marked_at    timestamptz,
  updated_at   timestamptz NOT NULL DEFAULT pgdurable.now(),
  CHECK ((step IS NULL) = (step_id IS NULL) AND (step IS NULL) = (marked_token IS NULL))
);
COMMENT ON TABLE pgdurable.durable_steps IS
  'Runs of durable task definitions: last claim token that entered a step, and the reconcile step marked in flight.';
COMMENT ON COLUMN pgdurable.durable_steps.run_id IS 'The run (deleted with it).';
COMMENT ON COLUMN pgdurable.durable_steps.entered_token IS
  'Lease token of the last claim that entered a step (a new token = first step of a claim: authorize again).';
COMMENT ON COLUMN pgdurable.durable_steps.step IS
  'Index of the reconcile step marked in flight; in flight only while it equals runs.step.';
COMMENT ON COLUMN pgdurable.durable_steps.step_id IS 'Id of the step marked in flight.';
COMMENT ON COLUMN pgdurable.durable_steps.marked_token IS 'Lease token under which the mark was set.';
COMMENT ON COLUMN pgdurable.durable_steps.marked_at IS 'When the mark was set (database clock).';
COMMENT ON COLUMN pgdurable.durable_steps.updated_at IS 'Last change of this row.';

------------------------------------------------------------------------------
-- pgdurable._fenced_token(id, token) -> pgdurable.runs
-- Internal: lock and return the run if the FENCE (by token) holds, else PD001.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._fenced_token(p_id uuid, p_token bigint)
RETURNS pgdurable.runs
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs;
BEGIN
  SELECT * INTO r FROM pgdurable.runs
   WHERE id = p_id AND lease_token = p_token
     AND status = 'leased' AND lease_expires_at > pgdurable.now()
   FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'lease lost on run % (token %)', p_id, p_token USING ERRCODE = 'PD001';
  END IF;
  RETURN r;
END
$$;
COMMENT ON FUNCTION pgdurable._fenced_token(uuid, bigint) IS
  'Internal: lock the run under the lease fence (id + token) or raise PD001 (LeaseLost).';

------------------------------------------------------------------------------
-- pgdurable.durable_step_enter(id, token, step)
--   -> TABLE(first_in_claim boolean, in_flight text)
-- FENCED (PD001). Called before every step of a durable task definition.
-- first_in_claim: no step was entered yet under this token (the first step
-- of a claim, i.e. a start or a resume: authorize is checked). in_flight: the
-- id of the step marked in flight at index p_step by an EARLIER claim (its
-- run was started, its outcome never confirmed: reconcile, never re-run), or
-- NULL. Records p_token as the entered token.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.durable_step_enter(p_id uuid, p_token bigint, p_step integer)
RETURNS TABLE (first_in_claim boolean, in_flight text)
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced_token(p_id, p_token);
  d pgdurable.durable_steps;
BEGIN
  SELECT * INTO d FROM pgdurable.durable_steps x WHERE x.run_id = r.id FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO pgdurable.durable_steps (run_id, entered_token) VALUES (r.id, p_token);
    RETURN QUERY SELECT true, NULL::text;
    RETURN;
  END IF;
  UPDATE pgdurable.durable_steps x SET entered_token = p_token, updated_at = pgdurable.now()
   WHERE x.run_id = r.id AND x.entered_token IS DISTINCT FROM p_token;
  RETURN QUERY SELECT d.entered_token IS DISTINCT FROM p_token,
                      CASE WHEN d.step = p_step AND d.marked_token <> p_token THEN d.step_id END;
END
$$;
COMMENT ON FUNCTION pgdurable.durable_step_enter(uuid, bigint, integer) IS
  'Fenced: enter a durable step; returns (first step of this claim?, step id found in flight or NULL).';

------------------------------------------------------------------------------
-- pgdurable.durable_step_mark(id, token, step, step_id) -> void
-- FENCED (PD001). Mark the reconcile step p_step (p_step_id) in flight,
-- committed BEFORE its run() starts. The mark needs no clearing: the step's
-- checkpoint moves runs.step past it, and a mark counts only at runs.step.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.durable_step_mark(p_id uuid, p_token bigint, p_step integer,
                                            p_step_id text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced_token(p_id, p_token);
BEGIN
  IF p_step IS NULL OR p_step <> r.step OR p_step_id IS NULL OR p_step_id = '' THEN
    RAISE EXCEPTION 'durable_step_mark: step % (%) is not the run''s next step %', p_step,
      p_step_id, r.step USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.durable_steps AS x (run_id, entered_token, step, step_id, marked_token,
                                            marked_at)
  VALUES (r.id, p_token, p_step, p_step_id, p_token, pgdurable.now())
  ON CONFLICT (run_id) DO UPDATE SET step = p_step, step_id = p_step_id,
         marked_token = p_token, marked_at = pgdurable.now(), updated_at = pgdurable.now();
END
$$;
COMMENT ON FUNCTION pgdurable.durable_step_mark(uuid, bigint, integer, text) IS
  'Fenced: mark a durable reconcile step in flight before it runs.';

------------------------------------------------------------------------------
-- pgdurable.effect_begin(id, token, owner, key)
--   -> TABLE(status text, result jsonb, error jsonb, replay boolean)
-- FENCED (PD001). Look up effect (run, key): 'succeeded' / 'failed' are
-- returned as stored (the caller returns the result / raises EffectFailed
-- without acting). Otherwise the effect is recorded 'started' under this
-- token and 'started' is returned: the caller performs it, then calls
-- effect_finish (0003). replay is true when the effect was found 'started'
-- by an EARLIER lease token (a crashed or stopped attempt started it and
-- never recorded its outcome); the row is then taken over by this token and
-- the caller applies the effect's replay policy: "safe" runs fn again,
-- "reconcile" calls reconcile instead.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.effect_begin(p_id uuid, p_token bigint, p_owner text, p_key text)
RETURNS TABLE (status text, result jsonb, error jsonb, replay boolean)
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  e pgdurable.effects;
BEGIN
  SELECT * INTO e FROM pgdurable.effects x WHERE x.run_id = r.id AND x.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO pgdurable.effects (run_id, key, status, token)
    VALUES (r.id, p_key, 'started', p_token);
    RETURN QUERY SELECT 'started'::text, NULL::jsonb, NULL::jsonb, false;
  ELSIF e.status = 'started' THEN
    UPDATE pgdurable.effects x SET token = p_token, updated_at = pgdurable.now()
     WHERE x.run_id = r.id AND x.key = p_key;
    RETURN QUERY SELECT 'started'::text, NULL::jsonb, NULL::jsonb, e.token <> p_token;
  ELSE
    RETURN QUERY SELECT e.status, e.result, e.error, false;
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable.effect_begin(uuid, bigint, text, text) IS
  'Fenced: return a recorded effect outcome, or record the effect as started (replay = an earlier attempt started it).';
