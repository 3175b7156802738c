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
