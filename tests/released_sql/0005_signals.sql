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

------------------------------------------------------------------------------
-- pgdurable._signal_dup(signal_id, kind, ref, payload, run_id) -> uuid[]
-- Internal: NULL when no signal with this signal_id exists. Otherwise the
-- existing signal must carry the same kind, ref (ignored when p_ref is NULL),
-- payload and run_id, and its `woke` ids are returned; any difference raises
-- PD008 (SignalConflict) and nothing changes.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._signal_dup(p_signal_id text, p_kind text, p_ref text,
                                      p_payload jsonb, p_run_id uuid)
RETURNS uuid[]
LANGUAGE plpgsql AS $$
DECLARE
  s pgdurable.signals;
BEGIN
  IF p_signal_id IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT * INTO s FROM pgdurable.signals x WHERE x.signal_id = p_signal_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF s.kind IS DISTINCT FROM p_kind OR (p_ref IS NOT NULL AND s.ref IS DISTINCT FROM p_ref)
     OR s.payload IS DISTINCT FROM p_payload OR s.run_id IS DISTINCT FROM p_run_id THEN
    RAISE EXCEPTION 'signal_id % was already sent with another kind, ref, payload or run',
      p_signal_id USING ERRCODE = 'PD008';
  END IF;
  RETURN s.woke;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_dup(text, text, text, jsonb, uuid) IS
  'Internal: the woken ids of an identical earlier signal_id, NULL if new; PD008 if it differs.';

