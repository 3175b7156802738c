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

DROP FUNCTION pgdurable.security_readonly();

------------------------------------------------------------------------------
-- pgdurable.secure_schema() -> integer
-- Re-apply the function rules to EVERY function in schema pgdurable (run by
-- this migration and by `pgdurable migrate` after each later migration):
--   * the allow-list first: a security_api row that names no function, or an
--     administrative one (security_invoker()), raises PD000 and changes nothing;
--   * when an owner role is recorded, the schema and every object in it are
--     handed to it (objects a superuser's later migrate created included);
--   * except the inlinable helpers (security_inlinable()): SET search_path =
--     pg_catalog, pgdurable, pg_temp; SECURITY DEFINER unless in
--     security_invoker();
--   * EXECUTE revoked from PUBLIC, except the inlinable helpers;
--   * the app roles of security_roles get EXECUTE on the routines of
--     security_api and nothing else, the read-only roles on those with
--     readonly and nothing else;
--   * the app roles USAGE on the schema and SELECT on every table and view;
--     the read-only roles USAGE, SELECT on the views and on schema_migrations.
-- Returns the number of functions it looked at. Run by the schema owner or a
-- superuser (it ALTERs functions). SECURITY INVOKER on purpose.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.secure_schema() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  f record;
  o record;
  n integer := 0;
  v_bad text;
  v_owner regrole := (SELECT s.role_oid::regrole FROM pgdurable.security_roles s
                        JOIN pg_roles g ON g.oid = s.role_oid
                       WHERE s.kind = 'owner' LIMIT 1);
BEGIN
  SELECT string_agg(a.routine, ', ' ORDER BY a.routine) INTO v_bad
    FROM pgdurable.security_api a
   WHERE to_regprocedure(a.routine) IS NULL
      OR to_regprocedure(a.routine) NOT IN (SELECT p.oid FROM pg_proc p
                                             WHERE p.pronamespace = 'pgdurable'::regnamespace)
      OR to_regprocedure(a.routine) IN (SELECT * FROM pgdurable.security_invoker());
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION 'secure_schema: security_api lists % (no such pgdurable function, or an '
      'administrative one): correct the list; nothing was changed', v_bad USING ERRCODE = 'PD000';
  END IF;
  IF v_owner IS NOT NULL THEN
    IF (SELECT nspowner FROM pg_namespace WHERE nspname = 'pgdurable') <> v_owner THEN
      EXECUTE format('ALTER SCHEMA pgdurable OWNER TO %s', v_owner);
    END IF;
    FOR o IN
      SELECT c.oid::regclass AS obj, c.relkind FROM pg_class c
       WHERE c.relnamespace = 'pgdurable'::regnamespace AND c.relowner <> v_owner
         AND (c.relkind IN ('r', 'p', 'v', 'm', 'f')
              OR (c.relkind = 'S' AND NOT EXISTS (
                    SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                       AND d.objid = c.oid AND d.deptype IN ('a', 'i'))))
    LOOP
      EXECUTE format('ALTER %s %s OWNER TO %s',
                     CASE o.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                    WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE'
                                    ELSE 'TABLE' END, o.obj, v_owner);
    END LOOP;
  END IF;
  FOR f IN
    SELECT p.oid::regprocedure AS sig, p.prosecdef, p.proconfig, p.proowner,
           p.oid IN (SELECT * FROM pgdurable.security_inlinable()) AS inlinable,
           p.oid IN (SELECT * FROM pgdurable.security_invoker()) AS invoker,
           a.oid IS NOT NULL AS app_ok, coalesce(a.readonly, false) AS readonly_ok
      FROM pg_proc p
      LEFT JOIN (SELECT to_regprocedure(x.routine)::oid AS oid, bool_or(x.readonly) AS readonly
                   FROM pgdurable.security_api x GROUP BY 1) a ON a.oid = p.oid
     WHERE p.pronamespace = 'pgdurable'::regnamespace AND p.prokind IN ('f', 'p')
  LOOP
    n := n + 1;
    IF v_owner IS NOT NULL AND f.proowner <> v_owner THEN
      EXECUTE format('ALTER ROUTINE %s OWNER TO %s', f.sig, v_owner);
    END IF;
    IF NOT f.inlinable THEN
      IF f.proconfig IS NULL
         OR NOT 'search_path=pg_catalog, pgdurable, pg_temp' = ANY (f.proconfig) THEN
        EXECUTE format('ALTER ROUTINE %s SET search_path = pg_catalog, pgdurable, pg_temp', f.sig);
      END IF;
      IF NOT f.invoker AND NOT f.prosecdef THEN
        EXECUTE format('ALTER ROUTINE %s SECURITY DEFINER', f.sig);
      END IF;
      EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f.sig);
    END IF;
    FOR o IN SELECT s.role_oid::regrole AS r, s.kind FROM pgdurable.security_roles s
               JOIN pg_roles g ON g.oid = s.role_oid WHERE s.kind IN ('app', 'readonly')
    LOOP
      IF (o.kind = 'app' AND f.app_ok) OR (o.kind = 'readonly' AND f.readonly_ok) THEN
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %s', f.sig, o.r);
      ELSE
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %s', f.sig, o.r);
      END IF;
    END LOOP;
  END LOOP;
  FOR o IN SELECT s.role_oid::regrole AS r, s.kind FROM pgdurable.security_roles s
             JOIN pg_roles g ON g.oid = s.role_oid WHERE s.kind IN ('app', 'readonly')
  LOOP
    EXECUTE format('GRANT USAGE ON SCHEMA pgdurable TO %s', o.r);
    IF o.kind = 'app' THEN
      EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA pgdurable TO %s', o.r);
    ELSE
      FOR f IN SELECT c.oid::regclass AS obj FROM pg_class c
                WHERE c.relnamespace = 'pgdurable'::regnamespace AND c.relkind IN ('v', 'm')
      LOOP
        EXECUTE format('GRANT SELECT ON %s TO %s', f.obj, o.r);
      END LOOP;
      -- the version check of every connection (the CLI's, the dashboard's)
      EXECUTE format('GRANT SELECT ON pgdurable.schema_migrations TO %s', o.r);
    END IF;
  END LOOP;
  RETURN n;
