-- 0008_durable_runs: durable task definitions (issue 6) run by leased workers,
-- and effect_begin, whose replay flag serves the "reconcile" replay policy of
-- ctx.effect.
--
-- A DurableTask registered with the Durable app runs as an ordinary run:
-- runs.task/revision = definition id/revision, runs.step = next_step_index,
-- runs.state = the task state. What a run row cannot hold is kept here, one
-- row per run in pgdurable.durable_steps: the lease token of the last claim
-- that entered a step (so the engine knows the first step of every claim,
-- where authorize is re-checked) and the "in flight" mark of a reconcile step.
--
-- FENCE (same as 0003, by token): a write applies only while
--   id = p_id AND lease_token = p_token AND status = 'leased'
--   AND lease_expires_at > pgdurable.now()
-- (the token is unique per claim, so it also names the owner); otherwise
-- SQLSTATE PD001 (LeaseLost) and nothing changes.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- durable_steps: per-run bookkeeping of durable task definitions.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.durable_steps (
  run_id       uuid        PRIMARY KEY REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  entered_token bigint     NOT NULL,
  step         integer     CHECK (step IS NULL OR step >= 0),
  step_id      text,
  marked_token bigint,
  marked_at    timestamptz,
  updated_at   timestamptz NOT NULL DEFAULT pgdurable.now(),
  CHECK ((step IS NULL) = (step_id IS NULL) AND (step IS NULL) = (marked_token IS NULL))
);
COMMENT ON TABLE pgdurable.durable_steps IS
  'Runs of durable task definitions: last claim token that entered a step, and the reconcile step marked in flight.';
COMMENT ON COLUMN pgdurable.durable_steps.run_id IS 'The run (deleted with it).';
COMMENT ON COLUMN pgdurable.durable_steps.entered_token IS
  'Lease token of the last claim that entered a step (a new token = first step of a claim: authorize again).';
COMMENT ON COLUMN pgdurable.durable_steps.step IS
  'Index of the reconcile step marked in flight; in flight only while it equals runs.step.';
COMMENT ON COLUMN pgdurable.durable_steps.step_id IS 'Id of the step marked in flight.';
COMMENT ON COLUMN pgdurable.durable_steps.marked_token IS 'Lease token under which the mark was set.';
COMMENT ON COLUMN pgdurable.durable_steps.marked_at IS 'When the mark was set (database clock).';
COMMENT ON COLUMN pgdurable.durable_steps.updated_at IS 'Last change of this row.';
