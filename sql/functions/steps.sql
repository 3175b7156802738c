-- functions/steps.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.renew_runs(owner, ids, tokens, ttl) -> TABLE(id, lease_expires_at,
-- cancel_requested): the heartbeat, as in 0003, found by primary key with a
-- generic plan (above).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.renew_runs(p_owner text, p_ids uuid[], p_tokens bigint[],
                                                p_ttl interval)
RETURNS TABLE (id uuid, lease_expires_at timestamptz, cancel_requested boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
BEGIN
  IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
    RAISE EXCEPTION 'renew_runs: ttl must be a positive interval, got %', p_ttl
      USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  UPDATE pgdurable.runs r SET lease_expires_at = pgdurable.now() + p_ttl
  FROM unnest(p_ids, p_tokens) AS u(id, token)
  WHERE r.id = u.id AND r.lease_token = u.token AND r.lease_owner = p_owner
    AND r.status IS NOT DISTINCT FROM 'leased' AND r.lease_expires_at > pgdurable.now()
  RETURNING r.id, r.lease_expires_at, r.cancel_requested_at IS NOT NULL;
END
$$;
COMMENT ON FUNCTION pgdurable.renew_runs(text, uuid[], bigint[], interval) IS
  'Heartbeat: renew all of a worker''s live leases in one UPDATE; returns the renewed ones.';

------------------------------------------------------------------------------
-- pgdurable._checkpoint(run, token, state): internal, write the step's state:
-- runs.state/step + 1/wake := NULL/reclaims := 0 and the checkpoints history
-- row (with the wake the step saw and the lease owner r holds). Returns the
-- new step number. (0003's definition + owner.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._checkpoint(r pgdurable.runs, p_token bigint,
                                                 p_state jsonb, p_spend numeric)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_step integer;
BEGIN
  -- two statements, not an UPDATE inside WITH feeding an INSERT (and PL/pgSQL,
  -- not SQL with parameters): the forms Citus plans in a cell
  UPDATE pgdurable.runs SET state = p_state, step = r.step + 1, wake = NULL, reclaims = 0,
         spent = spent + coalesce(p_spend, 0), updated_at = pgdurable.now()
   WHERE id = r.id
  RETURNING step INTO v_step;
  IF v_step IS NOT NULL THEN
    INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake, owner)
    VALUES (r.id, v_step, p_token, p_state, r.wake, r.lease_owner);
  END IF;
  RETURN v_step;
END
$$;
COMMENT ON FUNCTION pgdurable._checkpoint(pgdurable.runs, bigint, jsonb, numeric) IS
  'Internal: write runs.state/step and the checkpoints history row (token, owner) for a locked run.';

------------------------------------------------------------------------------
-- pgdurable._insert_checkpoints(ids, steps, tokens, states, wakes, owner)
-- Internal: the checkpoints history rows of a batch, for write_steps in a
-- cell (Citus). Its own function for its own plan_cache_mode: Citus plans an
-- INSERT ... SELECT only with its parameters bound (a custom plan), which
-- write_steps' generic plans never have; as a static statement here it is
-- parsed once per session, where EXECUTE parsed it at every call (0.29 ms
-- against 0.64 ms a batch of 32 in a cell, issue 46).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._insert_checkpoints(p_ids uuid[], p_steps integer[],
                                                         p_tokens bigint[], p_states jsonb[],
                                                         p_wakes jsonb[], p_owner text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_custom_plan AS $$
BEGIN
  INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake, owner)
  SELECT c.id, c.step, c.token, c.state, c.wake, p_owner
    FROM unnest(p_ids, p_steps, p_tokens, p_states, p_wakes) AS c(id, step, token, state, wake);
END
$$;
COMMENT ON FUNCTION pgdurable._insert_checkpoints(uuid[], integer[], bigint[], jsonb[], jsonb[], text) IS
  'Internal: insert a batch''s checkpoints history rows (write_steps in a Citus cell).';

