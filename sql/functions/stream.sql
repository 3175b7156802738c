-- functions/stream.sql: the current body of each function below.

------------------------------------------------------------------------------
-- HOT PATH. emit_event and the stream-end trigger read the run's events by
-- run_id. 0018 bounded created_at from below by the run's creation (less a
-- day); the bounds are now both sides and plain values (computed before the
-- statement, so the planner prunes partitions at plan time instead of locking
-- every partition and pruning at run time): from the run's creation less an
-- hour (clock steps) to now plus an hour. A run created today reads one
-- partition (two near midnight) instead of every partition from yesterday to
-- the last one made ahead, plus the default.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable.emit_event(id, token, owner, idx, event) -> bigint (seq)
-- Fenced: append the idx-th event of the current step to the run's stream, or,
-- when a retried step emits again, overwrite the event it emitted at idx in a
-- previous attempt (same seq). NOTIFY pgdurable_events(run id).
-- (0006's definition; reads only the partitions of the run's lifetime.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.emit_event(p_id uuid, p_token bigint, p_owner text,
                                                p_idx integer, p_event jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_since timestamptz := r.created_at - interval '1 hour';
  v_until timestamptz := pgdurable.now() + interval '1 hour';
  v_old bigint;
  v_seq bigint;
BEGIN
  IF p_idx IS NULL OR p_idx < 0 OR p_event IS NULL THEN
    RAISE EXCEPTION 'emit_event: idx >= 0 and an event are required' USING ERRCODE = 'PD000';
  END IF;
  -- one read for both questions (an UPDATE of a partitioned table costs ten
  -- times a read even when it matches nothing): was this idx already emitted
  -- by an earlier attempt of the step (then overwrite it), else the next seq
  SELECT (SELECT e.seq FROM pgdurable.run_events e
           WHERE e.run_id = p_id AND e.step = r.step AND e.idx = p_idx
             AND e.created_at >= v_since AND e.created_at <= v_until LIMIT 1),
         (SELECT coalesce(max(e.seq), 0) + 1 FROM pgdurable.run_events e
           WHERE e.run_id = p_id AND e.created_at >= v_since AND e.created_at <= v_until)
    INTO v_old, v_seq;
  IF v_old IS NOT NULL THEN
    UPDATE pgdurable.run_events e SET event = p_event, token = p_token
     WHERE e.run_id = p_id AND e.seq = v_old
       AND e.created_at >= v_since AND e.created_at <= v_until;
    v_seq := v_old;
  ELSE
    INSERT INTO pgdurable.run_events (run_id, seq, event, step, idx, token)
    VALUES (p_id, v_seq, p_event, r.step, p_idx, p_token);
  END IF;
  PERFORM pg_notify('pgdurable_events', p_id::text);
  RETURN v_seq;
END
$$;
COMMENT ON FUNCTION pgdurable.emit_event(uuid, bigint, text, integer, jsonb) IS
  'Fenced: append (or, for a retried step, overwrite) the idx-th event of the current step; NOTIFY pgdurable_events.';
