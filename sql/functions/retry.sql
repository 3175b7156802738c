-- functions/retry.sql: the current body of each function below.

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
CREATE OR REPLACE FUNCTION pgdurable.retry_run(p_id uuid) RETURNS text
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
