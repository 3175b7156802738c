-- functions/row_checks.sql: the current body of each function below.
-- pgdurable:before-migrations (tables' defaults and CHECKs call these)

CREATE OR REPLACE FUNCTION pgdurable.is_thread_key(p text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT pg_catalog.textregexeq(p, '^([^\\]|\\[\\0])+$'::pg_catalog.text)
$$;
COMMENT ON FUNCTION pgdurable.is_thread_key(text) IS
  'True for a valid stored thread key: non-empty, a backslash only in the escapes \\ (backslash) and \0 (NUL).';

------------------------------------------------------------------------------
-- pgdurable._runs_check(task, queue, status, step, attempts, max_attempts,
--   claims, reclaims, budget, thread_key, child_key, parent_policy,
--   parent_run_id, root_run_id, forked_from_step) -> true
-- Raises check_violation naming the first rule the values break. A NULL
-- condition passes, as in a CHECK. From psql:
--   SELECT pgdurable._runs_check('t', 'default', 'runnable', -1, 0, 3, 0, 0,
--          NULL, NULL, NULL, NULL, NULL, NULL, NULL);  -- runs_step_check
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_check(
  p_task text, p_queue text, p_status text, p_step integer, p_attempts integer,
  p_max_attempts integer, p_claims integer, p_reclaims integer, p_budget numeric,
  p_thread_key text, p_child_key text, p_parent_policy text, p_parent_run_id uuid,
  p_root_run_id uuid, p_forked_from_step integer)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  v_broken text;
BEGIN
  -- each WHEN is the negation of one old CHECK: true only when that rule is broken
  v_broken := CASE
    WHEN pg_catalog.texteq(p_task, '') THEN 'runs_task_check'
    WHEN pg_catalog.texteq(p_queue, '') THEN 'runs_queue_check'
    WHEN NOT (p_status OPERATOR(pg_catalog.=) ANY (
           '{runnable,leased,waiting,completed,failed,cancelled,incompatible}'::pg_catalog.text[]))
      THEN 'runs_status_check'
    WHEN pg_catalog.int4lt(p_step, 0) THEN 'runs_step_check'
    WHEN pg_catalog.int4lt(p_attempts, 0) THEN 'runs_attempts_check'
    WHEN pg_catalog.int4le(p_max_attempts, 0) THEN 'runs_max_attempts_check'
    WHEN pg_catalog.int4lt(p_claims, 0) THEN 'runs_claims_check'
    WHEN pg_catalog.int4lt(p_reclaims, 0) THEN 'runs_reclaims_check'
    WHEN pg_catalog.numeric_lt(p_budget, 0::pg_catalog.numeric) THEN 'runs_budget_check'
    WHEN pg_catalog.texteq(p_thread_key, '') THEN 'runs_thread_key_check'
    WHEN pg_catalog.texteq(p_child_key, '') THEN 'runs_child_key_check'
    WHEN NOT (p_parent_policy OPERATOR(pg_catalog.=) ANY ('{cancel,abandon}'::pg_catalog.text[]))
      THEN 'runs_parent_policy_check'
    WHEN NOT (pg_catalog.booleq(p_parent_run_id IS NULL, p_child_key IS NULL)
              AND pg_catalog.booleq(p_parent_run_id IS NULL, p_parent_policy IS NULL)
              AND pg_catalog.booleq(p_parent_run_id IS NULL, p_root_run_id IS NULL))
      THEN 'runs_child_shape'
    WHEN pg_catalog.int4lt(p_forked_from_step, 0) THEN 'runs_forked_from_step_check'
  END;
  IF v_broken IS NOT NULL THEN
    RAISE EXCEPTION 'new row for relation "runs" violates check constraint "%"', v_broken
      USING ERRCODE = 'check_violation', CONSTRAINT = v_broken, TABLE = 'runs',
            SCHEMA = 'pgdurable';
  END IF;
  RETURN true;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_check(text, text, text, integer, integer, integer, integer,
                                          integer, numeric, text, text, text, uuid, uuid,
                                          integer) IS
  'The rules of a runs row (the CHECK runs_check): true, or check_violation naming the rule broken.';
