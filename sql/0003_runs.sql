-- 0003_runs: the run state machine (start, claim, heartbeat, checkpoint,
-- complete, fail/retry, give back, cancel) and the end of an effect
-- (effect_finish). Parking and signals (park_run, send_signal, signal_run)
-- are in 0005_signals.sql; effect_begin is in 0008_durable_runs.sql.
--
-- Conventions shared by every function here:
--  * Time is pgdurable.now() only.
--  * FENCE: a worker's write applies only while
--      id = p_id AND lease_token = p_token AND lease_owner = p_owner
--      AND status = 'leased' AND lease_expires_at > pgdurable.now();
--    otherwise SQLSTATE PD001 (LeaseLost) is raised and nothing changes.
--  * NOTIFY pgdurable_wake (payload = queue) only when a run becomes runnable,
--    at most once per queue per transaction (identical notifications merge);
--    NOTIFY pgdurable_cancel (payload = run id) when a leased run is asked to
--    cancel. Never a notification per checkpoint.
--  * error jsonb is {type, message, traceback}.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.checkpoints ADD COLUMN wake jsonb;
COMMENT ON COLUMN pgdurable.checkpoints.wake IS
  'The wake outcome (signal or timeout) the step saw in ctx.wake, NULL if none.';

-- Poison runs: crashes are counted apart from step errors. attempts counts
-- failed steps (fail_run) against max_attempts; reclaims counts expired-lease
-- reclaims since the last checkpoint against the task's max_reclaims (passed
-- by the worker to claim_runs); claims counts every claim (information only).
ALTER TABLE pgdurable.runs ADD COLUMN reclaims integer NOT NULL DEFAULT 0
  CHECK (reclaims >= 0);
COMMENT ON COLUMN pgdurable.runs.reclaims IS
  'Expired-lease reclaims (its worker crashed or stalled) since the run''s last checkpoint; '
  'reset by every checkpoint. When a lease expires with reclaims >= the task''s max_reclaims '
  '(default 5) the run fails with error type PoisonRun. Step errors count in attempts instead.';
COMMENT ON COLUMN pgdurable.runs.claims IS
  'How many times a worker claimed the run (every claim: first, after a give-back, retry '
  'or reclaim); information only, bounds nothing (see reclaims and attempts).';
COMMENT ON COLUMN pgdurable.runs.attempts IS
  'Failed steps (exceptions, fail_run) counted against max_attempts; crashes count in reclaims.';

-- Claim branch (a): runnable runs by queue, priority, age.
CREATE INDEX runs_runnable_idx ON pgdurable.runs (queue, priority DESC, available_at)
  WHERE status = 'runnable';
-- Claim branch (b): leased runs by queue. lease_expires_at is deliberately NOT
-- indexed so that heartbeats (which change only it) stay HOT updates; the
-- leased set is small (at most the sum of all workers' concurrency).
CREATE INDEX runs_leased_idx ON pgdurable.runs (queue) WHERE status = 'leased';
-- Claim branch (c): parked runs with a timer.
CREATE INDEX runs_timer_idx ON pgdurable.runs (queue, wake_at)
  WHERE status = 'waiting' AND wake_at IS NOT NULL;
-- send_signal (0005): parked runs by what they wait for.
CREATE INDEX runs_waiting_signal_idx ON pgdurable.runs (wait_kind, wait_ref)
  WHERE status = 'waiting' AND wait_kind IS NOT NULL;
-- park_run (0005): pending (unconsumed) signals by (kind, ref), oldest first.
CREATE INDEX signals_pending_idx ON pgdurable.signals (kind, ref, id)
  WHERE consumed_at IS NULL;
