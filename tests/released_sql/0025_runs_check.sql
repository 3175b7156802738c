-- 0025_runs_check: the rules of a runs row as one CHECK that calls one
-- function, instead of 14 CHECK constraints.
--
-- PostgreSQL prepares every CHECK expression of a table again at the start of
-- each statement that writes it (ExecRelCheck: read the stored expression,
-- plan it, build its evaluator). runs had 14, so every start_run, claim,
-- checkpoint batch and completion paid for 14 expressions before its first
-- row. A single CHECK calling a PL/pgSQL function costs one expression to
-- prepare; the function's own expression is compiled once per session and
-- evaluated per row. Measured with pgbench on copies of runs (one client,
-- synchronous_commit off): one-row INSERT 3,100-3,900 tps with the 14, 3,800-
-- 5,000 with this CHECK, 4,400-6,100 with none (benchmarks/RESULTS.md).
--
-- The rules are the 14 old ones, unchanged, and a row that breaks one fails
-- as before: SQLSTATE 23514 (check_violation), the old constraint's name as
-- the error's constraint name and in its message
-- ('new row for relation "runs" violates check constraint "runs_step_check"').
-- Only PostgreSQL's DETAIL line ('Failing row contains (...)') is no longer
-- there.
--
-- The function takes the columns it checks, not the whole row: a whole-row
-- argument would copy every column of each written row, detoasting a large
-- state or result that the statement did not touch.
--
-- Security: the CHECK runs with the rights and the search_path of whoever
-- writes runs. pgdurable's functions pin theirs, but a superuser may write
-- runs directly with any search_path, so, like the inlinable helpers, the
-- function calls only schema-qualified built-ins and writes its operators
-- OPERATOR(pg_catalog.x); it carries no SET clause (a SET would be applied per
-- row) and is on the allow-list of security_inlinable() (restated here), which
-- tests/test_security_boundary.py checks, statically and with shadows planted.
--
-- The new CHECK is added NOT VALID (a brief exclusive lock, no scan) and the
-- 14 are dropped: from this migration on, every write is checked by the new
-- one, and every existing row met the old ones. 0026 validates it in its own
-- transaction, which lets reads and writes go on during the scan.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable._runs_check(task, queue, status, step, attempts, max_attempts,
--   claims, reclaims, budget, thread_key, child_key, parent_policy,
--   parent_run_id, root_run_id, forked_from_step) -> true
-- Raises check_violation naming the first rule the values break. A NULL
-- condition passes, as in a CHECK. From psql:
--   SELECT pgdurable._runs_check('t', 'default', 'runnable', -1, 0, 3, 0, 0,
--          NULL, NULL, NULL, NULL, NULL, NULL, NULL);  -- runs_step_check
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._runs_check(
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

ALTER TABLE pgdurable.runs ADD CONSTRAINT runs_check CHECK (pgdurable._runs_check(
  task, queue, status, step, attempts, max_attempts, claims, reclaims, budget, thread_key,
  child_key, parent_policy, parent_run_id, root_run_id, forked_from_step)) NOT VALID;
COMMENT ON CONSTRAINT runs_check ON pgdurable.runs IS
  'Every rule of a runs row in one CHECK (pgdurable._runs_check; it names the rule broken, '
  'e.g. runs_step_check): one expression for each write statement to prepare instead of 14.';

ALTER TABLE pgdurable.runs
  DROP CONSTRAINT runs_task_check,
  DROP CONSTRAINT runs_queue_check,
  DROP CONSTRAINT runs_status_check,
  DROP CONSTRAINT runs_step_check,
  DROP CONSTRAINT runs_attempts_check,
  DROP CONSTRAINT runs_max_attempts_check,
  DROP CONSTRAINT runs_claims_check,
  DROP CONSTRAINT runs_reclaims_check,
  DROP CONSTRAINT runs_budget_check,
  DROP CONSTRAINT runs_thread_key_check,
  DROP CONSTRAINT runs_child_key_check,
  DROP CONSTRAINT runs_parent_policy_check,
  DROP CONSTRAINT runs_child_shape,
  DROP CONSTRAINT runs_forked_from_step_check;

------------------------------------------------------------------------------
-- security_inlinable(): the allow-list (0009) with _runs_check added. Its
-- name predates this entry: every function on it runs with the caller's
-- rights and no SET clause, and resolves nothing through the caller's path.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.security_inlinable() RETURNS SETOF pg_catalog.regprocedure
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT p::regprocedure FROM unnest(ARRAY[
    'pgdurable.now()', 'pgdurable.wait_lock_key(text,text)', 'pgdurable.task_lock_key(text)',
    'pgdurable.is_thread_key(text)', 'pgdurable._error(text,text)',
    'pgdurable._verdict(pgdurable.runs,numeric,boolean)',
    'pgdurable._runs_check(text,text,text,integer,integer,integer,integer,integer,numeric,'
      'text,text,text,uuid,uuid,integer)']) AS p
$$;
COMMENT ON FUNCTION pgdurable.security_inlinable() IS
  'The helpers exempt from the pinned search_path (no SET, caller''s rights, built-ins '
  'schema-qualified): the inlinable LANGUAGE sql ones and the CHECK function _runs_check.';
