-- functions/text_stream.sql: the current body of each function below.
--
-- Token streams (issue 41; the contract is pgdurable/runs/text.py's docstring).
-- A step's text lives in pgdurable.run_events as rows {"type": "text",
-- "text": ...} with step = the step and idx NULL. A step's text "generation"
-- is its text rows after its last marker row ({"type": "interrupted"} or
-- {"type": "rollback"}, written by stop_step): every attempt of the step
-- continues the same generation until a marker starts a new one, and the
-- offsets the writer sends are offsets into it (code points).
--
-- The bounds on created_at are emit_event's (functions/stream.sql): the
-- run's creation less an hour to now plus an hour, plain values, so the
-- planner prunes partitions at plan time.

------------------------------------------------------------------------------
-- pgdurable._step_text(run, step) -> TABLE(last_seq bigint, mark bigint, have integer)
-- Internal: the run's last event seq, the seq of the step's last marker (0:
-- none) and the length (code points) of the step's text generation.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._step_text(r pgdurable.runs, p_step integer)
RETURNS TABLE (last_seq bigint, mark bigint, have integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_since timestamptz := r.created_at - interval '1 hour';
  v_until timestamptz := pgdurable.now() + interval '1 hour';
BEGIN
  SELECT coalesce(max(e.seq), 0) INTO last_seq FROM pgdurable.run_events e
   WHERE e.run_id = r.id AND e.created_at >= v_since AND e.created_at <= v_until;
  SELECT coalesce(max(e.seq), 0) INTO mark FROM pgdurable.run_events e
   WHERE e.run_id = r.id AND e.step = p_step AND e.idx IS NULL
     AND e.event->>'type' IN ('interrupted', 'rollback')
     AND e.created_at >= v_since AND e.created_at <= v_until;
  SELECT coalesce(sum(length(e.event->>'text')), 0)::integer INTO have FROM pgdurable.run_events e
   WHERE e.run_id = r.id AND e.step = p_step AND e.idx IS NULL AND e.seq > mark
     AND e.event->>'type' = 'text'
     AND e.created_at >= v_since AND e.created_at <= v_until;
  RETURN NEXT;
END
$$;
COMMENT ON FUNCTION pgdurable._step_text(pgdurable.runs, integer) IS
  'Internal: a run''s last event seq, its step''s last text marker and the length of the step''s text.';

------------------------------------------------------------------------------
-- pgdurable._interrupt_of(run) -> text
-- Internal: 'interrupt' or 'rollback' when the run's thread holds a pending
-- (untaken, unconsumed) message sent with that strategy AFTER a message the
-- run's current step took (the step is answering something older); the latest
-- such message's strategy. NULL otherwise (no thread, nothing taken, none).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._interrupt_of(r pgdurable.runs)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT m.double_text FROM pgdurable.thread_messages m
   WHERE r.thread_key IS NOT NULL AND m.thread_key = r.thread_key
     AND m.consumed_at IS NULL AND m.taken_by IS NULL
     AND m.double_text IN ('interrupt', 'rollback')
     AND m.seq > (SELECT max(t.seq) FROM pgdurable.thread_messages t
                   WHERE t.thread_key = r.thread_key AND t.consumed_at IS NULL
                     AND t.taken_by = r.id)
   ORDER BY m.seq DESC
   LIMIT 1
$$;
COMMENT ON FUNCTION pgdurable._interrupt_of(pgdurable.runs) IS
  'Internal: the interrupt/rollback a newer thread message asks of the step that is answering, else NULL.';

------------------------------------------------------------------------------
-- pgdurable._append_text(run, step, at, text, token) -> TABLE(seq bigint, have integer, status text)
-- Internal (the caller holds the run row): append the text that starts at
-- offset `at` of the step's generation, less what is already there (an
-- earlier attempt flushed it: a replay), as one row, and NOTIFY
-- pgdurable_events(run id). status 'ok', or 'gap' when `at` lies beyond the
-- step's text (nothing written: the writer lost count).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._append_text(r pgdurable.runs, p_step integer, p_at integer,
                                                 p_text text, p_token bigint)
