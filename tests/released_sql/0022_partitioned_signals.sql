-- 0022_partitioned_signals: finished signals become partitioned history, the
-- history tables lose their foreign keys to runs, and the schema takes the
-- Citus-readiness fixes that need no behaviour change (docs/scaling.md).
--
-- SIGNALS. pgdurable.signals keeps what is live: pending signals and those
-- consumed within the last hour or so. move_consumed_signals() (the workers'
-- maintenance, `pgdurable maintain`) moves consumed signals older than
-- p_min_age (default 1 hour) into pgdurable.signal_history, range-partitioned
-- by consumed_at into the same daily partitions as checkpoints and run_events
-- (created by create_history_partitions, dropped whole by
-- drop_history_partitions under the same rule: rows go only when retention
-- would delete the run that consumed them).
--
-- DEDUP IS UNCHANGED. A signal_id deduplicates for as long as its row exists,
-- as before: in signals or in signal_history, until retention deletes it with
-- the run that consumed it. _signal_dup looks in signals first, then in
-- signal_history (two statements in READ COMMITTED: a row moves only from
-- signals to history, so if the first statement misses it, it was already in
-- history, or did not exist). A concurrent first send of the same signal_id is
-- still refused by signals' UNIQUE (signal_id) (ON CONFLICT): a signal is never
-- moved in the transaction that stores it, only p_min_age later, so a sender
-- whose snapshot predates a row's commit still meets it in signals -- unless
-- the sender's REPEATABLE READ transaction has been open for longer than
-- p_min_age (documented).
--
-- FOREIGN KEYS. checkpoints.run_id and run_events.run_id no longer reference
-- runs. With the keys, every deleted run fired a cascade that probed every
-- partition (pruning slowed down with each partition), every inserted history
-- row ran a check query on runs, and dropping a detached partition dropped its
-- foreign key's triggers on runs: an ACCESS EXCLUSIVE lock on runs that stalled
-- every claim and deadlocked with a worker's complete_run (which holds a runs
-- row and inserts into checkpoints while the drop held checkpoints and waited
-- for runs). Every writer of history inserts under the run's row lock, and
-- prune_runs deletes a run's history explicitly; a run deleted by hand leaves
-- rows that the next drop_history_partitions drops with their partition (its
-- rule keeps only rows whose run still exists and is kept).
--
-- CITUS (no cross-shard foreign keys; keys contain the distribution column):
--   signals.run_id -> runs      dropped (prune_runs deletes by run_id)
--   runs.forked_from -> runs    dropped (prune_runs clears forked_from of the
--                               forks of a pruned run, as ON DELETE SET NULL did)
--   run_rewinds PRIMARY KEY (id) -> (run_id, id)

------------------------------------------------------------------------------
-- Foreign keys that go (found by catalog: their names differ by history).
------------------------------------------------------------------------------
DO $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT x.conrelid::regclass AS tbl, x.conname
             FROM pg_catalog.pg_constraint x
            WHERE x.contype = 'f' AND x.conparentid = 0
              AND x.confrelid = 'pgdurable.runs'::regclass
              AND ((x.conrelid IN ('pgdurable.checkpoints'::regclass, 'pgdurable.run_events'::regclass,
                                   'pgdurable.signals'::regclass)
                    AND x.conkey = ARRAY[(SELECT a.attnum FROM pg_catalog.pg_attribute a
                                           WHERE a.attrelid = x.conrelid AND a.attname = 'run_id')])
                   OR (x.conrelid = 'pgdurable.runs'::regclass
                       AND x.conkey = ARRAY[(SELECT a.attnum FROM pg_catalog.pg_attribute a
                                              WHERE a.attrelid = x.conrelid
                                                AND a.attname = 'forked_from')])) LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tbl, c.conname);
  END LOOP;
END
$$;
COMMENT ON COLUMN pgdurable.checkpoints.run_id IS
  'Run the checkpoint belongs to (no foreign key: written under the run''s lock, deleted by prune_runs).';
