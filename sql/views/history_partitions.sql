-- views/history_partitions.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.history_partitions: the partitions of checkpoints, run_events and
-- signal_history (0018's view, with signal_history).
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
   WHERE i.inhparent IN ('pgdurable.checkpoints'::regclass, 'pgdurable.run_events'::regclass,
                         'pgdurable.signal_history'::regclass);
COMMENT ON VIEW pgdurable.history_partitions IS
  'The partitions of checkpoints, run_events and signal_history: range (UTC days), size, estimated rows.';
COMMENT ON COLUMN pgdurable.history_partitions.history_table IS
  'checkpoints, run_events or signal_history.';
COMMENT ON COLUMN pgdurable.history_partitions.partition_name IS 'The partition (a table in pgdurable).';
COMMENT ON COLUMN pgdurable.history_partitions.is_default IS
  'True for the DEFAULT partition (rows outside every daily range).';
COMMENT ON COLUMN pgdurable.history_partitions.range_from IS 'Start of its range (inclusive); NULL for the default.';
COMMENT ON COLUMN pgdurable.history_partitions.range_to IS 'End of its range (exclusive); NULL for the default.';
COMMENT ON COLUMN pgdurable.history_partitions.estimated_rows IS 'Rows, as estimated by the last ANALYZE.';
COMMENT ON COLUMN pgdurable.history_partitions.total_bytes IS 'Size on disk with indexes and TOAST.';