RETURNS TABLE (seq bigint, have integer, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s record;
  v_new text;
BEGIN
  SELECT * INTO s FROM pgdurable._step_text(r, p_step);
  IF p_at > s.have THEN
    RETURN QUERY SELECT s.last_seq, s.have, 'gap'::text;
    RETURN;
  END IF;
  v_new := substr(p_text, s.have - p_at + 1);
  IF v_new IS NULL OR v_new = '' THEN
    RETURN QUERY SELECT s.last_seq, s.have, 'ok'::text;
    RETURN;
  END IF;
  INSERT INTO pgdurable.run_events (run_id, seq, event, step, idx, token)
  VALUES (r.id, s.last_seq + 1, jsonb_build_object('type', 'text', 'text', v_new), p_step, NULL,
          p_token);
  PERFORM pg_notify('pgdurable_events', r.id::text);
  RETURN QUERY SELECT s.last_seq + 1, s.have + length(v_new), 'ok'::text;
END
$$;
COMMENT ON FUNCTION pgdurable._append_text(pgdurable.runs, integer, integer, text, bigint) IS
  'Internal: append a step''s text from an offset, skipping what an earlier attempt flushed.';

------------------------------------------------------------------------------
-- pgdurable.stream_tick(ids, tokens, owners, steps, at, texts, durable, seqs)
--   -> TABLE(run_id uuid, status text, seq bigint, have integer, interrupt text)
-- ONE statement per tick for every text stream of a process (one notifying
-- commit, PITFALLS #1). For each i, fenced by (id, token, owner), the run
-- leased and at step steps[i]:
-- * durable[i]: append texts[i], which starts at offset at[i] of the step's
--   text generation (what is there already is skipped: a replay). seqs[i] is
--   the run's last seq as the writer knows it (its own last flush): when it
--   is still the last, at[i] is trusted as the step's length (no re-count).
--   The run row is locked FOR UPDATE SKIP LOCKED: a row a checkpoint or a
--   renewal holds is 'busy' (the writer sends it again next tick; no wait,
--   so no deadlock with a worker's batched writes).
-- * else (the live tail): NOTIFY pgdurable_text '<run id> <seqs[i]> <at[i]>
--   <texts[i]>': the text that follows the run's event seqs[i] from offset
--   at[i] on (offsets relative to the end of that event; not stored). The
--   caller keeps each payload under 8000 bytes. Fenced by a read (no lock).
-- status: 'ok' | 'busy' | 'lost' (fence) | 'gap'; seq and have: the run's
-- last seq and the step's text length after a durable flush; interrupt: see
-- _interrupt_of (durable flushes only). Bad input -> PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.stream_tick(
  p_ids uuid[], p_tokens bigint[], p_owners text[], p_steps integer[], p_at integer[],
  p_texts text[], p_durable boolean[], p_seqs bigint[])
RETURNS TABLE (run_id uuid, status text, seq bigint, have integer, interrupt text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  n integer := cardinality(p_ids);
  i integer;
  r pgdurable.runs;
  a record;
  v_last bigint;
BEGIN
  IF n IS NULL OR cardinality(p_tokens) IS DISTINCT FROM n
     OR cardinality(p_owners) IS DISTINCT FROM n OR cardinality(p_steps) IS DISTINCT FROM n
     OR cardinality(p_at) IS DISTINCT FROM n OR cardinality(p_texts) IS DISTINCT FROM n
     OR cardinality(p_durable) IS DISTINCT FROM n OR cardinality(p_seqs) IS DISTINCT FROM n
     OR array_position(p_ids, NULL) IS NOT NULL OR array_position(p_tokens, NULL) IS NOT NULL
     OR array_position(p_owners, NULL) IS NOT NULL OR array_position(p_steps, NULL) IS NOT NULL
     OR array_position(p_at, NULL) IS NOT NULL OR array_position(p_texts, NULL) IS NOT NULL
     OR array_position(p_durable, NULL) IS NOT NULL
     OR EXISTS (SELECT FROM unnest(p_at) x WHERE x < 0) THEN
    RAISE EXCEPTION 'stream_tick: ids, tokens, owners, steps, at, texts, durable and seqs must '
      'have the same length and no NULL (but seqs), at >= 0' USING ERRCODE = 'PD000';
  END IF;
  FOR i IN 1 .. n LOOP
    run_id := p_ids[i];
    seq := NULL; have := NULL; interrupt := NULL;
    IF p_durable[i] THEN
      SELECT * INTO r FROM pgdurable.runs x
       WHERE x.id = p_ids[i] AND x.lease_token = p_tokens[i] AND x.lease_owner = p_owners[i]
         AND x.status IS NOT DISTINCT FROM 'leased' AND x.lease_expires_at > pgdurable.now()
         AND x.step = p_steps[i]
         FOR UPDATE SKIP LOCKED;
      IF NOT FOUND THEN
        status := CASE WHEN EXISTS (
          SELECT FROM pgdurable.runs x
           WHERE x.id = p_ids[i] AND x.lease_token = p_tokens[i] AND x.lease_owner = p_owners[i]
             AND x.status IS NOT DISTINCT FROM 'leased' AND x.lease_expires_at > pgdurable.now()
             AND x.step = p_steps[i]) THEN 'busy' ELSE 'lost' END;
        RETURN NEXT;
        CONTINUE;
      END IF;
      IF p_seqs[i] IS NOT NULL THEN
        SELECT coalesce(max(e.seq), 0) INTO v_last FROM pgdurable.run_events e
         WHERE e.run_id = r.id AND e.created_at >= r.created_at - interval '1 hour'
           AND e.created_at <= pgdurable.now() + interval '1 hour';
      END IF;
      IF p_seqs[i] IS NOT NULL AND v_last = p_seqs[i] THEN
        -- nobody wrote since the writer's own last flush: its count is the step's length
        INSERT INTO pgdurable.run_events (run_id, seq, event, step, idx, token)
        VALUES (r.id, v_last + 1, jsonb_build_object('type', 'text', 'text', p_texts[i]),
                p_steps[i], NULL, p_tokens[i]);
        PERFORM pg_notify('pgdurable_events', r.id::text);
        status := 'ok'; seq := v_last + 1; have := p_at[i] + length(p_texts[i]);
      ELSE
        SELECT * INTO a FROM pgdurable._append_text(r, p_steps[i], p_at[i], p_texts[i],
                                                    p_tokens[i]);
        status := a.status; seq := a.seq; have := a.have;
      END IF;
      interrupt := pgdurable._interrupt_of(r);
    ELSE
      IF EXISTS (SELECT FROM pgdurable.runs x
                  WHERE x.id = p_ids[i] AND x.lease_token = p_tokens[i]
                    AND x.lease_owner = p_owners[i] AND x.status IS NOT DISTINCT FROM 'leased'
                    AND x.lease_expires_at > pgdurable.now() AND x.step = p_steps[i]) THEN
        PERFORM pg_notify('pgdurable_text', p_ids[i]::text || ' ' || coalesce(p_seqs[i], 0)
                          || ' ' || p_at[i] || ' ' || p_texts[i]);
        status := 'ok';
      ELSE
        status := 'lost';
      END IF;
    END IF;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.stream_tick(uuid[], bigint[], text[], integer[], integer[], text[],
                                          boolean[], bigint[]) IS
  'Fenced, batched: one tick of a process''s text streams: durable text rows and live-tail NOTIFYs.';

------------------------------------------------------------------------------
-- pgdurable.stop_step(id, token, owner, step, mode, at, text) -> text
-- FENCED (PD001). A step's safe point found an interrupt or a rollback
-- (_interrupt_of): end this attempt of the step without a checkpoint.
-- * 'interrupt': the pending text (offset at of the step's generation) is
--   appended (what was answered so far stays), then the marker
--   {"type": "interrupted", "step"}.
-- * 'rollback': the pending text is dropped; the marker {"type": "rollback",
--   "step", "discard_after": seq} says that every event after that seq (the
--   step's generation: its unfinished answer) is discarded; the messages the
--   step took are consumed as discarded (thread_messages.discarded_at).
-- Either way the marker names the message whose answer the stopped generation
-- was, "answering": the thread seq of the latest message the step had taken
-- (absent for a run without a thread or a step that took none): a thread
-- stream of one message (pgdurable/runs/live.py, until=) ends at its marker.
-- Either way the step's earlier events stop being overwritten by a retry
-- (their idx is cleared): the step's next attempt emits a new answer after
-- the marker. Then the run is released (release_run: runnable, NOTIFY; a
-- pending cancel cancels it): the next attempt's inbox() returns what the
-- step took (interrupt) and every message since. Returns release_run's status.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.stop_step(p_id uuid, p_token bigint, p_owner text,
                                               p_step integer, p_mode text, p_at integer,
                                               p_text text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  s record;
  v_first bigint;
  v_marker jsonb;
  v_answering bigint;
BEGIN
  IF p_mode IS NULL OR p_mode NOT IN ('interrupt', 'rollback') OR p_step IS NULL
     OR p_at IS NULL OR p_at < 0 THEN
    RAISE EXCEPTION 'stop_step: mode interrupt or rollback, step and at >= 0 are required'
      USING ERRCODE = 'PD000';
  END IF;
  IF r.step <> p_step THEN
    RAISE EXCEPTION 'stop_step: run % is at step %, not %', p_id, r.step, p_step
      USING ERRCODE = 'PD001';
  END IF;
  IF p_mode = 'interrupt' AND coalesce(p_text, '') <> '' THEN
    PERFORM pgdurable._append_text(r, p_step, p_at, p_text, p_token);
  END IF;
  SELECT * INTO s FROM pgdurable._step_text(r, p_step);
  -- the message whose answer this generation was: the latest the step took
  SELECT max(m.seq) INTO v_answering FROM pgdurable.thread_messages m
   WHERE r.thread_key IS NOT NULL AND m.thread_key = r.thread_key AND m.taken_by = r.id
     AND m.consumed_at IS NULL;
  IF p_mode = 'interrupt' THEN
    v_marker := jsonb_build_object('type', 'interrupted', 'step', p_step);
  ELSE
    SELECT min(e.seq) INTO v_first FROM pgdurable.run_events e
     WHERE e.run_id = r.id AND e.step = p_step AND e.seq > s.mark
       AND e.created_at >= r.created_at - interval '1 hour'
       AND e.created_at <= pgdurable.now() + interval '1 hour';
    v_marker := jsonb_build_object('type', 'rollback', 'step', p_step,
                                   'discard_after', coalesce(v_first - 1, s.last_seq));
    UPDATE pgdurable.thread_messages m
       SET consumed_by = r.id, consumed_step = r.step, consumed_at = pgdurable.now(),
           discarded_at = pgdurable.now()
     WHERE r.thread_key IS NOT NULL AND m.thread_key = r.thread_key AND m.taken_by = r.id
       AND m.consumed_at IS NULL;
  END IF;
  IF v_answering IS NOT NULL THEN
    v_marker := v_marker || jsonb_build_object('answering', v_answering);
  END IF;
  UPDATE pgdurable.run_events e SET idx = NULL
   WHERE e.run_id = r.id AND e.step = p_step AND e.idx IS NOT NULL
     AND e.created_at >= r.created_at - interval '1 hour'
     AND e.created_at <= pgdurable.now() + interval '1 hour';
  INSERT INTO pgdurable.run_events (run_id, seq, event, step, idx, token)
  VALUES (r.id, s.last_seq + 1, v_marker, p_step, NULL, p_token);
  PERFORM pg_notify('pgdurable_events', r.id::text);
  RETURN pgdurable.release_run(p_id, p_token, p_owner);
END
$$;
COMMENT ON FUNCTION pgdurable.stop_step(uuid, bigint, text, integer, text, integer, text) IS
  'Fenced: end a step at a safe point for an interrupt (keep its text) or a rollback (discard it), then release.';