COMMENT ON COLUMN pgdurable.run_events.run_id IS
  'Run that emitted the event (no foreign key: written under the run''s lock, deleted by prune_runs).';
COMMENT ON COLUMN pgdurable.signals.run_id IS
  'Set when the signal addresses one run (signal_run); no foreign key (prune_runs deletes them).';
COMMENT ON COLUMN pgdurable.runs.forked_from IS
  'The run this one was forked from (fork_run); set to NULL when that run is pruned.';

ALTER TABLE pgdurable.run_rewinds DROP CONSTRAINT run_rewinds_pkey;
ALTER TABLE pgdurable.run_rewinds ADD PRIMARY KEY (run_id, id);
DROP INDEX pgdurable.run_rewinds_run_idx;   -- the primary key serves it now

------------------------------------------------------------------------------
-- signal_history: consumed signals, moved out of signals by
-- move_consumed_signals. Same columns, same order (a signals row fits).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.signal_history (
  id          bigint      NOT NULL,
  kind        text        NOT NULL,
  ref         text        NOT NULL,
  payload     jsonb,
  signal_id   text,
  run_id      uuid,
  created_at  timestamptz NOT NULL,
  expires_at  timestamptz,
  consumed_by uuid,
  consumed_at timestamptz NOT NULL,
  woke        uuid[]      NOT NULL DEFAULT '{}',
  PRIMARY KEY (id, consumed_at)
) PARTITION BY RANGE (consumed_at);
-- _signal_dup: a signal_id is looked up here when signals does not have it
CREATE INDEX signal_history_signal_id_idx ON pgdurable.signal_history (signal_id)
  WHERE signal_id IS NOT NULL;
-- prune_runs: the signals a pruned run consumed (a run-addressed signal is
-- consumed by the run it addresses, so run_id = consumed_by when set)
CREATE INDEX signal_history_consumed_by_idx ON pgdurable.signal_history (consumed_by);
COMMENT ON TABLE pgdurable.signal_history IS
  'Consumed signals, moved from signals by move_consumed_signals. Partitioned by consumed_at (one '
  'partition per UTC day, plus signal_history_default); signal_id is unique across signals and this '
  'table by its writers (_signal_dup).';
COMMENT ON COLUMN pgdurable.signal_history.id IS 'Signal sequence number (signals.id).';
COMMENT ON COLUMN pgdurable.signal_history.kind IS 'Signal kind.';
COMMENT ON COLUMN pgdurable.signal_history.ref IS 'Reference within the kind.';
COMMENT ON COLUMN pgdurable.signal_history.payload IS 'JSON payload delivered to the run.';
COMMENT ON COLUMN pgdurable.signal_history.signal_id IS
  'Caller-chosen id: still deduplicates a resend while the row exists.';
COMMENT ON COLUMN pgdurable.signal_history.run_id IS 'Set when the signal addressed one run (signal_run).';
COMMENT ON COLUMN pgdurable.signal_history.created_at IS 'When the signal was sent.';
COMMENT ON COLUMN pgdurable.signal_history.expires_at IS 'Its TTL while it was pending.';
COMMENT ON COLUMN pgdurable.signal_history.consumed_by IS 'Run that consumed the signal.';
COMMENT ON COLUMN pgdurable.signal_history.consumed_at IS 'When it was consumed (the partition key).';
COMMENT ON COLUMN pgdurable.signal_history.woke IS
  'Runs this signal woke when it was sent (what a duplicate send returns).';

-- move_consumed_signals: consumed signals, oldest first
CREATE INDEX signals_consumed_at_idx ON pgdurable.signals (consumed_at)
  WHERE consumed_at IS NOT NULL;

