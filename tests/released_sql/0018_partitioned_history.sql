-- 0018_partitioned_history: checkpoints and run_events, the append-mostly
-- history, become range-partitioned by created_at (native declarative
-- partitioning, one partition per UTC day, plus a DEFAULT partition that
-- catches anything outside the daily ones). Retention drops whole partitions
-- (drop_history_partitions) instead of deleting rows; partitions ahead of time
-- come from create_history_partitions (`pgdurable maintain`, or the workers'
-- leader-elected maintenance: pgdurable/partitions.py). docs/scaling.md.
--
-- KEYS. A partitioned table's primary key must include the partition key:
--   checkpoints  PRIMARY KEY (run_id, step)  ->  (run_id, step, created_at)
--   run_events   PRIMARY KEY (run_id, seq)   ->  (run_id, seq, created_at)
--   run_events_step_idx UNIQUE (run_id, step, idx) -> a plain index.
-- Uniqueness of (run_id, step) and (run_id, seq) still holds, by the writers:
-- every insert happens in a transaction that holds the run's row lock
-- (_fenced / FOR UPDATE) and computes the next step/seq under it; no SQL
-- function relies on ON CONFLICT against these keys, and no foreign key
-- points to these tables. checkpoints.run_id and run_events.run_id still
-- REFERENCE runs ON DELETE CASCADE (allowed from a partitioned table).
--
-- MOVE. Existing rows are copied into the partitioned tables and the names are
-- swapped in this one transaction (fine for small tables: it holds an ACCESS
-- EXCLUSIVE lock on both tables while it copies). Daily partitions are created
-- for up to 35 days of existing history and 3 days ahead; older rows land in
-- the DEFAULT partition and are pruned row by row by prune_runs as before.
-- Large installations: see docs/scaling.md ("Moving a large history").
-- Views that read these tables (thread_owners, workflow_steps, and any other)
-- are re-pointed to the new tables with their own definitions.
--
-- Signals stay unpartitioned: pending signals are not history, and the
-- deduplication of send_signal/signal_run (ON CONFLICT (signal_id)) needs a
-- table-wide unique signal_id, which a time-partitioned table cannot have.
-- Consumed signals are deleted with their runs by prune_runs.

-- The views that read the history tables, to re-point after the swap. Their
-- text is taken with only pg_catalog on the search path (a function's SET, so
-- the caller's search_path is untouched), so every name in it is
-- schema-qualified and resolves to the new tables.
CREATE FUNCTION pg_temp.pd_history_views() RETURNS TABLE (name text, def text)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
  SELECT DISTINCT v.oid::regclass::text, pg_get_viewdef(v.oid)
    FROM pg_depend d
    JOIN pg_rewrite w ON w.oid = d.objid
    JOIN pg_class v ON v.oid = w.ev_class
   WHERE d.classid = 'pg_rewrite'::regclass
     AND d.refclassid = 'pg_class'::regclass
     AND d.refobjid IN ('pgdurable.checkpoints'::regclass, 'pgdurable.run_events'::regclass)
     AND v.relkind = 'v'
$$;
CREATE TEMP TABLE pd_history_views ON COMMIT DROP AS SELECT * FROM pg_temp.pd_history_views();
DROP FUNCTION pg_temp.pd_history_views();

ALTER TABLE pgdurable.checkpoints RENAME TO checkpoints_unpartitioned;
ALTER INDEX pgdurable.checkpoints_pkey RENAME TO checkpoints_unpartitioned_pkey;
ALTER TABLE pgdurable.run_events RENAME TO run_events_unpartitioned;
ALTER INDEX pgdurable.run_events_pkey RENAME TO run_events_unpartitioned_pkey;
ALTER INDEX pgdurable.run_events_step_idx RENAME TO run_events_unpartitioned_step_idx;

------------------------------------------------------------------------------
-- checkpoints: the history of a run's steps, one row per checkpointed step.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.checkpoints (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  step       integer     NOT NULL CHECK (step >= 1),
  token      bigint      NOT NULL,
  state      jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  wake       jsonb,
  PRIMARY KEY (run_id, step, created_at)
) PARTITION BY RANGE (created_at);
COMMENT ON TABLE pgdurable.checkpoints IS
  'History of each run''s steps: one row per checkpointed step. Partitioned by created_at (one '
  'partition per UTC day, plus checkpoints_default); (run_id, step) is unique by its writers.';
