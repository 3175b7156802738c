-- 0028_fence_by_primary_key: every fence finds its run by the primary key,
-- and the batched fences keep one plan per connection (issue 21, "stay fast
-- under load").
--
-- A fence reads the run(s) it is given and keeps the rows whose lease holds
-- (token, owner, status = 'leased', lease not expired): _fenced and
-- _fenced_token for one run (park_run, release_run, emit_event, start_child
-- and every other single-run transition), write_steps for a worker's batch of
-- steps, renew_runs for its heartbeat. Two things made their cost grow with the
-- number of runs leased by the whole fleet, not with the number of ids
-- (benchmarks/RESULTS.md, "Fences by primary key"; benchmarks/fence_scaling.py):
--   * status = 'leased' matches the predicate of runs_leased_idx (queue) WHERE
--     status = 'leased', a partial index of every leased run. Where the
--     statistics say few runs are leased, the planner reads that whole index,
--     fetches every leased run's row and keeps the one with the id: each fenced
--     call walked every leased run of every worker.
--   * PL/pgSQL plans a statement again at every call while its generic plan
--     looks dearer than a custom one, and for write_steps and renew_runs with
--     1-element arrays a custom plan always looks cheaper: where the statistics
--     say many runs are leased, each call planned the statement (~0.7 ms)
--     before running it.
-- Now the status test is written IS NOT DISTINCT FROM 'leased' (status is NOT
-- NULL, so it keeps the same rows), which runs_leased_idx's predicate cannot
-- match: the rows are found by runs_pkey, one probe per id. write_steps and
-- renew_runs keep one generic plan per connection (plan_cache_mode, as 0021
-- does for claim_runs). And the four functions plan with enable_seqscan = off:
-- a plan made while runs is small (a new installation, a test database) would
-- be a sequential scan, and a connection keeps its plan until the next ANALYZE
-- of runs, while the table grows under it; runs_pkey serves every size.
-- Nothing else changes: the same fence, results and errors. The scans that
-- want every leased run of a queue (expired leases in claim_runs, live leases
-- in flow control) keep runs_leased_idx.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable._fenced(id, token, owner) -> pgdurable.runs: as in 0003 (lock and
-- return the run if the FENCE holds, else PD001), found by primary key.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._fenced(p_id uuid, p_token bigint, p_owner text)
RETURNS pgdurable.runs
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET enable_seqscan = off AS $$
DECLARE
  r pgdurable.runs;
BEGIN
  SELECT * INTO r FROM pgdurable.runs
   WHERE id = p_id AND lease_token = p_token AND lease_owner = p_owner
     AND status IS NOT DISTINCT FROM 'leased' AND lease_expires_at > pgdurable.now()
   FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'lease lost on run % (token %, owner %)', p_id, p_token, p_owner
      USING ERRCODE = 'PD001';
  END IF;
  RETURN r;
END
$$;
COMMENT ON FUNCTION pgdurable._fenced(uuid, bigint, text) IS
  'Internal: lock the run under the lease fence or raise PD001 (LeaseLost).';

------------------------------------------------------------------------------
-- pgdurable._fenced_token(id, token) -> pgdurable.runs: as in 0008 (the fence
-- by token alone, else PD001), found by primary key.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._fenced_token(p_id uuid, p_token bigint)
RETURNS pgdurable.runs
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET enable_seqscan = off AS $$
DECLARE
  r pgdurable.runs;
BEGIN
  SELECT * INTO r FROM pgdurable.runs
   WHERE id = p_id AND lease_token = p_token
     AND status IS NOT DISTINCT FROM 'leased' AND lease_expires_at > pgdurable.now()
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
-- pgdurable.write_steps(owner, ids, tokens, states, spends, done, results)
--   -> TABLE(id uuid, status text)
-- FENCED, BATCHED: the hot path, as in 0003 and 0020 (see the contract in
-- 0003), with the fence's status test that no partial index matches and a
-- generic plan.
------------------------------------------------------------------------------
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
