-- functions/events.sql: the current body of each function below (0037_events).

------------------------------------------------------------------------------
-- pgdurable.event_ref(name, path, value) -> text
-- The lookup key of "events of `name` whose `path` equals `value`" (a wait's
-- first match field, a cancel_on): runs.wait_ref of a run parked on such a
-- wait, event_cancels.ref. Numbers are compared by value (1 = 1.0); the value
-- is hashed, so that a long string makes a short key (the matches are checked
-- in full after the lookup).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.event_ref(p_name text, p_path text, p_value jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT p_name || pg_catalog.chr(31) || p_path || pg_catalog.chr(31) || pg_catalog.md5(
    CASE pg_catalog.jsonb_typeof(p_value)
      WHEN 'number' THEN pg_catalog.trim_scale(p_value::pg_catalog.numeric)::pg_catalog.text
      ELSE p_value::pg_catalog.text END)
$$;
COMMENT ON FUNCTION pgdurable.event_ref(text, text, jsonb) IS
  'Lookup key of (event name, dotted path, scalar value): runs.wait_ref of an event wait, '
  'event_cancels.ref.';

------------------------------------------------------------------------------
-- pgdurable._event_path(path) -> text[]
-- Internal: 'data.a.b' -> '{a,b}' (the path inside events.data). PD000 for a
-- path that is not 'data.' followed by non-empty dot-separated names.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_path(p_path text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  v text[];
BEGIN
  IF p_path IS NULL OR p_path NOT LIKE 'data.%' THEN
    RAISE EXCEPTION 'event path % must start with "data."', coalesce(p_path, 'NULL')
      USING ERRCODE = 'PD000';
  END IF;
  v := pg_catalog.string_to_array(pg_catalog.substr(p_path, 6), '.');
  IF '' = ANY (v) THEN
    RAISE EXCEPTION 'event path % has an empty name', p_path USING ERRCODE = 'PD000';
  END IF;
  RETURN v;
END
$$;
COMMENT ON FUNCTION pgdurable._event_path(text) IS
  'Internal: a dotted event path (data.a.b) as the path inside events.data ({a,b}); PD000 if bad.';

------------------------------------------------------------------------------
-- pgdurable._event_match_check(match) -> text (the first path)
-- Internal: PD000 unless match is a non-empty JSON object of dotted paths
-- (data....) to scalars (string, number, boolean). Returns the first path in
-- sort order: the one the wait is looked up by.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_match_check(p_match jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  m record;
  v_first text;
BEGIN
  IF p_match IS NULL OR jsonb_typeof(p_match) <> 'object' OR p_match = '{}'::jsonb THEN
    RAISE EXCEPTION 'an event match must be a non-empty object of path -> value'
      USING ERRCODE = 'PD000';
  END IF;
  FOR m IN SELECT j.key, j.value FROM jsonb_each(p_match) j ORDER BY j.key LOOP
    PERFORM pgdurable._event_path(m.key);
    IF jsonb_typeof(m.value) NOT IN ('string', 'number', 'boolean') THEN
      RAISE EXCEPTION 'event match %: the value must be a string, number or boolean', m.key
        USING ERRCODE = 'PD000';
    END IF;
    v_first := coalesce(v_first, m.key);
  END LOOP;
  RETURN v_first;
END
$$;
COMMENT ON FUNCTION pgdurable._event_match_check(jsonb) IS
  'Internal: PD000 unless match maps data.... paths to scalars; returns its first path.';

------------------------------------------------------------------------------
-- pgdurable._event_matches(match, data) -> boolean
-- Internal: every path of match equals its value in data (jsonb equality).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_matches(p_match jsonb, p_data jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
  SELECT NOT EXISTS (
    SELECT 1 FROM pg_catalog.jsonb_each(p_match) m
     WHERE (p_data OPERATOR(pg_catalog.#>) pgdurable._event_path(m.key))
           IS DISTINCT FROM m.value)
$$;
COMMENT ON FUNCTION pgdurable._event_matches(jsonb, jsonb) IS
  'Internal: true when every path of match equals its value in the event data.';

------------------------------------------------------------------------------
-- pgdurable._event_doc(path, value) -> jsonb
-- Internal: the object that events.data contains when path equals value
-- ('data.a.b', 1 -> {"a": {"b": 1}}), for the GIN index (jsonb_path_ops).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_doc(p_path text, p_value jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  v_parts text[] := pgdurable._event_path(p_path);
  v jsonb := p_value;
  i integer;
BEGIN
  FOR i IN REVERSE pg_catalog.array_length(v_parts, 1) .. 1 LOOP
    v := pg_catalog.jsonb_build_object(v_parts[i], v);
  END LOOP;
  RETURN v;
END
$$;
COMMENT ON FUNCTION pgdurable._event_doc(text, jsonb) IS
  'Internal: the containment document of (path, value), e.g. data.a.b = 1 -> {"a": {"b": 1}}.';

------------------------------------------------------------------------------
-- pgdurable._event_json(event) -> jsonb
-- Internal: what a woken wait and a trigger's handler get of an event:
-- {"id", "name", "data", "event_id" (the dedup id or null), "time"}.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_json(e pgdurable.events) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT pg_catalog.jsonb_build_object('id', e.id, 'name', e.name, 'data', e.data,
                                       'event_id', e.event_key, 'time', e.created_at)
$$;
COMMENT ON FUNCTION pgdurable._event_json(pgdurable.events) IS
  'Internal: an event as waits and handlers see it: {id, name, data, event_id, time}.';

------------------------------------------------------------------------------
-- pgdurable._event_register_path(name, path)
-- Internal: make send_event look at `path` of events of `name` from now on.
-- A new path is inserted under the EXCLUSIVE advisory lock of the name
-- (senders hold it SHARED while they read the paths): a sender either sees
-- the path or commits before the registering transaction goes on. Call it
-- before locking any run row (senders lock runs under the shared lock).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_register_path(p_name text, p_path text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM pgdurable.event_paths p WHERE p.name = p_name AND p.path = p_path) THEN
    RETURN;
  END IF;
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('event-paths', p_name));
  INSERT INTO pgdurable.event_paths (name, path) VALUES (p_name, p_path)
  ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION pgdurable._event_register_path(text, text) IS
  'Internal: add (name, path) to event_paths under the name''s exclusive advisory lock.';

------------------------------------------------------------------------------
-- pgdurable._event_check(name, data, id): internal argument checks (PD000):
-- name non-empty, data a JSON object (NULL: {}), id NULL or non-empty.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_check(p_name text, p_data jsonb, p_id text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  IF p_name IS NULL OR p_name = '' THEN
    RAISE EXCEPTION 'event name must be non-empty' USING ERRCODE = 'PD000';
  END IF;
  IF p_data IS NOT NULL AND jsonb_typeof(p_data) <> 'object' THEN
    RAISE EXCEPTION 'event data must be a JSON object, not %', jsonb_typeof(p_data)
      USING ERRCODE = 'PD000';
  END IF;
  IF p_id = '' THEN
    RAISE EXCEPTION 'event id must be NULL or non-empty' USING ERRCODE = 'PD000';
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable._event_check(text, jsonb, text) IS
  'Internal: PD000 unless the event name is non-empty, data an object and id NULL or non-empty.';

------------------------------------------------------------------------------
-- pgdurable._event_window_add(trigger, event) -> text (the queue to NOTIFY, or NULL)
-- Internal (send_event): put the event into the open window of (trigger,
-- key) or open one. Senders of one (trigger, key) are serialised by an
-- advisory lock. The window's due time becomes
--   debounce: least(last_event_at + debounce, opened_at + max_wait);
--   batch:    now when this event fills it, else opened_at + batch_timeout;
--   both:     the earlier of the two.
-- THE WINDOW ROW DECIDES. The open window takes the event while its run has
-- not read it: its run's take_due_event_window closes it (closed_at) once
-- due, under the window's row lock, and this UPDATE of the window re-checks
-- closed_at under the same lock, so every event is either read by that run or
-- opens the next window, never both, never neither. The run is not touched
-- (no UPDATE of runs per event: it was 70 % of a debounced send's extra
-- cost): it is started at the window's first due time, and when it finds the
-- window due later (events came meanwhile) it sleeps until then
-- (pgdurable.runs.events.trigger_step). A run that ended without reading its
-- window (cancelled) takes no more events: the run's row is read FOR SHARE,
-- so a cancel commits before this join or after it (and the event is then
-- that run's, as the window's other events are). A full batch is closed and
-- its run made due now (a sleeping one woken). No open window, or its run
-- ended: the old one is closed and a new window opens with a new run
-- (start_run_flow, delayed to the due time). Leading debounce: when no event
-- of (trigger, key) came within the last `debounce`, the new window is due at
-- once and closed (this event alone); later ones open a trailing one. A
-- trigger with neither debounce nor batch: one run per event. A window closed
-- at its opening (one event: one per event, batch 1, leading) hands its event
-- to its run in the run's state ({"events": [...]}): the run reads no window.
-- The run's flow-control key (runs.concurrency_key) is the window's key: a
-- queue's per_key_concurrency bounds the runs of one key
-- (docs/flow_control.md).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_window_add(t pgdurable.event_triggers,
                                                       e pgdurable.events)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now timestamptz := pgdurable.now();
  v_key text := '';
  w pgdurable.event_windows;
  v_due timestamptz;
  v_full boolean;
  v_queue text;
  v_run uuid;
  v_last timestamptz;
  v_open timestamptz;
  v_alone boolean;
BEGIN
  IF t.key_path IS NOT NULL THEN
    v_key := coalesce(e.data #>> pgdurable._event_path(t.key_path), '');
  END IF;
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('event-window:' || t.name, v_key));
  SELECT * INTO w FROM pgdurable.event_windows x
   WHERE x.trigger = t.name AND x.key = v_key AND x.closed_at IS NULL;
  IF FOUND THEN
    -- a sender's time is its transaction's start: an older transaction can take the
    -- lock after a younger one; the window's first and last event times are kept
    -- as the earliest and the latest of its events' times
    v_open := least(w.opened_at, v_now);
    v_last := greatest(w.last_event_at, v_now);
    v_full := t.batch IS NOT NULL AND w.events + 1 >= t.batch;
    v_due := CASE WHEN v_full THEN v_now
                  ELSE least(CASE WHEN t.debounce IS NOT NULL
                                  THEN least(v_last + t.debounce, v_open + t.max_wait) END,
                             v_open + t.batch_timeout) END;
    PERFORM 1 FROM pgdurable.runs r
      WHERE r.id = w.run_id AND r.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible')
        FOR SHARE;
    IF FOUND THEN
      UPDATE pgdurable.event_windows x SET events = x.events + 1, opened_at = v_open,
             last_event_at = v_last, due_at = v_due,
             closed_at = CASE WHEN v_full THEN v_now END
       WHERE x.id = w.id AND x.closed_at IS NULL;
    END IF;
    IF FOUND THEN
      INSERT INTO pgdurable.event_window_events (window_id, event_id, event_at)
      VALUES (w.id, e.id, e.created_at);
      IF NOT v_full THEN
        RETURN NULL;
      END IF;
      -- full: its run goes now (if it sleeps, having found the window not yet due, wake it)
      UPDATE pgdurable.runs r SET available_at = least(r.available_at, v_now),
             wake_at = CASE WHEN r.status = 'waiting' THEN v_now ELSE r.wake_at END,
             updated_at = v_now
       WHERE r.id = w.run_id
         AND (r.status = 'runnable' OR (r.status = 'waiting' AND r.wait_kind IS NULL))
      RETURNING r.queue INTO v_queue;
      RETURN v_queue;
    END IF;
    -- its run ended (or read it): that window is over
    UPDATE pgdurable.event_windows SET closed_at = v_now WHERE id = w.id AND closed_at IS NULL;
  END IF;
  v_alone := (t.debounce IS NULL AND t.batch IS NULL) OR coalesce(t.batch = 1, false);
  IF t.leading_edge AND NOT v_alone THEN
    SELECT x.last_event_at INTO v_last FROM pgdurable.event_windows x
     WHERE x.trigger = t.name AND x.key = v_key ORDER BY x.id DESC LIMIT 1;
    v_alone := v_last IS NULL OR v_last <= v_now - t.debounce;
  END IF;
  v_due := CASE WHEN v_alone THEN v_now
                ELSE least(CASE WHEN t.debounce IS NOT NULL
                                THEN least(v_now + t.debounce, v_now + t.max_wait) END,
                           v_now + t.batch_timeout) END;
  SELECT s.run_id INTO v_run
    FROM pgdurable.start_run_flow(t.task, t.revision,
                                  CASE WHEN v_alone
                                       THEN jsonb_build_object('trigger', t.name, 'key', v_key,
                                                               'events', jsonb_build_array(
                                                                 pgdurable._event_json(e)))
                                       ELSE jsonb_build_object('trigger', t.name, 'key', v_key)
                                  END,
                                  t.queue, 0, t.max_attempts, NULL, NULL, NULL, NULL,
                                  nullif(v_key, ''), v_due, NULL) s;
  INSERT INTO pgdurable.event_windows AS x (trigger, key, run_id, opened_at, last_event_at,
                                            due_at, events, closed_at)
  VALUES (t.name, v_key, v_run, v_now, v_now, v_due, 1, CASE WHEN v_alone THEN v_now END)
  RETURNING * INTO w;
  INSERT INTO pgdurable.event_window_events (window_id, event_id, event_at)
      VALUES (w.id, e.id, e.created_at);
  RETURN NULL;  -- start_run NOTIFYs the queue itself
END
$$;
COMMENT ON FUNCTION pgdurable._event_window_add(pgdurable.event_triggers, pgdurable.events) IS
  'Internal: add an event to its trigger''s open window for its key, or open one with a new run.';

------------------------------------------------------------------------------
-- pgdurable.send_event(name, data, id) -> TABLE(event_id bigint, created boolean)
-- Store an event and act on it in ONE transaction (the caller's, if any):
--   1. dedup: an event of the same name and id already stored with the same
--      data -> nothing happens again, its number is returned with created =
--      false; with other data -> PD015 and nothing changes. The id is unique
--      through event_ids (one unpartitioned table), whichever partition of
--      events holds the event: an id deduplicates for as long as its event is
--      stored (retention deletes both together);
--   2. cancel_on: every unfinished run registered with a cancel_on that
--      this event matches is cancelled (cancel_run: at once if runnable or
--      waiting; a leased run gets a cancel request and its worker stops it);
--   3. waits: every run parked on a wait_event this event matches (and
--      whose `since` is not after the event's time) is made runnable with
--      wake = {"type": "event", "name", "event": {id, name, data, event_id,
--      time}}; its queue is NOTIFYed;
--   4. triggers: the event joins a window of every trigger on its name
--      (_event_window_add).
-- Bad input (empty name, data not an object, empty id) -> PD000, nothing written.
-- Locks: the name's paths lock SHARED, then per matched (name, path, value)
-- wait_lock_key('event', ref) in path order (park_event takes the same one),
-- then per trigger and key one lock in trigger order.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.send_event(p_name text, p_data jsonb, p_id text DEFAULT NULL)
RETURNS TABLE (event_id bigint, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e pgdurable.events;
  v_data jsonb := coalesce(p_data, '{}'::jsonb);
  v_paths text[];
  v_path text;
  v_val jsonb;
  v_ref text;
  v_refs text[] := '{}';
  v_run uuid;
  v_queues text[] := '{}';
  v_q text;
  v_now timestamptz := pgdurable.now();
  v_id bigint;
  t pgdurable.event_triggers;
BEGIN
  PERFORM pgdurable._event_check(p_name, p_data, p_id);
  IF p_id IS NOT NULL THEN
    -- the id is claimed in event_ids (unique across the partitions of events); a
    -- concurrent send of the same id waits here for this one's commit, then finds it
    LOOP
      INSERT INTO pgdurable.event_ids AS x (name, event_key, event_id, created_at)
      VALUES (p_name, p_id, nextval('pgdurable.events_id_seq'), v_now)
      ON CONFLICT (name, event_key) DO NOTHING
      RETURNING x.event_id INTO v_id;
      EXIT WHEN v_id IS NOT NULL;
      SELECT ev.* INTO e FROM pgdurable.event_ids i
        JOIN pgdurable.events ev ON ev.id = i.event_id AND ev.created_at = i.created_at
       WHERE i.name = p_name AND i.event_key = p_id;
      IF FOUND THEN
        IF e.data IS DISTINCT FROM v_data THEN
          RAISE EXCEPTION 'event id % was already sent for event % with other data', p_id, p_name
            USING ERRCODE = 'PD015';
        END IF;
        RETURN QUERY SELECT e.id, false;
        RETURN;
      END IF;
      -- an entry whose event is gone (deleted by hand): the id is new again
      DELETE FROM pgdurable.event_ids i WHERE i.name = p_name AND i.event_key = p_id;
    END LOOP;
  END IF;
  INSERT INTO pgdurable.events AS x (id, name, data, event_key, created_at)
  VALUES (coalesce(v_id, nextval('pgdurable.events_id_seq')), p_name, v_data, p_id, v_now)
  RETURNING * INTO e;

  PERFORM pg_advisory_xact_lock_shared(pgdurable.wait_lock_key('event-paths', p_name));
  SELECT array_agg(p.path ORDER BY p.path) INTO v_paths
    FROM pgdurable.event_paths p WHERE p.name = p_name;
  FOREACH v_path IN ARRAY coalesce(v_paths, '{}') LOOP
    v_val := e.data #> pgdurable._event_path(v_path);
    CONTINUE WHEN v_val IS NULL OR jsonb_typeof(v_val) NOT IN ('string', 'number', 'boolean');
    v_refs := v_refs || pgdurable.event_ref(p_name, v_path, v_val);
  END LOOP;

  -- cancel_on (no wait lock held: a run being parked holds its row lock)
  FOR v_run IN SELECT DISTINCT c.run_id FROM pgdurable.event_cancels c
                WHERE c.ref = ANY (v_refs) AND c.name = p_name ORDER BY c.run_id LOOP
    PERFORM pgdurable.cancel_run(v_run);
  END LOOP;

  -- waits
  FOREACH v_ref IN ARRAY v_refs LOOP
    PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('event', v_ref));
    WITH w AS (
      UPDATE pgdurable.runs r SET status = 'runnable', available_at = v_now,
             wake = jsonb_build_object('type', 'event', 'name', p_name,
                                       'event', pgdurable._event_json(e)),
             wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
             updated_at = v_now
        FROM pgdurable.event_waits ew
       WHERE r.status = 'waiting' AND r.wait_kind = 'event' AND r.wait_ref = v_ref
         AND ew.run_id = r.id AND ew.ref = v_ref AND ew.since <= e.created_at
         AND pgdurable._event_matches(ew.match, e.data)
      RETURNING r.id, r.queue
    ), seen AS (
      UPDATE pgdurable.event_waits ew
         SET since = e.created_at,
             seen = CASE WHEN ew.since = e.created_at THEN ew.seen || e.id ELSE ARRAY[e.id] END,
             event_id = e.id, woke_at = v_now
        FROM w WHERE ew.run_id = w.id
    )
    SELECT v_queues || coalesce(array_agg(DISTINCT w.queue), '{}') INTO v_queues FROM w;
  END LOOP;

  -- triggers
  FOR t IN SELECT * FROM pgdurable.event_triggers x WHERE x.event = p_name ORDER BY x.name LOOP
    v_q := pgdurable._event_window_add(t, e);
    IF v_q IS NOT NULL THEN
      v_queues := v_queues || v_q;
    END IF;
  END LOOP;

  FOR v_q IN SELECT DISTINCT u FROM unnest(v_queues) u LOOP
    PERFORM pg_notify('pgdurable_wake', v_q);
  END LOOP;
  RETURN QUERY SELECT e.id, true;
END
$$;
COMMENT ON FUNCTION pgdurable.send_event(text, jsonb, text) IS
  'Send an event: cancel the runs whose cancel_on it matches, wake the matching wait_events, feed '
  'triggers'' windows; dedup by (name, id) (PD015 on conflict).';

------------------------------------------------------------------------------
-- pgdurable.park_event(id, token, owner, state, spend, name, match, wake_in)
--   -> TABLE(status text, wake_at timestamptz)
-- FENCED (PD001). park_run for a wait_event: checkpoint the state, then,
-- if an event the wait can see is stored (name, match, time >= the wait's
-- since, not one an earlier wait of the run returned; the oldest first),
-- leave the run 'runnable' with wake = {"type": "event", ...} (NOTIFY its
-- queue); else park it 'waiting' on wait_kind 'event', wait_ref =
-- event_ref(name, first path, value), wake_at = now + wake_in (NULL: no
-- timeout), capped by the deadline.
-- WHICH EVENTS A WAIT SEES: those whose time (the sending transaction's
-- pgdurable.now()) is at or after the wait's `since`: the run's creation
-- for its first event wait, afterwards the time of the event that ended its
-- previous event wait (a timeout does not move it). So an event sent after
-- the run started (or after its previous event) and before it parks is
-- found here, not lost.
-- Verdicts first: a pending cancel -> 'cancelled', over budget/deadline ->
-- 'failed'. Bad match (PD000) changes nothing.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.park_event(p_id uuid, p_token bigint, p_owner text,
                                                p_state jsonb, p_spend numeric, p_name text,
                                                p_match jsonb, p_wake_in interval)
RETURNS TABLE (status text, wake_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_path text;
  v_ref text;
  r pgdurable.runs;
  v_err jsonb;
  w pgdurable.event_waits;
  v_since timestamptz;
  v_seen bigint[] := '{}';
  v_ev pgdurable.events;
  v_now timestamptz := pgdurable.now();
  v_wake_at timestamptz;
BEGIN
  IF p_name IS NULL OR p_name = '' THEN
    RAISE EXCEPTION 'park_event: event name must be non-empty' USING ERRCODE = 'PD000';
  END IF;
  IF p_wake_in IS NOT NULL AND p_wake_in < interval '0' THEN
    RAISE EXCEPTION 'park_event: timeout must be >= 0' USING ERRCODE = 'PD000';
  END IF;
  v_path := pgdurable._event_match_check(p_match);
  v_ref := pgdurable.event_ref(p_name, v_path, p_match -> v_path);
  PERFORM pgdurable._event_register_path(p_name, v_path);  -- before any run lock
  r := pgdurable._fenced(p_id, p_token, p_owner);
  v_err := pgdurable._verdict(r, p_spend, true);
  v_wake_at := least(v_now + p_wake_in, r.deadline_at);
  PERFORM pgdurable._checkpoint(r, p_token, p_state, p_spend);
  IF v_err IS NOT NULL THEN
    RETURN QUERY SELECT pgdurable._end(p_id, CASE WHEN v_err->>'type' = 'RunCancelled'
                                   THEN 'cancelled' ELSE 'failed' END, v_err, 0), NULL::timestamptz;
    RETURN;
  END IF;
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('event', v_ref));
  SELECT * INTO w FROM pgdurable.event_waits x WHERE x.run_id = p_id FOR UPDATE;
  IF FOUND THEN
    v_since := w.since;
    v_seen := w.seen;
  ELSE
    v_since := r.created_at;
  END IF;
  SELECT * INTO v_ev FROM pgdurable.events e
   WHERE e.name = p_name
     AND e.data @> pgdurable._event_doc(v_path, p_match -> v_path)
     AND e.created_at >= v_since AND NOT (e.id = ANY (v_seen))
     AND pgdurable._event_matches(p_match, e.data)
   ORDER BY e.created_at, e.id
   LIMIT 1;
  IF FOUND THEN
    INSERT INTO pgdurable.event_waits AS x (run_id, name, match, ref, since, seen, wake_at,
                                            event_id, woke_at)
    VALUES (p_id, p_name, p_match, v_ref, v_ev.created_at, ARRAY[v_ev.id], v_wake_at,
            v_ev.id, v_now)
    ON CONFLICT (run_id) DO UPDATE
      SET name = excluded.name, match = excluded.match, ref = excluded.ref,
          since = excluded.since, wake_at = excluded.wake_at, event_id = excluded.event_id,
          woke_at = excluded.woke_at, waits = x.waits + 1,
          seen = CASE WHEN x.since = excluded.since THEN x.seen || v_ev.id
                      ELSE excluded.seen END;
    UPDATE pgdurable.runs SET status = 'runnable', available_at = v_now,
           lease_owner = NULL, lease_expires_at = NULL,
           wake = jsonb_build_object('type', 'event', 'name', p_name,
                                     'event', pgdurable._event_json(v_ev)),
           updated_at = v_now
     WHERE id = p_id;
    PERFORM pg_notify('pgdurable_wake', r.queue);
    RETURN QUERY SELECT 'runnable'::text, NULL::timestamptz;
    RETURN;
  END IF;
  INSERT INTO pgdurable.event_waits AS x (run_id, name, match, ref, since, seen, wake_at)
  VALUES (p_id, p_name, p_match, v_ref, v_since, v_seen, v_wake_at)
  ON CONFLICT (run_id) DO UPDATE
    SET name = excluded.name, match = excluded.match, ref = excluded.ref,
        wake_at = excluded.wake_at, event_id = NULL, woke_at = NULL, waits = x.waits + 1;
  UPDATE pgdurable.runs SET status = 'waiting', lease_owner = NULL, lease_expires_at = NULL,
         wait_kind = 'event', wait_ref = v_ref, wait_since = v_now,
         wake_at = v_wake_at, updated_at = v_now
   WHERE id = p_id;
  RETURN QUERY SELECT 'waiting'::text, v_wake_at;
END
$$;
COMMENT ON FUNCTION pgdurable.park_event(uuid, bigint, text, jsonb, numeric, text, jsonb, interval) IS
  'Fenced: checkpoint and park on a wait_event, or wake at once with a stored event the wait sees.';

------------------------------------------------------------------------------
-- pgdurable.cancel_on_events(run_id, names, paths, values) -> integer
-- Register cancel_on entries of a run (called in the statement that starts
-- it): an event of names[i] whose paths[i] equals values->i later cancels
-- the run. Idempotent (an entry already there is kept). Bad input (arrays
-- of different lengths, a bad path, a value that is not a scalar) -> PD000,
-- nothing written. Returns how many entries the run has.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.cancel_on_events(p_run_id uuid, p_names text[],
                                                      p_paths text[], p_values jsonb)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  i integer;
  v_n integer := coalesce(array_length(p_names, 1), 0);
  v_val jsonb;
BEGIN
  IF v_n <> coalesce(array_length(p_paths, 1), 0) OR p_values IS NULL
     OR jsonb_typeof(p_values) <> 'array' OR jsonb_array_length(p_values) <> v_n THEN
    RAISE EXCEPTION 'cancel_on: names, paths and values must have the same length'
      USING ERRCODE = 'PD000';
  END IF;
  FOR i IN 1 .. v_n LOOP
    v_val := p_values -> (i - 1);
    IF p_names[i] IS NULL OR p_names[i] = '' THEN
      RAISE EXCEPTION 'cancel_on: event name must be non-empty' USING ERRCODE = 'PD000';
    END IF;
    PERFORM pgdurable._event_path(p_paths[i]);
    IF jsonb_typeof(v_val) NOT IN ('string', 'number', 'boolean') THEN
      RAISE EXCEPTION 'cancel_on %: the value must be a string, number or boolean', p_paths[i]
        USING ERRCODE = 'PD000';
    END IF;
    PERFORM pgdurable._event_register_path(p_names[i], p_paths[i]);
    INSERT INTO pgdurable.event_cancels (run_id, name, path, value, ref)
    VALUES (p_run_id, p_names[i], p_paths[i], v_val,
            pgdurable.event_ref(p_names[i], p_paths[i], v_val))
    ON CONFLICT DO NOTHING;
  END LOOP;
  RETURN (SELECT count(*) FROM pgdurable.event_cancels c WHERE c.run_id = p_run_id);
END
$$;
COMMENT ON FUNCTION pgdurable.cancel_on_events(uuid, text[], text[], jsonb) IS
  'Register a run''s cancel_on entries: a matching event cancels it (send_event).';

------------------------------------------------------------------------------
-- pgdurable.upsert_event_trigger(name, event, task, revision, queue,
--   max_attempts, key_path, debounce, max_wait, leading, batch, batch_timeout)
--   -> text ('created' | 'updated' | 'unchanged')
-- Declare a trigger (worker start, for @app.on_event). A changed trigger
-- applies to windows opened afterwards; open windows keep their run.
-- Bad input -> PD000 (a CHECK of event_triggers names it), nothing written.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.upsert_event_trigger(
  p_name text, p_event text, p_task text, p_revision text, p_queue text,
  p_max_attempts integer, p_key_path text, p_debounce interval, p_max_wait interval,
  p_leading boolean, p_batch integer, p_batch_timeout interval)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  o pgdurable.event_triggers;
  n pgdurable.event_triggers;
BEGIN
  IF p_key_path IS NOT NULL THEN
    PERFORM pgdurable._event_path(p_key_path);
  END IF;
  BEGIN
    n := ROW(p_name, p_event, p_task, p_revision, coalesce(p_queue, 'default'),
             coalesce(p_max_attempts, 3), p_key_path, p_debounce, p_max_wait,
             coalesce(p_leading, false), p_batch, p_batch_timeout, pgdurable.now());
    SELECT * INTO o FROM pgdurable.event_triggers x WHERE x.name = p_name FOR UPDATE;
    IF FOUND AND (o.event, o.task, o.revision, o.queue, o.max_attempts, o.key_path, o.debounce,
                  o.max_wait, o.leading_edge, o.batch, o.batch_timeout)
                 IS NOT DISTINCT FROM
                 (n.event, n.task, n.revision, n.queue, n.max_attempts, n.key_path, n.debounce,
                  n.max_wait, n.leading_edge, n.batch, n.batch_timeout) THEN
      RETURN 'unchanged';
    END IF;
    INSERT INTO pgdurable.event_triggers SELECT n.*
    ON CONFLICT (name) DO UPDATE
      SET event = excluded.event, task = excluded.task, revision = excluded.revision,
          queue = excluded.queue, max_attempts = excluded.max_attempts,
          key_path = excluded.key_path, debounce = excluded.debounce,
          max_wait = excluded.max_wait, leading_edge = excluded.leading_edge, batch = excluded.batch,
          batch_timeout = excluded.batch_timeout, updated_at = excluded.updated_at;
  EXCEPTION WHEN check_violation OR not_null_violation THEN
    RAISE EXCEPTION 'event trigger %: %', p_name, SQLERRM USING ERRCODE = 'PD000';
  END;
  RETURN CASE WHEN o.name IS NULL THEN 'created' ELSE 'updated' END;
END
$$;
COMMENT ON FUNCTION pgdurable.upsert_event_trigger(text, text, text, text, text, integer, text,
                                                   interval, interval, boolean, integer, interval) IS
  'Declare an event trigger (created | updated | unchanged); PD000 on bad input.';

------------------------------------------------------------------------------
-- pgdurable.take_event_window(run_id)
--   -> TABLE(window_id bigint, trigger text, key text, id bigint, name text,
--            data jsonb, event_id text, created_at timestamptz)
-- The events of the window that started this run, oldest first, due or not.
-- Closes the window and records when it was first read (taken_at). The same
-- rows every time. No window: no rows. The reader of the previous release,
-- kept for its workers during a rolling deploy (such a worker may read a
-- debounce window before its due time, as senders no longer move the run's
-- start); the current one is take_due_event_window.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.take_event_window(p_run_id uuid)
RETURNS TABLE (window_id bigint, trigger text, key text, id bigint, name text, data jsonb,
               event_id text, created_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  w pgdurable.event_windows;
BEGIN
  UPDATE pgdurable.event_windows x
     SET taken_at = coalesce(x.taken_at, pgdurable.now()),
         closed_at = coalesce(x.closed_at, pgdurable.now())
   WHERE x.run_id = p_run_id
  RETURNING * INTO w;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
    SELECT w.id, w.trigger, w.key, e.id, e.name, e.data, e.event_key, e.created_at
      FROM pgdurable.event_window_events we
      JOIN pgdurable.events e ON e.id = we.event_id AND e.created_at = we.event_at
     WHERE we.window_id = w.id
     ORDER BY e.created_at, e.id;
END
$$;
COMMENT ON FUNCTION pgdurable.take_event_window(uuid) IS
  'The events of the trigger window that started a run, oldest first; closes the window.';

------------------------------------------------------------------------------
-- pgdurable.take_due_event_window(run_id)
--   -> TABLE(due_at timestamptz, window_id bigint, trigger text, key text,
--            id bigint, name text, data jsonb, event_id text, created_at timestamptz)
-- What a trigger's run reads when it runs (pgdurable.runs.events.trigger_step):
--   * its window is due (due_at <= now) or already closed: close it (under its
--     row lock: no event joins it afterwards, _event_window_add) and return its
--     events, oldest first (the same rows every time: a retried step gets the
--     same events); taken_at records when it was first read;
--   * its window is not due yet (events moved its due time since the run was
--     started): ONE row with id NULL and the window's due_at: the run sleeps
--     until then and reads again;
--   * no window: no rows.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.take_due_event_window(p_run_id uuid)
RETURNS TABLE (due_at timestamptz, window_id bigint, trigger text, key text, id bigint,
               name text, data jsonb, event_id text, created_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  w pgdurable.event_windows;
  v_now timestamptz := pgdurable.now();
BEGIN
  UPDATE pgdurable.event_windows x
     SET taken_at = coalesce(x.taken_at, v_now), closed_at = coalesce(x.closed_at, v_now)
   WHERE x.run_id = p_run_id AND (x.closed_at IS NOT NULL OR x.due_at <= v_now)
  RETURNING * INTO w;
  IF NOT FOUND THEN
    RETURN QUERY SELECT x.due_at, x.id, x.trigger, x.key, NULL::bigint, NULL::text, NULL::jsonb,
                        NULL::text, NULL::timestamptz
                   FROM pgdurable.event_windows x WHERE x.run_id = p_run_id;
    RETURN;
  END IF;
  RETURN QUERY
    SELECT w.due_at, w.id, w.trigger, w.key, e.id, e.name, e.data, e.event_key, e.created_at
      FROM pgdurable.event_window_events we
      JOIN pgdurable.events e ON e.id = we.event_id AND e.created_at = we.event_at
     WHERE we.window_id = w.id
     ORDER BY e.created_at, e.id;
END
$$;
COMMENT ON FUNCTION pgdurable.take_due_event_window(uuid) IS
  'The events of the trigger window that started a run once it is due (closing it), oldest '
  'first; else one row with its due_at and no event.';

------------------------------------------------------------------------------
-- WHAT RETENTION MAY DROP (prune_events row by row, drop_event_partitions by
-- partition; the same rule). An event older than the cut-off is deleted
-- unless an unfinished run (not completed, failed, cancelled, incompatible)
-- may still read it:
--   * it is in a trigger window (debounce, batch, or one event) whose run is
--     unfinished: open windows included, since a window's run is started when
--     the window opens and reads its events (take_event_window) when it runs;
--   * its time is at or after _event_horizon(): the earliest `since` of an
--     unfinished run (event_waits.since, or the run's creation when it never
--     waited on an event), so that no wait_event of an unfinished run -- a
--     parked one, one woken by its timeout that waits again, or the first
--     one of a run that has not parked yet -- can miss an event it could see.
--     (A parked wait needs no stored event at all: the events stored before
--     it parked were matched by park_event, later ones by send_event, both
--     under the same lock. A wait that parks later looks back to its since.)
-- Events an unfinished run may read are kept whatever their age (by partition:
-- moved to events_default first). A deleted event's id no longer deduplicates:
-- its event_ids entry goes with it, and so do its window links.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable._event_horizon() -> timestamptz (NULL: no unfinished run)
-- Internal: the earliest time from which an unfinished run may still read
-- events in a wait_event (see above). One pass over the unfinished runs.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_horizon() RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT min(coalesce(w.since, r.created_at))
    FROM pgdurable.runs r
    LEFT JOIN pgdurable.event_waits w ON w.run_id = r.id
   WHERE r.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible')
$$;
COMMENT ON FUNCTION pgdurable._event_horizon() IS
  'Internal: the earliest event time a wait_event of an unfinished run may still see (NULL: none).';

------------------------------------------------------------------------------
-- pgdurable.prune_events(older_than, batch) -> bigint (rows deleted)
-- Retention for events row by row, ONE short transaction: delete up to
-- `batch` events older than `older_than` (database clock) that retention may
-- drop (see WHAT RETENTION MAY DROP), with their window links and dedup ids,
-- then up to `batch` windows opened before the cut-off whose run is finished
-- or gone and which hold no event any more. Rows locked by someone else are
-- skipped. Whole daily partitions go first, by drop_event_partitions (the
-- retention loop, ops/retention.py, calls it before); this clears what is
-- left (events_default, and the days not yet dropped). Call it until it
-- returns less than `batch`. older_than < 0 or batch outside 1..100000: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_events(p_older_than interval,
                                                  p_batch integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_cut timestamptz;
  v_events bigint;
  v_windows bigint;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' OR p_batch IS NULL
     OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_events: older_than >= 0 and batch in 1..100000 required'
      USING ERRCODE = 'PD000';
  END IF;
  v_cut := least(pgdurable.now() - p_older_than,
                 coalesce(pgdurable._event_horizon(), 'infinity'));
  WITH doomed AS MATERIALIZED (
    SELECT e.id, e.created_at, e.name, e.event_key FROM pgdurable.events e
     WHERE e.created_at < v_cut
       AND NOT EXISTS (
         SELECT 1 FROM pgdurable.event_window_events we
           JOIN pgdurable.event_windows w ON w.id = we.window_id
           JOIN pgdurable.runs r ON r.id = w.run_id
          WHERE we.event_id = e.id
            AND r.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible'))
     ORDER BY e.created_at
     LIMIT p_batch
       FOR UPDATE OF e SKIP LOCKED
  ), links AS (
    DELETE FROM pgdurable.event_window_events we USING doomed d
     WHERE we.event_id = d.id AND we.event_at = d.created_at
  ), ids AS (
    DELETE FROM pgdurable.event_ids i USING doomed d
     WHERE d.event_key IS NOT NULL AND i.name = d.name AND i.event_key = d.event_key
       AND i.event_id = d.id
  )
  DELETE FROM pgdurable.events e USING doomed d WHERE e.id = d.id AND e.created_at = d.created_at;
  GET DIAGNOSTICS v_events = ROW_COUNT;
  WITH gone AS MATERIALIZED (
    SELECT w.id FROM pgdurable.event_windows w
     WHERE w.opened_at < v_cut
       AND NOT EXISTS (SELECT 1 FROM pgdurable.runs r WHERE r.id = w.run_id
                          AND r.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible'))
       AND NOT EXISTS (SELECT 1 FROM pgdurable.event_window_events we WHERE we.window_id = w.id)
     LIMIT p_batch
       FOR UPDATE OF w SKIP LOCKED
  )
  DELETE FROM pgdurable.event_windows w USING gone g WHERE w.id = g.id;
  GET DIAGNOSTICS v_windows = ROW_COUNT;
  RETURN v_events + v_windows;
END
$$;
COMMENT ON FUNCTION pgdurable.prune_events(interval, integer) IS
  'Retention for events: delete up to batch events older than older_than that no unfinished run '
  'may read, then emptied windows of finished runs; returns rows deleted (call until < batch).';

------------------------------------------------------------------------------
-- pgdurable._event_partition(day) -> boolean (false: it existed)
-- Internal: create pgdurable.events_pYYYYMMDD for the UTC day, take over the
-- rows of that day that had landed in events_default, and attach it. The
-- caller holds history_lock_key().
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._event_partition(p_day date) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_name text := 'events_p' || to_char(p_day, 'YYYYMMDD');
  v_lo timestamptz := p_day::timestamp AT TIME ZONE 'UTC';
  v_hi timestamptz := (p_day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
  IF to_regclass('pgdurable.' || quote_ident(v_name)) IS NOT NULL THEN
    RETURN false;
  END IF;
  EXECUTE format('CREATE TABLE pgdurable.%I (LIKE pgdurable.events INCLUDING DEFAULTS '
                 'INCLUDING CONSTRAINTS INCLUDING COMMENTS)', v_name);
  EXECUTE format('ALTER TABLE pgdurable.%I SET (autovacuum_vacuum_scale_factor = 0.05, '
                 'autovacuum_vacuum_cost_delay = 0)', v_name);
  EXECUTE format('COMMENT ON TABLE pgdurable.%I IS %L', v_name,
                 'Partition of pgdurable.events (see pgdurable.event_partitions).');
  EXECUTE format('WITH moved AS (DELETE FROM pgdurable.events_default WHERE created_at >= $1 '
                 'AND created_at < $2 RETURNING *) INSERT INTO pgdurable.%I SELECT * FROM moved',
                 v_name) USING v_lo, v_hi;
  EXECUTE format('ALTER TABLE pgdurable.events ATTACH PARTITION pgdurable.%I '
                 'FOR VALUES FROM (%L) TO (%L)', v_name, v_lo, v_hi);
  RETURN true;
END
$$;
COMMENT ON FUNCTION pgdurable._event_partition(date) IS
  'Internal: create and attach the daily partition of events for a UTC day (rows of the day in '
  'events_default move into it).';

------------------------------------------------------------------------------
-- pgdurable.create_event_partitions(days_ahead, days_back) -> integer
-- Create the daily partitions of events for the UTC days from today -
-- days_back to today + days_ahead (by pgdurable.now()) that do not exist yet;
-- returns how many were created. Idempotent; serialised with the history
-- partitions' maintenance by history_lock_key(); lock_timeout 5 s. The
-- maintenance turn (ops/partitions.py, `pgdurable maintain`) calls it next to
-- create_history_partitions. Days outside 0..366: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.create_event_partitions(p_days_ahead integer DEFAULT 3,
                                                             p_days_back integer DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
  v_today date := (pgdurable.now() AT TIME ZONE 'UTC')::date;
BEGIN
  IF p_days_ahead IS NULL OR p_days_ahead < 0 OR p_days_ahead > 366
     OR p_days_back IS NULL OR p_days_back < 0 OR p_days_back > 366 THEN
    RAISE EXCEPTION 'create_event_partitions: days_ahead and days_back must be between 0 and 366'
      USING ERRCODE = 'PD000';
  END IF;
  PERFORM pg_advisory_xact_lock(pgdurable.history_lock_key());
  RETURN (SELECT count(*) FILTER (WHERE pgdurable._event_partition(d::date))
            FROM generate_series(v_today - p_days_back, v_today + p_days_ahead,
                                 interval '1 day') d);
END
$$;
COMMENT ON FUNCTION pgdurable.create_event_partitions(integer, integer) IS
  'Create the missing daily partitions of events around today (UTC); returns how many.';

------------------------------------------------------------------------------
-- pgdurable.drop_event_partitions(older_than)
--   -> TABLE(partition_name text, rows_dropped bigint, rows_kept bigint)
-- Retention by partition: every daily partition of events whose range ended
-- before now() - older_than is detached and dropped whole. The rows an
-- unfinished run may still read (see WHAT RETENTION MAY DROP) are moved to
-- events_default first, with their dedup ids and window links; the ids and
-- links of the dropped rows are deleted (a DROP fires no trigger). Serialised
-- by history_lock_key(); lock_timeout 5 s (DETACH locks events briefly).
-- older_than NULL or < 0: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.drop_event_partitions(p_older_than interval)
RETURNS TABLE (partition_name text, rows_dropped bigint, rows_kept bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
  v_cutoff timestamptz;
  v_horizon timestamptz;
  p record;
  v_total bigint;
  v_keep bigint;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'drop_event_partitions: older_than must be a non-negative interval'
      USING ERRCODE = 'PD000';
  END IF;
  v_cutoff := pgdurable.now() - p_older_than;
  PERFORM pg_advisory_xact_lock(pgdurable.history_lock_key());
  FOR p IN SELECT x.partition_name AS part FROM pgdurable.event_partitions x
            WHERE NOT x.is_default AND x.range_to <= v_cutoff
            ORDER BY x.range_to LOOP
    v_horizon := coalesce(v_horizon, pgdurable._event_horizon(), 'infinity');
    EXECUTE format('ALTER TABLE pgdurable.events DETACH PARTITION pgdurable.%I', p.part);
    EXECUTE format('SELECT count(*) FROM pgdurable.%I', p.part) INTO v_total;
    -- what an unfinished run may read: back into events (its range is no longer
    -- covered: events_default); ids and links keep pointing at it
    EXECUTE format('INSERT INTO pgdurable.events SELECT d.* FROM pgdurable.%I d '
                   'WHERE d.created_at >= $1 OR EXISTS ('
                   'SELECT 1 FROM pgdurable.event_window_events we '
                   'JOIN pgdurable.event_windows w ON w.id = we.window_id '
                   'JOIN pgdurable.runs r ON r.id = w.run_id '
                   'WHERE we.event_id = d.id AND we.event_at = d.created_at AND r.status NOT IN '
                   '(''completed'', ''failed'', ''cancelled'', ''incompatible''))',
                   p.part) USING v_horizon;
    GET DIAGNOSTICS v_keep = ROW_COUNT;
    IF v_keep < v_total THEN
      EXECUTE format('DELETE FROM pgdurable.event_ids i USING pgdurable.%I d '
                     'WHERE d.event_key IS NOT NULL AND i.name = d.name '
                     'AND i.event_key = d.event_key AND i.event_id = d.id '
                     'AND NOT EXISTS (SELECT 1 FROM pgdurable.events_default k '
                     'WHERE k.id = d.id AND k.created_at = d.created_at)', p.part);
      EXECUTE format('DELETE FROM pgdurable.event_window_events we USING pgdurable.%I d '
                     'WHERE we.event_id = d.id AND we.event_at = d.created_at '
                     'AND NOT EXISTS (SELECT 1 FROM pgdurable.events_default k '
                     'WHERE k.id = d.id AND k.created_at = d.created_at)', p.part);
    END IF;
    EXECUTE format('DROP TABLE pgdurable.%I', p.part);
    partition_name := p.part;
    rows_dropped := v_total - v_keep;
    rows_kept := v_keep;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.drop_event_partitions(interval) IS
  'Retention by partition: drop whole daily partitions of events older than the cut-off, keeping '
  '(moving to events_default) the events an unfinished run may still read.';
