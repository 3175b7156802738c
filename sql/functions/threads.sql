-- functions/threads.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.thread_lease_key(thread_key) -> bytea
-- The pgdurable.leases key of a thread: UTF-8 of 'pgdurable.thread:' || key,
-- the key in its stored (escaped) form, as in threads.thread_key.
-- From psql: SELECT * FROM pgdurable.acquire_lease(pgdurable.thread_lease_key('chat:1'), ...).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.thread_lease_key(p_thread text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT convert_to('pgdurable.thread:' || p_thread, 'UTF8')
$$;
COMMENT ON FUNCTION pgdurable.thread_lease_key(text) IS
  'The lease key (bytea) of a thread in pgdurable.leases.';

------------------------------------------------------------------------------
-- pgdurable._thread_owner(run_id, lease_token) -> bytea
-- Internal: the thread-lease owner of one attempt of a run, '<id>:<token>'.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._thread_owner(p_run uuid, p_token bigint) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT convert_to(p_run::text || ':' || p_token::text, 'UTF8')
$$;
COMMENT ON FUNCTION pgdurable._thread_owner(uuid, bigint) IS
  'Internal: thread-lease owner of a run attempt, <run id>:<lease token> (per attempt, S12).';

------------------------------------------------------------------------------
-- pgdurable._owner_run(owner bytea) -> uuid
-- Internal: the run id in a thread-lease owner '<id>:<token>', NULL if the
-- owner is not of that form (e.g. a foreign acquirer).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._owner_run(p_owner bytea) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  m text[];
BEGIN
  IF p_owner IS NULL THEN
    RETURN NULL;
  END IF;
  m := regexp_match(encode(p_owner, 'escape'),
                    '^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}):[0-9]+$');
  RETURN CASE WHEN m IS NULL THEN NULL ELSE m[1]::uuid END;
END
$$;
COMMENT ON FUNCTION pgdurable._owner_run(bytea) IS
  'Internal: run id of a thread-lease owner <id>:<token>, NULL for any other owner.';

------------------------------------------------------------------------------
-- pgdurable._thread_holder(lease key, run_id) -> bytea
-- Internal: the live owner of a thread lease if it is SOME attempt of this
-- run (e.g. an older attempt whose lease a send re-acquired), else NULL.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._thread_holder(p_key bytea, p_run uuid) RETURNS bytea
LANGUAGE sql STABLE AS $$
  SELECT l.owner FROM pgdurable.leases l
   WHERE l.key = p_key AND l.owner IS NOT NULL AND l.expires_at > pgdurable.now()
     AND pgdurable._owner_run(l.owner) = p_run
$$;
COMMENT ON FUNCTION pgdurable._thread_holder(bytea, uuid) IS
  'Internal: the live thread-lease owner when it is an attempt of this run, else NULL.';

------------------------------------------------------------------------------
-- pgdurable._ttl_ms(interval) -> bigint: internal, an interval as a lease
-- TTL in ms, clamped to 1 .. 86 400 000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._ttl_ms(p interval) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
  SELECT least(86400000, greatest(1, ceil(extract(epoch FROM p) * 1000)))::bigint
$$;
COMMENT ON FUNCTION pgdurable._ttl_ms(interval) IS
  'Internal: interval -> lease TTL in ms, clamped to 1 .. 86400000.';

------------------------------------------------------------------------------
-- pgdurable._thread_wake(run_id, thread_key): internal. Tell the owner that
-- its inbox has news: if it is parked on ('inbox', key) and its row is not
-- locked, make it runnable (wake = signal record) and NOTIFY its queue;
-- otherwise leave ONE pending ('inbox', key) signal (unless one is pending)
-- for its next park_run to consume. Never waits for the run's row lock.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._thread_wake(p_run uuid, p_thread text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
  v_queue text;
BEGIN
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('inbox', p_thread));
  WITH c AS MATERIALIZED (
    SELECT r.id FROM pgdurable.runs r
     WHERE r.id = p_run AND r.status = 'waiting' AND r.wait_kind = 'inbox'
       AND r.wait_ref = p_thread
       FOR UPDATE SKIP LOCKED)
  UPDATE pgdurable.runs r SET status = 'runnable', available_at = pgdurable.now(),
         wake = jsonb_build_object('type', 'signal', 'kind', 'inbox', 'ref', p_thread,
                                   'payload', NULL, 'at', pgdurable.now(), 'signal', NULL),
         wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
         updated_at = pgdurable.now()
    FROM c WHERE r.id = c.id
  RETURNING r.queue INTO v_queue;
  IF v_queue IS NOT NULL THEN
    PERFORM pg_notify('pgdurable_wake', v_queue);
    RETURN true;
  END IF;
  IF NOT EXISTS (SELECT FROM pgdurable.signals s
                  WHERE s.kind = 'inbox' AND s.ref = p_thread AND s.consumed_at IS NULL) THEN
    INSERT INTO pgdurable.signals (kind, ref, payload, run_id)
    VALUES ('inbox', p_thread, NULL, NULL);
  END IF;
  RETURN false;
