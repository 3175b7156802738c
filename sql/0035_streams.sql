-- 0035_streams: token streams to the browser and double-texting (issue 41).
--
-- TEXT. ctx.emit_text(delta) buffers tokens in the worker process; a
-- per-process writer (pgdurable/runs/text.py) sends, in ONE statement per
-- tick for every stream of the process (pgdurable.stream_tick,
-- functions/text_stream.sql), the live tail of each stream as small
-- NOTIFY pgdurable_text payloads and, every flush interval or flush size and
-- before every checkpoint, the pending text as ONE run_events row
-- {"type": "text", "text": ...} per stream (step = the step, idx NULL). A
-- retried attempt of a step replays its text: what an earlier attempt of the
-- step flushed is not written again (the rows of a step's current
-- "generation", after its last interrupted/rollback marker, are the step's
-- text so far).
--
-- DOUBLE-TEXTING. send_message_v2 takes a strategy for a message sent while
-- the thread's owner run is answering (unfinished and not parked on its
-- inbox): reject (PD014, ThreadBusy, nothing stored), enqueue (delivered: the owner or
-- its follow-up answers it next), interrupt (delivered; the step that is
-- answering an older message stops at its next safe point and runs again
-- with both) or rollback (older unanswered messages and the unfinished
-- answer are discarded; the step runs again with the new message).
-- Per message, else per thread (threads.double_text), else the sender's
-- default (the route's), else enqueue.

ALTER TABLE pgdurable.threads ADD COLUMN double_text text
  CHECK (double_text IN ('reject', 'enqueue', 'interrupt', 'rollback'));
COMMENT ON COLUMN pgdurable.threads.double_text IS
  'The thread''s double-texting strategy (pgdurable.set_double_text); NULL: the sender''s default.';

ALTER TABLE pgdurable.thread_messages ADD COLUMN double_text text
  CHECK (double_text IN ('enqueue', 'interrupt', 'rollback'));
ALTER TABLE pgdurable.thread_messages ADD COLUMN discarded_at timestamptz;
ALTER TABLE pgdurable.thread_messages ADD COLUMN stream_no integer;
ALTER TABLE pgdurable.thread_messages ADD COLUMN stream_seq bigint;
COMMENT ON COLUMN pgdurable.thread_messages.double_text IS
  'The double-texting strategy applied because the thread was answering when it was sent; '
  'NULL when it was not (or before 0037).';
COMMENT ON COLUMN pgdurable.thread_messages.discarded_at IS
  'When a rollback discarded it (consumed_at is set too): it is never answered.';
COMMENT ON COLUMN pgdurable.thread_messages.stream_no IS
  'The thread stream''s position when it was sent: runs.thread_no of the thread''s last run (0: none).';
COMMENT ON COLUMN pgdurable.thread_messages.stream_seq IS
  'The thread stream''s position when it was sent: the last run_events.seq of that run (0: none); '
  'its answer comes after (stream_no, stream_seq).';

-- The app role calls them (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.send_message_v2(text,text,jsonb,text,text,text,text,integer,integer,jsonb,interval,text,text)', false),
  ('pgdurable.set_double_text(text,text)', false),
  ('pgdurable.stream_tick(uuid[],bigint[],text[],integer[],integer[],text[],boolean[],bigint[])', false),
  ('pgdurable.stop_step(uuid,bigint,text,integer,text,integer,text)', false);
