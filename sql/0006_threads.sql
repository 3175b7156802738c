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
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

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
-- pgdurable.prune_thread_messages(older_than, batch) -> bigint
-- Retention for inboxes: ONE short transaction deleting up to p_batch
-- consumed messages whose consumed_at <= now() - older_than (oldest first,
-- FOR UPDATE SKIP LOCKED: never waits). Pending messages are never deleted.
-- A pruned message id can be sent again (dedup lasts as long as the row).
-- Call repeatedly until it returns < p_batch. Bad input -> PD000.
------------------------------------------------------------------------------
CREATE INDEX thread_messages_consumed_idx ON pgdurable.thread_messages (consumed_at)
  WHERE consumed_at IS NOT NULL;
