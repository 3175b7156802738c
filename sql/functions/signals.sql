-- functions/signals.sql: the current body of each function below.

CREATE OR REPLACE FUNCTION pgdurable.wait_lock_key(p_kind text, p_ref text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT pg_catalog.hashtextextended(
    pg_catalog.textcat(pg_catalog.textcat(p_kind, E'\x1f'::pg_catalog.text), p_ref),
    0::pg_catalog.int8)
$$;
COMMENT ON FUNCTION pgdurable.wait_lock_key(text, text) IS
  'Advisory lock key serialising park_run and send_signal on one (kind, ref).';

------------------------------------------------------------------------------
-- pgdurable._signal_dup(signal_id, kind, ref, payload, run_id) -> uuid[]
-- Internal (0024's contract, per kind): NULL when no signal of this kind with
-- this signal_id exists, in signals or in signal_history. Otherwise the
-- existing signal must carry the same ref (ignored when p_ref is NULL),
-- payload and run_id, and its `woke` ids are returned; any difference raises
-- PD008 and nothing changes. signals first (its (kind, signal_id) key), then
-- signal_history through signal_history_ids (one probe; the history row only
-- for a resend).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._signal_dup(p_signal_id text, p_kind text, p_ref text,
                                                 p_payload jsonb, p_run_id uuid)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s record;
  v_at timestamptz;
BEGIN
  IF p_signal_id IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT x.ref, x.payload, x.run_id, x.woke INTO s
    FROM pgdurable.signals x WHERE x.kind = p_kind AND x.signal_id = p_signal_id;
  IF NOT FOUND THEN
    SELECT i.consumed_at INTO v_at
      FROM pgdurable.signal_history_ids i WHERE i.kind = p_kind AND i.signal_id = p_signal_id;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
    SELECT h.ref, h.payload, h.run_id, h.woke INTO s
      FROM pgdurable.signal_history h
     WHERE h.signal_id = p_signal_id AND h.consumed_at = v_at AND h.kind = p_kind
     LIMIT 1;
    IF NOT FOUND THEN
      -- its row is gone (a partition dropped by hand): a new id; the entry is stale
      DELETE FROM pgdurable.signal_history_ids i
       WHERE i.kind = p_kind AND i.signal_id = p_signal_id AND i.consumed_at = v_at;
      RETURN NULL;
    END IF;
  END IF;
  IF (p_ref IS NOT NULL AND s.ref IS DISTINCT FROM p_ref)
     OR s.payload IS DISTINCT FROM p_payload OR s.run_id IS DISTINCT FROM p_run_id THEN
    RAISE EXCEPTION 'signal_id % was already sent for kind % with another ref, payload or run',
      p_signal_id, p_kind USING ERRCODE = 'PD008';
  END IF;
  RETURN s.woke;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_dup(text, text, text, jsonb, uuid) IS
  'Internal: the woken ids of an identical earlier (kind, signal_id), NULL if new; PD008 if it differs.';

------------------------------------------------------------------------------
-- pgdurable._signal_check(kind, ref, signal_id): internal argument checks
-- (PD000): kind and ref non-empty, signal_id NULL or non-empty.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._signal_check(p_kind text, p_ref text, p_signal_id text)
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
-- (0005's contract; the signal_id is now scoped by kind.) Wake the runs
-- waiting on (kind, ref) or keep the signal pending (ttl NULL: until
-- consumed). A (kind, signal_id) already stored with the same ref and payload
-- returns the same run ids and delivers nothing again; with another ref or
-- payload -> PD008. The same signal_id under another kind is another signal.
-- Bad input (empty kind/ref/signal_id) -> PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.send_signal(p_kind text, p_ref text, p_payload jsonb,
                                                 p_signal_id text DEFAULT NULL,
                                                 p_ttl interval DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_sig pgdurable.signals;
  v_dup uuid[];
  v_ids uuid[];
  v_queues text[];
  v_q text;
  v_sig_id bigint;
  v_first uuid;
BEGIN
  PERFORM pgdurable._signal_check(p_kind, p_ref, p_signal_id);
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key(p_kind, p_ref));
  v_dup := pgdurable._signal_dup(p_signal_id, p_kind, p_ref, p_payload, NULL);
  IF v_dup IS NOT NULL THEN
    RETURN QUERY SELECT unnest(v_dup);
    RETURN;
  END IF;
  -- ON CONFLICT: a concurrent sender of the same (kind, signal_id) under
  -- another ref (so another advisory lock) commits first; we then judge it.
  INSERT INTO pgdurable.signals AS s (kind, ref, payload, signal_id, expires_at)
  VALUES (p_kind, p_ref, p_payload, p_signal_id, pgdurable.now() + p_ttl)
  ON CONFLICT (kind, signal_id) DO NOTHING
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
    -- plain variables, not v_ids[1] nor v_sig.id inside the UPDATE: an array
    -- subscript of a parameter in SET crashed a Citus 13.2 node (a cell)
    v_sig_id := v_sig.id;
    v_first := v_ids[1];
    UPDATE pgdurable.signals SET consumed_by = v_first, consumed_at = pgdurable.now(),
           woke = v_ids
     WHERE id = v_sig_id;
    FOREACH v_q IN ARRAY v_queues LOOP
      PERFORM pg_notify('pgdurable_wake', v_q);
    END LOOP;
    RETURN QUERY SELECT unnest(v_ids);
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable.send_signal(text, text, jsonb, text, interval) IS
  'Send a signal: wake runs waiting on (kind, ref) or keep it pending; dedup by (kind, signal_id) '
  '(PD008 on conflict).';

------------------------------------------------------------------------------
-- pgdurable.send_signals(kinds, refs, payloads, signal_ids, ttl)
--   -> TABLE(n integer, run_id uuid)
-- Many signals in ONE statement and transaction, each exactly as send_signal
-- (the same wakes, pending signals and dedup by (kind, signal_id)); a row per
-- run woken, n = the signal's 1-based position in the arrays. Any error
-- (PD000 bad input, PD008 a conflicting signal_id) and nothing of the batch
-- is kept. Why: a waking signal NOTIFYs, and PostgreSQL serialises the commits
-- of notifying transactions (PITFALLS #1), so one signal per transaction is
-- bounded by one commit each; identical NOTIFYs of one transaction merge, so a
-- batch sends one pgdurable_wake per queue and commits once. The (kind, ref)
-- advisory locks are taken in one order (by key, then position), so that two
-- batches over the same refs cannot deadlock. Arrays of different lengths, or
-- more than 10,000 signals -> PD000. signal_ids NULL: none deduplicated.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.send_signals(p_kinds text[], p_refs text[], p_payloads jsonb[],
                                                  p_signal_ids text[] DEFAULT NULL,
                                                  p_ttl interval DEFAULT NULL)
RETURNS TABLE (n integer, run_id uuid)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_len integer := coalesce(cardinality(p_kinds), 0);
  v record;
BEGIN
  IF coalesce(cardinality(p_refs), 0) <> v_len OR coalesce(cardinality(p_payloads), 0) <> v_len
     OR (p_signal_ids IS NOT NULL AND cardinality(p_signal_ids) <> v_len) THEN
    RAISE EXCEPTION 'send_signals: kinds, refs, payloads (and signal_ids) must have the same length'
      USING ERRCODE = 'PD000';
  END IF;
  IF v_len > 10000 THEN
    RAISE EXCEPTION 'send_signals: at most 10000 signals per call, got %', v_len
      USING ERRCODE = 'PD000';
  END IF;
  FOR v IN SELECT u.i::integer AS i, u.k, u.r, u.p, p_signal_ids[u.i] AS sid
             FROM unnest(p_kinds, p_refs, p_payloads) WITH ORDINALITY AS u(k, r, p, i)
            ORDER BY pgdurable.wait_lock_key(u.k, u.r), u.i LOOP
    RETURN QUERY SELECT v.i, s.s FROM pgdurable.send_signal(v.k, v.r, v.p, v.sid, p_ttl) AS s(s);
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.send_signals(text[], text[], jsonb[], text[], interval) IS
  'Send many signals in one statement and transaction (each as send_signal); one NOTIFY per queue.';

------------------------------------------------------------------------------
-- pgdurable.signal_run(run_id, kind, payload, signal_id, ttl) -> SETOF uuid
-- (0005's contract; the signal_id is now scoped by kind.) A signal for one
-- run: it wakes the run if it waits on this kind, else it stays pending for
-- that run only. A finished run: nothing (no row). Unknown run: PD002. A
-- (kind, signal_id) already sent to the same run with the same payload returns
-- the first answer; to another run or with another payload -> PD008.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.signal_run(p_run_id uuid, p_kind text, p_payload jsonb,
                                                p_signal_id text DEFAULT NULL,
                                                p_ttl interval DEFAULT NULL)
RETURNS SETOF uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
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
  ON CONFLICT (kind, signal_id) DO NOTHING
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
  'Signal one run: wake it if it waits on this kind, else keep it pending for that run; '
  'dedup by (kind, signal_id).';

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
CREATE OR REPLACE FUNCTION pgdurable.park_run(p_id uuid, p_token bigint, p_owner text, p_state jsonb,
                                   p_spend numeric, p_kind text, p_ref text,
                                   p_wake_at timestamptz, p_wake_in interval DEFAULT NULL)
RETURNS TABLE (status text, wake_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_err jsonb := pgdurable._verdict(r, p_spend, true);
  v_sig pgdurable.signals;
  v_wake_at timestamptz := least(coalesce(p_wake_at, pgdurable.now() + p_wake_in), r.deadline_at);
  v_wake jsonb;
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
      -- the wake record computed first: Citus refuses a non-IMMUTABLE call
      -- (jsonb_build_object) inside a CASE of an UPDATE (a cell)
      v_wake := jsonb_build_object('type', 'signal', 'kind', v_sig.kind, 'ref', p_ref,
                                   'payload', v_sig.payload, 'at', v_sig.created_at,
                                   'signal', v_sig.id)
                || CASE WHEN v_sig.run_id IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('run_id', v_sig.run_id) END;
      UPDATE pgdurable.runs SET status = 'runnable', available_at = pgdurable.now(),
             lease_owner = NULL, lease_expires_at = NULL, wake = v_wake,
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
-- pgdurable.move_consumed_signals(min_age, batch) -> bigint
-- ONE short transaction: move up to p_batch signals consumed at least p_min_age
-- ago (oldest first) from signals to signal_history; returns how many. Rows
-- locked by someone else are skipped. p_min_age (default 1 hour) bounds the
-- dedup race with a REPEATABLE READ sender (see the top of 0022); 0 is allowed
-- (tests, or installations that send signals only in READ COMMITTED).
-- p_min_age < 0 or p_batch outside 1..100000: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.move_consumed_signals(p_min_age interval DEFAULT interval '1 hour',
                                                p_batch integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_moved bigint;
BEGIN
  IF p_min_age IS NULL OR p_min_age < interval '0' THEN
    RAISE EXCEPTION 'move_consumed_signals: min_age must be a non-negative interval'
      USING ERRCODE = 'PD000';
  END IF;
  IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'move_consumed_signals: batch must be between 1 and 100000'
      USING ERRCODE = 'PD000';
  END IF;
  WITH doomed AS MATERIALIZED (
    SELECT s.id FROM pgdurable.signals s
     WHERE s.consumed_at IS NOT NULL AND s.consumed_at <= pgdurable.now() - p_min_age
     ORDER BY s.consumed_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED
  ), moved AS (
    DELETE FROM pgdurable.signals s USING doomed WHERE s.id = doomed.id
    RETURNING s.id, s.kind, s.ref, s.payload, s.signal_id, s.run_id, s.created_at, s.expires_at,
              s.consumed_by, s.consumed_at, s.woke
  )
  INSERT INTO pgdurable.signal_history (id, kind, ref, payload, signal_id, run_id, created_at,
                                        expires_at, consumed_by, consumed_at, woke)
  SELECT * FROM moved;
  GET DIAGNOSTICS v_moved = ROW_COUNT;
  RETURN v_moved;
END
$$;
COMMENT ON FUNCTION pgdurable.move_consumed_signals(interval, integer) IS
  'Move one batch of signals consumed at least min_age ago into signal_history; returns how many.';

CREATE OR REPLACE FUNCTION pgdurable._signal_history_ids_add() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e record;
BEGIN
  IF current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus): a statement reading a transition table into a distributed table is
    -- refused ("unrecognized RTE kind"): the transition table is read alone, and each
    -- pair written by a single-table statement, in key order
    FOR e IN SELECT DISTINCT ON (n.kind, n.signal_id) n.kind, n.signal_id, n.consumed_at
               FROM new_rows n
              WHERE n.signal_id IS NOT NULL
              ORDER BY n.kind, n.signal_id, n.consumed_at DESC LOOP
      INSERT INTO pgdurable.signal_history_ids AS i (kind, signal_id, consumed_at)
      VALUES (e.kind, e.signal_id, e.consumed_at)
      ON CONFLICT (kind, signal_id) DO UPDATE SET consumed_at = excluded.consumed_at;
    END LOOP;
    RETURN NULL;
  END IF;
  INSERT INTO pgdurable.signal_history_ids AS i (kind, signal_id, consumed_at)
  SELECT DISTINCT ON (n.kind, n.signal_id) n.kind, n.signal_id, n.consumed_at
    FROM new_rows n
   WHERE n.signal_id IS NOT NULL
   ORDER BY n.kind, n.signal_id, n.consumed_at DESC
  ON CONFLICT (kind, signal_id) DO UPDATE SET consumed_at = excluded.consumed_at;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_history_ids_add() IS
  'Internal: add the (kind, signal_id) pairs a statement inserted into signal_history to '
  'signal_history_ids.';
DROP TRIGGER IF EXISTS signal_history_ids_add ON pgdurable.signal_history;
CREATE TRIGGER signal_history_ids_add AFTER INSERT ON pgdurable.signal_history
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_add();
DROP TRIGGER IF EXISTS signal_history_ids_update_add ON pgdurable.signal_history;
CREATE TRIGGER signal_history_ids_update_add AFTER UPDATE ON pgdurable.signal_history
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_add();

CREATE OR REPLACE FUNCTION pgdurable._signal_history_ids_remove() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e record;
BEGIN
  IF current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus): the transition table read alone (see _signal_history_ids_add)
    FOR e IN SELECT DISTINCT o.kind, o.signal_id, o.consumed_at FROM old_rows o
              WHERE o.signal_id IS NOT NULL ORDER BY 1, 2, 3 LOOP
      DELETE FROM pgdurable.signal_history_ids i
       WHERE i.kind = e.kind AND i.signal_id = e.signal_id AND i.consumed_at = e.consumed_at;
    END LOOP;
    RETURN NULL;
  END IF;
  DELETE FROM pgdurable.signal_history_ids i
   USING old_rows o
   WHERE i.kind = o.kind AND i.signal_id = o.signal_id AND i.consumed_at = o.consumed_at;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_history_ids_remove() IS
  'Internal: remove the (kind, signal_id) pairs a statement deleted from signal_history from '
  'signal_history_ids.';
DROP TRIGGER IF EXISTS signal_history_ids_remove ON pgdurable.signal_history;
CREATE TRIGGER signal_history_ids_remove AFTER DELETE ON pgdurable.signal_history
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_remove();
DROP TRIGGER IF EXISTS signal_history_ids_update_remove ON pgdurable.signal_history;
CREATE TRIGGER signal_history_ids_update_remove AFTER UPDATE ON pgdurable.signal_history
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_remove();
