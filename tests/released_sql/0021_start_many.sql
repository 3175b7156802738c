-- 0021_start_many: start many runs in ONE statement (issue 21).
--
-- pgdurable.start_runs takes one array per start argument (the arrays of
-- start_run + start_run_flow + tag_started_run, one element per run) and
-- inserts every run with ONE INSERT ... SELECT FROM unnest(...), then sends at
-- most ONE NOTIFY pgdurable_wake per queue that got a new run. Nothing else
-- changes: start_run, start_run_flow and tag_started_run stay as they are
-- (a single start keeps its statement; pgdurable/batch_start.py calls this
-- one).

------------------------------------------------------------------------------
-- pgdurable.start_runs(tasks, revisions, states, queues, priorities,
--                      max_attempts, idempotency_keys, deadlines_in,
--                      deadlines_at, budgets, keys, ats, delays, metadata,
--                      trace_context)
--   -> TABLE(ord integer, run_id uuid, created boolean)
-- One row per input element, in input order (ord from 1). All arrays have the
-- same length (else PD000, nothing written). Per element, as start_run_flow +
-- tag_started_run: deadline_at, else now() + deadline_in; available_at = at,
-- else now() + delay, else now(); concurrency key '' when NULL; metadata a
-- JSON object or NULL (else PD000). trace_context (one for the batch: the
-- caller's) is stored on every created run.
-- Idempotency: a key that exists already, or that an earlier element of the
-- same call carries, returns that run's id with created = false; the row of
-- a concurrent inserter of the same key is waited for (ON CONFLICT DO
-- NOTHING) and then read by a second statement with a fresh snapshot, as in
-- start_run. A constraint violation of any element (an empty task, queue or
-- a negative budget, ...) fails the whole call: nothing is written.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.start_runs(
  p_tasks text[], p_revisions text[], p_states jsonb[], p_queues text[],
  p_priorities integer[], p_max_attempts integer[], p_idempotency_keys text[],
  p_deadlines_in interval[], p_deadlines_at timestamptz[], p_budgets numeric[],
  p_keys text[], p_ats timestamptz[], p_delays interval[], p_metadata jsonb[],
  p_trace_context jsonb)
RETURNS TABLE (ord integer, run_id uuid, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n integer := coalesce(cardinality(p_tasks), 0);
  v_ids uuid[];
  v_created uuid[];
  v_queues text[];
BEGIN
  IF v_n = 0 THEN
    RETURN;
  END IF;
  IF coalesce(cardinality(p_revisions), 0) <> v_n OR coalesce(cardinality(p_states), 0) <> v_n
     OR coalesce(cardinality(p_queues), 0) <> v_n OR coalesce(cardinality(p_priorities), 0) <> v_n
     OR coalesce(cardinality(p_max_attempts), 0) <> v_n
     OR coalesce(cardinality(p_idempotency_keys), 0) <> v_n
     OR coalesce(cardinality(p_deadlines_in), 0) <> v_n
     OR coalesce(cardinality(p_deadlines_at), 0) <> v_n
     OR coalesce(cardinality(p_budgets), 0) <> v_n OR coalesce(cardinality(p_keys), 0) <> v_n
     OR coalesce(cardinality(p_ats), 0) <> v_n OR coalesce(cardinality(p_delays), 0) <> v_n
     OR coalesce(cardinality(p_metadata), 0) <> v_n THEN
    RAISE EXCEPTION 'start_runs: every array must have % elements', v_n USING ERRCODE = 'PD000';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(p_delays) d WHERE d < interval '0') THEN
    RAISE EXCEPTION 'start: delay must be >= 0' USING ERRCODE = 'PD000';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(p_metadata) m
              WHERE m IS NOT NULL AND jsonb_typeof(m) <> 'object') THEN
    RAISE EXCEPTION 'metadata must be a JSON object' USING ERRCODE = 'PD000';
  END IF;

  -- ids are drawn first so that the inserted rows map back to their elements
  v_ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, v_n));
  WITH ins AS (
    INSERT INTO pgdurable.runs AS r (id, task, revision, state, queue, priority, max_attempts,
                                     idempotency_key, deadline_at, budget, concurrency_key,
                                     available_at, metadata, trace_context)
    SELECT i.id, i.task, i.revision, coalesce(i.state, '{}'), i.queue, i.priority,
           i.max_attempts, i.idempotency_key,
           coalesce(i.deadline_at, pgdurable.now() + i.deadline_in), i.budget,
           coalesce(i.ckey, ''), coalesce(i.at, pgdurable.now() + i.delay, pgdurable.now()),
           i.metadata, p_trace_context
      FROM unnest(v_ids, p_tasks, p_revisions, p_states, p_queues, p_priorities,
                  p_max_attempts, p_idempotency_keys, p_deadlines_in, p_deadlines_at,
                  p_budgets, p_keys, p_ats, p_delays, p_metadata)
           WITH ORDINALITY AS i(id, task, revision, state, queue, priority, max_attempts,
                                idempotency_key, deadline_in, deadline_at, budget, ckey,
                                at, delay, metadata, n)
     ORDER BY i.n  -- the first element of a repeated key is the one inserted
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING r.id, r.queue
  )
  SELECT array_agg(ins.id), array_agg(DISTINCT ins.queue) INTO v_created, v_queues FROM ins;

  -- at most one NOTIFY per queue that got a run (delivered on commit only)
  PERFORM pg_notify('pgdurable_wake', w) FROM unnest(v_queues) w;

  -- a fresh snapshot: our own rows and a concurrent inserter's committed row
  -- of the same key (ON CONFLICT waited for it) are both visible here
  RETURN QUERY
    SELECT i.n::integer,
           CASE WHEN c.id IS NOT NULL THEN c.id
                ELSE (SELECT r.id FROM pgdurable.runs r WHERE r.idempotency_key = i.k) END,
           c.id IS NOT NULL
      FROM unnest(v_ids, p_idempotency_keys) WITH ORDINALITY AS i(id, k, n)
      LEFT JOIN unnest(v_created) AS c(id) ON c.id = i.id
     ORDER BY i.n;
END
$$;
COMMENT ON FUNCTION pgdurable.start_runs(text[], text[], jsonb[], text[], integer[], integer[],
                                         text[], interval[], timestamptz[], numeric[], text[],
                                         timestamptz[], interval[], jsonb[], jsonb) IS
  'Start many runs in one INSERT (idempotent per key); one NOTIFY pgdurable_wake per queue.';

------------------------------------------------------------------------------
-- claim_runs: a generic plan for its statements (issue 21, enqueue -> start).
-- PL/pgSQL plans the claim's CTE statement again at every call (a custom plan
-- each time: ~0.6 ms of planning in a 1.3 ms claim on the project's 2-core
-- machine); the generic plan uses the same partial indexes (checked at
-- 1,000,000 finished and parked runs by benchmarks/claim_scaling.py). The
-- function body is unchanged. A later migration that re-creates claim_runs
-- must keep this SET (tests/test_start_many.py checks it).
------------------------------------------------------------------------------
ALTER FUNCTION pgdurable.claim_runs(text, text[], text[], text[], integer, interval, integer[])
  SET plan_cache_mode = force_generic_plan;
