-- 0005_signals: the waiting boundary -- signals with dedup and conflicts,
-- signals addressed to one run, parking that consumes both kinds of pending
-- signal, and the waiting_runs view.
--
--   send_signal  -- wake the runs waiting on (kind, ref) or keep the signal
--                   pending, with S15 dedup (same id: same result, never
--                   delivered twice; same id, other content: PD008)
--   signal_run   -- a signal for one run (wakes it if it waits on the kind,
--                   else pending for that run only)
--   park_run     -- checkpoint and park (Wait/Sleep), consuming instead a
--                   pending broadcast signal on (kind, ref) or one addressed
--                   to the parking run (signal_run)
-- Locking: sending to / parking on (kind, ref) takes
-- pg_advisory_xact_lock(wait_lock_key(kind, ref)) (0003); signal_run and park_run
-- both hold the run's row lock, which serialises a run-addressed signal with
-- the park of that run. Either order of commit delivers the signal exactly once.
--
-- A signal racing a wait's timeout: whichever locks the waiting run first
-- wins (claim_runs' timer branch uses FOR UPDATE SKIP LOCKED, send_signal's
-- UPDATE waits and re-checks status = 'waiting'). If the timeout wins, the
-- signal is NOT consumed: it stays pending (consumed_at NULL, woke '{}') until
-- its TTL, for the next run that parks on (kind, ref).
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.signals ADD COLUMN woke uuid[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN pgdurable.signals.woke IS
  'Runs this signal woke when it was sent (empty: kept pending). A duplicate '
  'send with the same signal_id returns exactly these ids again.';

-- park_run: pending signals addressed to one run (signal_run), by run.
CREATE INDEX signals_pending_run_idx ON pgdurable.signals (run_id, kind, id)
  WHERE consumed_at IS NULL AND run_id IS NOT NULL;
-- Deleting a run (prune_runs) cascades to signals.run_id (ON DELETE CASCADE)
-- and prune_runs deletes by run_id, consumed ones included: without this
-- index each deleted run scans the whole signals table.
CREATE INDEX signals_run_idx ON pgdurable.signals (run_id) WHERE run_id IS NOT NULL;
