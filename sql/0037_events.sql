-- 0037_events: events that start runs, wake waits and cancel runs (issue 43).
--
-- AN EVENT is a row of pgdurable.events: a name, JSON data, an optional id
-- for deduplication (unique per name, as signal ids are per kind) and its
-- time on the database clock (the sending transaction's pgdurable.now()).
-- pgdurable.send_event (functions/events.sql) stores it and, in the same
-- transaction:
--   * wakes the runs parked on a matching wait_event (runs.wait_kind =
--     'event', runs.wait_ref = event_ref(name, path, value) of the wait's
--     first match field: the existing runs_waiting_signal_idx finds them);
--   * cancels the runs started with a matching cancel_on (event_cancels,
--     through cancel_run);
--   * adds the event to the open window of every trigger on its name
--     (event_windows: one row per open window, keyed by (trigger, key);
--     the window's run is started when the window opens, delayed to the
--     window's due time, and pushed later by each event while no worker has
--     claimed it). The database decides: senders of one (trigger, key) are
--     serialised by a transaction-scoped advisory lock.
-- Which paths of an event's data are looked at is kept in event_paths (the
-- paths some wait or cancel_on matched on), so that a send looks up a few
-- index entries, never scans the waiting runs.

CREATE TABLE pgdurable.events (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name       text        NOT NULL CHECK (name <> ''),
  data       jsonb       NOT NULL DEFAULT '{}',
  event_key  text        CHECK (event_key <> ''),
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  CONSTRAINT events_name_event_key_key UNIQUE (name, event_key)
);
CREATE INDEX events_name_created_idx ON pgdurable.events (name, created_at);
CREATE INDEX events_created_idx ON pgdurable.events (created_at);
CREATE INDEX events_data_idx ON pgdurable.events USING gin (data jsonb_path_ops);
COMMENT ON TABLE pgdurable.events IS
  'Events (pgdurable.send_event): what happened, by name, with JSON data; they wake waits, '
  'cancel runs and start triggered runs.';
COMMENT ON COLUMN pgdurable.events.id IS 'Event number (identity; not in commit order).';
COMMENT ON COLUMN pgdurable.events.name IS 'Event name, e.g. order.paid.';
COMMENT ON COLUMN pgdurable.events.data IS 'The event''s data: a JSON object.';
COMMENT ON COLUMN pgdurable.events.event_key IS
  'Deduplication id, unique per name: a resend with the same data changes nothing, with other '
  'data is refused (PD015).';
COMMENT ON COLUMN pgdurable.events.created_at IS
  'The event''s time: the sending transaction''s pgdurable.now() (database clock).';

CREATE TABLE pgdurable.event_paths (
  name text NOT NULL,
  path text NOT NULL,
  PRIMARY KEY (name, path)
);
COMMENT ON TABLE pgdurable.event_paths IS
  'The data paths (e.g. data.order_id) some wait_event or cancel_on matched events of a name on: '
  'send_event looks up each of them by index.';
COMMENT ON COLUMN pgdurable.event_paths.name IS 'Event name.';
COMMENT ON COLUMN pgdurable.event_paths.path IS 'Dotted path into the event, e.g. data.order_id.';

CREATE TABLE pgdurable.event_waits (
  run_id     uuid        PRIMARY KEY REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  name       text        NOT NULL,
  match      jsonb       NOT NULL,
  ref        text        NOT NULL,
  since      timestamptz NOT NULL,
  wake_at    timestamptz,
  seen       bigint[]    NOT NULL DEFAULT '{}',
  event_id   bigint,
  woke_at    timestamptz,
  waits      integer     NOT NULL DEFAULT 1
);
COMMENT ON TABLE pgdurable.event_waits IS
  'A run''s current (or last) wait_event: what it matches and since when; one row per run.';
COMMENT ON COLUMN pgdurable.event_waits.run_id IS 'The waiting run.';
COMMENT ON COLUMN pgdurable.event_waits.name IS 'Event name waited for.';
COMMENT ON COLUMN pgdurable.event_waits.match IS
  'Object of dotted path -> scalar value every field of which the event must equal.';
