-- 0017_fork: fix a run that went wrong. Fork a run from any recorded step
-- (fork_run, bulk fork_failed), rewind a failed or cancelled run in place
-- (rewind_run, history kept in run_rewinds), step-level heartbeats with
-- progress (record_heartbeat) and a registry of the (task, revision) pairs
-- that started workers serve (worker_revisions), which a fork to another
-- revision checks.
--
-- WHICH STEP AN EFFECT BELONGS TO. effect_begin (0008) records an effect
-- while its run is locked under the lease fence; the BEFORE INSERT trigger
-- effects_step stores the run's step index at that moment (runs.step = the
-- number of checkpoints so far = the 0-based index of the running step).
-- An effect with step < N happened in steps 1..N, i.e. before checkpoint N.
-- Effects recorded before this migration have step NULL: for them, "before
-- checkpoint N" means updated_at <= that checkpoint's created_at.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN forked_from uuid
  REFERENCES pgdurable.runs (id) ON DELETE SET NULL;
ALTER TABLE pgdurable.runs ADD COLUMN forked_from_step integer
  CHECK (forked_from_step IS NULL OR forked_from_step >= 0);
ALTER TABLE pgdurable.runs ADD COLUMN progress jsonb;
ALTER TABLE pgdurable.runs ADD COLUMN heartbeat_at timestamptz;
COMMENT ON COLUMN pgdurable.runs.forked_from IS
  'The run this one was forked from (fork_run), NULL otherwise (or once the source was pruned).';
COMMENT ON COLUMN pgdurable.runs.forked_from_step IS
  'The source run''s checkpoint this fork continues from (its history 1..N was copied).';
COMMENT ON COLUMN pgdurable.runs.progress IS
  'The last progress a step reported with ctx.heartbeat(progress) (JSON), NULL if none.';
COMMENT ON COLUMN pgdurable.runs.heartbeat_at IS
  'When a step last called ctx.heartbeat (database clock); step-level liveness, '
  'separate from the worker''s lease renewal (lease_expires_at).';
-- "forks of a run" (bulk fork skips sources already forked; ON DELETE SET NULL)
CREATE INDEX runs_forked_from_idx ON pgdurable.runs (forked_from) WHERE forked_from IS NOT NULL;
-- bulk fork: failed runs of a task by finish time
CREATE INDEX runs_failed_task_idx ON pgdurable.runs (task, finished_at) WHERE status = 'failed';

ALTER TABLE pgdurable.effects ADD COLUMN step integer CHECK (step IS NULL OR step >= 0);
COMMENT ON COLUMN pgdurable.effects.step IS
  'The run''s step index (runs.step, 0-based) when the effect was first recorded; NULL for '
  'effects recorded before migration 0012_fork.';

------------------------------------------------------------------------------
-- run_rewinds: the history of rewind_run (what a rewind discarded).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.run_rewinds (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  run_id      uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  from_step   integer     NOT NULL,
  to_step     integer     NOT NULL,
  status      text        NOT NULL,
  error       jsonb,
  revision    text        NOT NULL,
  checkpoints jsonb       NOT NULL,
  effects     jsonb       NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT pgdurable.now()
);
CREATE INDEX run_rewinds_run_idx ON pgdurable.run_rewinds (run_id, id);
COMMENT ON TABLE pgdurable.run_rewinds IS
  'One row per rewind of a run in place (rewind_run): what it discarded, so the history stays readable.';
COMMENT ON COLUMN pgdurable.run_rewinds.id IS 'Rewind number (global, increasing).';
COMMENT ON COLUMN pgdurable.run_rewinds.run_id IS 'The rewound run.';
COMMENT ON COLUMN pgdurable.run_rewinds.from_step IS 'runs.step before the rewind.';
COMMENT ON COLUMN pgdurable.run_rewinds.to_step IS 'The checkpoint the run continues from.';
COMMENT ON COLUMN pgdurable.run_rewinds.status IS 'The run''s status before the rewind (failed | cancelled).';
COMMENT ON COLUMN pgdurable.run_rewinds.error IS 'The run''s error before the rewind.';
COMMENT ON COLUMN pgdurable.run_rewinds.revision IS 'The run''s revision before the rewind.';
COMMENT ON COLUMN pgdurable.run_rewinds.checkpoints IS
  'The discarded checkpoints (steps > to_step): [{step, token, state, wake, created_at}].';
COMMENT ON COLUMN pgdurable.run_rewinds.effects IS
  'The discarded effects (recorded at step >= to_step), which run again: [{key, status, result, error, step}].';
COMMENT ON COLUMN pgdurable.run_rewinds.created_at IS 'When the rewind happened.';

------------------------------------------------------------------------------
-- worker_revisions: the (task, revision) pairs that started workers serve.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.worker_revisions (
  worker_id  text        NOT NULL,
  task       text        NOT NULL,
  revision   text        NOT NULL,
  started_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (worker_id, task)
);
CREATE INDEX worker_revisions_task_idx ON pgdurable.worker_revisions (task, revision);
COMMENT ON TABLE pgdurable.worker_revisions IS
  'Task revisions registered by workers when they start (removed when they stop cleanly; a '
  'crashed worker''s rows stay until a worker with the same id starts or they are deleted). '
  'fork_run/rewind_run to another revision require a row here unless forced.';
COMMENT ON COLUMN pgdurable.worker_revisions.worker_id IS 'The worker''s id (lease owner name).';
COMMENT ON COLUMN pgdurable.worker_revisions.task IS 'A task the worker runs.';
COMMENT ON COLUMN pgdurable.worker_revisions.revision IS 'The revision of that task it runs.';
COMMENT ON COLUMN pgdurable.worker_revisions.started_at IS 'When the worker registered it.';