COMMENT ON COLUMN pgdurable.checkpoints.run_id IS 'Run the checkpoint belongs to.';
COMMENT ON COLUMN pgdurable.checkpoints.step IS 'Step number this checkpoint completes (1-based).';
COMMENT ON COLUMN pgdurable.checkpoints.token IS 'Lease token under which the step was checkpointed.';
COMMENT ON COLUMN pgdurable.checkpoints.state IS 'State after the step.';
COMMENT ON COLUMN pgdurable.checkpoints.created_at IS
  'When the checkpoint was written (the partition key).';
COMMENT ON COLUMN pgdurable.checkpoints.wake IS
  'What woke the run before this step ran (signal payload, timer), or NULL.';

------------------------------------------------------------------------------
-- run_events: each run's output stream (ctx.emit).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.run_events (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  seq        bigint      NOT NULL CHECK (seq >= 1),
  event      jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  step       integer,
  idx        integer,
  token      bigint,
  final      boolean     NOT NULL DEFAULT false,
  PRIMARY KEY (run_id, seq, created_at)
) PARTITION BY RANGE (created_at);
-- emit_event's overwrite of a retried step's idx-th event (unique by its writer).
CREATE INDEX run_events_step_idx ON pgdurable.run_events (run_id, step, idx)
  WHERE step IS NOT NULL;
COMMENT ON TABLE pgdurable.run_events IS
  'Each run''s output stream (ctx.emit). Partitioned by created_at (one partition per UTC day, '
  'plus run_events_default); (run_id, seq) is unique by its writers.';
COMMENT ON COLUMN pgdurable.run_events.run_id IS 'Run that emitted the event.';
COMMENT ON COLUMN pgdurable.run_events.seq IS 'Sequence number within the run, from 1, gapless.';
COMMENT ON COLUMN pgdurable.run_events.event IS 'The event (JSON).';
COMMENT ON COLUMN pgdurable.run_events.created_at IS 'When it was emitted (the partition key).';
COMMENT ON COLUMN pgdurable.run_events.step IS
  'Step that emitted it (0-based runs.step at the time); NULL for the final event.';
COMMENT ON COLUMN pgdurable.run_events.idx IS
  'Position among the events of its step (a retried step overwrites its events by idx).';
COMMENT ON COLUMN pgdurable.run_events.token IS 'Lease token of the attempt that wrote the event.';
COMMENT ON COLUMN pgdurable.run_events.final IS
  'True for the run''s last event, written in the transaction that made the run terminal '
  '(cleared by retry_run, which revives the run).';