COMMENT ON COLUMN pgdurable.event_waits.ref IS
  'event_ref(name, path, value) of the first match field (runs.wait_ref while parked).';
COMMENT ON COLUMN pgdurable.event_waits.since IS
  'The wait sees events whose time is at or after this: the run''s start, or the time of the '
  'event that ended its previous event wait.';
COMMENT ON COLUMN pgdurable.event_waits.seen IS
  'Events of time = since that earlier waits of the run returned: never returned again.';
COMMENT ON COLUMN pgdurable.event_waits.wake_at IS 'The wait''s timeout (NULL: none).';
COMMENT ON COLUMN pgdurable.event_waits.event_id IS 'The event that ended the wait (NULL: waiting or timed out).';
COMMENT ON COLUMN pgdurable.event_waits.woke_at IS 'When an event ended the wait.';
COMMENT ON COLUMN pgdurable.event_waits.waits IS 'How many event waits the run has parked on.';

CREATE TABLE pgdurable.event_cancels (
  run_id uuid  NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  name   text  NOT NULL,
  path   text  NOT NULL,
  value  jsonb NOT NULL,
  ref    text  NOT NULL,
  PRIMARY KEY (run_id, ref)
);
CREATE INDEX event_cancels_ref_idx ON pgdurable.event_cancels (ref);
COMMENT ON TABLE pgdurable.event_cancels IS
  'cancel_on of runs: an event of name whose path equals value cancels run_id (cancel_run).';
COMMENT ON COLUMN pgdurable.event_cancels.run_id IS 'The run to cancel.';
COMMENT ON COLUMN pgdurable.event_cancels.name IS 'Event name.';
COMMENT ON COLUMN pgdurable.event_cancels.path IS 'Dotted path into the event, e.g. data.order_id.';
COMMENT ON COLUMN pgdurable.event_cancels.value IS 'The scalar the path must equal.';
COMMENT ON COLUMN pgdurable.event_cancels.ref IS 'event_ref(name, path, value): the lookup key.';

CREATE TABLE pgdurable.event_triggers (
  name          text        PRIMARY KEY CHECK (name <> ''),
  event         text        NOT NULL CHECK (event <> ''),
  task          text        NOT NULL CHECK (task <> ''),
  revision      text        NOT NULL,
  queue         text        NOT NULL DEFAULT 'default' CHECK (queue <> ''),
  max_attempts  integer     NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
  key_path      text        CHECK (key_path <> ''),
  debounce      interval    CHECK (debounce > interval '0'),
  max_wait      interval    CHECK (max_wait > interval '0'),
  leading_edge  boolean     NOT NULL DEFAULT false,
  batch         integer     CHECK (batch > 0),
  batch_timeout interval    CHECK (batch_timeout > interval '0'),
  updated_at    timestamptz NOT NULL DEFAULT pgdurable.now(),
  CHECK (max_wait IS NULL OR debounce IS NOT NULL),
  CHECK (NOT leading_edge OR debounce IS NOT NULL),
  CHECK (batch_timeout IS NULL OR batch IS NOT NULL),
  CHECK (batch IS NULL OR batch = 1 OR batch_timeout IS NOT NULL OR debounce IS NOT NULL)
);
CREATE INDEX event_triggers_event_idx ON pgdurable.event_triggers (event);
COMMENT ON TABLE pgdurable.event_triggers IS
  'Triggers (@app.on_event): events of `event` start runs of `task`, one per event, per debounce '
  'window or per batch, keyed by key_path.';
COMMENT ON COLUMN pgdurable.event_triggers.name IS 'Trigger name (the handler task''s name).';
COMMENT ON COLUMN pgdurable.event_triggers.event IS 'The event name it listens to.';
COMMENT ON COLUMN pgdurable.event_triggers.task IS 'The task its runs execute.';
COMMENT ON COLUMN pgdurable.event_triggers.revision IS 'The task revision its runs start with.';
COMMENT ON COLUMN pgdurable.event_triggers.queue IS 'The queue of its runs.';
COMMENT ON COLUMN pgdurable.event_triggers.max_attempts IS 'max_attempts of its runs.';
COMMENT ON COLUMN pgdurable.event_triggers.key_path IS
  'Dotted path of the window key (e.g. data.thread_id); NULL: one key for all events.';