------------------------------------------------------------------------------
-- pgdurable._history_partition(table, name) -> void
-- Internal: create pgdurable.<name> as a stand-alone copy of the history table
-- <table> (columns, defaults, CHECKs, column comments), ready to be attached.
-- Only <table>_default and <table>_pYYYYMMDD names (it runs as the schema owner).
-- (0018's definition, with signal_history.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._history_partition(p_table text, p_name text) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_table NOT IN ('checkpoints', 'run_events', 'signal_history')
     OR NOT (p_name = p_table || '_default' OR p_name ~ ('^' || p_table || '_p[0-9]{8}$')) THEN
    RAISE EXCEPTION '_history_partition: % is not a partition name of a history table', p_name
      USING ERRCODE = 'PD000';
  END IF;
  EXECUTE format('CREATE TABLE pgdurable.%I (LIKE pgdurable.%I INCLUDING DEFAULTS '
                 'INCLUDING CONSTRAINTS INCLUDING COMMENTS)', p_name, p_table);
  EXECUTE format('ALTER TABLE pgdurable.%I SET (autovacuum_vacuum_scale_factor = 0.05, '
                 'autovacuum_vacuum_cost_delay = 0)', p_name);
  EXECUTE format('COMMENT ON TABLE pgdurable.%I IS %L', p_name,
                 'Partition of pgdurable.' || p_table || ' (see pgdurable.history_partitions).');
END
$$;

SELECT pgdurable._history_partition('signal_history', 'signal_history_default');
ALTER TABLE pgdurable.signal_history ATTACH PARTITION pgdurable.signal_history_default DEFAULT;

------------------------------------------------------------------------------
-- pgdurable._history_key(table) -> text
-- Internal: the partition key column of a history table.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._history_key(p_table text) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$ SELECT CASE p_table WHEN 'signal_history' THEN 'consumed_at' ELSE 'created_at' END $$;
COMMENT ON FUNCTION pgdurable._history_key(text) IS
  'Internal: the partition key column of a history table (created_at; consumed_at for signal_history).';

------------------------------------------------------------------------------
-- pgdurable._create_history_partitions(tables, from, to) -> integer
-- Internal: create the missing daily partitions of the given history tables
-- for the UTC days from..to; each is built stand-alone, takes over the rows of
-- its day that had landed in the DEFAULT partition, and is attached. The
-- caller holds history_lock_key().
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._create_history_partitions(p_tables text[], p_from date, p_to date)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_day date;
  v_table text;
  v_name text;
  v_lo timestamptz;
  v_hi timestamptz;
  v_made integer := 0;
BEGIN
  FOR v_day IN SELECT d::date FROM generate_series(p_from, p_to, interval '1 day') d LOOP
    v_lo := v_day::timestamp AT TIME ZONE 'UTC';
    v_hi := (v_day + 1)::timestamp AT TIME ZONE 'UTC';
    FOREACH v_table IN ARRAY p_tables LOOP
      v_name := v_table || '_p' || to_char(v_day, 'YYYYMMDD');
      CONTINUE WHEN to_regclass('pgdurable.' || quote_ident(v_name)) IS NOT NULL;
      PERFORM pgdurable._history_partition(v_table, v_name);
      EXECUTE format('WITH moved AS (DELETE FROM pgdurable.%I WHERE %I >= $1 '
                     'AND %I < $2 RETURNING *) INSERT INTO pgdurable.%I SELECT * FROM moved',
                     v_table || '_default', pgdurable._history_key(v_table),
                     pgdurable._history_key(v_table), v_name) USING v_lo, v_hi;
      EXECUTE format('ALTER TABLE pgdurable.%I ATTACH PARTITION pgdurable.%I FOR VALUES FROM (%L) TO (%L)',
                     v_table, v_name, v_lo, v_hi);
      v_made := v_made + 1;
    END LOOP;
  END LOOP;
  RETURN v_made;
END
$$;
COMMENT ON FUNCTION pgdurable._create_history_partitions(text[], date, date) IS
  'Internal: create the missing daily partitions of some history tables for a range of UTC days.';

------------------------------------------------------------------------------
-- pgdurable.create_history_partitions(days_ahead, days_back) -> integer
-- Create the daily partitions of checkpoints, run_events and signal_history
-- for the UTC days from today - days_back to today + days_ahead (by
-- pgdurable.now()) that do not exist yet; returns how many were created.
-- Idempotent; serialised by history_lock_key; lock_timeout 5 s.
-- (0018's contract, with signal_history.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.create_history_partitions(p_days_ahead integer DEFAULT 3,
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
    RAISE EXCEPTION 'create_history_partitions: days_ahead and days_back must be between 0 and 366'
      USING ERRCODE = 'PD000';
  END IF;
  PERFORM pg_advisory_xact_lock(pgdurable.history_lock_key());
  RETURN pgdurable._create_history_partitions(ARRAY['checkpoints', 'run_events', 'signal_history'],
                                              v_today - p_days_back, v_today + p_days_ahead);
END
$$;

------------------------------------------------------------------------------
-- pgdurable.drop_history_partitions(older_than)
--   -> TABLE(history_table, partition_name, rows_dropped, rows_kept bigint)
-- Retention by partition (0018's contract, with signal_history): every daily
-- partition of checkpoints, run_events and signal_history whose range ends at
-- or before now() - older_than is dropped whole. THE RULE: a row is dropped
-- only when prune_runs would delete its run too (terminal, finished_at <= the
-- cut-off) or its run no longer exists; the run of a checkpoint or event is
-- run_id, of a signal the run that consumed it. Rows of every other run are
-- moved to the DEFAULT partition before the drop. No foreign key points from
-- these tables to runs (0022), so neither the detach nor the drop locks runs.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.drop_history_partitions(p_older_than interval)
RETURNS TABLE (history_table text, partition_name text, rows_dropped bigint, rows_kept bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
  v_cutoff timestamptz;
  p record;
  v_col text;
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
    v_col := CASE p.tbl WHEN 'signal_history' THEN 'consumed_by' ELSE 'run_id' END;
    EXECUTE format('SELECT count(*), count(*) FILTER (WHERE r.id IS NOT NULL AND NOT ('
                   'r.status IN (''completed'', ''failed'', ''cancelled'', ''incompatible'') '
                   'AND r.finished_at <= $1)) '
                   'FROM pgdurable.%I d LEFT JOIN pgdurable.runs r ON r.id = d.%I',
                   p.part, v_col) INTO v_total, v_keep USING v_cutoff;
    EXECUTE format('ALTER TABLE pgdurable.%I DETACH PARTITION pgdurable.%I', p.tbl, p.part);
    IF v_keep > 0 THEN
      -- the range is no longer covered: these rows land in the DEFAULT partition
      EXECUTE format('INSERT INTO pgdurable.%I SELECT d.* FROM pgdurable.%I d '
                     'JOIN pgdurable.runs r ON r.id = d.%I WHERE NOT ('
                     'r.status IN (''completed'', ''failed'', ''cancelled'', ''incompatible'') '
                     'AND r.finished_at <= $1)', p.tbl, p.part, v_col) USING v_cutoff;
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

------------------------------------------------------------------------------
-- pgdurable.history_partitions: the partitions of checkpoints, run_events and
-- signal_history (0018's view, with signal_history).
------------------------------------------------------------------------------
CREATE OR REPLACE VIEW pgdurable.history_partitions AS
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
   WHERE i.inhparent IN ('pgdurable.checkpoints'::regclass, 'pgdurable.run_events'::regclass,
                         'pgdurable.signal_history'::regclass);
COMMENT ON VIEW pgdurable.history_partitions IS
  'The partitions of checkpoints, run_events and signal_history: range (UTC days), size, estimated rows.';
COMMENT ON COLUMN pgdurable.history_partitions.history_table IS
  'checkpoints, run_events or signal_history.';

------------------------------------------------------------------------------
-- pgdurable.move_consumed_signals(min_age, batch) -> bigint
-- ONE short transaction: move up to p_batch signals consumed at least p_min_age
-- ago (oldest first) from signals to signal_history; returns how many. Rows
-- locked by someone else are skipped. p_min_age (default 1 hour) bounds the
-- dedup race with a REPEATABLE READ sender (see the top of 0022); 0 is allowed
-- (tests, or installations that send signals only in READ COMMITTED).
-- p_min_age < 0 or p_batch outside 1..100000: PD000.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.move_consumed_signals(p_min_age interval DEFAULT interval '1 hour',
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

------------------------------------------------------------------------------
-- pgdurable._signal_dup(signal_id, kind, ref, payload, run_id) -> uuid[]
-- Internal (0005's contract): NULL when no signal with this signal_id exists,
-- in signals or in signal_history. Otherwise the existing signal must carry
-- the same kind, ref (ignored when p_ref is NULL), payload and run_id, and its
-- `woke` ids are returned; any difference raises PD008 and nothing changes.
-- signals first, then signal_history: a row only ever moves from the first to
-- the second, so a miss in signals followed by a miss in history means it
-- does not exist.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._signal_dup(p_signal_id text, p_kind text, p_ref text,
                                                 p_payload jsonb, p_run_id uuid)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s record;
BEGIN
  IF p_signal_id IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT x.kind, x.ref, x.payload, x.run_id, x.woke INTO s
    FROM pgdurable.signals x WHERE x.signal_id = p_signal_id;
  IF NOT FOUND THEN
    SELECT h.kind, h.ref, h.payload, h.run_id, h.woke INTO s
      FROM pgdurable.signal_history h WHERE h.signal_id = p_signal_id LIMIT 1;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
  END IF;
  IF s.kind IS DISTINCT FROM p_kind OR (p_ref IS NOT NULL AND s.ref IS DISTINCT FROM p_ref)
     OR s.payload IS DISTINCT FROM p_payload OR s.run_id IS DISTINCT FROM p_run_id THEN
    RAISE EXCEPTION 'signal_id % was already sent with another kind, ref, payload or run',
      p_signal_id USING ERRCODE = 'PD008';
  END IF;
  RETURN s.woke;
END
$$;

------------------------------------------------------------------------------
-- pgdurable.prune_runs(older_than, batch, exclusive)
--   -> TABLE(runs, checkpoints, effects, events, signals bigint, locked boolean)
-- (0007's contract.) Also deletes the pruned runs' consumed signals from
-- signal_history, and clears forked_from of their forks (the foreign key's
-- ON DELETE SET NULL, gone in 0022). History rows have no foreign key to runs
-- any more, so deleting a run fires no cascade over every partition.
-- BOUND: a run's history is written while the run lives, in transactions that
-- (then or later) update its row, so none of it is newer than the run's last
-- update (greatest(finished_at, updated_at)). The deletes are bounded by the
-- batch's latest such time plus a day (clock steps): the planner skips every
-- newer partition (with 30 days kept, about 30 of them). A row newer than the
-- bound (a run edited by hand) is left behind, and dropped with its partition
-- by drop_history_partitions (its run is gone).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_runs(p_older_than interval, p_batch integer DEFAULT 1000,
                                                p_exclusive boolean DEFAULT false)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint,
               signals bigint, locked boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ids uuid[];
  v_until timestamptz;
  v_runs bigint := 0;
  v_cp bigint := 0;
  v_eff bigint := 0;
  v_ev bigint := 0;
  v_sig bigint := 0;
  v_sig1 bigint := 0;
  v_sig2 bigint := 0;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'prune_runs: older_than must be a non-negative interval' USING ERRCODE = 'PD000';
  END IF;
  IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_runs: batch must be between 1 and 100000' USING ERRCODE = 'PD000';
  END IF;
  IF p_exclusive AND NOT pg_try_advisory_xact_lock(pgdurable.prune_lock_key()) THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, false;
    RETURN;
  END IF;
  SELECT array_agg(d.id), max(d.last) + interval '1 day' INTO v_ids, v_until FROM (
    SELECT r.id, greatest(r.finished_at, r.updated_at) AS last FROM pgdurable.runs r
     WHERE r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       AND r.finished_at <= pgdurable.now() - p_older_than
     ORDER BY r.finished_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED) d;
  IF v_ids IS NOT NULL THEN
    DELETE FROM pgdurable.checkpoints c WHERE c.run_id = ANY (v_ids) AND c.created_at <= v_until;
    GET DIAGNOSTICS v_cp = ROW_COUNT;
    DELETE FROM pgdurable.effects e WHERE e.run_id = ANY (v_ids);
    GET DIAGNOSTICS v_eff = ROW_COUNT;
    DELETE FROM pgdurable.run_events e WHERE e.run_id = ANY (v_ids) AND e.created_at <= v_until;
    GET DIAGNOSTICS v_ev = ROW_COUNT;
    DELETE FROM pgdurable.signals s WHERE s.run_id = ANY (v_ids) OR s.consumed_by = ANY (v_ids);
    GET DIAGNOSTICS v_sig = ROW_COUNT;
    DELETE FROM pgdurable.signal_history h
     WHERE h.consumed_by = ANY (v_ids) AND h.consumed_at <= v_until;
    GET DIAGNOSTICS v_sig1 = ROW_COUNT;
    UPDATE pgdurable.runs f SET forked_from = NULL
     WHERE f.forked_from = ANY (v_ids) AND NOT f.id = ANY (v_ids);
    DELETE FROM pgdurable.runs r WHERE r.id = ANY (v_ids);
    GET DIAGNOSTICS v_runs = ROW_COUNT;
  END IF;
  -- pending signals that nobody consumed before their TTL
  WITH doomed AS MATERIALIZED (
    SELECT s.id FROM pgdurable.signals s
     WHERE s.consumed_at IS NULL AND s.expires_at <= pgdurable.now() - p_older_than
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED)
  DELETE FROM pgdurable.signals s USING doomed WHERE s.id = doomed.id;
  GET DIAGNOSTICS v_sig2 = ROW_COUNT;
  RETURN QUERY SELECT v_runs, v_cp, v_eff, v_ev, v_sig + v_sig1 + v_sig2, true;
END
$$;

------------------------------------------------------------------------------
-- pgdurable.prune_preview(older_than) (0007's contract, with signal_history).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_preview(p_older_than interval)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint, signals bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'prune_preview: older_than must be a non-negative interval' USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  WITH d AS MATERIALIZED (
    SELECT r.id FROM pgdurable.runs r
     WHERE r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       AND r.finished_at <= pgdurable.now() - p_older_than)
  SELECT (SELECT count(*) FROM d),
         (SELECT count(*) FROM pgdurable.checkpoints c WHERE c.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.effects e WHERE e.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.run_events e WHERE e.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.signals s
           WHERE s.run_id IN (SELECT id FROM d) OR s.consumed_by IN (SELECT id FROM d)
              OR (s.consumed_at IS NULL AND s.expires_at <= pgdurable.now() - p_older_than))
         + (SELECT count(*) FROM pgdurable.signal_history h WHERE h.consumed_by IN (SELECT id FROM d));
END
$$;

------------------------------------------------------------------------------
-- HOT PATH. emit_event and the stream-end trigger read the run's events by
-- run_id. 0018 bounded created_at from below by the run's creation (less a
-- day); the bounds are now both sides and plain values (computed before the
-- statement, so the planner prunes partitions at plan time instead of locking
-- every partition and pruning at run time): from the run's creation less an
-- hour (clock steps) to now plus an hour. A run created today reads one
-- partition (two near midnight) instead of every partition from yesterday to
-- the last one made ahead, plus the default.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable.emit_event(id, token, owner, idx, event) -> bigint (seq)
-- Fenced: append the idx-th event of the current step to the run's stream, or,
-- when a retried step emits again, overwrite the event it emitted at idx in a
-- previous attempt (same seq). NOTIFY pgdurable_events(run id).
-- (0006's definition; reads only the partitions of the run's lifetime.)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.emit_event(p_id uuid, p_token bigint, p_owner text,
                                                p_idx integer, p_event jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_since timestamptz := r.created_at - interval '1 hour';
  v_until timestamptz := pgdurable.now() + interval '1 hour';
  v_old bigint;
  v_seq bigint;
BEGIN
  IF p_idx IS NULL OR p_idx < 0 OR p_event IS NULL THEN
    RAISE EXCEPTION 'emit_event: idx >= 0 and an event are required' USING ERRCODE = 'PD000';
  END IF;
  -- one read for both questions (an UPDATE of a partitioned table costs ten
  -- times a read even when it matches nothing): was this idx already emitted
  -- by an earlier attempt of the step (then overwrite it), else the next seq
  SELECT (SELECT e.seq FROM pgdurable.run_events e
           WHERE e.run_id = p_id AND e.step = r.step AND e.idx = p_idx
             AND e.created_at >= v_since AND e.created_at <= v_until LIMIT 1),
         (SELECT coalesce(max(e.seq), 0) + 1 FROM pgdurable.run_events e
           WHERE e.run_id = p_id AND e.created_at >= v_since AND e.created_at <= v_until)
    INTO v_old, v_seq;
  IF v_old IS NOT NULL THEN
    UPDATE pgdurable.run_events e SET event = p_event, token = p_token
     WHERE e.run_id = p_id AND e.seq = v_old
       AND e.created_at >= v_since AND e.created_at <= v_until;
    v_seq := v_old;
  ELSE
    INSERT INTO pgdurable.run_events (run_id, seq, event, step, idx, token)
    VALUES (p_id, v_seq, p_event, r.step, p_idx, p_token);
  END IF;
  PERFORM pg_notify('pgdurable_events', p_id::text);
  RETURN v_seq;
END
$$;

------------------------------------------------------------------------------
-- pgdurable._runs_stream_end(): trigger when a run becomes terminal (0006's
-- definition; reads only the partitions of the run's lifetime).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_stream_end() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_since timestamptz := NEW.created_at - interval '1 hour';
  v_until timestamptz := pgdurable.now() + interval '1 hour';
  v_seq bigint;
BEGIN
  SELECT max(e.seq) INTO v_seq FROM pgdurable.run_events e
   WHERE e.run_id = NEW.id AND e.created_at >= v_since AND e.created_at <= v_until;
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

------------------------------------------------------------------------------
-- MOVE. Daily signal_history partitions for the days of existing consumed
-- signals (up to 35 days back, as 0018) and 3 days ahead, aligned with the
-- other history tables; then the consumed signals older than an hour move.
-- One statement over the consumed rows (fine for small tables; large ones:
-- docs/scaling.md, "Moving a large history").
------------------------------------------------------------------------------
SELECT pg_advisory_xact_lock(pgdurable.history_lock_key());
SELECT pgdurable._create_history_partitions(ARRAY['signal_history'],
  greatest(coalesce((SELECT (min(s.consumed_at) AT TIME ZONE 'UTC')::date FROM pgdurable.signals s
                      WHERE s.consumed_at IS NOT NULL),
                    (pgdurable.now() AT TIME ZONE 'UTC')::date),
           (pgdurable.now() AT TIME ZONE 'UTC')::date - 35),
  (pgdurable.now() AT TIME ZONE 'UTC')::date + 3);
WITH moved AS (
  DELETE FROM pgdurable.signals s
   WHERE s.consumed_at IS NOT NULL AND s.consumed_at <= pgdurable.now() - interval '1 hour'
  RETURNING s.id, s.kind, s.ref, s.payload, s.signal_id, s.run_id, s.created_at, s.expires_at,
            s.consumed_by, s.consumed_at, s.woke)
INSERT INTO pgdurable.signal_history (id, kind, ref, payload, signal_id, run_id, created_at,
                                      expires_at, consumed_by, consumed_at, woke)
SELECT * FROM moved;
