-- 0029_role_boundary: the app role reaches no unfenced helper (issue 36).
--
-- THE ALLOW-LIST. secure_schema() granted the app role EXECUTE on every
-- routine of the schema, the internal SECURITY DEFINER helpers included: with
-- no lease and no token the app role could end any run with any status
-- (_end), rewrite any run's state and history (_checkpoint), make spent
-- negative, create partitions in 2090 (_create_history_partitions). Now
-- pgdurable.security_api lists, in ONE place, every routine the app role may
-- execute (the API of the library, the CLI, the dashboard, contrib/,
-- clients/mastra and the examples; tests/test_role_boundary.py scans their
-- sources) and, flagged readonly, those the read-only role may execute too
-- (the functions its views call, listen_presence, run_tree, the pure helpers).
-- secure_schema() grants exactly those and revokes everything else from the
-- app and read-only roles and from PUBLIC; PUBLIC keeps only the pure
-- inlinable helpers of security_inlinable() (caller's rights, no table, no
-- write: granting them gives nothing). Helpers run inside the definer
-- functions as the owner and need no grant; triggers need none either. A
-- later migration that adds an API function adds its row:
--   INSERT INTO pgdurable.security_api (routine, readonly)
--   VALUES ('pgdurable.my_function(text,integer)', false);
-- secure_schema() refuses a row that names no function or an administrative
-- one (security_invoker()), so a renamed function cannot silently lose or keep
-- its grant. This migration ends with secure_schema(): an existing database
-- loses the old grants when it is migrated. security_readonly() (0023) is
-- replaced by the readonly flag and dropped.
--
-- THE HELPERS THAT TAKE A WHOLE ROW, re-checked now that only definer
-- functions reach them (none lets a caller bypass a fence, a flow limit or
-- thread ownership):
--   * _checkpoint(runs, token, state, spend): called by park_run and
--     park_children only, with the row _fenced(id, token, owner) returned
--     (locked FOR UPDATE, current token and owner, live lease).
--   * _fork_point(runs, ...): fork_run (row read by id FOR KEY SHARE) and
--     rewind_run (_locked_run); it only reads, and its refusals (thread runs,
--     unrecorded steps, unserved revisions) judge the stored row.
--   * _thread_handoff(runs): only the runs trigger _runs_thread_sync, with NEW.
--   * _schedule_start(schedules, tick, triggered): fire_schedule (row locked
--     under the next_fire_at fence, ticks checked) and trigger_schedule
--     (_schedule(name), FOR UPDATE).
--   * _claim_flow(..., now): claim_runs only, with now = pgdurable.now() and
--     the claim's remaining limit; it locks the queue row and counts the live
--     leases itself. Called directly it took a caller's `now`: live leases
--     looked expired and the rate bucket refilled.
--   * _thread_new_run(...): send_message (thread row locked, thread lease
--     held) and _thread_handoff. Called directly it put a second run into a
--     thread whose lease another run holds.
--   * _end(id, ...): its callers pass the id of a row they fenced (ack_cancel,
--     fail_run, park_run, park_children, release_run) or locked and found not
--     leased (cancel_run), or the trigger's children.
--   * _verdict(runs, ...), _error(...): pure, caller's rights, no table.
--   * _schedule(name) stays on the list: pgdurable/schedules.py locks a
--     schedule's row through it before it plans a resume (a row the app role
--     may read anyway).
-- What the public functions still let ANY app-role session do, by design (the
-- app role's powers, SECURITY.md): claim any runnable or expired run, signal
-- any wait (an approval too) with any payload, cancel, retry, rewind a failed
-- or cancelled run with a new state, fork; send to any thread; take, release
-- or transfer any lease with the generic lease functions, the thread leases
-- ('pgdurable.thread:<key>', public so that a LeaseProvider sees a thread's
-- owner) included; start a run whose idempotency key is a schedule tick's
-- (upsert_schedule may change the schedule anyway). App-role sessions are
-- mutually trusted.
--
-- THE FENCE'S INPUTS stay readable. The lease token separates lease terms,
-- not sessions: a zombie worker (paused, partitioned, stalled past its TTL)
-- is refused once the run was claimed again. It does not authenticate one
-- app-role session to another: the token is a counter (+1 per claim), it is
-- in the thread lease owners that get_lease_owner returns ('<run>:<token>'),
-- in the history rows, RunInfo, the CLI and the dashboard; hiding it would
-- need random tokens and column privileges on six tables and five views, and
-- would still leave an app-role session every power listed above. The
-- read-only role sees tokens in run_detail, active_leases and thread_owners
-- and can execute no fenced function.
--
-- SMALLER HOLES:
--   * tag_started_run labelled any row whose xmin was the current
--     transaction: retry_run + cancel_run of an existing run made it pass.
--     runs.created_xact (new, the inserting transaction's id, NULL on older
--     rows) is what it checks now, with created_at = now().
--   * signal ids are scoped by kind: (kind, signal_id) is unique in signals,
--     signal_history_ids is keyed by (kind, signal_id) and rebuilt from
--     signal_history; _signal_dup, send_signal, signal_run and the history
--     triggers use the pair. A CI sender can no longer take the id of an
--     approval. drop_history_partitions keeps deleting ids by (signal_id,
--     consumed_at): every row sharing both lies in the same partition.
--   * a pubsub event over 1 MiB of JSON and a lease owner over 64 KiB are
--     refused with PD013 (pgdurable.ValueTooLarge); nothing changes.
--   * the read-only role may SELECT schema_migrations (the version check
--     every connection of the CLI and the dashboard does).
------------------------------------------------------------------------------
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- pgdurable.security_api: the allow-list.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.security_api (
  routine  text    PRIMARY KEY,
  readonly boolean NOT NULL DEFAULT false
);
COMMENT ON TABLE pgdurable.security_api IS
  'The allow-list: every routine the app roles may EXECUTE (the read-only roles those with '
  'readonly); secure_schema() grants these and revokes every other routine of the schema.';
COMMENT ON COLUMN pgdurable.security_api.routine IS
  'The routine''s signature as regprocedure reads it, e.g. ''pgdurable.cancel_run(uuid)''.';
COMMENT ON COLUMN pgdurable.security_api.readonly IS
  'true: the read-only roles may execute it too (views call it, or it reads no state).';

INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  -- pure helpers (security_inlinable(): caller's rights, no table) and what the views call
  ('pgdurable.now()', true),
  ('pgdurable.wait_lock_key(text,text)', true),
  ('pgdurable.task_lock_key(text)', true),
  ('pgdurable.is_thread_key(text)', true),
  ('pgdurable._error(text,text)', true),
  ('pgdurable._verdict(pgdurable.runs,numeric,boolean)', true),
  ('pgdurable._runs_check(text,text,text,integer,integer,integer,integer,integer,numeric,'
   'text,text,text,uuid,uuid,integer)', true),
  ('pgdurable.lease_display(bytea)', true),
  ('pgdurable.thread_lease_key(text)', true),
  ('pgdurable._owner_run(bytea)', true),
  ('pgdurable.listen_presence(text,integer)', true),
  ('pgdurable.run_tree(uuid)', true),
  -- leases (PostgresLeaseProvider, clients/mastra; the text overloads for psql)
  ('pgdurable.acquire_lease(bytea,bytea,bigint)', false),
  ('pgdurable.get_lease_owner(bytea)', false),
  ('pgdurable.get_lease(bytea)', false),
  ('pgdurable.release_lease(bytea,bytea,bigint)', false),
  ('pgdurable.renew_lease(bytea,bytea,bigint,bigint)', false),
  ('pgdurable.transfer_lease(bytea,bytea,bytea,bigint,bigint)', false),
  ('pgdurable.acquire_lease(text,text,bigint)', false),
  ('pgdurable.get_lease_owner(text)', false),
  ('pgdurable.release_lease(text,text,bigint)', false),
  ('pgdurable.renew_lease(text,text,bigint,bigint)', false),
  ('pgdurable.transfer_lease(text,text,text,bigint,bigint)', false),
  -- runs: start, claim and the fenced transitions (the app, the worker)
  ('pgdurable.start_run(text,text,jsonb,text,integer,integer,text,interval,timestamptz,numeric)', false),
  ('pgdurable.start_runs(text[],text[],jsonb[],text[],integer[],integer[],text[],interval[],'
   'timestamptz[],numeric[],text[],timestamptz[],interval[],jsonb[],jsonb)', false),
  ('pgdurable.start_run_flow(text,text,jsonb,text,integer,integer,text,interval,timestamptz,'
   'numeric,text,timestamptz,interval)', false),
  ('pgdurable.tag_started_run(uuid,boolean,jsonb,jsonb)', false),
  ('pgdurable.claim_runs(text,text[],text[],text[],integer,interval,integer[])', false),
  ('pgdurable.renew_runs(text,uuid[],bigint[],interval)', false),
  ('pgdurable.next_wakeup(text[],text[],text[])', false),
  ('pgdurable.write_steps(text,uuid[],bigint[],jsonb[],numeric[],boolean[],jsonb[])', false),
  ('pgdurable.checkpoint_run(uuid,bigint,text,jsonb,numeric)', false),
  ('pgdurable.complete_run(uuid,bigint,text,jsonb,jsonb,numeric)', false),
  ('pgdurable.release_run(uuid,bigint,text)', false),
  ('pgdurable.fail_run(uuid,bigint,text,jsonb,numeric,interval,boolean)', false),
  ('pgdurable.ack_cancel(uuid,bigint,text,numeric)', false),
  ('pgdurable.park_run(uuid,bigint,text,jsonb,numeric,text,text,timestamptz,interval)', false),
  ('pgdurable.effect_begin(uuid,bigint,text,text)', false),
  ('pgdurable.effect_finish(uuid,bigint,text,text,boolean,jsonb,jsonb)', false),
  ('pgdurable.durable_step_enter(uuid,bigint,integer)', false),
  ('pgdurable.durable_step_mark(uuid,bigint,integer,text)', false),
  ('pgdurable.record_heartbeat(uuid,bigint,text,jsonb)', false),
  ('pgdurable.register_worker(text,text[],text[])', false),
  ('pgdurable.unregister_worker(text)', false),
  -- runs: operations (the app, the CLI, the dashboard's actions)
  ('pgdurable.cancel_run(uuid)', false),
  ('pgdurable.retry_run(uuid)', false),
  ('pgdurable.mark_incompatible(text,text,text)', false),
  ('pgdurable.fork_run(uuid,integer,jsonb,text,text,boolean)', false),
  ('pgdurable.fork_failed(text,text,timestamptz,text,boolean,integer)', false),
  ('pgdurable.rewind_run(uuid,integer,jsonb,text,text,boolean)', false),
  ('pgdurable.json_merge_patch(jsonb,jsonb)', false),
  -- signals
  ('pgdurable.send_signal(text,text,jsonb,text,interval)', false),
  ('pgdurable.signal_run(uuid,text,jsonb,text,interval)', false),
  -- child runs
  ('pgdurable.start_child(uuid,bigint,text,text,text,jsonb,text,integer,integer,interval,'
   'timestamptz,numeric,text)', false),
  ('pgdurable.park_children(uuid,bigint,text,jsonb,numeric,uuid[],integer,interval)', false),
  -- threads and output streams
  ('pgdurable.send_message(text,text,jsonb,text,text,text,text,integer,integer,jsonb,interval)', false),
  ('pgdurable.take_messages(uuid,bigint,text)', false),
  ('pgdurable.emit_event(uuid,bigint,text,integer,jsonb)', false),
  -- durable tasks and idempotency keys
  ('pgdurable.task_checkpoint_load(text)', false),
  ('pgdurable.task_checkpoint_save(text,jsonb)', false),
  ('pgdurable.idempotency_claim(text,text,interval)', false),
  ('pgdurable.idempotency_renew(text,text,interval)', false),
  ('pgdurable.idempotency_finish(text,text,jsonb,interval)', false),
  ('pgdurable.idempotency_fail(text,text,jsonb,interval)', false),
  ('pgdurable.idempotency_release(text,text)', false),
  -- flow control
  ('pgdurable.set_queue(text,integer,integer,numeric,numeric)', false),
  ('pgdurable.set_bucket(text,numeric,numeric)', false),
  ('pgdurable.acquire_tokens(text,numeric)', false),
  -- schedules
  ('pgdurable.upsert_schedule(text,text,interval,text,text,text,jsonb,text,integer,text,text,'
   'integer,timestamptz,text)', false),
  ('pgdurable.mark_undeclared(text,text[],text[])', false),
  ('pgdurable._schedule(text)', false),
  ('pgdurable.pause_schedule(text)', false),
  ('pgdurable.resume_schedule(text,timestamptz)', false),
  ('pgdurable.delete_schedule(text)', false),
  ('pgdurable.fire_schedule(text,timestamptz,timestamptz[],timestamptz)', false),
  ('pgdurable.trigger_schedule(text)', false),
  ('pgdurable.disable_schedule(text,timestamptz,text)', false),
  ('pgdurable.due_schedules(text[],integer)', false),
  ('pgdurable.schedule_wakeup(text[])', false),
  -- pubsub (clients/mastra)
  ('pgdurable.pubsub_publish(text,json[])', false),
  ('pgdurable.pubsub_read(text,bigint,integer)', false),
  ('pgdurable.pubsub_last_offset(text)', false),
  ('pgdurable.pubsub_claim(text,text,integer,boolean)', false),
  ('pgdurable.pubsub_clear(text)', false),
  -- LangGraph saver, OpenAI Agents session (contrib/)
  ('pgdurable.lg_put(text,text,text,text,text,bytea,jsonb,bytea,bytea,bigint)', false),
  ('pgdurable.lg_put_writes(text,text,text,text,text,integer[],text[],text[],bytea[],bytea,bytea,'
   'bigint)', false),
  ('pgdurable.lg_list(text,text,text,text,jsonb,integer)', false),
  ('pgdurable.lg_get(text,text,text)', false),
  ('pgdurable.lg_delete_threads(text[])', false),
  ('pgdurable.lg_delete_for_runs(text[])', false),
  ('pgdurable.lg_copy_thread(text,text)', false),
  ('pgdurable.lg_prune_keep_latest(text[])', false),
  ('pgdurable.lg_set_retention(integer,interval)', false),
  ('pgdurable.session_add_items(text,jsonb[],text)', false),
  ('pgdurable.session_get_items(text,integer)', false),
  ('pgdurable.session_pop_item(text)', false),
  ('pgdurable.session_clear(text)', false),
  -- retention and history partitions (`pgdurable prune`, `maintain`, the worker's services)
  ('pgdurable.prune_lock_key()', false),
  ('pgdurable.prune_runs(interval,integer,boolean)', false),
  ('pgdurable.prune_preview(interval)', false),
  ('pgdurable.prune_thread_messages(interval,integer)', false),
  ('pgdurable.prune_pubsub(interval,integer)', false),
  ('pgdurable.prune_graph_checkpoints(integer)', false),
  ('pgdurable.prune_graph_checkpoints_preview()', false),
  ('pgdurable.idempotency_prune(integer)', false),
  ('pgdurable.history_lock_key()', false),
  ('pgdurable.create_history_partitions(integer,integer)', false),
  ('pgdurable.drop_history_partitions(interval)', false),
  ('pgdurable.move_consumed_signals(interval,integer)', false);

DROP FUNCTION IF EXISTS pgdurable.security_readonly();
COMMENT ON TABLE pgdurable.security_roles IS
  'Roles set up by pgdurable.grant_roles: secure_schema grants the app roles EXECUTE on the '
  'allow-list (security_api) and SELECT, the read-only roles the readonly entries and the views, '
  'also after later migrations.';

------------------------------------------------------------------------------
-- tag_started_run labels only a run its own transaction inserted.
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN created_xact bigint;
-- a default set apart from ADD COLUMN: no rewrite, older rows stay NULL
ALTER TABLE pgdurable.runs
  ALTER COLUMN created_xact SET DEFAULT (pg_catalog.pg_current_xact_id())::text::bigint;
COMMENT ON COLUMN pgdurable.runs.created_xact IS
  'Id of the transaction that inserted the run (NULL before 0029): tag_started_run labels only '
  'a run of its own transaction.';

------------------------------------------------------------------------------
-- Signal ids are scoped by kind.
------------------------------------------------------------------------------
ALTER TABLE pgdurable.signals
  ADD CONSTRAINT signals_kind_signal_id_key UNIQUE (kind, signal_id),
  DROP CONSTRAINT signals_signal_id_key;
COMMENT ON COLUMN pgdurable.signals.signal_id IS
  'Deduplication id, unique per kind (with signal_history): a resend of (kind, signal_id) '
  'changes nothing; another kind''s equal id is another signal.';

-- signal_history_ids keyed by (kind, signal_id), rebuilt from signal_history.
-- The lock keeps move_consumed_signals and prune_runs (whose triggers write
-- the ids) out until this migration commits, so no id is left out.
LOCK TABLE pgdurable.signal_history IN SHARE ROW EXCLUSIVE MODE;
TRUNCATE pgdurable.signal_history_ids;
ALTER TABLE pgdurable.signal_history_ids
  ADD COLUMN kind text NOT NULL,
  DROP CONSTRAINT signal_history_ids_pkey,
  ADD PRIMARY KEY (kind, signal_id);
COMMENT ON COLUMN pgdurable.signal_history_ids.kind IS
  'Its row''s kind: a signal_id is unique per kind.';
COMMENT ON TABLE pgdurable.signal_history_ids IS
  'The (kind, signal_id) pairs of signal_history, unpartitioned: a new id is told in one probe '
  '(_signal_dup). Kept by triggers on signal_history and by drop_history_partitions.';
INSERT INTO pgdurable.signal_history_ids (kind, signal_id, consumed_at)
SELECT DISTINCT ON (h.kind, h.signal_id) h.kind, h.signal_id, h.consumed_at
  FROM pgdurable.signal_history h
 WHERE h.signal_id IS NOT NULL
 ORDER BY h.kind, h.signal_id, h.consumed_at DESC;

COMMENT ON TABLE pgdurable.signal_history IS
  'Consumed signals, moved from signals by move_consumed_signals. Partitioned by consumed_at (one '
  'partition per UTC day, plus signal_history_default); (kind, signal_id) is unique across signals '
  'and this table by its writers (_signal_dup, which finds a pair here through signal_history_ids).';
