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
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

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