END
$$;
COMMENT ON FUNCTION pgdurable._thread_wake(uuid, text) IS
  'Internal: wake a run parked on its inbox (SKIP LOCKED), else leave one pending inbox signal.';

------------------------------------------------------------------------------
-- pgdurable._thread_new_run(id, thread, task, revision, queue, priority,
--                           max_attempts, state) -> integer (thread_no)
-- Internal: insert a runnable run owning the thread (the caller already
-- holds the thread lease for '<id>:0'), NOTIFY pgdurable_wake(queue) and
-- pgdurable_threads(md5(thread)) for the thread's stream followers.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._thread_new_run(p_id uuid, p_thread text, p_task text,
  p_revision text, p_queue text, p_priority integer, p_max_attempts integer, p_state jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  v_no integer;
BEGIN
  UPDATE pgdurable.threads SET runs = runs + 1 WHERE thread_key = p_thread
  RETURNING runs INTO v_no;
  INSERT INTO pgdurable.runs (id, task, revision, state, queue, priority, max_attempts,
                              thread_key, thread_no)
  VALUES (p_id, p_task, p_revision, coalesce(p_state, '{}'), p_queue, p_priority,
          p_max_attempts, p_thread, v_no);
  PERFORM pg_notify('pgdurable_wake', p_queue);
  -- thread stream followers (pgdurable/runs/live.py) hear of the thread's new run
  PERFORM pg_notify('pgdurable_threads', md5(p_thread));
  RETURN v_no;
END
$$;
COMMENT ON FUNCTION pgdurable._thread_new_run(uuid, text, text, text, text, integer, integer, jsonb) IS
  'Internal: start the run that owns a thread (caller holds the thread lease) and NOTIFY its queue.';

