-- 0007_operations: the operator surface in SQL -- inspection views, retry,
-- and retention (pruning terminal runs in batches of short transactions).
--
-- Views answer: what runs where (run_overview, active_leases), what is stuck
-- (run_overview.lease_expired, queue_stats.oldest_runnable_age), what waits on
-- what (waiting_runs, from 0005_signals), what failed and why
-- (run_overview.error_type / error_message).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
-- Retention finds terminal runs by age without scanning live ones. status and
-- finished_at change together (at the terminal transition), so this partial
-- index costs no extra HOT breakage on heartbeats.
CREATE INDEX runs_finished_idx ON pgdurable.runs (finished_at)
  WHERE status IN ('completed', 'failed', 'cancelled', 'incompatible');
-- Retention deletes the signals consumed by pruned runs (consumed_by has no FK).
CREATE INDEX signals_consumed_by_idx ON pgdurable.signals (consumed_by)
  WHERE consumed_by IS NOT NULL;
-- History tables lose rows in batches to retention: vacuum them after 5 % dead
-- rows instead of the default 20 %, without cost throttling (runs and leases
-- already ship aggressive settings in 0001: pitfall 8).
ALTER TABLE pgdurable.checkpoints SET (autovacuum_vacuum_scale_factor = 0.05,
                                       autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pgdurable.effects SET (autovacuum_vacuum_scale_factor = 0.05,
                                   autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pgdurable.run_events SET (autovacuum_vacuum_scale_factor = 0.05,
                                      autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pgdurable.signals SET (autovacuum_vacuum_scale_factor = 0.05,
                                   autovacuum_vacuum_cost_delay = 0);

------------------------------------------------------------------------------
-- pgdurable.run_overview: one readable row per run.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_overview AS
  SELECT r.id,
         r.task,
         r.revision,
         r.queue,
         r.status,
         r.priority,
         r.step,
         r.attempts,
         r.max_attempts,
         r.reclaims,
         r.lease_owner                                                AS worker,
         r.lease_expires_at,
         (r.status = 'leased' AND r.lease_expires_at <= pgdurable.now()) AS lease_expired,
         r.wait_kind,
         r.wait_ref,
         r.wait_since,
         r.wake_at,
         r.cancel_requested_at IS NOT NULL                            AS cancel_requested,
         r.error ->> 'type'                                           AS error_type,
         r.error ->> 'message'                                        AS error_message,
         r.created_at,
         r.updated_at,
         r.finished_at,
         pgdurable.now() - r.created_at                               AS age
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_overview IS
  'One readable row per run: where it runs (worker, lease), what it waits on, why it failed.';
COMMENT ON COLUMN pgdurable.run_overview.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_overview.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_overview.revision IS 'Task revision the run was started with.';
COMMENT ON COLUMN pgdurable.run_overview.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.run_overview.status IS
  'runnable | leased | waiting | completed | failed | cancelled | incompatible.';
COMMENT ON COLUMN pgdurable.run_overview.priority IS 'Higher runs first within a queue.';
COMMENT ON COLUMN pgdurable.run_overview.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_overview.attempts IS 'Failed attempts so far.';
COMMENT ON COLUMN pgdurable.run_overview.max_attempts IS 'Attempts allowed before the run fails.';
COMMENT ON COLUMN pgdurable.run_overview.reclaims IS
  'Lease expiries (crashed or stalled worker) since the last checkpoint: > 0 = the run may crash its workers.';
COMMENT ON COLUMN pgdurable.run_overview.worker IS 'Worker holding the run (status leased), else NULL.';
COMMENT ON COLUMN pgdurable.run_overview.lease_expires_at IS 'When the current claim lapses.';
COMMENT ON COLUMN pgdurable.run_overview.lease_expired IS
  'Leased but the lease has lapsed: its worker died or stalled; the next claim takes it over.';
COMMENT ON COLUMN pgdurable.run_overview.wait_kind IS 'Signal kind a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_overview.wait_ref IS 'Signal reference a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_overview.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.run_overview.wake_at IS 'Timer: when a parked run becomes runnable.';
COMMENT ON COLUMN pgdurable.run_overview.cancel_requested IS 'A cancel is pending (the worker stops at its next boundary).';
COMMENT ON COLUMN pgdurable.run_overview.error_type IS 'Type of the last error (e.g. LeaseExpired, ValueError).';
COMMENT ON COLUMN pgdurable.run_overview.error_message IS 'Message of the last error.';
COMMENT ON COLUMN pgdurable.run_overview.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.run_overview.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.run_overview.finished_at IS 'When it reached a terminal status.';
COMMENT ON COLUMN pgdurable.run_overview.age IS 'pgdurable.now() - created_at.';

------------------------------------------------------------------------------
-- pgdurable.queue_stats: one row per queue.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.queue_stats AS
  SELECT r.queue,
         count(*) FILTER (WHERE r.status = 'runnable')                      AS runnable,
         count(*) FILTER (WHERE r.status = 'runnable'
                            AND r.available_at <= pgdurable.now())          AS due,
         count(*) FILTER (WHERE r.status = 'leased')                        AS leased,
         count(*) FILTER (WHERE r.status = 'leased'
                            AND r.lease_expires_at <= pgdurable.now())      AS expired_leases,
         count(*) FILTER (WHERE r.status = 'waiting')                       AS waiting,
         count(*) FILTER (WHERE r.status = 'completed')                     AS completed,
         count(*) FILTER (WHERE r.status = 'failed')                        AS failed,
         count(*) FILTER (WHERE r.status IN ('cancelled', 'incompatible'))  AS cancelled,
         pgdurable.now() - min(r.available_at) FILTER (
           WHERE r.status = 'runnable' AND r.available_at <= pgdurable.now()) AS oldest_runnable_age
    FROM pgdurable.runs r
   GROUP BY r.queue;
COMMENT ON VIEW pgdurable.queue_stats IS
  'Per queue: how many runs are in each status and how long the oldest due runnable run has waited.';
COMMENT ON COLUMN pgdurable.queue_stats.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.queue_stats.runnable IS 'Runs waiting for a worker (including retries not yet due).';
COMMENT ON COLUMN pgdurable.queue_stats.due IS 'Runnable runs whose available_at has passed (claimable now).';
COMMENT ON COLUMN pgdurable.queue_stats.leased IS 'Runs held by a worker.';
COMMENT ON COLUMN pgdurable.queue_stats.expired_leases IS 'Leased runs whose lease lapsed (dead or stalled worker).';
COMMENT ON COLUMN pgdurable.queue_stats.waiting IS 'Parked runs (signal, approval, timer).';
COMMENT ON COLUMN pgdurable.queue_stats.completed IS 'Completed runs not yet pruned.';
COMMENT ON COLUMN pgdurable.queue_stats.failed IS 'Failed runs not yet pruned.';
COMMENT ON COLUMN pgdurable.queue_stats.cancelled IS 'Cancelled or incompatible runs not yet pruned.';
COMMENT ON COLUMN pgdurable.queue_stats.oldest_runnable_age IS
  'How long the oldest due runnable run has waited for a worker (NULL: none); growing = no worker is serving the queue.';

------------------------------------------------------------------------------
-- pgdurable.retry_run(id) -> text (the new status, 'runnable')
-- A failed or cancelled run becomes runnable again from its last checkpoint
-- (state and step kept): attempts, reclaims and claims reset to 0, error, wake, wait,
-- lease, cancel request and finished_at cleared, available now; NOTIFY
-- pgdurable_wake(queue). The deadline is kept (a run past its deadline fails
-- again at its next boundary). The run's end event stays in its stream with
-- final = false (the run goes on after it). Unknown id: PD002. Any other status: PD000,
-- nothing changes. A thread run can be retried only while it is its thread's
-- latest run (else PD000): a thread has one owner at a time, and a revived
-- older run would compete with its successor for the thread.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.retry_run(p_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._locked_run(p_id);
  v_later uuid;
BEGIN
  IF r.status NOT IN ('failed', 'cancelled') THEN
    RAISE EXCEPTION 'run % is %: only failed or cancelled runs can be retried', p_id, r.status
      USING ERRCODE = 'PD000';
  END IF;
  IF r.thread_key IS NOT NULL THEN
    SELECT x.id INTO v_later FROM pgdurable.runs x
     WHERE x.thread_key = r.thread_key AND x.thread_no > r.thread_no
     ORDER BY x.thread_no DESC LIMIT 1;
    IF v_later IS NOT NULL THEN
      RAISE EXCEPTION 'run % is not the latest run of its thread (run % is): only the latest '
        'run of a thread can be retried; send the thread a message instead', p_id, v_later
        USING ERRCODE = 'PD000';
    END IF;
  END IF;
  UPDATE pgdurable.runs SET status = 'runnable', attempts = 0, reclaims = 0, claims = 0,
         error = NULL, wake = NULL, result = NULL,
         wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
         lease_owner = NULL, lease_expires_at = NULL, cancel_requested_at = NULL,
         available_at = pgdurable.now(), finished_at = NULL, updated_at = pgdurable.now()
   WHERE id = p_id;
  -- its end event is no longer its end: streams follow the revived run past it
  UPDATE pgdurable.run_events SET final = false WHERE run_id = p_id AND final;
  PERFORM pg_notify('pgdurable_wake', r.queue);
  RETURN 'runnable';
END
$$;
COMMENT ON FUNCTION pgdurable.retry_run(uuid) IS
  'Make a failed or cancelled run runnable again from its last checkpoint (attempts reset).';

------------------------------------------------------------------------------
-- pgdurable.prune_lock_key() -> bigint
-- The transaction advisory-lock key taken by exclusive prune batches, so that
-- at most one automatic pruner works at a time across the fleet. Transaction
-- scoped (pg_try_advisory_xact_lock): safe behind PgBouncer in transaction mode.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.prune_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT hashtextextended('pgdurable.prune', 0)
$$;
COMMENT ON FUNCTION pgdurable.prune_lock_key() IS
  'Advisory lock key held (per transaction) by exclusive prune batches.';

------------------------------------------------------------------------------
-- pgdurable.prune_runs(older_than, batch, exclusive)
--   -> TABLE(runs, checkpoints, effects, events, signals bigint, locked boolean)
-- ONE short transaction (call it in autocommit, repeatedly, until runs <
-- batch): delete up to p_batch terminal runs (completed, failed, cancelled,
-- incompatible) whose finished_at <= now() - p_older_than, oldest first, with
-- their checkpoints, effects, events and signals (run_id or consumed_by), plus
-- up to p_batch expired unconsumed signals. Rows locked by someone else are
-- skipped (FOR UPDATE SKIP LOCKED): never waits on a worker. Live runs are
-- never touched. With p_exclusive, the batch first takes
-- pg_try_advisory_xact_lock(prune_lock_key()); if another exclusive pruner
-- holds it, nothing is deleted and locked = false. Returns the counts.
-- Children are deleted explicitly (not only by ON DELETE CASCADE) so that the
-- counts are exact; cascades still remove tables added by other migrations.
-- p_older_than < 0 or p_batch outside 1..100000: PD000.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.prune_runs(p_older_than interval, p_batch integer DEFAULT 1000,
                                     p_exclusive boolean DEFAULT false)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint,
               signals bigint, locked boolean)
LANGUAGE plpgsql AS $$
DECLARE
  v_ids uuid[];
  v_runs bigint := 0;
  v_cp bigint := 0;
  v_eff bigint := 0;
  v_ev bigint := 0;
  v_sig bigint := 0;
  v_sig2 bigint := 0;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'prune_runs: older_than must be a non-negative interval' USING ERRCODE = 'PD000';
  END IF;
  IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_runs: batch must be between 1 and 100000' USING ERRCODE = 'PD000';
  END IF;
  IF p_exclusive AND NOT pg_try_advisory_xact_lock(pgdurable.prune_lock_key()) THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, false;
    RETURN;
  END IF;
  SELECT array_agg(d.id) INTO v_ids FROM (
    SELECT r.id FROM pgdurable.runs r
     WHERE r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       AND r.finished_at <= pgdurable.now() - p_older_than
     ORDER BY r.finished_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED) d;
  IF v_ids IS NOT NULL THEN
    DELETE FROM pgdurable.checkpoints c WHERE c.run_id = ANY (v_ids);
    GET DIAGNOSTICS v_cp = ROW_COUNT;
    DELETE FROM pgdurable.effects e WHERE e.run_id = ANY (v_ids);
    GET DIAGNOSTICS v_eff = ROW_COUNT;
    DELETE FROM pgdurable.run_events e WHERE e.run_id = ANY (v_ids);
    GET DIAGNOSTICS v_ev = ROW_COUNT;
    DELETE FROM pgdurable.signals s WHERE s.run_id = ANY (v_ids) OR s.consumed_by = ANY (v_ids);
    GET DIAGNOSTICS v_sig = ROW_COUNT;
    DELETE FROM pgdurable.runs r WHERE r.id = ANY (v_ids);
    GET DIAGNOSTICS v_runs = ROW_COUNT;
  END IF;
  -- pending signals that nobody consumed before their TTL
  WITH doomed AS MATERIALIZED (
    SELECT s.id FROM pgdurable.signals s
     WHERE s.consumed_at IS NULL AND s.expires_at <= pgdurable.now() - p_older_than
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED)
  DELETE FROM pgdurable.signals s USING doomed WHERE s.id = doomed.id;
  GET DIAGNOSTICS v_sig2 = ROW_COUNT;
  RETURN QUERY SELECT v_runs, v_cp, v_eff, v_ev, v_sig + v_sig2, true;
END
$$;
COMMENT ON FUNCTION pgdurable.prune_runs(interval, integer, boolean) IS
  'Retention: delete one batch of old terminal runs with their history; returns the counts.';

------------------------------------------------------------------------------
-- pgdurable.prune_preview(older_than)
--   -> TABLE(runs, checkpoints, effects, events, signals bigint)
-- What prune_runs would delete in total (a dry run): counts only, no locks
-- beyond a plain read.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.prune_preview(p_older_than interval)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint, signals bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'prune_preview: older_than must be a non-negative interval' USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  WITH d AS MATERIALIZED (
    SELECT r.id FROM pgdurable.runs r
     WHERE r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       AND r.finished_at <= pgdurable.now() - p_older_than)
  SELECT (SELECT count(*) FROM d),
         (SELECT count(*) FROM pgdurable.checkpoints c WHERE c.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.effects e WHERE e.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.run_events e WHERE e.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.signals s
           WHERE s.run_id IN (SELECT id FROM d) OR s.consumed_by IN (SELECT id FROM d)
              OR (s.consumed_at IS NULL AND s.expires_at <= pgdurable.now() - p_older_than));
END
$$;
COMMENT ON FUNCTION pgdurable.prune_preview(interval) IS
  'Dry run of retention: how many runs and history rows prune_runs would delete.';
