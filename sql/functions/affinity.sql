-- functions/affinity.sql: the current body of each function below.

-- No index on the affinity columns: every statement that writes runs opens
-- every index of runs, and nothing needs to find the runs pinned to a worker
-- (a stopping worker wakes its own queues, worker_absent).

------------------------------------------------------------------------------
-- THE RULE, written out where it is used (the runnable and timer branches of
-- claim_runs and _claim_flow, the runnable and timer parts of next_wakeup:
-- keep them in step). An affine run r is ready at X (available_at, or wake_at
-- for a timer); U = _holder_until(r.affinity_worker, r.affinity_instance, now)
-- is its holder's presence until, NULL when the holder (that worker id, that
-- process instance) is not present. r is reserved for its holder while
-- U IS NOT NULL and X + r.affinity_wait > now. The claim takes r when
-- affinity_worker IS NULL, or is the claimer, or X + affinity_wait <= now, or
-- U IS NULL; next_wakeup reports r due at
-- greatest(X, least(X + affinity_wait, coalesce(U, X))): when its window ends,
-- or when its holder's presence would lapse (asked again then if it was renewed).
--
-- Why a function: the OR stops at the null test for a run without affinity,
-- so _holder_until runs only for affine candidates, and a function call is
-- nothing to the executor until then. Measured (benchmarks/RESULTS.md):
--   * a correlated subquery is costed per candidate row by the planner: the
--     estimate of the claim's timer branch (a generic plan) passed
--     jit_above_cost, and every claim was JIT-compiled (~50 ms);
--   * an uncorrelated one (an InitPlan: evaluated once, lazily) is costed once,
--     but its plan nodes are set up, and worker_presence opened and locked, at
--     every claim: 5-7 us more per claim of runs without affinity.
-- COST 1 keeps the planner's estimate of the filter at an operator's.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable._holder_until(worker, instance, now) -> timestamptz
-- Until when the worker `worker`, process `instance`, is present (its
-- worker_presence row's until, if that is after `now`), else NULL. One
-- primary-key probe.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._holder_until(p_worker text, p_instance text, p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE COST 1
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT w.until FROM pgdurable.worker_presence w
   WHERE w.worker_id = p_worker AND w.instance = p_instance AND w.until > p_now
$$;
COMMENT ON FUNCTION pgdurable._holder_until(text, text, timestamptz) IS
  'Internal: until when a worker process instance is present (NULL: it is not).';

------------------------------------------------------------------------------
-- pgdurable._presence(now) -> jsonb
-- Internal: the workers present at `now`, {worker_id: {"i": instance, "u":
-- until}}: what _holder_until answers, read once. In a cell (Citus) the claim
-- and next_wakeup read it first and test the affinity rule against it: a
-- function that reads a table, called per row from a query on the cell's
-- tables, is refused there ("cannot execute a distributed query from a query
-- on a shard"). The holder of r is present when
-- presence -> r.affinity_worker ->> 'i' = r.affinity_instance.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._presence(p_now timestamptz) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT coalesce(jsonb_object_agg(w.worker_id, jsonb_build_object('i', w.instance,
                                                                   'u', w.until)), '{}')
    FROM pgdurable.worker_presence w WHERE w.until > p_now
$$;
COMMENT ON FUNCTION pgdurable._presence(timestamptz) IS
  'Internal: the worker process instances present now and until when (JSON by worker id).';

------------------------------------------------------------------------------
-- pgdurable._affinity_record(worker, instance, mode, wait, info, since) -> jsonb
-- The affinity as the engine hands it to a step: {worker, instance, mode,
-- wait (seconds), info, since}.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._affinity_record(p_worker text, p_instance text, p_mode text,
                                           p_wait interval, p_info jsonb, p_since timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE WHEN p_worker IS NULL THEN NULL
              ELSE jsonb_build_object('worker', p_worker, 'instance', p_instance, 'mode', p_mode,
                                      'wait', extract(epoch FROM p_wait), 'info', p_info,
                                      'since', p_since) END
$$;
COMMENT ON FUNCTION pgdurable._affinity_record(text, text, text, interval, jsonb, timestamptz) IS
  'Internal: a run''s affinity columns as one JSON object (NULL without affinity).';

------------------------------------------------------------------------------
-- pgdurable.pin_run(id, token, owner, instance, mode, wait, info) -> jsonb
-- FENCED (PD001). Pin the run to its current lease holder, process instance
-- `instance`: mode 'soft' or 'hard', wait in (0, 1 day], info a JSON object
-- (at most 8 KB) or NULL. mode NULL unpins (clears the affinity; instance,
-- wait and info are ignored). Returns the affinity record (_affinity_record)
-- or NULL. Bad input raises PD000 and changes nothing.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.pin_run(p_id uuid, p_token bigint, p_owner text, p_instance text,
                                  p_mode text, p_wait interval, p_info jsonb)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs;
  v_now timestamptz := pgdurable.now();
BEGIN
  IF p_mode IS NOT NULL THEN
    IF p_mode NOT IN ('soft', 'hard') THEN
      RAISE EXCEPTION 'pin_run: mode must be soft or hard (or NULL to unpin), not %',
        quote_literal(p_mode) USING ERRCODE = 'PD000';
    END IF;
    IF coalesce(p_instance, '') = '' THEN
      RAISE EXCEPTION 'pin_run: the holder''s instance is required' USING ERRCODE = 'PD000';
    END IF;
    IF p_wait IS NULL OR p_wait <= interval '0' OR p_wait > interval '1 day' THEN
      RAISE EXCEPTION 'pin_run: wait must be a positive interval of at most 1 day, got %',
        coalesce(p_wait::text, 'NULL') USING ERRCODE = 'PD000';
    END IF;
    IF p_info IS NOT NULL AND (jsonb_typeof(p_info) <> 'object' OR octet_length(p_info::text) > 8192) THEN
      RAISE EXCEPTION 'pin_run: info must be a JSON object of at most 8192 bytes'
        USING ERRCODE = 'PD000';
    END IF;
  END IF;
  r := pgdurable._fenced(p_id, p_token, p_owner);
  UPDATE pgdurable.runs SET
         affinity_worker = CASE WHEN p_mode IS NULL THEN NULL ELSE p_owner END,
         affinity_instance = CASE WHEN p_mode IS NULL THEN NULL ELSE p_instance END,
         affinity_mode = p_mode,
         affinity_wait = CASE WHEN p_mode IS NULL THEN NULL ELSE p_wait END,
         affinity_info = CASE WHEN p_mode IS NULL THEN NULL ELSE p_info END,
         affinity_since = CASE WHEN p_mode IS NULL THEN NULL ELSE v_now END
   WHERE id = r.id;
  RETURN pgdurable._affinity_record(CASE WHEN p_mode IS NULL THEN NULL ELSE p_owner END,
                                    p_instance, p_mode, p_wait, p_info, v_now);
END
$$;
COMMENT ON FUNCTION pgdurable.pin_run(uuid, bigint, text, text, text, interval, jsonb) IS
  'Fenced: pin the run to the worker holding its service (soft/hard, wait, info), or unpin (mode NULL).';

------------------------------------------------------------------------------
-- pgdurable.affine_started_run(id, from) -> uuid
-- Give a run THIS transaction has just inserted (composed with a start in one
-- statement, as tag_started_run is) the affinity of run `from`: same holder,
-- instance, mode, wait and info. Only a row inserted by the current
-- transaction (created_xact, created_at = now(), as tag_started_run checks
-- since 0029: a run this transaction merely updated does not pass) that has
-- no affinity yet is changed (an idempotent repeat of a start finds the old
-- row: nothing changes); `from` without affinity gives none; an unknown `from`
-- raises PD002 (the start is rolled back with it). from NULL: nothing.
-- Returns p_id.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.affine_started_run(p_id uuid, p_from uuid)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  f pgdurable.runs;
BEGIN
  IF p_from IS NULL THEN
    RETURN p_id;
  END IF;
  SELECT * INTO f FROM pgdurable.runs x WHERE x.id = p_from;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no run %', p_from USING ERRCODE = 'PD002';
  END IF;
  IF f.affinity_worker IS NOT NULL THEN
    UPDATE pgdurable.runs r SET affinity_worker = f.affinity_worker,
           affinity_instance = f.affinity_instance, affinity_mode = f.affinity_mode,
           affinity_wait = f.affinity_wait, affinity_info = f.affinity_info,
           affinity_since = pgdurable.now()
     WHERE r.id = p_id AND r.affinity_worker IS NULL
       AND r.created_xact = (pg_catalog.pg_current_xact_id())::text::bigint
       AND r.created_at = pgdurable.now();
  END IF;
  RETURN p_id;
END
$$;
COMMENT ON FUNCTION pgdurable.affine_started_run(uuid, uuid) IS
  'Give a run inserted by this very transaction the affinity of another run (composed with a start).';
