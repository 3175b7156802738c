-- 0030_retry_failed_step: retrying or forking a failed run runs its failure
-- again instead of replaying it (issue 37).
--
-- A workflow (@app.workflow) records a step's last error as a checkpoint, so
-- that code which catches it and goes on replays the same error later. When
-- nobody catches it, that record is what failed the run: the worker says so
-- in runs.error ("checkpoint": N, the checkpoint that records the error; see
-- pgdurable/workflows.py). Before this migration retry_run, fork_failed and
-- a fork at the last step kept that record, and the run failed again at once
-- with the recorded error, without calling the step. THE RULES:
--
-- * THE RESUME POINT (_resume_step): a failed run whose error names its last
--   checkpoint as the failed step's record continues from the checkpoint
--   before it (the step runs again); any other run from its last checkpoint.
--   A step error the workflow caught stays history (it is not the last
--   checkpoint when the run fails, or not what the run failed with).
-- * RETRY (retry_run) continues from the resume point. The dropped record is
--   kept in run_rewinds (kind 'retry'). The wake that started the failed step
--   (a signal's payload, a sleep that ended) is its wake again. When nothing
--   is dropped the run's pending wake is kept too (before, retry cleared it
--   and a received signal was lost), except a wait that timed out right
--   before the failure: the retried run waits again.
-- * EFFECTS recorded after the resume point that FAILED are no longer taken
--   as their outcome: a retry makes them 'started' again (the previous
--   outcome kept in run_rewinds), so they follow their replay policy: "safe"
--   runs fn again, "reconcile" asks reconcile first (never re-run blindly).
--   Succeeded effects stay recorded (never performed twice). This holds for
--   every kind of run (tasks, durable tasks, workflows: a reconcile step's
--   attempts are such effects).
-- * CHILDREN: when the pending wake is the outcome of a wait on children, a
--   retried parent retries the failed children in it (recursively, by the
--   same rules) and waits for them again; it then sees their new outcomes. A
--   child whose parent has ended cannot be retried alone when its policy is
--   'cancel' (it would be cancelled at once): PD000 names the parent. A child
--   retried while its parent still waits on it is waited for again.
-- * FORK (fork_run) with step NULL forks from the resume point; a fork at the
--   resume point also gets the effects the source recorded after it, as a
--   retry sees them. A fork or rewind at any step carries the wake that
--   continued from that checkpoint (the outcome of a wait recorded there),
--   and step 0 of a workflow run is its start (the input in checkpoint 1).
-- * fork_failed forks every failed run from its resume point.
--
-- LOCK ORDER: retry_run locks the run, then (a child) its parent FOR KEY
-- SHARE, as a child's transitions do. A parent's retry locks its failed
-- children after itself, with NOWAIT: those are terminal, so only another
-- operator action can hold one, and then nothing changes (PD000, try again)
-- instead of a wait that could deadlock with it.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- run_rewinds.kind: a rewind in place, or what a retry dropped or reset.
------------------------------------------------------------------------------
ALTER TABLE pgdurable.run_rewinds ADD COLUMN kind text NOT NULL DEFAULT 'rewind'
  CHECK (kind IN ('rewind', 'retry'));
COMMENT ON COLUMN pgdurable.run_rewinds.kind IS
  'rewind (rewind_run) or retry (retry_run dropped the failed step''s record and/or made '
  'failed effects started again).';
COMMENT ON TABLE pgdurable.run_rewinds IS
  'One row per rewind of a run in place (rewind_run), or per retry that dropped or reset history '
  '(retry_run): what it discarded, so the history stays readable.';
COMMENT ON COLUMN pgdurable.run_rewinds.effects IS
  'A rewind: the discarded effects (recorded at step >= to_step), which run again. A retry: the '
  'failed effects it made started again, with their previous outcome: [{key, status, result, '
  'error, step}].';

------------------------------------------------------------------------------
-- pgdurable._fork_point(r, step, state, mode, revision, force)
--   -> TABLE(state jsonb, wake jsonb, revision text)
-- Internal, shared by fork_run and rewind_run, as in 0017 (thread runs:
-- PD000; mode; step; revision: PDF02), now with the wake the run continues
-- with (_wake_at) and step 0 of a workflow run (_state_at).
------------------------------------------------------------------------------
DROP FUNCTION IF EXISTS pgdurable._fork_point(pgdurable.runs, integer, jsonb, text, text, boolean);