------------------------------------------------------------------------------
-- pgdurable._signal_check(kind, ref, signal_id): internal argument checks
-- (PD000): kind and ref non-empty, signal_id NULL or non-empty.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._signal_check(p_kind text, p_ref text, p_signal_id text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_kind IS NULL OR p_kind = '' OR p_ref IS NULL OR p_ref = '' THEN
    RAISE EXCEPTION 'signal kind and ref must be non-empty' USING ERRCODE = 'PD000';
  END IF;
  IF p_signal_id = '' THEN
    RAISE EXCEPTION 'signal_id must be NULL or non-empty' USING ERRCODE = 'PD000';
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_check(text, text, text) IS
  'Internal: PD000 unless kind/ref are non-empty and signal_id is NULL or non-empty.';

------------------------------------------------------------------------------
-- pgdurable.send_signal(kind, ref, payload, signal_id, ttl) -> SETOF uuid
-- ONE transaction, under pg_advisory_xact_lock(wait_lock_key(kind, ref)):
-- every run waiting on (kind, ref) becomes 'runnable' with
--   wake = {type: 'signal', kind, ref, payload, at, signal}
-- (its wait and timer cleared; NOTIFY pgdurable_wake once per queue) and the
-- woken ids are returned. The signal row is stored with woke = those ids:
-- consumed (by the first woken run) if any woke, else pending until
-- now() + ttl (ttl NULL = no expiry) for the next park on (kind, ref).
-- DEDUP (S15): a signal_id already stored with the same kind, ref and payload
-- changes nothing and returns the ids it woke the first time (a retried
-- webhook gets the same answer; nothing is delivered twice). The same
-- signal_id with another kind, ref, payload (or a signal_run id) -> PD008.
-- Bad input (empty kind/ref/signal_id) -> PD000.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.send_signal(p_kind text, p_ref text, p_payload jsonb,
                                      p_signal_id text DEFAULT NULL,
                                      p_ttl interval DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
  v_sig pgdurable.signals;
  v_dup uuid[];
  v_ids uuid[];
  v_queues text[];
  v_q text;
BEGIN
  PERFORM pgdurable._signal_check(p_kind, p_ref, p_signal_id);
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key(p_kind, p_ref));
  v_dup := pgdurable._signal_dup(p_signal_id, p_kind, p_ref, p_payload, NULL);
  IF v_dup IS NOT NULL THEN
    RETURN QUERY SELECT unnest(v_dup);
    RETURN;
  END IF;
  -- ON CONFLICT: a concurrent sender of the same signal_id under another
  -- (kind, ref) (so another advisory lock) commits first; we then judge it.
  INSERT INTO pgdurable.signals AS s (kind, ref, payload, signal_id, expires_at)
  VALUES (p_kind, p_ref, p_payload, p_signal_id, pgdurable.now() + p_ttl)
  ON CONFLICT (signal_id) DO NOTHING
  RETURNING * INTO v_sig;
  IF v_sig.id IS NULL THEN
    RETURN QUERY SELECT unnest(pgdurable._signal_dup(p_signal_id, p_kind, p_ref, p_payload, NULL));
    RETURN;
  END IF;
  WITH w AS (
    UPDATE pgdurable.runs r SET status = 'runnable', available_at = pgdurable.now(),
           wake = jsonb_build_object('type', 'signal', 'kind', p_kind, 'ref', p_ref,
                                     'payload', p_payload, 'at', v_sig.created_at,
                                     'signal', v_sig.id),
           wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
           updated_at = pgdurable.now()
     WHERE r.status = 'waiting' AND r.wait_kind = p_kind AND r.wait_ref = p_ref
    RETURNING r.id, r.queue)
  SELECT array_agg(w.id ORDER BY w.id), array_agg(DISTINCT w.queue) INTO v_ids, v_queues FROM w;
  IF v_ids IS NOT NULL THEN
    UPDATE pgdurable.signals SET consumed_by = v_ids[1], consumed_at = pgdurable.now(),
           woke = v_ids
     WHERE id = v_sig.id;
    FOREACH v_q IN ARRAY v_queues LOOP
      PERFORM pg_notify('pgdurable_wake', v_q);
    END LOOP;
    RETURN QUERY SELECT unnest(v_ids);
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable.send_signal(text, text, jsonb, text, interval) IS
  'Send a signal: wake runs waiting on (kind, ref) or keep it pending; dedup by signal_id (PD008 on conflict).';

------------------------------------------------------------------------------
-- pgdurable.signal_run(run_id, kind, payload, signal_id, ttl) -> SETOF uuid
-- A signal addressed to ONE run. Locks the run (FOR UPDATE; unknown id ->
-- PD002). If it is 'waiting' on this kind (any ref), it becomes 'runnable'
-- with wake = {type: 'signal', kind, ref: its wait_ref, payload, at, signal,
-- run_id} (NOTIFY its queue) and its id is returned. If it is runnable,
-- leased or waiting on something else, the signal is kept pending for this
-- run only (signals.run_id; ref = the run id) until now() + ttl, and
-- park_run hands it over when the run parks on this kind; nothing is
-- returned. A terminal run: nothing is stored, nothing returned.
-- signal_id dedup as in send_signal (same run, kind, payload: the first
-- result again; otherwise PD008).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.signal_run(p_run_id uuid, p_kind text, p_payload jsonb,
                                     p_signal_id text DEFAULT NULL,
                                     p_ttl interval DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs;
  v_sig pgdurable.signals;
  v_dup uuid[];
  v_ref text;
BEGIN
  PERFORM pgdurable._signal_check(p_kind, 'x', p_signal_id);
  r := pgdurable._locked_run(p_run_id);
  v_dup := pgdurable._signal_dup(p_signal_id, p_kind, NULL, p_payload, p_run_id);
  IF v_dup IS NOT NULL THEN
    RETURN QUERY SELECT unnest(v_dup);
    RETURN;
  END IF;
  IF r.status IN ('completed', 'failed', 'cancelled', 'incompatible') THEN
    RETURN;
  END IF;
  v_ref := CASE WHEN r.status = 'waiting' AND r.wait_kind = p_kind THEN r.wait_ref
                ELSE p_run_id::text END;
  INSERT INTO pgdurable.signals AS s (kind, ref, payload, signal_id, run_id, expires_at)
  VALUES (p_kind, v_ref, p_payload, p_signal_id, p_run_id, pgdurable.now() + p_ttl)
  ON CONFLICT (signal_id) DO NOTHING
  RETURNING * INTO v_sig;
  IF v_sig.id IS NULL THEN
    RETURN QUERY SELECT unnest(pgdurable._signal_dup(p_signal_id, p_kind, NULL, p_payload, p_run_id));
    RETURN;
  END IF;
  IF r.status = 'waiting' AND r.wait_kind = p_kind THEN
    UPDATE pgdurable.runs SET status = 'runnable', available_at = pgdurable.now(),
           wake = jsonb_build_object('type', 'signal', 'kind', p_kind, 'ref', r.wait_ref,
                                     'payload', p_payload, 'at', v_sig.created_at,
                                     'signal', v_sig.id, 'run_id', p_run_id),
           wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
           updated_at = pgdurable.now()
     WHERE id = p_run_id;
    UPDATE pgdurable.signals SET consumed_by = p_run_id, consumed_at = pgdurable.now(),
           woke = ARRAY[p_run_id]
     WHERE id = v_sig.id;
    PERFORM pg_notify('pgdurable_wake', r.queue);
    RETURN NEXT p_run_id;
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable.signal_run(uuid, text, jsonb, text, interval) IS
  'Signal one run: wake it if it waits on this kind, else keep the signal pending for it alone.';

------------------------------------------------------------------------------
-- pgdurable.park_run(id, token, owner, state, spend, kind, ref, wake_at, wake_in)
--   -> TABLE(status text, wake_at timestamptz)
-- FENCED (PD001). Checkpoint the state, then park the run: status 'waiting',
-- lease released, wait_kind/wait_ref/wait_since/wake_at set. kind/ref both
-- NULL = a plain timer (Sleep), which needs wake_at or wake_in (else PD000);
-- with a signal, wake_at and wake_in NULL = no timeout. wake_at is capped
-- at the run's deadline (so a parked run wakes to fail on time). wake_in (an
-- interval from now, database clock) is used when wake_at is NULL.
-- With kind/ref: takes pg_advisory_xact_lock(wait_lock_key(kind, ref)) (and
-- holds the run's row lock) and, if a pending signal exists -- the oldest
-- unconsumed, unexpired one that is either broadcast on (kind, ref) (run_id
-- NULL) or addressed to this run with this kind (signal_run, any ref) --
-- consumes it and leaves the run 'runnable' with wake = {type: 'signal',
-- kind, ref, payload, at, signal[, run_id]} (NOTIFY queue) instead of
-- parking: a signal sent before the park is never lost.
-- Verdicts first: a pending cancel -> 'cancelled', over budget/deadline -> 'failed'.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.park_run(p_id uuid, p_token bigint, p_owner text, p_state jsonb,
                                   p_spend numeric, p_kind text, p_ref text,
                                   p_wake_at timestamptz, p_wake_in interval DEFAULT NULL)
RETURNS TABLE (status text, wake_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_err jsonb := pgdurable._verdict(r, p_spend, true);
  v_sig pgdurable.signals;
  v_wake_at timestamptz := least(coalesce(p_wake_at, pgdurable.now() + p_wake_in), r.deadline_at);
BEGIN
  IF (p_kind IS NULL) <> (p_ref IS NULL) OR p_kind = '' OR p_ref = '' THEN
    RAISE EXCEPTION 'park_run: kind and ref must both be non-empty or both NULL'
      USING ERRCODE = 'PD000';
  END IF;
  IF p_kind IS NULL AND p_wake_at IS NULL AND p_wake_in IS NULL THEN
    -- a timer with no time: parked on nothing, nothing could ever wake it
    RAISE EXCEPTION 'park_run: a timer (kind and ref NULL) needs wake_at or wake_in'
      USING ERRCODE = 'PD000';
  END IF;
  PERFORM pgdurable._checkpoint(r, p_token, p_state, p_spend);
  IF v_err IS NOT NULL THEN
    RETURN QUERY SELECT pgdurable._end(p_id, CASE WHEN v_err->>'type' = 'RunCancelled'
                                   THEN 'cancelled' ELSE 'failed' END, v_err, 0), NULL::timestamptz;
    RETURN;
  END IF;
  IF p_kind IS NOT NULL THEN
    PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key(p_kind, p_ref));
    SELECT * INTO v_sig FROM pgdurable.signals s
     WHERE s.id = (
       SELECT min(c.id) FROM (
         (SELECT s1.id FROM pgdurable.signals s1
           WHERE s1.kind = p_kind AND s1.ref = p_ref AND s1.run_id IS NULL
             AND s1.consumed_at IS NULL
             AND (s1.expires_at IS NULL OR s1.expires_at > pgdurable.now())
           ORDER BY s1.id LIMIT 1)
         UNION ALL
         (SELECT s2.id FROM pgdurable.signals s2
           WHERE s2.run_id = p_id AND s2.kind = p_kind AND s2.consumed_at IS NULL
             AND (s2.expires_at IS NULL OR s2.expires_at > pgdurable.now())
           ORDER BY s2.id LIMIT 1)) c)
     FOR UPDATE;
    IF FOUND THEN
      UPDATE pgdurable.signals SET consumed_by = p_id, consumed_at = pgdurable.now()
       WHERE id = v_sig.id;
      UPDATE pgdurable.runs SET status = 'runnable', available_at = pgdurable.now(),
             lease_owner = NULL, lease_expires_at = NULL,
             wake = jsonb_build_object('type', 'signal', 'kind', v_sig.kind, 'ref', p_ref,
                                       'payload', v_sig.payload, 'at', v_sig.created_at,
                                       'signal', v_sig.id)
                    || CASE WHEN v_sig.run_id IS NULL THEN '{}'::jsonb
                            ELSE jsonb_build_object('run_id', v_sig.run_id) END,
             updated_at = pgdurable.now()
       WHERE id = p_id;
      PERFORM pg_notify('pgdurable_wake', r.queue);
      RETURN QUERY SELECT 'runnable'::text, NULL::timestamptz;
      RETURN;
    END IF;
  END IF;
  UPDATE pgdurable.runs SET status = 'waiting', lease_owner = NULL, lease_expires_at = NULL,
         wait_kind = p_kind, wait_ref = p_ref, wait_since = pgdurable.now(),
         wake_at = v_wake_at, updated_at = pgdurable.now()
   WHERE id = p_id;
  RETURN QUERY SELECT 'waiting'::text, v_wake_at;
END
$$;
COMMENT ON FUNCTION pgdurable.park_run(uuid, bigint, text, jsonb, numeric, text, text, timestamptz, interval) IS
  'Fenced: checkpoint and park, consuming a pending broadcast or run-addressed signal instead if one exists.';

------------------------------------------------------------------------------
-- pgdurable.waiting_runs: every parked run and what it waits for.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.waiting_runs AS
  SELECT r.id                                        AS run_id,
         r.task,
         r.queue,
         CASE WHEN r.wait_kind IS NULL THEN 'timer'
              WHEN r.wake_at IS NULL THEN 'signal'
              ELSE 'signal_or_timeout' END           AS waits_for,
         r.wait_kind                                 AS kind,
         r.wait_ref                                  AS ref,
         r.wait_since,
         r.wake_at,
         pgdurable.now() - r.wait_since              AS waited,
         r.wake_at - pgdurable.now()                 AS wakes_in,
         r.deadline_at,
         (SELECT count(*) FROM pgdurable.signals s
           WHERE s.run_id = r.id AND s.consumed_at IS NULL
             AND (s.expires_at IS NULL OR s.expires_at > pgdurable.now())) AS pending_signals
    FROM pgdurable.runs r
   WHERE r.status = 'waiting';
COMMENT ON VIEW pgdurable.waiting_runs IS
  'Parked runs (status waiting): what each waits for (signal kind/ref and/or timer), since when, until when.';
COMMENT ON COLUMN pgdurable.waiting_runs.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.waiting_runs.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.waiting_runs.queue IS 'Queue the run goes back to when it wakes.';
COMMENT ON COLUMN pgdurable.waiting_runs.waits_for IS
  'timer (Sleep) | signal (Wait without timeout) | signal_or_timeout (Wait with timeout).';
COMMENT ON COLUMN pgdurable.waiting_runs.kind IS 'Signal kind awaited (e.g. ci, approval); NULL for a timer.';
COMMENT ON COLUMN pgdurable.waiting_runs.ref IS 'Signal reference awaited (e.g. a build id); NULL for a timer.';
COMMENT ON COLUMN pgdurable.waiting_runs.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.waiting_runs.wake_at IS
  'When the timer fires (Sleep end or Wait timeout, capped at the deadline); NULL = no timer.';
COMMENT ON COLUMN pgdurable.waiting_runs.waited IS 'How long it has been parked (pgdurable.now() - wait_since).';
COMMENT ON COLUMN pgdurable.waiting_runs.wakes_in IS 'Time left until wake_at (negative: due, a worker will claim it).';
COMMENT ON COLUMN pgdurable.waiting_runs.deadline_at IS 'The run''s deadline, if any.';
COMMENT ON COLUMN pgdurable.waiting_runs.pending_signals IS
  'Unexpired signals addressed to this run (signal_run) of another kind than it waits for.';
