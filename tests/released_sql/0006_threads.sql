-- 0006_threads: thread ownership, signal routing (the seed's signal layer)
-- and the resumable output stream.
--
-- THREADS. A thread key (e.g. 'chat:42') has at most one owning run. The
-- owner holds the lease pgdurable.thread_lease_key(key) in pgdurable.leases;
-- its lease owner is the run's current ATTEMPT, '<run id>:<runs.lease_token>'
-- (pgdurable._thread_owner), never the bare run id: each claim of the run
-- moves the thread lease to the new attempt by transfer_lease, so a stale
-- attempt's cleanup (release_lease with its old owner) cannot touch its
-- successor's lease (CONTRACT S12).
--
-- * send_message decides, under the thread's row lock (pgdurable.threads),
--   in ONE transaction: no live owner -> acquire the thread lease for a new
--   run and start it ('wake'); a live (or lapsed but still unfinished) owner
--   run -> append to the thread inbox addressed to it ('deliver') and wake it
--   if it is parked on its inbox. The message is durable when it returns.
-- * The inbox is per thread: a run drains (take_messages) the thread's
--   messages that are not consumed, in seq order. A take RESERVES them for
--   (run, step); the reservation becomes consumption in the same transaction
--   that checkpoints the step (the runs trigger below sees runs.step advance).
--   A step that is retried sees its reserved messages again; a run that ends
--   without checkpointing that step releases them to the next owner.
-- * A thread run that reaches a terminal status with unconsumed messages
--   starts the follow-up run and transfer_lease(thread, current, next) in the
--   same transaction (no gap: S4). If the transfer fails (the lease was lost)
--   it acquires; if that loses, the messages are routed to the winner (S5).
--   With nothing pending the lease is released.
-- * Lease lifetime policy: while the owner run is leased by a worker, the
--   thread lease is renewed with the worker's heartbeat (renew_runs changes
--   lease_expires_at; the trigger renews the thread lease to the same
--   expiry). While the owner is runnable or parked (waiting), it keeps the
--   thread with a lease of threads.idle_ttl (default 1 hour) from the moment
--   it parked, renewed by every send; should that lapse, the next send
--   re-acquires the lease for the same unfinished run instead of starting a
--   competitor. A worker that dies: the thread lease lapses with the run's
--   lease; the worker that reclaims the run takes the thread over (S8).
-- * A parked owner is woken by a send when it waits on the signal
--   ('inbox', thread_key) (ctx.wait_inbox()); a message that arrives before
--   it parks leaves a pending ('inbox', key) signal that park_run consumes.
--
-- Lock order (deadlock-free): runs row -> threads row -> advisory wait lock
-- ('inbox', key) -> leases row. park_run (0005) takes the wait lock while
-- holding the run row, and the trigger below then updates the lease row, so
-- everyone here takes the wait lock before the lease row. send_message never
-- waits for a runs row lock (it wakes with SKIP LOCKED and otherwise leaves a
-- pending signal).
--
-- THREAD KEYS. A key is any non-empty string, NUL included (Mastra's keys are
-- resource || NUL || thread), but text cannot hold NUL, so every thread_key
-- column (threads, thread_messages, runs, thread_owners) and the inbox signal
-- ref hold an ESCAPED form: a backslash is stored as two backslashes and NUL
-- as backslash-zero; nothing else changes. Python encodes/decodes it in one
-- place (pgdurable.threads.encode_thread_key / decode_thread_key), so
-- ctx.thread_key and Message.thread_key are the original key. In psql,
-- 'chat:42' reads as itself, Mastra's key 'user-1' NUL 'thread-9' as
-- 'user-1\0thread-9' and the key 'C:\tmp' as 'C:\\tmp' (with
-- standard_conforming_strings on, as these literals are written). Only the
-- two escapes are valid (pgdurable.is_thread_key; send_message raises PD000
-- for anything else), so every stored key decodes to exactly one string and
-- equal keys are equal stored texts. The thread lease key is
-- 'pgdurable.thread:' || the escaped key. Prefix routing (thread_task) is
-- done in Python on the original keys, never in SQL.
--
-- OUTPUT STREAM. emit_event appends to pgdurable.run_events under the run's
-- lease fence, keyed by (run, step, idx): a retried step re-emitting its
-- idx-th event overwrites that row in place instead of appending (no
-- duplicates). Every emit NOTIFYs pgdurable_events (payload = run id; one per
-- transaction). When a run that has a thread or emitted events reaches a
-- terminal status, a final event {type: 'end', status, ...} is appended in
-- the same transaction (so a reader sees completion after the last event).