------------------------------------------------------------------------------
-- pgdurable._history_partition(table, name) -> void
-- Internal: create pgdurable.<name> as a stand-alone copy of the history table
-- <table> (columns, defaults, CHECKs, column comments), ready to be attached.
-- Only <table>_default and <table>_pYYYYMMDD names (it runs as the schema owner).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._history_partition(p_table text, p_name text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_table NOT IN ('checkpoints', 'run_events')
     OR NOT (p_name = p_table || '_default' OR p_name ~ ('^' || p_table || '_p[0-9]{8}$')) THEN
    RAISE EXCEPTION '_history_partition: % is not a partition name of a history table', p_name
      USING ERRCODE = 'PD000';
  END IF;
  EXECUTE format('CREATE TABLE pgdurable.%I (LIKE pgdurable.%I INCLUDING DEFAULTS '
                 'INCLUDING CONSTRAINTS INCLUDING COMMENTS)', p_name, p_table);
  -- as 0007 set for the unpartitioned tables (a partitioned parent has no storage)
  EXECUTE format('ALTER TABLE pgdurable.%I SET (autovacuum_vacuum_scale_factor = 0.05, '
                 'autovacuum_vacuum_cost_delay = 0)', p_name);
  EXECUTE format('COMMENT ON TABLE pgdurable.%I IS %L', p_name,
                 'Partition of pgdurable.' || p_table || ' (see pgdurable.history_partitions).');
END
$$;
COMMENT ON FUNCTION pgdurable._history_partition(text, text) IS
  'Internal: create a stand-alone table shaped like a history table, to attach as its partition.';

SELECT pgdurable._history_partition('checkpoints', 'checkpoints_default');
ALTER TABLE pgdurable.checkpoints ATTACH PARTITION pgdurable.checkpoints_default DEFAULT;
SELECT pgdurable._history_partition('run_events', 'run_events_default');
ALTER TABLE pgdurable.run_events ATTACH PARTITION pgdurable.run_events_default DEFAULT;

------------------------------------------------------------------------------
-- pgdurable.history_lock_key() -> bigint
-- The transaction-scoped advisory lock that serialises partition maintenance
-- (create_history_partitions, drop_history_partitions).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.history_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$ SELECT pg_catalog.hashtextextended('pgdurable.history_partitions', 0) $$;
COMMENT ON FUNCTION pgdurable.history_lock_key() IS
  'Advisory lock key serialising history partition maintenance.';

------------------------------------------------------------------------------
-- pgdurable.create_history_partitions(days_ahead, days_back) -> integer
-- Create the daily partitions of checkpoints and run_events for the UTC days
-- from today - days_back to today + days_ahead (by pgdurable.now()) that do not
-- exist yet; returns how many were created. Idempotent; serialised by
-- history_lock_key. Each new partition is built stand-alone, takes over the
-- rows of its day that had landed in the DEFAULT partition, and is attached
-- (ATTACH takes SHARE UPDATE EXCLUSIVE on the parent: writers keep writing).
-- lock_timeout 5 s: maintenance never queues behind a long transaction for
-- long (the caller retries at its next turn).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.create_history_partitions(p_days_ahead integer DEFAULT 3,
                                                    p_days_back integer DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
  v_today date := (pgdurable.now() AT TIME ZONE 'UTC')::date;
  v_day date;
  v_table text;
  v_name text;
  v_lo timestamptz;
  v_hi timestamptz;
  v_made integer := 0;
BEGIN
  IF p_days_ahead IS NULL OR p_days_ahead < 0 OR p_days_ahead > 366
     OR p_days_back IS NULL OR p_days_back < 0 OR p_days_back > 366 THEN
    RAISE EXCEPTION 'create_history_partitions: days_ahead and days_back must be between 0 and 366'
      USING ERRCODE = 'PD000';
  END IF;
  PERFORM pg_advisory_xact_lock(pgdurable.history_lock_key());
  FOR v_day IN SELECT d::date FROM generate_series(v_today - p_days_back, v_today + p_days_ahead,
                                                   interval '1 day') d LOOP
    v_lo := v_day::timestamp AT TIME ZONE 'UTC';
    v_hi := (v_day + 1)::timestamp AT TIME ZONE 'UTC';
    FOREACH v_table IN ARRAY ARRAY['checkpoints', 'run_events'] LOOP
      v_name := v_table || '_p' || to_char(v_day, 'YYYYMMDD');
      CONTINUE WHEN to_regclass('pgdurable.' || quote_ident(v_name)) IS NOT NULL;
      PERFORM pgdurable._history_partition(v_table, v_name);
      EXECUTE format('WITH moved AS (DELETE FROM pgdurable.%I WHERE created_at >= $1 '
                     'AND created_at < $2 RETURNING *) INSERT INTO pgdurable.%I SELECT * FROM moved',
                     v_table || '_default', v_name) USING v_lo, v_hi;
      EXECUTE format('ALTER TABLE pgdurable.%I ATTACH PARTITION pgdurable.%I FOR VALUES FROM (%L) TO (%L)',
                     v_table, v_name, v_lo, v_hi);
      v_made := v_made + 1;
    END LOOP;
  END LOOP;
  RETURN v_made;
END
$$;
COMMENT ON FUNCTION pgdurable.create_history_partitions(integer, integer) IS
  'Create the missing daily partitions of checkpoints and run_events around today (UTC); returns how many.';

------------------------------------------------------------------------------
-- pgdurable.drop_history_partitions(older_than)
--   -> TABLE(history_table, partition_name, rows_dropped, rows_kept bigint)
-- Retention by partition: every daily partition of checkpoints and run_events
-- whose range ends at or before now() - older_than is dropped whole. THE RULE:
-- a partition's rows are dropped only when prune_runs would delete their run
-- too (terminal status, finished_at <= the cut-off); rows of every other run
-- (still live, or finished within the window) are KEPT: they are moved to the
-- DEFAULT partition before the drop (and pruned row by row with their run
-- later). The rows to keep are counted in a scan without locks on the parent;
-- only then is the partition detached (ACCESS EXCLUSIVE on the parent, for a
-- catalog change when nothing is kept), lock_timeout 5 s. New history never
-- lands in an old partition (created_at is now()). A failed run retried by
-- retry_run after its history was dropped keeps its runs row and state but not
-- the dropped rows (prune_runs would have deleted the whole run).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.drop_history_partitions(p_older_than interval)
RETURNS TABLE (history_table text, partition_name text, rows_dropped bigint, rows_kept bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
  v_cutoff timestamptz;
  p record;
  v_total bigint;
  v_keep bigint;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'drop_history_partitions: older_than must be a non-negative interval'
      USING ERRCODE = 'PD000';
  END IF;
  v_cutoff := pgdurable.now() - p_older_than;
  PERFORM pg_advisory_xact_lock(pgdurable.history_lock_key());
  FOR p IN SELECT h.history_table AS tbl, h.partition_name AS part
             FROM pgdurable.history_partitions h
            WHERE NOT h.is_default AND h.range_to <= v_cutoff
            ORDER BY h.range_to, h.history_table LOOP
    EXECUTE format('SELECT count(*), count(*) FILTER (WHERE r.id IS NOT NULL AND NOT ('
                   'r.status IN (''completed'', ''failed'', ''cancelled'', ''incompatible'') '
                   'AND r.finished_at <= $1)) '
                   'FROM pgdurable.%I d LEFT JOIN pgdurable.runs r ON r.id = d.run_id',
                   p.part) INTO v_total, v_keep USING v_cutoff;
    EXECUTE format('ALTER TABLE pgdurable.%I DETACH PARTITION pgdurable.%I', p.tbl, p.part);
    IF v_keep > 0 THEN
      -- the range is no longer covered: these rows land in the DEFAULT partition
      EXECUTE format('INSERT INTO pgdurable.%I SELECT d.* FROM pgdurable.%I d '
                     'JOIN pgdurable.runs r ON r.id = d.run_id WHERE NOT ('
                     'r.status IN (''completed'', ''failed'', ''cancelled'', ''incompatible'') '
                     'AND r.finished_at <= $1)', p.tbl, p.part) USING v_cutoff;
      GET DIAGNOSTICS v_keep = ROW_COUNT;
    END IF;
    EXECUTE format('DROP TABLE pgdurable.%I', p.part);
    history_table := p.tbl;
    partition_name := p.part;
    rows_dropped := v_total - v_keep;
    rows_kept := v_keep;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.drop_history_partitions(interval) IS
  'Retention by partition: drop whole daily history partitions older than the cut-off, '
  'keeping (moving to the default partition) the rows of runs prune_runs would not delete.';

------------------------------------------------------------------------------
-- pgdurable.history_partitions: the partitions of checkpoints and run_events.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.history_partitions AS
  SELECT pc.relname::text                                          AS history_table,
         c.relname::text                                           AS partition_name,
         (pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')          AS is_default,
         (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                       'FROM \(''([^'']+)''\)'))[1]::timestamptz   AS range_from,
         (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                       'TO \(''([^'']+)''\)'))[1]::timestamptz     AS range_to,
         greatest(c.reltuples, 0)::bigint                          AS estimated_rows,
         pg_total_relation_size(c.oid)                             AS total_bytes
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    JOIN pg_class pc ON pc.oid = i.inhparent
   WHERE i.inhparent IN ('pgdurable.checkpoints'::regclass, 'pgdurable.run_events'::regclass);
COMMENT ON VIEW pgdurable.history_partitions IS
  'The partitions of checkpoints and run_events: range (UTC days), size, estimated rows.';
COMMENT ON COLUMN pgdurable.history_partitions.history_table IS 'checkpoints or run_events.';
COMMENT ON COLUMN pgdurable.history_partitions.partition_name IS 'The partition (a table in pgdurable).';
COMMENT ON COLUMN pgdurable.history_partitions.is_default IS
  'True for the DEFAULT partition (rows outside every daily range).';
COMMENT ON COLUMN pgdurable.history_partitions.range_from IS 'Start of its range (inclusive); NULL for the default.';
COMMENT ON COLUMN pgdurable.history_partitions.range_to IS 'End of its range (exclusive); NULL for the default.';
COMMENT ON COLUMN pgdurable.history_partitions.estimated_rows IS 'Rows, as estimated by the last ANALYZE.';
COMMENT ON COLUMN pgdurable.history_partitions.total_bytes IS 'Size on disk with indexes and TOAST.';

-- The partitions for existing history (up to 35 days back) and 3 days ahead,
-- then the rows, then the views, then the old tables go.
SELECT pgdurable.create_history_partitions(3, least(35, greatest(0,
  (pgdurable.now() AT TIME ZONE 'UTC')::date - (
    SELECT (min(m) AT TIME ZONE 'UTC')::date FROM (
      SELECT min(created_at) AS m FROM pgdurable.checkpoints_unpartitioned
      UNION ALL SELECT min(created_at) FROM pgdurable.run_events_unpartitioned) x))));
INSERT INTO pgdurable.checkpoints (run_id, step, token, state, created_at, wake)
  SELECT run_id, step, token, state, created_at, wake FROM pgdurable.checkpoints_unpartitioned;
INSERT INTO pgdurable.run_events (run_id, seq, event, created_at, step, idx, token, final)
  SELECT run_id, seq, event, created_at, step, idx, token, final
    FROM pgdurable.run_events_unpartitioned;

DO $$
DECLARE
  v record;
BEGIN
  FOR v IN SELECT h.name, h.def FROM pg_temp.pd_history_views h LOOP
    EXECUTE format('CREATE OR REPLACE VIEW %s AS %s', v.name, v.def);
  END LOOP;
END
$$;

DROP TABLE pgdurable.checkpoints_unpartitioned;
DROP TABLE pgdurable.run_events_unpartitioned;

------------------------------------------------------------------------------
-- HOT PATH. A statement that finds a run's rows by run_id alone visits every
-- partition (an index probe and a lock each). The run's events cannot be older
-- than the run, so emit_event and the stream-end trigger bound created_at from
-- below by the run's created_at (less a day of margin for clock steps): the
-- executor prunes every older partition.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable.emit_event(id, token, owner, idx, event) -> bigint (seq)
-- Fenced: append the idx-th event of the current step to the run's stream, or,
-- when a retried step emits again, overwrite the event it emitted at idx in a
-- previous attempt (same seq). NOTIFY pgdurable_events(run id).
-- (0006's definition; reads only partitions from the run's creation on.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.emit_event(p_id uuid, p_token bigint, p_owner text,
                                                p_idx integer, p_event jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_since timestamptz := r.created_at - interval '1 day';
  v_seq bigint;
BEGIN
  IF p_idx IS NULL OR p_idx < 0 OR p_event IS NULL THEN
    RAISE EXCEPTION 'emit_event: idx >= 0 and an event are required' USING ERRCODE = 'PD000';
  END IF;
  UPDATE pgdurable.run_events e SET event = p_event, token = p_token
   WHERE e.run_id = p_id AND e.step = r.step AND e.idx = p_idx AND e.created_at >= v_since
  RETURNING e.seq INTO v_seq;
  IF v_seq IS NULL THEN
    SELECT coalesce(max(e.seq), 0) + 1 INTO v_seq FROM pgdurable.run_events e
     WHERE e.run_id = p_id AND e.created_at >= v_since;
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
-- pgdurable._runs_stream_end(): trigger AFTER UPDATE OF status on
-- pgdurable.runs when a run becomes terminal: if the run has a thread or
-- emitted events, append its final event {type: 'end', status, result,
-- error} (final = true) and NOTIFY pgdurable_events(run id), in the same
-- transaction as the terminal transition (S16: completion after the last
-- event). Runs that never emitted and have no thread write nothing.
-- (0006's definition; reads only partitions from the run's creation on.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_stream_end() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_seq bigint;
BEGIN
  SELECT max(e.seq) INTO v_seq FROM pgdurable.run_events e
   WHERE e.run_id = NEW.id AND e.created_at >= NEW.created_at - interval '1 day';
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