------------------------------------------------------------------------------
-- pgdurable.write_steps(owner, ids, tokens, states, spends, done, results)
--   -> TABLE(id uuid, status text)
-- FENCED, BATCHED: the hot path, as in 0003 and 0020 (see the contract in
-- 0003), with the fence's status test that no partial index matches and a
-- generic plan.
------------------------------------------------------------------------------
------------------------------------------------------------------------------
-- pgdurable._write_steps_cell(... write_steps' arguments ...) -> TABLE(id, status)
-- Internal: write_steps in a cell (Citus, pgdurable.cell = on, set by
-- pgdurable/ops/citus.py), called by write_steps after its argument checks.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._write_steps_cell(p_owner text, p_ids uuid[], p_tokens bigint[],
                                                       p_states jsonb[], p_spends numeric[],
                                                       p_done boolean[], p_results jsonb[])
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
DECLARE
  v_now timestamptz;
  v_rec record;
  k integer;
  v_map jsonb := '{}';
  v_ids uuid[] := '{}';
  v_steps integer[] := '{}';
  v_tokens bigint[] := '{}';
  v_states jsonb[] := '{}';
  v_wakes jsonb[] := '{}';
  v_status text[] := '{}';
  v_spend numeric;
  v_done boolean;
  v_e_cb jsonb;
  v_e_dl jsonb;
  v_e_step jsonb;
  v_st text;
BEGIN
  -- The same as write_steps' one statement, in statements on ONE table each,
  -- which Citus plans on its fast path (executed on the node holding the
  -- shard without a deparse); a statement with a join, a CTE or a subquery is
  -- planned again, deparsed, parsed and planned on the shard at every call,
  -- and each data-modifying statement costs ~80 us of Citus' bookkeeping: so
  -- one UPDATE for the batch, not one per run (benchmarks/citus_cells.py,
  -- issue 46). The fenced rows are locked and read by one query, their
  -- verdicts (_verdict's rules) computed here into one JSON object by run id
  -- that the UPDATE reads with IMMUTABLE operators only (Citus refuses
  -- non-IMMUTABLE calls inside CASE/COALESCE of an UPDATE, and an array
  -- subscript of a parameter in SET crashes it); the history rows are written
  -- by _insert_checkpoints (see there).
  v_now := pgdurable.now();
  FOR v_rec IN
    SELECT r.id, r.lease_token, r.step, r.wake, r.cancel_requested_at, r.budget, r.spent,
           r.deadline_at, r.error
      FROM pgdurable.runs r
     WHERE r.id = ANY (p_ids) AND r.lease_owner = p_owner
       AND r.status IS NOT DISTINCT FROM 'leased' AND r.lease_expires_at > v_now
       FOR UPDATE
  LOOP
    k := array_position(p_ids, v_rec.id);
    CONTINUE WHEN v_rec.lease_token <> p_tokens[k];
    v_spend := coalesce(p_spends[k], 0);
    v_done := p_done[k];
    v_e_cb := CASE WHEN v_rec.cancel_requested_at IS NOT NULL
                     THEN pgdurable._error('RunCancelled', 'run was cancelled')
                   WHEN v_rec.budget IS NOT NULL AND v_rec.spent + v_spend > v_rec.budget
                     THEN pgdurable._error('BudgetExceeded', format('spent %s of budget %s',
                            v_rec.spent + v_spend, v_rec.budget))
              END;
    v_e_dl := CASE WHEN v_rec.deadline_at IS NOT NULL AND v_rec.deadline_at <= v_now
                     THEN pgdurable._error('DeadlineExceeded',
                            format('deadline %s passed', v_rec.deadline_at))
              END;
    v_e_step := coalesce(v_e_cb, CASE WHEN NOT v_done THEN v_e_dl END);
    v_st := CASE WHEN v_e_step IS NULL THEN CASE WHEN v_done THEN 'completed' ELSE 'leased' END
                 WHEN v_e_step->>'type' = 'RunCancelled' THEN 'cancelled' ELSE 'failed' END;
    v_map := v_map || jsonb_build_object(v_rec.id::text, jsonb_build_object(
      'state', p_states[k], 'spend', v_spend, 'status', v_st,
      'result', CASE WHEN v_done AND v_e_cb IS NULL THEN p_results[k] END,
      'error', v_e_step,
      'keep', NOT v_done AND coalesce(v_e_cb, v_e_dl) IS NULL));
    v_ids := v_ids || v_rec.id;
    v_steps := v_steps || (v_rec.step + 1);
    v_tokens := v_tokens || v_rec.lease_token;
    v_states := v_states || p_states[k];
    v_wakes := v_wakes || v_rec.wake;
    v_status := v_status || v_st;
  END LOOP;
  IF cardinality(v_ids) > 0 THEN
    UPDATE pgdurable.runs r SET
           state = v_map -> r.id::text -> 'state', step = r.step + 1, wake = NULL, reclaims = 0,
           spent = r.spent + (v_map -> r.id::text ->> 'spend')::numeric,
           status = v_map -> r.id::text ->> 'status',
           result = nullif(v_map -> r.id::text -> 'result', 'null'::jsonb),
           error = coalesce(nullif(v_map -> r.id::text -> 'error', 'null'::jsonb), r.error),
           lease_owner = CASE WHEN (v_map -> r.id::text ->> 'keep')::boolean
                              THEN r.lease_owner END,
           lease_expires_at = CASE WHEN (v_map -> r.id::text ->> 'keep')::boolean
                                   THEN r.lease_expires_at END,
           finished_at = CASE WHEN (v_map -> r.id::text ->> 'keep')::boolean THEN NULL
                              ELSE v_now END,
           updated_at = v_now
     WHERE r.id = ANY (v_ids);
    PERFORM pgdurable._insert_checkpoints(v_ids, v_steps, v_tokens, v_states, v_wakes, p_owner);
  END IF;
  RETURN QUERY
  SELECT x.id, coalesce(s.status, 'lost')
    FROM unnest(p_ids) AS x(id)
    LEFT JOIN unnest(v_ids, v_status) AS s(id, status) ON s.id = x.id;
END
$$;
COMMENT ON FUNCTION pgdurable._write_steps_cell(text, uuid[], bigint[], jsonb[], numeric[], boolean[], jsonb[]) IS
  'Internal: write_steps in a Citus cell, in statements on one table each.';

CREATE OR REPLACE FUNCTION pgdurable.write_steps(p_owner text, p_ids uuid[], p_tokens bigint[],
                                                 p_states jsonb[], p_spends numeric[],
                                                 p_done boolean[], p_results jsonb[])
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off AS $$
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
  IF current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus): the same in statements Citus plans on its fast path
    RETURN QUERY SELECT w.id, w.status
      FROM pgdurable._write_steps_cell(p_owner, p_ids, p_tokens, p_states, p_spends, p_done,
                                       p_results) w;
    RETURN;
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
       AND r.status IS NOT DISTINCT FROM 'leased' AND r.lease_expires_at > pgdurable.now()
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
-- pgdurable.checkpoint_run(id, token, owner, state, spend) -> text
-- FENCED (PD001). One Continue step through write_steps (see there):
-- returns leased | cancelled | failed.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.checkpoint_run(p_id uuid, p_token bigint, p_owner text,
                                         p_state jsonb, p_spend numeric DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_status text;
BEGIN
  SELECT w.status INTO v_status
    FROM pgdurable.write_steps(p_owner, ARRAY[p_id], ARRAY[p_token], ARRAY[p_state],
                               ARRAY[p_spend], ARRAY[false], ARRAY[NULL::jsonb]) w;
  IF v_status = 'lost' THEN
    RAISE EXCEPTION 'lease lost on run % (token %, owner %)', p_id, p_token, p_owner
      USING ERRCODE = 'PD001';
  END IF;
  RETURN v_status;
END
$$;
COMMENT ON FUNCTION pgdurable.checkpoint_run(uuid, bigint, text, jsonb, numeric) IS
  'Fenced: checkpoint a step (state + history row); returns leased | cancelled | failed.';

------------------------------------------------------------------------------
-- The watch-only NOTIFYs, sent only while somebody listens.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._checkpoints_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ids text;
BEGIN
  IF coalesce(current_setting('pgdurable.live_steps', true), '') = 'off'
     OR NOT EXISTS (SELECT FROM pgdurable.listeners l
                     WHERE l.channel = 'pgdurable_steps'
                       AND l.until > pg_catalog.statement_timestamp()) THEN
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
  'Internal: one NOTIFY pgdurable_steps per statement writing checkpoints, while a dashboard listens.';
DROP TRIGGER IF EXISTS checkpoints_notify ON pgdurable.checkpoints;
CREATE TRIGGER checkpoints_notify
  AFTER INSERT ON pgdurable.checkpoints
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._checkpoints_notify();
