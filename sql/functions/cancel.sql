-- functions/cancel.sql: the current body of each function below.

------------------------------------------------------------------------------
-- ack_cancel: as in 0003, but a run whose cancel nobody requested is refused
-- (PD000, nothing changes): a forged NOTIFY pgdurable_cancel must not end it.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.ack_cancel(p_id uuid, p_token bigint, p_owner text,
                                                p_spend numeric DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  IF r.cancel_requested_at IS NULL THEN
    RAISE EXCEPTION 'ack_cancel: nobody requested a cancel of run %', p_id
      USING ERRCODE = 'PD000';
  END IF;
  RETURN pgdurable._end(r.id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), p_spend);
END
$$;
COMMENT ON FUNCTION pgdurable.ack_cancel(uuid, bigint, text, numeric) IS
  'Fenced: the worker stopped a cancelled run''s step; record cancelled (only if a cancel was requested).';

------------------------------------------------------------------------------
-- pgdurable.cancel_run(id) -> text (the resulting status)
-- runnable / waiting -> 'cancelled' at once. leased -> cancel_requested_at set,
-- NOTIFY pgdurable_cancel(id), returns 'leased': the owner stops the step and
-- records 'cancelled'; if the owner commits a completion first, the final
-- status is 'completed' (first commit wins; see complete_run). An expired
-- lease with a cancel request becomes 'cancelled' at the next claim.
-- Terminal runs: no-op, returns their status. Unknown id: PD002.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.cancel_run(p_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._locked_run(p_id);
BEGIN
  IF r.status IN ('runnable', 'waiting') THEN
    RETURN pgdurable._end(p_id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), 0);
  ELSIF r.status = 'leased' THEN
    IF r.cancel_requested_at IS NULL THEN
      UPDATE pgdurable.runs SET cancel_requested_at = pgdurable.now() WHERE id = p_id;
      PERFORM pg_notify('pgdurable_cancel', p_id::text);
    END IF;
    RETURN 'leased';
  END IF;
  RETURN r.status;
END
$$;
COMMENT ON FUNCTION pgdurable.cancel_run(uuid) IS
  'Cancel a run: at once if runnable/waiting, by request + NOTIFY if leased; returns the status.';
