-- functions/effects.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.effect_finish(id, token, owner, key, succeeded, result, error) -> void
-- FENCED (PD001). Record the outcome of a started effect: 'succeeded' with
-- result, or 'failed' with error {type, message}.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.effect_finish(p_id uuid, p_token bigint, p_owner text, p_key text,
                                        p_succeeded boolean, p_result jsonb, p_error jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  UPDATE pgdurable.effects SET
         status = CASE WHEN p_succeeded THEN 'succeeded' ELSE 'failed' END,
         result = p_result, error = p_error, token = p_token, updated_at = pgdurable.now()
   WHERE run_id = r.id AND key = p_key;
END
$$;
COMMENT ON FUNCTION pgdurable.effect_finish(uuid, bigint, text, text, boolean, jsonb, jsonb) IS
  'Fenced: record a started effect as succeeded (result) or failed (error).';

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
CREATE OR REPLACE FUNCTION pgdurable.durable_step_enter(p_id uuid, p_token bigint, p_step integer)
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
CREATE OR REPLACE FUNCTION pgdurable.durable_step_mark(p_id uuid, p_token bigint, p_step integer,
                                            p_step_id text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced_token(p_id, p_token);
  -- v_now, not pgdurable.now(), in DO UPDATE: Citus refuses non-IMMUTABLE calls there (a cell)
  v_now timestamptz := pgdurable.now();
BEGIN
  IF p_step IS NULL OR p_step <> r.step OR p_step_id IS NULL OR p_step_id = '' THEN
    RAISE EXCEPTION 'durable_step_mark: step % (%) is not the run''s next step %', p_step,
      p_step_id, r.step USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.durable_steps AS x (run_id, entered_token, step, step_id, marked_token,
                                            marked_at)
  VALUES (r.id, p_token, p_step, p_step_id, p_token, v_now)
  ON CONFLICT (run_id) DO UPDATE SET step = p_step, step_id = p_step_id,
         marked_token = p_token, marked_at = v_now, updated_at = v_now;
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
CREATE OR REPLACE FUNCTION pgdurable.effect_begin(p_id uuid, p_token bigint, p_owner text, p_key text)
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

------------------------------------------------------------------------------
-- pgdurable._effects_step() -> trigger (BEFORE INSERT ON effects)
-- Stamp a new effect with its run's current step index (see the header).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._effects_step() RETURNS trigger
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
DROP TRIGGER IF EXISTS effects_step ON pgdurable.effects;
CREATE TRIGGER effects_step BEFORE INSERT ON pgdurable.effects
  FOR EACH ROW EXECUTE FUNCTION pgdurable._effects_step();
