-- functions/fence.sql: the current body of each function below.

CREATE OR REPLACE FUNCTION pgdurable._error(p_type text, p_message text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT pg_catalog.jsonb_build_object('type'::pg_catalog.text, p_type,
                                       'message'::pg_catalog.text, p_message,
                                       'traceback'::pg_catalog.text, NULL::pg_catalog.text)
$$;
COMMENT ON FUNCTION pgdurable._error(text, text) IS
  'Internal: the {type, message, traceback} record for errors decided in SQL.';

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
-- pgdurable._locked_run(id) -> pgdurable.runs
-- Internal: lock (FOR UPDATE) and return the run, whatever its status;
-- unknown id -> PD002 (RunNotFound). For operations that are not fenced
-- (cancel_run, signal_run, retry_run).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._locked_run(p_id uuid)
RETURNS pgdurable.runs
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs;
BEGIN
  SELECT * INTO r FROM pgdurable.runs x WHERE x.id = p_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no run %', p_id USING ERRCODE = 'PD002';
  END IF;
  RETURN r;
END
$$;
COMMENT ON FUNCTION pgdurable._locked_run(uuid) IS
  'Internal: lock and return a run by id, or raise PD002 (RunNotFound).';

CREATE OR REPLACE FUNCTION pgdurable._verdict(r pgdurable.runs, p_spend numeric,
                                              p_check_deadline boolean)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT CASE
    WHEN r.cancel_requested_at IS NOT NULL
      THEN pgdurable._error('RunCancelled'::pg_catalog.text, 'run was cancelled'::pg_catalog.text)
    WHEN r.budget IS NOT NULL AND pg_catalog.numeric_gt(
           pg_catalog.numeric_add(r.spent, coalesce(p_spend, 0::pg_catalog.numeric)), r.budget) THEN
      pgdurable._error('BudgetExceeded'::pg_catalog.text, pg_catalog.format(
        'spent %s of budget %s'::pg_catalog.text,
        pg_catalog.numeric_add(r.spent, coalesce(p_spend, 0::pg_catalog.numeric)), r.budget))
    WHEN p_check_deadline AND r.deadline_at IS NOT NULL
         AND pg_catalog.timestamptz_le(r.deadline_at, pgdurable.now()) THEN
      pgdurable._error('DeadlineExceeded'::pg_catalog.text, pg_catalog.format(
        'deadline %s passed'::pg_catalog.text, r.deadline_at))
  END
$$;
COMMENT ON FUNCTION pgdurable._verdict(pgdurable.runs, numeric, boolean) IS
  'Internal: cancel/budget/deadline verdict at a step boundary (NULL = go on).';

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