END
$$;
COMMENT ON FUNCTION pgdurable.secure_schema() IS
  'Pin search_path and SECURITY DEFINER on every pgdurable function, grant the app and read-only '
  'roles exactly the allow-list (security_api) (idempotent; owner or superuser).';
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
-- pgdurable.tag_started_run(id, created, metadata, trace_context) -> uuid
-- (0019's contract.) Set the metadata and trace context of a run THIS
-- transaction has just inserted (composed with start_run in one statement:
-- SELECT ... FROM start_run(...) s, LATERAL tag_started_run(s.run_id, s.created, ...)).
-- Only a row inserted by the current transaction (created_xact, created_at =
-- now()) whose metadata and trace context are still NULL is changed: a run
-- that this transaction merely updated (retry_run, cancel_run) is not. Its
-- xmin, the test until now, is the current transaction's after any update.
-- created = false (idempotent repeat) or both values NULL: nothing changes.
-- metadata must be a JSON object (else PD000). Returns p_id.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.tag_started_run(p_id uuid, p_created boolean,
                                                     p_metadata jsonb, p_trace_context jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_metadata IS NOT NULL AND jsonb_typeof(p_metadata) <> 'object' THEN
    RAISE EXCEPTION 'metadata must be a JSON object' USING ERRCODE = 'PD000';
  END IF;
  IF p_created AND (p_metadata IS NOT NULL OR p_trace_context IS NOT NULL) THEN
    UPDATE pgdurable.runs r SET metadata = p_metadata, trace_context = p_trace_context
     WHERE r.id = p_id AND r.metadata IS NULL AND r.trace_context IS NULL
       AND r.created_xact = (pg_catalog.pg_current_xact_id())::text::bigint
       AND r.created_at = pgdurable.now();
  END IF;
  RETURN p_id;
END
$$;

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

CREATE OR REPLACE FUNCTION pgdurable._signal_history_ids_add() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
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

CREATE OR REPLACE FUNCTION pgdurable._signal_history_ids_remove() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  DELETE FROM pgdurable.signal_history_ids i
   USING old_rows o
   WHERE i.kind = o.kind AND i.signal_id = o.signal_id AND i.consumed_at = o.consumed_at;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_history_ids_remove() IS
  'Internal: remove the (kind, signal_id) pairs a statement deleted from signal_history from '
  'signal_history_ids.';

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
  'Send a signal: wake runs waiting on (kind, ref) or keep it pending; dedup by (kind, signal_id) '
  '(PD008 on conflict).';

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
-- Bounded sizes: PD013 (pgdurable.ValueTooLarge), nothing changes.
------------------------------------------------------------------------------

-- pgdurable.lease_check(key, owner, ttl_ms, check_owner, check_ttl) -> interval
-- (0002's contract.) PD000 for an empty or NULL key or owner, or a TTL outside
-- 1 .. 86 400 000 ms; PD013 for an owner over 64 KiB (65 536 bytes: any
-- string, as the LeaseProvider contract says, but not a megabyte per lease row;
-- every acquire, renew and transfer checks its owners here, so none is ever
-- stored); returns the TTL as an interval.
CREATE OR REPLACE FUNCTION pgdurable.lease_check(p_key bytea, p_owner bytea, p_ttl_ms bigint,
                                                 p_check_owner boolean, p_check_ttl boolean)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_key IS NULL OR length(p_key) = 0 THEN
    RAISE EXCEPTION 'lease key must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_check_owner AND (p_owner IS NULL OR length(p_owner) = 0) THEN
    RAISE EXCEPTION 'lease owner must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_check_owner AND length(p_owner) > 65536 THEN
    RAISE EXCEPTION 'lease owner is % bytes long; at most 65536 (64 KiB of UTF-8)',
      length(p_owner) USING ERRCODE = 'PD013';
  END IF;
  IF p_check_ttl THEN
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 86400000 THEN
      RAISE EXCEPTION 'ttl_ms must be between 1 and 86400000 (24 h), got %', p_ttl_ms
        USING ERRCODE = 'PD000';
    END IF;
    RETURN make_interval(secs => p_ttl_ms / 1000.0);
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable.lease_check(bytea, bytea, bigint, boolean, boolean) IS
  'Internal: validate a lease key/owner/TTL (PD000 bad input, PD013 owner over 64 KiB) and '
  'return the TTL as an interval.';

-- pgdurable.pubsub_publish(topic, events json[]) -> bigint
-- (0011's contract.) Append events to a topic's log: offsets last+1 .. last+n
-- (the first is returned; NULL for no events), one NOTIFY pgdurable_pubsub.
-- Each event must be a JSON object (PD000) of at most 1 MiB (1 048 576 bytes
-- of JSON text; PD013): one publish of a huge event would otherwise be read
-- whole by every subscriber's batch.
CREATE OR REPLACE FUNCTION pgdurable.pubsub_publish(p_topic text, p_events json[])
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n bigint := coalesce(cardinality(p_events), 0);
  v_last bigint;
  v_now timestamptz := pgdurable.now();
  v_big integer;
BEGIN
  PERFORM pgdurable.pubsub_check_topic(p_topic);
  IF v_n = 0 THEN
    RETURN NULL;
  END IF;
  IF EXISTS (SELECT FROM unnest(p_events) e WHERE e IS NULL OR json_typeof(e) <> 'object') THEN
    RAISE EXCEPTION 'pubsub events must be JSON objects' USING ERRCODE = 'PD000';
  END IF;
  SELECT max(octet_length(e::text)) INTO v_big FROM unnest(p_events) e;
  IF v_big > 1048576 THEN
    RAISE EXCEPTION 'pubsub event is % bytes of JSON; at most 1048576 (1 MiB)', v_big
      USING ERRCODE = 'PD013';
  END IF;
  INSERT INTO pgdurable.pubsub_topics AS t (topic, last_offset, created_at, updated_at)
  VALUES (p_topic, v_n - 1, v_now, v_now)
  ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + v_n, updated_at = v_now
  RETURNING t.last_offset INTO v_last;
  INSERT INTO pgdurable.pubsub_events (topic, "offset", event, created_at)
  SELECT p_topic, v_last - v_n + u.ord, u.e, v_now
    FROM unnest(p_events) WITH ORDINALITY AS u(e, ord);
  PERFORM pg_notify('pgdurable_pubsub', pgdurable.pubsub_notify_payload(p_topic, v_last));
  RETURN v_last - v_n + 1;
END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_publish(text, json[]) IS
  'Append events (JSON objects of at most 1 MiB) to a topic; returns the first offset; one NOTIFY.';

SELECT pgdurable.secure_schema();