------------------------------------------------------------------------------
-- pgdurable.send_message_v2(thread, message_id, payload, sender, task, revision,
--                           queue, priority, max_attempts, state, idle_ttl,
--                           double_text, default_double_text)
--   -> TABLE(action text, run_id uuid, seq bigint, duplicate boolean,
--            stream_no integer, stream_seq bigint)
-- The ownership decision, atomically, under the thread's row lock:
-- * message_id already stored for the thread: same payload -> its original
--   (action, run_id, seq) with duplicate = true, nothing changes; another
--   payload -> SQLSTATE PD008 (SignalConflict).
-- * a live or lapsed thread lease whose owner run is unfinished -> 'deliver':
--   the message is appended for that run (a lapsed lease is re-acquired for
--   the run's current attempt, a parked owner's lease is extended by
--   idle_ttl) and the run is woken if parked on its inbox.
-- * otherwise (free, released, or held by a finished run) -> 'wake': a new
--   run of (task, revision) in queue is started holding the thread lease
--   (acquire, or transfer from a finished holder); its state is the final
--   state of the thread's previous run, else state.
-- * a live lease held by an owner that is not a run attempt -> PD001.
-- DOUBLE-TEXTING: when the owner run is ANSWERING (unfinished and not parked
-- on its inbox) the message follows the strategy double_text, else the
-- thread's (threads.double_text), else default_double_text, else 'enqueue':
-- 'reject' -> PD014 (ThreadBusy), nothing stored; 'enqueue' -> delivered
-- as above; 'interrupt' -> delivered, and the step answering an older
-- message stops at its next safe point (stream_tick, stop_step) and runs
-- again with both; 'rollback' -> every older message not taken yet is
-- discarded (consumed, discarded_at), delivered, and the step answering an
-- older message stops at its next safe point, its answer and the messages it
-- took discarded. The strategy applied is recorded (thread_messages.double_text).
-- (stream_no, stream_seq): the thread stream's position before this message
-- (its last run's thread_no and last event seq; 0, 0 for a new thread): its
-- answer follows. A duplicate returns the first send's.
-- thread is the stored (escaped) key (pgdurable.is_thread_key).
-- Bad input -> PD000. Never reports delivery without a recipient (run_id is
-- always a run that exists and is unfinished at commit).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.send_message_v2(
  p_thread text, p_message_id text, p_payload jsonb, p_sender text, p_task text,
  p_revision text, p_queue text, p_priority integer, p_max_attempts integer,
  p_state jsonb, p_idle_ttl interval, p_double_text text, p_default_double_text text)
RETURNS TABLE (action text, run_id uuid, seq bigint, duplicate boolean, stream_no integer,
               stream_seq bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  lk bytea;
  t pgdurable.threads;
  m pgdurable.thread_messages;
  l pgdurable.leases;
  v_now timestamptz := pgdurable.now();
  v_run pgdurable.runs;
  v_live boolean;
  v_ttl bigint;
  v_id uuid;
  v_action text;
  v_state jsonb;
  v_got boolean;
  v_strategy text;
  v_double text;
  v_no integer;
  v_seq bigint;
BEGIN
  IF p_double_text NOT IN ('reject', 'enqueue', 'interrupt', 'rollback')
     OR p_default_double_text NOT IN ('reject', 'enqueue', 'interrupt', 'rollback') THEN
    RAISE EXCEPTION 'send_message: double_text must be reject, enqueue, interrupt or rollback'
      USING ERRCODE = 'PD000';
  END IF;
  IF p_thread IS NULL OR p_thread = '' OR p_message_id IS NULL OR p_message_id = ''
     OR p_payload IS NULL OR p_task IS NULL OR p_task = '' OR p_revision IS NULL
     OR p_queue IS NULL OR p_queue = '' OR coalesce(p_max_attempts, 0) < 1
     OR (p_idle_ttl IS NOT NULL AND p_idle_ttl <= '0') THEN
    RAISE EXCEPTION 'send_message: thread, message_id, payload, task, revision, queue and '
      'max_attempts >= 1 are required (idle_ttl > 0)' USING ERRCODE = 'PD000';
  END IF;
  IF NOT pgdurable.is_thread_key(p_thread) THEN
    RAISE EXCEPTION 'send_message: thread % is not an escaped thread key (a backslash is only '
      'valid in \\ for a backslash or \0 for NUL)', p_thread USING ERRCODE = 'PD000';
  END IF;
  lk := pgdurable.thread_lease_key(p_thread);
  INSERT INTO pgdurable.threads AS x (thread_key, idle_ttl)
  VALUES (p_thread, coalesce(p_idle_ttl, '1 hour'))
  ON CONFLICT (thread_key) DO UPDATE SET idle_ttl = coalesce(p_idle_ttl, x.idle_ttl)
  RETURNING * INTO t;  -- the row lock serialises this thread's sends and handoffs
  -- lock order: thread row -> inbox wait lock -> lease row (as park_run's trigger)
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('inbox', p_thread));
  SELECT * INTO m FROM pgdurable.thread_messages x
   WHERE x.thread_key = p_thread AND x.message_id = p_message_id;
  IF FOUND THEN
    IF m.payload IS DISTINCT FROM p_payload THEN
      RAISE EXCEPTION 'message % was already sent to thread % with another payload',
        p_message_id, p_thread USING ERRCODE = 'PD008';
    END IF;
    RETURN QUERY SELECT m.action, m.run_id, m.seq, true, coalesce(m.stream_no, 0),
                        coalesce(m.stream_seq, 0);
    RETURN;
  END IF;
  -- the thread stream's position now: its answer follows
  SELECT x.thread_no, (SELECT max(e.seq) FROM pgdurable.run_events e
                        WHERE e.run_id = x.id AND e.created_at >= x.created_at - interval '1 hour'
                          AND e.created_at <= v_now + interval '1 hour')
    INTO v_no, v_seq
    FROM pgdurable.runs x WHERE x.thread_key = p_thread ORDER BY x.thread_no DESC LIMIT 1;
  v_ttl := pgdurable._ttl_ms(t.idle_ttl);
  SELECT * INTO l FROM pgdurable.leases x WHERE x.key = lk FOR UPDATE;
  v_live := l.owner IS NOT NULL AND l.expires_at > v_now;
  IF l.owner IS NOT NULL THEN
    SELECT * INTO v_run FROM pgdurable.runs r WHERE r.id = pgdurable._owner_run(l.owner);
  END IF;
  IF v_live AND v_run.id IS NULL THEN
    RAISE EXCEPTION 'thread % is held by % which is not a pgdurable run attempt',
      p_thread, pgdurable.lease_display(l.owner) USING ERRCODE = 'PD001';
  END IF;
  IF v_run.id IS NOT NULL
     AND v_run.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible') THEN
    v_action := 'deliver';
    v_id := v_run.id;
    IF NOT (v_run.status = 'waiting' AND v_run.wait_kind IS NOT DISTINCT FROM 'inbox') THEN
      -- the owner is answering: double-texting
      v_strategy := coalesce(p_double_text, t.double_text, p_default_double_text, 'enqueue');
      IF v_strategy = 'reject' THEN
        RAISE EXCEPTION 'thread % is answering (run %): message % refused (double_text reject)',
          p_thread, v_run.id, p_message_id USING ERRCODE = 'PD014';
      END IF;
      v_double := v_strategy;
      IF v_strategy = 'rollback' THEN
        UPDATE pgdurable.thread_messages x
           SET consumed_by = v_run.id, consumed_step = v_run.step, consumed_at = v_now,
               discarded_at = v_now
         WHERE x.thread_key = p_thread AND x.consumed_at IS NULL
           AND (x.taken_by IS NULL OR v_run.status <> 'leased');
      END IF;
    END IF;
    IF NOT v_live THEN
      SELECT a.acquired INTO v_got FROM pgdurable.acquire_lease(
        lk, pgdurable._thread_owner(v_run.id, v_run.lease_token), v_ttl) a;
    ELSIF v_run.status <> 'leased' THEN
      UPDATE pgdurable.leases x SET expires_at = greatest(x.expires_at, v_now + t.idle_ttl),
             renewed_at = v_now
       WHERE x.key = lk;
    END IF;
  ELSE
    v_action := 'wake';
    v_id := gen_random_uuid();
    IF v_live THEN  -- held by a finished run: hand over without a gap
      PERFORM pgdurable.transfer_lease(lk, l.owner, pgdurable._thread_owner(v_id, 0), v_ttl);
    ELSE
      SELECT a.acquired INTO v_got FROM pgdurable.acquire_lease(
        lk, pgdurable._thread_owner(v_id, 0), v_ttl) a;
      IF NOT v_got THEN  -- cannot happen: we hold the lease row locked
        RAISE EXCEPTION 'send_message: thread lease of % not acquired', p_thread
          USING ERRCODE = '40001';
      END IF;
    END IF;
    SELECT r.state INTO v_state FROM pgdurable.runs r
     WHERE r.thread_key = p_thread ORDER BY r.thread_no DESC LIMIT 1;
    PERFORM pgdurable._thread_new_run(v_id, p_thread, p_task, p_revision, p_queue,
                                      coalesce(p_priority, 0), p_max_attempts,
                                      coalesce(v_state, p_state));
  END IF;
  INSERT INTO pgdurable.thread_messages (thread_key, seq, message_id, payload, sender, action,
                                         run_id, double_text, stream_no, stream_seq)
  VALUES (p_thread, t.next_seq, p_message_id, p_payload, p_sender, v_action, v_id, v_double,
          coalesce(v_no, 0), coalesce(v_seq, 0));
  UPDATE pgdurable.threads SET next_seq = next_seq + 1, last_message_at = v_now,
         route_task = p_task, route_revision = p_revision, route_queue = p_queue,
         route_priority = coalesce(p_priority, 0), route_max_attempts = p_max_attempts
   WHERE thread_key = p_thread;
  IF v_action = 'deliver' THEN
    PERFORM pgdurable._thread_wake(v_id, p_thread);
  END IF;
  RETURN QUERY SELECT v_action, v_id, t.next_seq, false, coalesce(v_no, 0), coalesce(v_seq, 0);
END
$$;
COMMENT ON FUNCTION pgdurable.send_message_v2(text, text, jsonb, text, text, text, text, integer,
                                              integer, jsonb, interval, text, text) IS
  'Send a message to a thread (wake or deliver), with a double-texting strategy when it is answering.';

------------------------------------------------------------------------------
-- pgdurable.send_message(thread, message_id, payload, sender, task, revision,
--                        queue, priority, max_attempts, state, idle_ttl)
--   -> TABLE(action text, run_id uuid, seq bigint, duplicate boolean)
-- send_message_v2 with the thread's strategy, else enqueue (the behaviour
-- before double-texting, for the callers of earlier releases).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.send_message(
  p_thread text, p_message_id text, p_payload jsonb, p_sender text, p_task text,
  p_revision text, p_queue text, p_priority integer, p_max_attempts integer,
  p_state jsonb DEFAULT NULL, p_idle_ttl interval DEFAULT NULL)
RETURNS TABLE (action text, run_id uuid, seq bigint, duplicate boolean)
LANGUAGE sql AS $$
  SELECT s.action, s.run_id, s.seq, s.duplicate
    FROM pgdurable.send_message_v2(p_thread, p_message_id, p_payload, p_sender, p_task,
                                   p_revision, p_queue, p_priority, p_max_attempts, p_state,
                                   p_idle_ttl, NULL, NULL) s
$$;
COMMENT ON FUNCTION pgdurable.send_message(text, text, jsonb, text, text, text, text, integer,
                                           integer, jsonb, interval) IS
  'Send a message to a thread: start its owner run (wake) or append to the owner''s inbox (deliver), atomically.';

------------------------------------------------------------------------------
-- pgdurable.set_double_text(thread, strategy) -> void
-- The thread's double-texting strategy (reject, enqueue, interrupt,
-- rollback; NULL: the sender's default), stored on its threads row (created
-- if the thread has none yet). thread is the stored (escaped) key. PD000 for
-- a bad key or strategy.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.set_double_text(p_thread text, p_strategy text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_thread IS NULL OR p_thread = '' OR NOT pgdurable.is_thread_key(p_thread)
     OR p_strategy NOT IN ('reject', 'enqueue', 'interrupt', 'rollback') THEN
    RAISE EXCEPTION 'set_double_text: an escaped thread key and reject, enqueue, interrupt, '
      'rollback or NULL are required' USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.threads AS x (thread_key, double_text) VALUES (p_thread, p_strategy)
  ON CONFLICT (thread_key) DO UPDATE SET double_text = p_strategy;
END
$$;
COMMENT ON FUNCTION pgdurable.set_double_text(text, text) IS
  'Set a thread''s double-texting strategy (NULL: the sender''s default).';

------------------------------------------------------------------------------
-- pgdurable.take_messages(id, token, owner)
--   -> TABLE(seq bigint, message_id text, payload jsonb, sender text,
--            created_at timestamptz, thread_key text)
-- FENCED (PD001). ctx.inbox(): the thread's unconsumed, unreserved messages,
-- in seq order, now reserved for (run, current step): each message once per
-- attempt (a second call returns only what arrived since; a new attempt finds
-- an earlier attempt's reservations returned by the runs_thread_sync trigger).
-- Consumed when the step's checkpoint commits (trigger).
-- The run's attempt must own the thread lease (a lapsed one is re-acquired);
-- if another owner holds it -> PD001 (the run lost its thread). Pending
-- ('inbox', key) signals are consumed (the owner has seen its inbox). A run
-- without a thread -> no rows.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.take_messages(p_id uuid, p_token bigint, p_owner text)
RETURNS TABLE (seq bigint, message_id text, payload jsonb, sender text,
               created_at timestamptz, thread_key text)
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  lk bytea;
  l pgdurable.leases;
  me bytea;
  v_got boolean;
BEGIN
  IF r.thread_key IS NULL THEN
    RETURN;
  END IF;
  lk := pgdurable.thread_lease_key(r.thread_key);
  me := pgdurable._thread_owner(r.id, r.lease_token);
  -- lock order: run row -> inbox wait lock -> lease row
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('inbox', r.thread_key));
  SELECT * INTO l FROM pgdurable.leases x WHERE x.key = lk FOR UPDATE;
  IF l.owner IS NOT NULL AND l.expires_at > pgdurable.now() THEN
    IF l.owner <> me AND pgdurable._owner_run(l.owner) = r.id THEN
      -- an earlier attempt of this run holds it: move it to this attempt
      PERFORM pgdurable.transfer_lease(lk, l.owner, me,
                                       pgdurable._ttl_ms(r.lease_expires_at - pgdurable.now()));
    ELSIF l.owner <> me THEN
      RAISE EXCEPTION 'run % lost thread % to %', r.id, r.thread_key,
        pgdurable.lease_display(l.owner) USING ERRCODE = 'PD001';
    END IF;
  ELSE
    SELECT a.acquired INTO v_got FROM pgdurable.acquire_lease(
      lk, me, pgdurable._ttl_ms(r.lease_expires_at - pgdurable.now())) a;
  END IF;
  UPDATE pgdurable.signals s SET consumed_by = r.id, consumed_at = pgdurable.now()
   WHERE s.kind = 'inbox' AND s.ref = r.thread_key AND s.consumed_at IS NULL;
  RETURN QUERY
  WITH u AS (
    UPDATE pgdurable.thread_messages m SET taken_by = r.id, taken_step = r.step
     WHERE m.thread_key = r.thread_key AND m.consumed_at IS NULL AND m.taken_by IS NULL
    RETURNING m.seq, m.message_id, m.payload, m.sender, m.created_at, m.thread_key)
  SELECT * FROM u ORDER BY u.seq;
END
$$;
COMMENT ON FUNCTION pgdurable.take_messages(uuid, bigint, text) IS
  'Fenced: drain the thread inbox for the current step (reserved; consumed with the step''s checkpoint).';

------------------------------------------------------------------------------
-- pgdurable._thread_handoff(run): internal, called when a thread run reached
-- a terminal status (its row is locked by that transaction). Releases its
-- unconsumed reservations and counts consecutive unproductive runs
-- (threads.unproductive_runs); then, under the thread row lock: pending messages
-- -> start the follow-up run (task, revision, queue, priority, max_attempts
-- of the latest send's route, threads.route_*, so a thread moves to the code
-- its senders run after a deploy; this run's own where no send recorded one;
-- state = this run's final state) and transfer_lease(thread,
-- this attempt, '<next>:0'); transfer failed -> acquire; acquire lost ->
-- route the pending messages to the winner run (run_id := winner, woken).
-- Nothing pending, or max_unproductive_runs runs in a row that failed or
-- consumed nothing (a poison message, or a task that ignores its inbox, must
-- not start runs forever) -> release_lease(thread, this
-- attempt); pending messages then wait for the next send's run.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._thread_handoff(r pgdurable.runs) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  lk bytea := pgdurable.thread_lease_key(r.thread_key);
  me bytea := pgdurable._thread_owner(r.id, r.lease_token);
  v_from bytea;
  t pgdurable.threads;
  v_next uuid;
  v_ttl bigint;
  v_token bigint;
  a record;
  v_winner uuid;
BEGIN
  UPDATE pgdurable.thread_messages m SET taken_by = NULL, taken_step = NULL
   WHERE m.thread_key = r.thread_key AND m.taken_by = r.id AND m.consumed_at IS NULL;
  UPDATE pgdurable.threads x
     SET unproductive_runs = CASE WHEN r.status = 'completed' AND x.last_consumer = r.id
                                  THEN 0 ELSE x.unproductive_runs + 1 END
   WHERE x.thread_key = r.thread_key
  RETURNING * INTO t;  -- locks the thread row (serialised with sends)
  IF NOT FOUND THEN
    RETURN;
  END IF;
  -- lock order: run row -> thread row -> inbox wait lock -> lease row
  PERFORM pg_advisory_xact_lock(pgdurable.wait_lock_key('inbox', r.thread_key));
  -- this attempt, or an earlier attempt of this run that still holds the lease
  v_from := coalesce(pgdurable._thread_holder(lk, r.id), me);
  IF t.unproductive_runs >= t.max_unproductive_runs
     OR NOT EXISTS (SELECT FROM pgdurable.thread_messages m
                     WHERE m.thread_key = r.thread_key AND m.consumed_at IS NULL) THEN
    -- nothing pending, or a poison loop: pending messages stay for the next send's run
    PERFORM pgdurable.release_lease(lk, v_from);
    RETURN;
  END IF;
  v_ttl := pgdurable._ttl_ms(t.idle_ttl);
  v_next := gen_random_uuid();
  v_token := pgdurable.transfer_lease(lk, v_from, pgdurable._thread_owner(v_next, 0), v_ttl);
  IF v_token IS NULL THEN
    SELECT * INTO a FROM pgdurable.acquire_lease(lk, pgdurable._thread_owner(v_next, 0), v_ttl);
    IF NOT a.acquired THEN
      v_winner := pgdurable._owner_run(a.owner);
      IF v_winner IS NOT NULL THEN
        UPDATE pgdurable.thread_messages m SET run_id = v_winner
         WHERE m.thread_key = r.thread_key AND m.consumed_at IS NULL AND m.taken_by IS NULL;
        PERFORM pgdurable._thread_wake(v_winner, r.thread_key);
      END IF;
      -- a foreign winner: the messages stay pending in the thread inbox for
      -- the next run that owns it (never dropped)
      RETURN;
    END IF;
  END IF;
  PERFORM pgdurable._thread_new_run(
    v_next, r.thread_key, coalesce(t.route_task, r.task),
    CASE WHEN t.route_task IS NULL THEN r.revision ELSE t.route_revision END,
    coalesce(t.route_queue, r.queue), coalesce(t.route_priority, r.priority),
    coalesce(t.route_max_attempts, r.max_attempts), r.state);
  UPDATE pgdurable.thread_messages m SET run_id = v_next
   WHERE m.thread_key = r.thread_key AND m.consumed_at IS NULL AND m.taken_by IS NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._thread_handoff(pgdurable.runs) IS
  'Internal: at a thread run''s end, start the follow-up run by transfer_lease (or route to the winner), else release.';

------------------------------------------------------------------------------
-- pgdurable._runs_thread_sync(): trigger AFTER UPDATE on pgdurable.runs for
-- thread runs. Keeps the thread lease and the inbox in step with the run, in
-- the same transaction as the run's own transition:
--  * lease_token changed (a claim = a new attempt): transfer the thread lease
--    '<id>:<old>' -> '<id>:<new>' (acquire if it lapsed; if another owner
--    holds it, the run has lost its thread and take_messages will say so),
--    and return the messages an earlier attempt took but never checkpointed
--    to the inbox (an attempt consumes only what its own inbox() returned);
--  * leased and lease_expires_at changed (heartbeat): renew the thread lease
--    to the run lease's expiry;
--  * step advanced (a checkpoint): the messages reserved by this run become
--    consumed (consumed_by, consumed_step, consumed_at; threads.last_consumer);
--  * became runnable or waiting: the thread lease is extended by idle_ttl;
--  * became terminal: _thread_handoff.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_thread_sync() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  lk bytea := pgdurable.thread_lease_key(NEW.thread_key);
  me bytea := pgdurable._thread_owner(NEW.id, NEW.lease_token);
  v_now timestamptz := pgdurable.now();
  v_terminal boolean := NEW.status IN ('completed', 'failed', 'cancelled', 'incompatible');
  v_was_terminal boolean := OLD.status IN ('completed', 'failed', 'cancelled', 'incompatible');
  v_ttl bigint;
  v_tok bigint;
  v_n bigint;
  v_run pgdurable.runs;
  v_until timestamptz;
BEGIN
  IF NEW.step > OLD.step THEN
    UPDATE pgdurable.thread_messages m SET consumed_by = NEW.id, consumed_step = OLD.step,
           consumed_at = v_now
     WHERE m.thread_key = NEW.thread_key AND m.taken_by = NEW.id AND m.consumed_at IS NULL;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n > 0 THEN
      UPDATE pgdurable.threads x SET last_consumer = NEW.id
       WHERE x.thread_key = NEW.thread_key AND x.last_consumer IS DISTINCT FROM NEW.id;
    END IF;
  END IF;
  IF v_terminal THEN
    IF NOT v_was_terminal THEN
      -- NEW as a pgdurable.runs (in a cell the trigger runs on the shard: NEW is of
      -- the shard table's row type, which _thread_handoff does not take)
      v_run := NEW;
      PERFORM pgdurable._thread_handoff(v_run);
    END IF;
    RETURN NULL;
  END IF;
  IF NEW.status = 'leased' AND NEW.lease_expires_at IS NOT NULL THEN
    v_ttl := pgdurable._ttl_ms(NEW.lease_expires_at - v_now);
    IF NEW.lease_token IS DISTINCT FROM OLD.lease_token THEN
      -- a new attempt: what an earlier attempt took but never checkpointed is
      -- returned to the inbox, so this attempt's checkpoint consumes only what
      -- this attempt's own inbox() returned (the messages come back in order)
      UPDATE pgdurable.thread_messages m SET taken_by = NULL, taken_step = NULL
       WHERE m.thread_key = NEW.thread_key AND m.taken_by = NEW.id AND m.consumed_at IS NULL;
      v_tok := pgdurable.transfer_lease(
        lk, coalesce(pgdurable._thread_holder(lk, NEW.id),
                     pgdurable._thread_owner(OLD.id, OLD.lease_token)), me, v_ttl);
      IF v_tok IS NULL THEN
        PERFORM pgdurable.acquire_lease(lk, me, v_ttl);
      END IF;
    ELSIF NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at THEN
      UPDATE pgdurable.leases x SET expires_at = greatest(x.expires_at, NEW.lease_expires_at),
             renewed_at = v_now
       WHERE x.key = lk AND x.owner = me AND x.expires_at > v_now;
    END IF;
  ELSIF NEW.status IS DISTINCT FROM OLD.status AND NEW.status IN ('runnable', 'waiting') THEN
    -- the new expiry computed first: Citus (a cell) refuses a STABLE call with a column
    -- reference (timestamptz + t.idle_ttl) in an UPDATE
    SELECT v_now + t.idle_ttl INTO v_until FROM pgdurable.threads t
     WHERE t.thread_key = NEW.thread_key;
    IF FOUND THEN
      UPDATE pgdurable.leases x SET expires_at = greatest(x.expires_at, v_until),
             renewed_at = v_now
       WHERE x.key = lk AND x.owner = me AND x.expires_at > v_now;
    END IF;
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_thread_sync() IS
  'Trigger: keep a thread run''s lease, inbox consumption and handoff in its own transaction.';
DROP TRIGGER IF EXISTS runs_thread_sync ON pgdurable.runs;
CREATE TRIGGER runs_thread_sync
  AFTER UPDATE ON pgdurable.runs
  FOR EACH ROW
  WHEN (NEW.thread_key IS NOT NULL AND (
        OLD.status IS DISTINCT FROM NEW.status
        OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
        OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at
        OR OLD.step IS DISTINCT FROM NEW.step))
  EXECUTE FUNCTION pgdurable._runs_thread_sync();
COMMENT ON TRIGGER runs_thread_sync ON pgdurable.runs IS
  'Keeps a thread run''s thread lease with its current attempt: moves, renews, extends on park, hands off at the end.';

CREATE OR REPLACE FUNCTION pgdurable.prune_thread_messages(p_older_than interval,
                                                p_batch integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  v_n bigint;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0'
     OR p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_thread_messages: older_than >= 0 and batch in 1..100000 required'
      USING ERRCODE = 'PD000';
  END IF;
  WITH doomed AS MATERIALIZED (
    SELECT m.thread_key, m.seq FROM pgdurable.thread_messages m
     WHERE m.consumed_at IS NOT NULL AND m.consumed_at <= pgdurable.now() - p_older_than
     ORDER BY m.consumed_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED)
  DELETE FROM pgdurable.thread_messages m USING doomed d
   WHERE m.thread_key = d.thread_key AND m.seq = d.seq;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n;
END
$$;
COMMENT ON FUNCTION pgdurable.prune_thread_messages(interval, integer) IS
  'Retention: delete one batch of consumed thread messages older than older_than; returns the count.';
