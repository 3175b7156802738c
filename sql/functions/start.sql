-- functions/start.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.start_run(task, revision, state, queue, priority, max_attempts,
--                     idempotency_key, deadline_in, deadline_at, budget)
--   -> TABLE(run_id uuid, created boolean)
-- Inserts a runnable run and NOTIFYs pgdurable_wake(queue) (delivered on
-- commit: inside a caller's transaction, workers wake only if it commits).
-- With an idempotency_key that already exists, nothing is written and the
-- existing run's id is returned with created = false (race-safe: INSERT ...
-- ON CONFLICT DO NOTHING waits for a concurrent inserter, then we read its row).
-- The deadline is deadline_at, else now() + deadline_in, else none.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.start_run(
  p_task text, p_revision text, p_state jsonb, p_queue text, p_priority integer,
  p_max_attempts integer, p_idempotency_key text, p_deadline_in interval,
  p_deadline_at timestamptz, p_budget numeric)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
  v_id uuid;
BEGIN
  INSERT INTO pgdurable.runs AS r (task, revision, state, queue, priority, max_attempts,
                                   idempotency_key, deadline_at, budget)
  VALUES (p_task, p_revision, coalesce(p_state, '{}'), p_queue, p_priority, p_max_attempts,
          p_idempotency_key,
          coalesce(p_deadline_at, pgdurable.now() + p_deadline_in), p_budget)
  ON CONFLICT (idempotency_key) DO NOTHING
  RETURNING r.id INTO v_id;
  IF v_id IS NOT NULL THEN
    PERFORM pg_notify('pgdurable_wake', p_queue);
    RETURN QUERY SELECT v_id, true;
    RETURN;
  END IF;
  SELECT r.id INTO v_id FROM pgdurable.runs r WHERE r.idempotency_key = p_idempotency_key;
  RETURN QUERY SELECT v_id, false;
END
$$;
COMMENT ON FUNCTION pgdurable.start_run(text, text, jsonb, text, integer, integer, text,
                                        interval, timestamptz, numeric) IS
  'Start a run (idempotent by idempotency_key); NOTIFY pgdurable_wake on creation.';

------------------------------------------------------------------------------
-- pgdurable.start_run_flow(... start_run's arguments ..., key, at, delay)
--   -> TABLE(run_id uuid, created boolean)
-- start_run, then (when created) the run's concurrency key and delayed start:
-- available_at = at, else now() + delay, else now. A delayed run is
-- 'runnable' with a future available_at (pgdurable.delayed_runs); workers
-- find it through next_wakeup.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.start_run_flow(
  p_task text, p_revision text, p_state jsonb, p_queue text, p_priority integer,
  p_max_attempts integer, p_idempotency_key text, p_deadline_in interval,
  p_deadline_at timestamptz, p_budget numeric, p_key text, p_at timestamptz,
  p_delay interval)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_id uuid;
  v_created boolean;
  v_at timestamptz;
BEGIN
  IF p_delay IS NOT NULL AND p_delay < interval '0' THEN
    RAISE EXCEPTION 'start: delay must be >= 0, got %', p_delay USING ERRCODE = 'PD000';
  END IF;
  SELECT s.run_id, s.created INTO v_id, v_created
    FROM pgdurable.start_run(p_task, p_revision, p_state, p_queue, p_priority, p_max_attempts,
                             p_idempotency_key, p_deadline_in, p_deadline_at, p_budget) s;
  IF v_created AND (coalesce(p_key, '') <> '' OR p_at IS NOT NULL OR p_delay IS NOT NULL) THEN
    -- the start time computed first: Citus refuses non-IMMUTABLE calls inside
    -- a COALESCE of an UPDATE (a cell)
    v_at := coalesce(p_at, pgdurable.now() + p_delay);
    UPDATE pgdurable.runs SET concurrency_key = coalesce(p_key, ''),
           available_at = coalesce(v_at, available_at)
     WHERE id = v_id;
  END IF;
  RETURN QUERY SELECT v_id, v_created;
END
$$;
COMMENT ON FUNCTION pgdurable.start_run_flow(text, text, jsonb, text, integer, integer, text,
                                             interval, timestamptz, numeric, text, timestamptz,
                                             interval) IS
  'start_run with a concurrency key and a delayed start (at, else now + delay).';

------------------------------------------------------------------------------
-- pgdurable.tag_started_run(id, created, metadata, trace_context) -> uuid
-- (0019's contract.) Set the metadata and trace context of a run THIS
-- transaction has just inserted (composed with start_run in one statement:
-- SELECT ... FROM start_run(...) s, LATERAL tag_started_run(s.run_id, s.created, ...)).
-- Only a row inserted by the current transaction (created_xact, created_at =
-- now()) whose metadata and trace context are still NULL is changed: a run
-- that this transaction merely updated (retry_run, cancel_run) is not. Its
-- xmin, the test until now, is the current transaction's after any update.
-- created = false (idempotent repeat) or both values NULL: nothing changes.
-- metadata must be a JSON object (else PD000). Returns p_id.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.tag_started_run(p_id uuid, p_created boolean,
                                                     p_metadata jsonb, p_trace_context jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
    RAISE EXCEPTION 'metadata must be a JSON object' USING ERRCODE = 'PD000';
  END IF;
  IF p_created AND (p_metadata IS NOT NULL OR p_trace_context IS NOT NULL) THEN
    UPDATE pgdurable.runs r SET metadata = p_metadata, trace_context = p_trace_context
     WHERE r.id = p_id AND r.metadata IS NULL AND r.trace_context IS NULL
       AND r.created_xact = (pg_catalog.pg_current_xact_id())::text::bigint
       AND r.created_at = pgdurable.now();
  END IF;
  RETURN p_id;
END
$$;
COMMENT ON FUNCTION pgdurable.tag_started_run(uuid, boolean, jsonb, jsonb) IS
  'Set metadata/trace context of a run inserted by this very transaction (composed with start_run).';

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
CREATE OR REPLACE FUNCTION pgdurable.start_runs(
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
