-- 0039_events_partitions: events are kept in daily partitions and dropped whole,
-- as checkpoints, run_events and signal_history are (0018, 0022); issue 43.
--
-- THE TABLE. pgdurable.events becomes range-partitioned by created_at (the
-- event's time on the database clock): one partition per UTC day,
-- events_pYYYYMMDD, plus events_default for rows outside every daily range.
-- The existing rows are kept (same id, name, data, event_key, created_at), and
-- so are its indexes, under the same names: (name, created_at), (created_at)
-- and the GIN index on data (jsonb_path_ops) by which park_event finds a stored
-- event a wait matches. A partitioned table's primary key must hold the
-- partition key: it is (id, created_at). PostgreSQL 15 has no identity column on
-- a partitioned table: id takes its default from the sequence events_id_seq,
-- which goes on from where the identity's sequence stopped.
--
-- DEDUP. A unique key of a partitioned table must hold the partition key too,
-- so (name, event_key) can no longer be unique on events itself: two sends of
-- one id on two days would land in two partitions. The dedup key moves to
-- pgdurable.event_ids, one unpartitioned table with PRIMARY KEY (name,
-- event_key) and the event's (id, created_at): send_event inserts there first
-- (ON CONFLICT DO NOTHING: a concurrent second send of the id waits for the
-- first to commit and then finds it), and a resend finds its event in one probe
-- of event_ids and one of the partition that holds created_at. So an id
-- deduplicates across partitions for as long as its event is stored, exactly
-- as before: until retention deletes the event (drop_event_partitions removes
-- the ids of the rows it drops; prune_events the ids of the rows it deletes).
--
-- TRIGGER WINDOWS. A send no longer moves the window's run (functions/
-- events.sql, _event_window_add): the window row decides, and the run reads
-- it with take_due_event_window (allowed to the app role below).
--
-- WINDOW LINKS. event_window_events gains event_at, the linked event's
-- created_at, so that a run reading its window (take_event_window) probes only
-- the partition of each of its events.
--
-- Its functions and views are no longer here: each has one current body in
-- sql/functions/events.sql and sql/views/events.sql (create_event_partitions,
-- drop_event_partitions, event_partitions), applied after the numbered files.