------------------------------------------------------------------------------
-- pgdurable.is_thread_key(text) -> boolean
-- True when the text is a valid stored (escaped) thread key: non-empty, every
-- backslash starts one of the escapes \\ (a backslash) or \0 (NUL).
-- From psql: SELECT pgdurable.is_thread_key('user-1\0thread-9');  -- true
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.is_thread_key(p text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT p ~ '^([^\\]|\\[\\0])+$'
$$;
COMMENT ON FUNCTION pgdurable.is_thread_key(text) IS
  'True for a valid stored thread key: non-empty, a backslash only in the escapes \\ (backslash) and \0 (NUL).';

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN thread_key text CHECK (thread_key <> '');
ALTER TABLE pgdurable.runs ADD COLUMN thread_no integer;
COMMENT ON COLUMN pgdurable.runs.thread_key IS
  'Thread the run owns (or owned) when it was started by send_message or a thread handoff (escaped key, '
  'see threads.thread_key); NULL otherwise.';
COMMENT ON COLUMN pgdurable.runs.thread_no IS
  'Position of the run among its thread''s runs (1, 2, ...); orders a thread''s output stream.';
-- never updated after insert: keeps heartbeats HOT
CREATE INDEX runs_thread_idx ON pgdurable.runs (thread_key, thread_no)
  WHERE thread_key IS NOT NULL;

ALTER TABLE pgdurable.run_events ADD COLUMN step integer;
ALTER TABLE pgdurable.run_events ADD COLUMN idx integer;
ALTER TABLE pgdurable.run_events ADD COLUMN token bigint;
ALTER TABLE pgdurable.run_events ADD COLUMN final boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN pgdurable.run_events.step IS
  'Step that emitted the event (NULL for the final event written at the terminal transition).';
COMMENT ON COLUMN pgdurable.run_events.idx IS
  'Index of the event within its step (0, 1, ...): a retried step overwrites (step, idx) instead of appending.';
COMMENT ON COLUMN pgdurable.run_events.token IS 'Lease token of the attempt that wrote the event.';
COMMENT ON COLUMN pgdurable.run_events.final IS
  'True for the run''s last event, written in the transaction that made the run terminal '
  '(cleared by retry_run, which revives the run).';
CREATE UNIQUE INDEX run_events_step_idx ON pgdurable.run_events (run_id, step, idx)
  WHERE step IS NOT NULL;

CREATE TABLE pgdurable.threads (
  thread_key      text        PRIMARY KEY CHECK (pgdurable.is_thread_key(thread_key)),
  next_seq        bigint      NOT NULL DEFAULT 1,
  runs            integer     NOT NULL DEFAULT 0,
  idle_ttl        interval    NOT NULL DEFAULT '1 hour',
  last_consumer   uuid,
  unproductive_runs     integer NOT NULL DEFAULT 0,
  max_unproductive_runs integer NOT NULL DEFAULT 3 CHECK (max_unproductive_runs >= 1),
  created_at      timestamptz NOT NULL DEFAULT pgdurable.now(),
  last_message_at timestamptz,
  route_task         text,
  route_revision     text,
  route_queue        text,
  route_priority     integer,
  route_max_attempts integer
);
COMMENT ON TABLE pgdurable.threads IS
  'One row per thread key: its message counter; its row lock serialises sends and handoffs of the thread.';
COMMENT ON COLUMN pgdurable.threads.thread_key IS
  'Thread key, escaped: a backslash is stored as \\ and NUL as \0, everything else as itself '
  '(''chat:42''; Mastra''s resource NUL thread reads ''resource\0thread'').';
COMMENT ON COLUMN pgdurable.threads.next_seq IS 'Sequence number the next message of the thread gets.';
COMMENT ON COLUMN pgdurable.threads.runs IS 'How many runs the thread has started (the last one''s thread_no).';
COMMENT ON COLUMN pgdurable.threads.idle_ttl IS
  'Thread lease TTL while the owner run is runnable or parked (renewed by sends).';
COMMENT ON COLUMN pgdurable.threads.last_consumer IS
  'The run whose checkpoint consumed the thread''s latest consumed message.';
COMMENT ON COLUMN pgdurable.threads.unproductive_runs IS
  'Consecutive runs of the thread that ended failed, cancelled, incompatible, or completed without '
  'consuming a message (0 after a completed run that consumed).';
COMMENT ON COLUMN pgdurable.threads.max_unproductive_runs IS
  'After this many consecutive unproductive runs no follow-up is started automatically (a poison '
  'message, or a task that ignores its inbox): the pending messages wait (inbox_depth) and the '
  'next send starts a run.';
COMMENT ON COLUMN pgdurable.threads.created_at IS 'When the thread''s first message was sent.';
COMMENT ON COLUMN pgdurable.threads.last_message_at IS 'When the thread''s latest message was sent.';
COMMENT ON COLUMN pgdurable.threads.route_task IS
  'Task the latest send routed the thread to (the sender''s app.thread_task); a follow-up run '
  'started at a handoff runs it, so threads move to a new deploy''s task and revision.';
COMMENT ON COLUMN pgdurable.threads.route_revision IS 'Revision of route_task the latest send named.';
COMMENT ON COLUMN pgdurable.threads.route_queue IS 'Queue the latest send named for new runs.';
COMMENT ON COLUMN pgdurable.threads.route_priority IS 'Priority the latest send named for new runs.';
COMMENT ON COLUMN pgdurable.threads.route_max_attempts IS 'max_attempts the latest send named for new runs.';

CREATE TABLE pgdurable.thread_messages (
  thread_key    text        NOT NULL REFERENCES pgdurable.threads (thread_key) ON DELETE CASCADE,
  seq           bigint      NOT NULL CHECK (seq >= 1),
  message_id    text        NOT NULL CHECK (message_id <> ''),
  payload       jsonb       NOT NULL,
  sender        text,
  action        text        NOT NULL CHECK (action IN ('wake', 'deliver')),
  run_id        uuid        NOT NULL,
  taken_by      uuid,
  taken_step    integer,
  consumed_by   uuid,
  consumed_step integer,
  consumed_at   timestamptz,
  created_at    timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (thread_key, seq),
  UNIQUE (thread_key, message_id)
);
COMMENT ON TABLE pgdurable.thread_messages IS
  'Thread inboxes: every message sent to a thread, in order; consumed exactly once by the owning run''s checkpointed step.';
COMMENT ON COLUMN pgdurable.thread_messages.thread_key IS 'Thread the message was sent to (escaped key).';
COMMENT ON COLUMN pgdurable.thread_messages.seq IS 'Order within the thread (1, 2, ...; the order of commits of send_message).';
COMMENT ON COLUMN pgdurable.thread_messages.message_id IS
  'Caller-chosen (or generated) id, unique per thread: the same id is stored once; another payload is a SignalConflict.';
COMMENT ON COLUMN pgdurable.thread_messages.payload IS 'The message (JSON).';
COMMENT ON COLUMN pgdurable.thread_messages.sender IS 'Free-form sender label (optional).';
COMMENT ON COLUMN pgdurable.thread_messages.action IS
  'What send_message did: wake (started a run for it) or deliver (appended to the owner''s inbox).';
COMMENT ON COLUMN pgdurable.thread_messages.run_id IS
  'Run the message was delivered to (the owner when sent, or the run it was routed to at a handoff).';
COMMENT ON COLUMN pgdurable.thread_messages.taken_by IS
  'Run whose current step drained the message (reserved; consumed when that step is checkpointed).';
COMMENT ON COLUMN pgdurable.thread_messages.taken_step IS 'Step (runs.step) during which it was drained.';
COMMENT ON COLUMN pgdurable.thread_messages.consumed_by IS 'Run that consumed the message (its step was checkpointed).';
COMMENT ON COLUMN pgdurable.thread_messages.consumed_step IS 'Step whose checkpoint consumed the message.';
COMMENT ON COLUMN pgdurable.thread_messages.consumed_at IS 'When it was consumed; NULL while pending.';
COMMENT ON COLUMN pgdurable.thread_messages.created_at IS 'When it was sent.';
CREATE INDEX thread_messages_pending_idx ON pgdurable.thread_messages (thread_key, seq)
  WHERE consumed_at IS NULL;

------------------------------------------------------------------------------
-- pgdurable.thread_lease_key(thread_key) -> bytea
-- The pgdurable.leases key of a thread: UTF-8 of 'pgdurable.thread:' || key,
-- the key in its stored (escaped) form, as in threads.thread_key.
-- From psql: SELECT * FROM pgdurable.acquire_lease(pgdurable.thread_lease_key('chat:1'), ...).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.thread_lease_key(p_thread text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT convert_to('pgdurable.thread:' || p_thread, 'UTF8')
$$;
COMMENT ON FUNCTION pgdurable.thread_lease_key(text) IS
  'The lease key (bytea) of a thread in pgdurable.leases.';

------------------------------------------------------------------------------
-- pgdurable._thread_owner(run_id, lease_token) -> bytea
-- Internal: the thread-lease owner of one attempt of a run, '<id>:<token>'.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._thread_owner(p_run uuid, p_token bigint) RETURNS bytea
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
CREATE FUNCTION pgdurable._owner_run(p_owner bytea) RETURNS uuid
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
CREATE FUNCTION pgdurable._thread_holder(p_key bytea, p_run uuid) RETURNS bytea
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
CREATE FUNCTION pgdurable._ttl_ms(p interval) RETURNS bigint
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
CREATE FUNCTION pgdurable._thread_wake(p_run uuid, p_thread text) RETURNS boolean
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
-- holds the thread lease for '<id>:0') and NOTIFY pgdurable_wake(queue).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._thread_new_run(p_id uuid, p_thread text, p_task text,
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
  RETURN v_no;
END
$$;
COMMENT ON FUNCTION pgdurable._thread_new_run(uuid, text, text, text, text, integer, integer, jsonb) IS
  'Internal: start the run that owns a thread (caller holds the thread lease) and NOTIFY its queue.';

------------------------------------------------------------------------------
-- pgdurable.send_message(thread, message_id, payload, sender, task, revision,
--                        queue, priority, max_attempts, state, idle_ttl)
--   -> TABLE(action text, run_id uuid, seq bigint, duplicate boolean)
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
-- thread is the stored (escaped) key (pgdurable.is_thread_key).
-- Bad input -> PD000. Never reports delivery without a recipient (run_id is
-- always a run that exists and is unfinished at commit).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.send_message(
  p_thread text, p_message_id text, p_payload jsonb, p_sender text, p_task text,
  p_revision text, p_queue text, p_priority integer, p_max_attempts integer,
  p_state jsonb DEFAULT NULL, p_idle_ttl interval DEFAULT NULL)
RETURNS TABLE (action text, run_id uuid, seq bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
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
BEGIN
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
    RETURN QUERY SELECT m.action, m.run_id, m.seq, true;
    RETURN;
  END IF;
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
  INSERT INTO pgdurable.thread_messages (thread_key, seq, message_id, payload, sender, action, run_id)
  VALUES (p_thread, t.next_seq, p_message_id, p_payload, p_sender, v_action, v_id);
  UPDATE pgdurable.threads SET next_seq = next_seq + 1, last_message_at = v_now,
         route_task = p_task, route_revision = p_revision, route_queue = p_queue,
         route_priority = coalesce(p_priority, 0), route_max_attempts = p_max_attempts
   WHERE thread_key = p_thread;
  IF v_action = 'deliver' THEN
    PERFORM pgdurable._thread_wake(v_id, p_thread);
  END IF;
  RETURN QUERY SELECT v_action, v_id, t.next_seq, false;
END
$$;
COMMENT ON FUNCTION pgdurable.send_message(text, text, jsonb, text, text, text, text, integer,
                                           integer, jsonb, interval) IS
  'Send a message to a thread: start its owner run (wake) or append to the owner''s inbox (deliver), atomically.';

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
CREATE FUNCTION pgdurable.take_messages(p_id uuid, p_token bigint, p_owner text)
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
-- pgdurable.emit_event(id, token, owner, idx, event) -> bigint (seq)
-- FENCED (PD001). ctx.emit(): the idx-th event (0-based) of the run's
-- current step. A new (step, idx) gets seq = last + 1 (the run row lock of
-- the fence orders concurrent emits; seq is gapless); an existing one (the
-- step is being retried) is overwritten in place and keeps its seq. NOTIFY
-- pgdurable_events(run id), once per call (one transaction).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.emit_event(p_id uuid, p_token bigint, p_owner text, p_idx integer,
                                     p_event jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_seq bigint;
BEGIN
  IF p_idx IS NULL OR p_idx < 0 OR p_event IS NULL THEN
    RAISE EXCEPTION 'emit_event: idx >= 0 and an event are required' USING ERRCODE = 'PD000';
  END IF;
  UPDATE pgdurable.run_events e SET event = p_event, token = p_token
   WHERE e.run_id = p_id AND e.step = r.step AND e.idx = p_idx
  RETURNING e.seq INTO v_seq;
  IF v_seq IS NULL THEN
    SELECT coalesce(max(e.seq), 0) + 1 INTO v_seq FROM pgdurable.run_events e WHERE e.run_id = p_id;
    INSERT INTO pgdurable.run_events (run_id, seq, event, step, idx, token)
    VALUES (p_id, v_seq, p_event, r.step, p_idx, p_token);
  END IF;
  PERFORM pg_notify('pgdurable_events', p_id::text);
  RETURN v_seq;
END
$$;
COMMENT ON FUNCTION pgdurable.emit_event(uuid, bigint, text, integer, jsonb) IS
  'Fenced: append (or, for a retried step, overwrite) the idx-th event of the current step; NOTIFY pgdurable_events.';

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
CREATE FUNCTION pgdurable._thread_handoff(r pgdurable.runs) RETURNS void
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
CREATE FUNCTION pgdurable._runs_thread_sync() RETURNS trigger
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
      PERFORM pgdurable._thread_handoff(NEW);
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
    UPDATE pgdurable.leases x SET expires_at = greatest(x.expires_at, v_now + t.idle_ttl),
           renewed_at = v_now
      FROM pgdurable.threads t
     WHERE x.key = lk AND x.owner = me AND x.expires_at > v_now
       AND t.thread_key = NEW.thread_key;
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_thread_sync() IS
  'Trigger: keep a thread run''s lease, inbox consumption and handoff in its own transaction.';

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

------------------------------------------------------------------------------
-- pgdurable._runs_stream_end(): trigger AFTER UPDATE OF status on
-- pgdurable.runs when a run becomes terminal: if the run has a thread or
-- emitted events, append its final event {type: 'end', status, result,
-- error} (final = true) and NOTIFY pgdurable_events(run id), in the same
-- transaction as the terminal transition (S16: completion after the last
-- event). Runs that never emitted and have no thread write nothing.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._runs_stream_end() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  v_seq bigint;
BEGIN
  SELECT max(e.seq) INTO v_seq FROM pgdurable.run_events e WHERE e.run_id = NEW.id;
  IF v_seq IS NULL AND NEW.thread_key IS NULL THEN
    RETURN NULL;
  END IF;
  INSERT INTO pgdurable.run_events (run_id, seq, event, final)
  VALUES (NEW.id, coalesce(v_seq, 0) + 1,
          jsonb_build_object('type', 'end', 'status', NEW.status, 'result', NEW.result,
                             'error', NEW.error - 'traceback'),
          true);
  PERFORM pg_notify('pgdurable_events', NEW.id::text);
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_stream_end() IS
  'Trigger: append a run''s final stream event when it becomes terminal (runs with a thread or events).';

CREATE TRIGGER runs_stream_end
  AFTER UPDATE OF status ON pgdurable.runs
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status IN ('completed', 'failed', 'cancelled', 'incompatible')
        AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible'))
  EXECUTE FUNCTION pgdurable._runs_stream_end();
COMMENT ON TRIGGER runs_stream_end ON pgdurable.runs IS
  'Appends the final stream event (type end) in the transaction that makes a run terminal.';

------------------------------------------------------------------------------
-- pgdurable.prune_thread_messages(older_than, batch) -> bigint
-- Retention for inboxes: ONE short transaction deleting up to p_batch
-- consumed messages whose consumed_at <= now() - older_than (oldest first,
-- FOR UPDATE SKIP LOCKED: never waits). Pending messages are never deleted.
-- A pruned message id can be sent again (dedup lasts as long as the row).
-- Call repeatedly until it returns < p_batch. Bad input -> PD000.
------------------------------------------------------------------------------
CREATE INDEX thread_messages_consumed_idx ON pgdurable.thread_messages (consumed_at)
  WHERE consumed_at IS NOT NULL;

CREATE FUNCTION pgdurable.prune_thread_messages(p_older_than interval,
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

------------------------------------------------------------------------------
-- pgdurable.thread_owners: which run owns which thread, its inbox depth and
-- its stream position.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.thread_owners AS
  SELECT t.thread_key,
         CASE WHEN l.owner IS NOT NULL AND l.expires_at > pgdurable.now()
              THEN pgdurable._owner_run(l.owner) END                       AS run_id,
         pgdurable.lease_display(l.owner)                                   AS lease_owner,
         l.token                                                            AS lease_token,
         l.expires_at                                                       AS lease_expires_at,
         (l.owner IS NOT NULL AND l.expires_at > pgdurable.now())           AS owned,
         r.status                                                           AS run_status,
         r.step                                                             AS run_step,
         (SELECT count(*) FROM pgdurable.thread_messages m
           WHERE m.thread_key = t.thread_key AND m.consumed_at IS NULL)     AS inbox_depth,
         t.next_seq - 1                                                     AS last_message_seq,
         (SELECT max(e.seq) FROM pgdurable.run_events e WHERE e.run_id = r.id) AS stream_position,
         t.runs                                                             AS runs_started,
         t.last_message_at
    FROM pgdurable.threads t
    LEFT JOIN pgdurable.leases l ON l.key = pgdurable.thread_lease_key(t.thread_key)
    -- the owning run; when the lease is released, the thread's last run
    LEFT JOIN pgdurable.runs r ON r.id = coalesce(
      pgdurable._owner_run(l.owner),
      (SELECT x.id FROM pgdurable.runs x WHERE x.thread_key = t.thread_key
        ORDER BY x.thread_no DESC LIMIT 1));
COMMENT ON VIEW pgdurable.thread_owners IS
  'One row per thread: the run that owns it (live thread lease), its inbox depth and its stream position.';
COMMENT ON COLUMN pgdurable.thread_owners.thread_key IS
  'Thread key, escaped (\\ is a backslash, \0 is NUL; see threads.thread_key).';
COMMENT ON COLUMN pgdurable.thread_owners.run_id IS 'Run owning the thread now (NULL when the lease is free or lapsed).';
COMMENT ON COLUMN pgdurable.thread_owners.lease_owner IS 'Holder (or last holder) of the thread lease, <run id>:<attempt token>.';
COMMENT ON COLUMN pgdurable.thread_owners.lease_token IS 'Fencing token of the thread lease.';
COMMENT ON COLUMN pgdurable.thread_owners.lease_expires_at IS 'When the thread lease lapses (database clock).';
COMMENT ON COLUMN pgdurable.thread_owners.owned IS 'True while the thread lease is live.';
COMMENT ON COLUMN pgdurable.thread_owners.run_status IS
  'Status of the owning run (of the thread''s last run when the lease is released).';
COMMENT ON COLUMN pgdurable.thread_owners.run_step IS
  'Steps checkpointed by the owning run (the thread''s last run when released).';
COMMENT ON COLUMN pgdurable.thread_owners.inbox_depth IS 'Messages of the thread not consumed yet.';
COMMENT ON COLUMN pgdurable.thread_owners.last_message_seq IS 'Sequence number of the thread''s latest message (0: none).';
COMMENT ON COLUMN pgdurable.thread_owners.stream_position IS
  'Last event seq of the owning run''s output stream (the thread''s last run when released).';
COMMENT ON COLUMN pgdurable.thread_owners.runs_started IS 'How many runs the thread has started.';
COMMENT ON COLUMN pgdurable.thread_owners.last_message_at IS 'When the latest message was sent.';