COMMENT ON COLUMN pgdurable.event_triggers.debounce IS
  'Quiet time: the window''s run starts this long after its last event (NULL: no debounce).';
COMMENT ON COLUMN pgdurable.event_triggers.max_wait IS
  'A debounce window runs at most this long after its first event (NULL: unbounded).';
COMMENT ON COLUMN pgdurable.event_triggers.leading_edge IS
  'The first event after a quiet time starts a run at once (its own window).';
COMMENT ON COLUMN pgdurable.event_triggers.batch IS 'A window holds at most this many events.';
COMMENT ON COLUMN pgdurable.event_triggers.batch_timeout IS
  'A batch runs at most this long after its first event, full or not.';
COMMENT ON COLUMN pgdurable.event_triggers.updated_at IS 'When the trigger was last declared differently.';

CREATE TABLE pgdurable.event_windows (
  id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  trigger       text        NOT NULL,
  key           text        NOT NULL,
  run_id        uuid        NOT NULL,
  opened_at     timestamptz NOT NULL DEFAULT pgdurable.now(),
  last_event_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  due_at        timestamptz NOT NULL,
  events        integer     NOT NULL DEFAULT 0 CHECK (events >= 0),
  closed_at     timestamptz,
  taken_at      timestamptz
);
CREATE UNIQUE INDEX event_windows_open_idx ON pgdurable.event_windows (trigger, key)
  WHERE closed_at IS NULL;
CREATE INDEX event_windows_key_idx ON pgdurable.event_windows (trigger, key, id);
CREATE INDEX event_windows_run_idx ON pgdurable.event_windows (run_id);
COMMENT ON TABLE pgdurable.event_windows IS
  'One row per debounce window or batch of a trigger and key: the run it started and its events.';
COMMENT ON COLUMN pgdurable.event_windows.id IS 'Window number.';
COMMENT ON COLUMN pgdurable.event_windows.trigger IS 'The trigger (event_triggers.name).';
COMMENT ON COLUMN pgdurable.event_windows.key IS 'The key (the event''s key_path value as text; '''' without).';
COMMENT ON COLUMN pgdurable.event_windows.run_id IS 'The run started for this window.';
COMMENT ON COLUMN pgdurable.event_windows.opened_at IS 'Time of its first event.';
COMMENT ON COLUMN pgdurable.event_windows.last_event_at IS 'Time of its last event.';
COMMENT ON COLUMN pgdurable.event_windows.due_at IS 'When its run may start (the run''s available_at).';
COMMENT ON COLUMN pgdurable.event_windows.events IS 'How many events it holds.';
COMMENT ON COLUMN pgdurable.event_windows.closed_at IS
  'When it stopped taking events (full, leading, or its run claimed); NULL: open.';
COMMENT ON COLUMN pgdurable.event_windows.taken_at IS 'When its run first read its events.';

CREATE TABLE pgdurable.event_window_events (
  window_id bigint NOT NULL,
  event_id  bigint NOT NULL,
  PRIMARY KEY (window_id, event_id)
);
CREATE INDEX event_window_events_event_idx ON pgdurable.event_window_events (event_id);
COMMENT ON TABLE pgdurable.event_window_events IS 'Which events each trigger window holds.';
COMMENT ON COLUMN pgdurable.event_window_events.window_id IS 'The window (event_windows.id).';
COMMENT ON COLUMN pgdurable.event_window_events.event_id IS 'The event (events.id).';

-- The app role calls them (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.event_ref(text,text,jsonb)', true),
  ('pgdurable.send_event(text,jsonb,text)', false),
  ('pgdurable.park_event(uuid,bigint,text,jsonb,numeric,text,jsonb,interval)', false),
  ('pgdurable.cancel_on_events(uuid,text[],text[],jsonb)', false),
  ('pgdurable.upsert_event_trigger(text,text,text,text,text,integer,text,interval,interval,'
   'boolean,integer,interval)', false),
  ('pgdurable.take_event_window(uuid)', false);
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.prune_events(interval,integer)', false);