-- The functions whose argument is the row type of the table being replaced go
-- (functions/events.sql creates them again, on the new table's type).
DROP FUNCTION IF EXISTS pgdurable._event_json(pgdurable.events);
DROP FUNCTION IF EXISTS pgdurable._event_window_add(pgdurable.event_triggers, pgdurable.events);

-- No send_event writes while the rows move (migrate runs in one transaction).
LOCK TABLE pgdurable.events IN ACCESS EXCLUSIVE MODE;
ALTER TABLE pgdurable.events RENAME TO events_0037;
ALTER SEQUENCE pgdurable.events_id_seq RENAME TO events_0037_id_seq;
ALTER INDEX pgdurable.events_pkey RENAME TO events_0037_pkey;
ALTER INDEX pgdurable.events_name_event_key_key RENAME TO events_0037_name_event_key_key;
ALTER INDEX pgdurable.events_name_created_idx RENAME TO events_0037_name_created_idx;
ALTER INDEX pgdurable.events_created_idx RENAME TO events_0037_created_idx;
ALTER INDEX pgdurable.events_data_idx RENAME TO events_0037_data_idx;

CREATE TABLE pgdurable.events (
  id         bigint      NOT NULL,
  name       text        NOT NULL CHECK (name <> ''),
  data       jsonb       NOT NULL DEFAULT '{}',
  event_key  text        CHECK (event_key <> ''),
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
COMMENT ON TABLE pgdurable.events IS
  'Events (pgdurable.send_event): what happened, by name, with JSON data; they wake waits, '
  'cancel runs and start triggered runs. Partitioned by created_at (one partition per UTC day, '
  'plus events_default; pgdurable.event_partitions); event_key is unique per name through '
  'pgdurable.event_ids.';
COMMENT ON COLUMN pgdurable.events.id IS
  'Event number (from events_id_seq; not in commit order). With created_at, the primary key.';
COMMENT ON COLUMN pgdurable.events.name IS 'Event name, e.g. order.paid.';
COMMENT ON COLUMN pgdurable.events.data IS 'The event''s data: a JSON object.';
COMMENT ON COLUMN pgdurable.events.event_key IS
  'Deduplication id, unique per name (pgdurable.event_ids): a resend with the same data changes '
  'nothing, with other data is refused (PD015).';
COMMENT ON COLUMN pgdurable.events.created_at IS
  'The event''s time: the sending transaction''s pgdurable.now() (database clock); the '
  'partition key.';

CREATE TABLE pgdurable.events_default (LIKE pgdurable.events INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING COMMENTS);
ALTER TABLE pgdurable.events_default SET (autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.events_default IS
  'Partition of pgdurable.events (see pgdurable.event_partitions).';
ALTER TABLE pgdurable.events ATTACH PARTITION pgdurable.events_default DEFAULT;

-- Daily partitions for the days of the existing events (up to 35 days back, as
-- 0018 and 0022) and 3 days ahead, as create_event_partitions makes them.
SELECT pg_advisory_xact_lock(pg_catalog.hashtextextended('pgdurable.history_partitions', 0));
DO $$
DECLARE
  v_today date := (pgdurable.now() AT TIME ZONE 'UTC')::date;
  v_day   date;
  v_name  text;
BEGIN
  FOR v_day IN SELECT d::date FROM generate_series(
                 greatest(coalesce((SELECT (min(e.created_at) AT TIME ZONE 'UTC')::date
                                      FROM pgdurable.events_0037 e), v_today), v_today - 35),
                 v_today + 3, interval '1 day') d LOOP
    v_name := 'events_p' || to_char(v_day, 'YYYYMMDD');
    EXECUTE format('CREATE TABLE pgdurable.%I (LIKE pgdurable.events INCLUDING DEFAULTS '
                   'INCLUDING CONSTRAINTS INCLUDING COMMENTS)', v_name);
    EXECUTE format('ALTER TABLE pgdurable.%I SET (autovacuum_vacuum_scale_factor = 0.05, '
                   'autovacuum_vacuum_cost_delay = 0)', v_name);
    EXECUTE format('COMMENT ON TABLE pgdurable.%I IS %L', v_name,
                   'Partition of pgdurable.events (see pgdurable.event_partitions).');
    EXECUTE format('ALTER TABLE pgdurable.events ATTACH PARTITION pgdurable.%I '
                   'FOR VALUES FROM (%L) TO (%L)', v_name,
                   v_day::timestamp AT TIME ZONE 'UTC', (v_day + 1)::timestamp AT TIME ZONE 'UTC');
  END LOOP;
END
$$;

INSERT INTO pgdurable.events (id, name, data, event_key, created_at)
SELECT e.id, e.name, e.data, e.event_key, e.created_at FROM pgdurable.events_0037 e;

-- the id sequence goes on from the identity's
CREATE SEQUENCE pgdurable.events_id_seq AS bigint OWNED BY pgdurable.events.id;
SELECT pg_catalog.setval('pgdurable.events_id_seq', s.last_value, s.is_called)
  FROM pgdurable.events_0037_id_seq s;
ALTER TABLE pgdurable.events ALTER COLUMN id SET DEFAULT nextval('pgdurable.events_id_seq');

CREATE TABLE pgdurable.event_ids (
  name       text        NOT NULL,
  event_key  text        NOT NULL,
  event_id   bigint      NOT NULL,
  created_at timestamptz NOT NULL,
  PRIMARY KEY (name, event_key)
);
COMMENT ON TABLE pgdurable.event_ids IS
  'The deduplication ids of stored events, unpartitioned: (name, id) is unique across every '
  'partition of events for as long as its event is stored (send_event; retention removes them '
  'with their events).';
COMMENT ON COLUMN pgdurable.event_ids.name IS 'Event name.';
COMMENT ON COLUMN pgdurable.event_ids.event_key IS 'The deduplication id (events.event_key).';
COMMENT ON COLUMN pgdurable.event_ids.event_id IS 'The event stored under it (events.id).';
COMMENT ON COLUMN pgdurable.event_ids.created_at IS
  'Its events.created_at: the partition to read it from.';
INSERT INTO pgdurable.event_ids (name, event_key, event_id, created_at)
SELECT e.name, e.event_key, e.id, e.created_at FROM pgdurable.events_0037 e
 WHERE e.event_key IS NOT NULL;

DROP TABLE pgdurable.events_0037;

CREATE INDEX events_name_created_idx ON pgdurable.events (name, created_at);
CREATE INDEX events_created_idx ON pgdurable.events (created_at);
CREATE INDEX events_data_idx ON pgdurable.events USING gin (data jsonb_path_ops);

ALTER TABLE pgdurable.event_window_events ADD COLUMN event_at timestamptz;
UPDATE pgdurable.event_window_events we SET event_at = e.created_at
  FROM pgdurable.events e WHERE e.id = we.event_id;
-- a link whose event is gone (deleted by hand) gets -infinity: it joins no event
UPDATE pgdurable.event_window_events SET event_at = '-infinity' WHERE event_at IS NULL;
ALTER TABLE pgdurable.event_window_events ALTER COLUMN event_at SET NOT NULL;
COMMENT ON COLUMN pgdurable.event_window_events.event_at IS
  'The event''s created_at (its partition of events).';

-- The app role calls them (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.create_event_partitions(integer,integer)', false),
  ('pgdurable.drop_event_partitions(interval)', false),
  ('pgdurable.take_due_event_window(uuid)', false);
