-- functions/history_partitions.sql: the current body of each function below.

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
COMMENT ON FUNCTION pgdurable._history_partition(text, text) IS
  'Internal: create a stand-alone table shaped like a history table, to attach as its partition.';

------------------------------------------------------------------------------
-- pgdurable.history_lock_key() -> bigint
-- The transaction-scoped advisory lock that serialises partition maintenance
-- (create_history_partitions, drop_history_partitions).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.history_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$ SELECT pg_catalog.hashtextextended('pgdurable.history_partitions', 0) $$;
COMMENT ON FUNCTION pgdurable.history_lock_key() IS
  'Advisory lock key serialising history partition maintenance.';

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
COMMENT ON FUNCTION pgdurable.create_history_partitions(integer, integer) IS
  'Create the missing daily partitions of checkpoints and run_events around today (UTC); returns how many.';

------------------------------------------------------------------------------
-- pgdurable.drop_history_partitions(older_than)
--   -> TABLE(history_table, partition_name, rows_dropped, rows_kept bigint)
-- (0022's contract and body.) Also removes from signal_history_ids the ids of
-- a dropped signal_history partition's rows, before the rows it keeps go to
-- the DEFAULT partition (whose insert adds theirs back): a DROP fires no
-- trigger.
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
    IF p.tbl = 'signal_history' THEN
      EXECUTE format('DELETE FROM pgdurable.signal_history_ids i USING pgdurable.%I d '
                     'WHERE i.signal_id = d.signal_id AND i.consumed_at = d.consumed_at',
                     p.part);
    END IF;
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
COMMENT ON FUNCTION pgdurable.drop_history_partitions(interval) IS
  'Retention by partition: drop whole daily history partitions older than the cut-off, '
  'keeping (moving to the default partition) the rows of runs prune_runs would not delete.';

------------------------------------------------------------------------------
-- pgdurable._history_key(table) -> text
-- Internal: the partition key column of a history table.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._history_key(p_table text) RETURNS text
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
CREATE OR REPLACE FUNCTION pgdurable._create_history_partitions(p_tables text[], p_from date, p_to date)
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
