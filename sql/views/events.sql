-- views/events.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.event_list: every event and what it triggered (its trigger
-- windows and their runs), for operators (`pgdurable events`).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.event_list AS
  SELECT e.id,
         e.name,
         e.event_key,
         e.created_at,
         e.data,
         coalesce((SELECT jsonb_agg(jsonb_build_object('trigger', w.trigger, 'key', w.key,
                                                       'window', w.id, 'run_id', w.run_id,
                                                       'status', r.status)
                                    ORDER BY w.trigger, w.id)
                     FROM pgdurable.event_window_events we
                     JOIN pgdurable.event_windows w ON w.id = we.window_id
                     LEFT JOIN pgdurable.runs r ON r.id = w.run_id
                    WHERE we.event_id = e.id), '[]'::jsonb) AS triggered
    FROM pgdurable.events e;
COMMENT ON VIEW pgdurable.event_list IS
  'Events for operators: name, id, time, data, and the trigger windows and runs each one joined.';
COMMENT ON COLUMN pgdurable.event_list.id IS 'Event number.';
COMMENT ON COLUMN pgdurable.event_list.name IS 'Event name.';
COMMENT ON COLUMN pgdurable.event_list.event_key IS 'Deduplication id (NULL: none).';
COMMENT ON COLUMN pgdurable.event_list.created_at IS 'The event''s time (database clock).';
COMMENT ON COLUMN pgdurable.event_list.data IS 'The event''s data.';
COMMENT ON COLUMN pgdurable.event_list.triggered IS
  'The trigger windows it joined: [{trigger, key, window, run_id, status}] (status NULL: run pruned).';

------------------------------------------------------------------------------
-- pgdurable.event_partitions: the partitions of events (0039), as
-- history_partitions shows those of the history tables.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.event_partitions AS
  SELECT c.relname::text                                          AS partition_name,
         (pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT')         AS is_default,
         (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                       'FROM \(''([^'']+)''\)'))[1]::timestamptz  AS range_from,
         (regexp_match(pg_get_expr(c.relpartbound, c.oid),
                       'TO \(''([^'']+)''\)'))[1]::timestamptz    AS range_to,
         greatest(c.reltuples, 0)::bigint                         AS estimated_rows,
         pg_total_relation_size(c.oid)                            AS total_bytes
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
   WHERE i.inhparent = 'pgdurable.events'::regclass;
COMMENT ON VIEW pgdurable.event_partitions IS
  'The partitions of events: range (UTC days), size, estimated rows (create_event_partitions, '
  'drop_event_partitions).';
COMMENT ON COLUMN pgdurable.event_partitions.partition_name IS 'The partition (a table in pgdurable).';
COMMENT ON COLUMN pgdurable.event_partitions.is_default IS
  'True for events_default (rows outside every daily range).';
COMMENT ON COLUMN pgdurable.event_partitions.range_from IS 'Start of its range (inclusive); NULL for the default.';
COMMENT ON COLUMN pgdurable.event_partitions.range_to IS 'End of its range (exclusive); NULL for the default.';
COMMENT ON COLUMN pgdurable.event_partitions.estimated_rows IS 'Rows, as estimated by the last ANALYZE.';
COMMENT ON COLUMN pgdurable.event_partitions.total_bytes IS 'Size on disk with indexes and TOAST.';
