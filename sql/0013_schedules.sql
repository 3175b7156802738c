-- schedules: cron and interval runs stored in Postgres, one run per tick.
--
-- A schedule is one row of pgdurable.schedules. Its next tick is
-- next_fire_at (database clock). Cron expressions and time zones are
-- evaluated in Python (pgdurable/schedules.py: cronsim + zoneinfo); the
-- database decides WHO fires a tick and that it fires once:
--
--   * a worker reads the due schedules (no lock), computes which ticks to
--     fire (catch-up policy) and the tick after them, and calls
--     pgdurable.fire_schedule(name, expected next_fire_at, ticks, next).
--     That ONE transaction locks the row FOR UPDATE SKIP LOCKED only while
--     next_fire_at still equals what the worker read (the fence), starts a
--     run per tick through start_run with the idempotency key
--     'pgdurable:schedule:<name>@<tick, UTC>' (a second start of the same
--     tick returns the first run), applies the overlap policy and advances
--     next_fire_at. A worker that loses the race gets no rows and changes
--     nothing.
--   * pgdurable.schedule_wakeup(queues) tells an idle worker when the next
--     tick is due, so it sleeps until then (no polling loop).
--
-- Runs started by a schedule are recorded in pgdurable.schedule_runs (run id,
-- schedule name, tick), a side table keyed by run id (runs keeps its shape).
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- schedules: one row per schedule.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.schedules (
  name             text        PRIMARY KEY CHECK (name <> ''),
  cron             text        CHECK (cron <> ''),
  every            interval    CHECK (every >= interval '1 second'),
  timezone         text        NOT NULL DEFAULT 'UTC' CHECK (timezone <> ''),
  task             text        NOT NULL CHECK (task <> ''),
  revision         text        NOT NULL DEFAULT '1' CHECK (revision <> ''),
  state            jsonb       NOT NULL DEFAULT '{}',
  queue            text        NOT NULL DEFAULT 'default' CHECK (queue <> ''),
  max_attempts     integer     NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
  overlap          text        NOT NULL DEFAULT 'skip'
                   CHECK (overlap IN ('skip', 'allow', 'cancel_previous')),
  catchup          text        NOT NULL DEFAULT 'latest'
                   CHECK (catchup IN ('none', 'latest', 'all')),
  catchup_limit    integer     NOT NULL DEFAULT 100 CHECK (catchup_limit BETWEEN 1 AND 10000),
  paused           boolean     NOT NULL DEFAULT false,
  next_fire_at     timestamptz NOT NULL,
  last_tick        timestamptz,
  last_run_id      uuid,
  last_fired_at    timestamptz,
  fired            bigint      NOT NULL DEFAULT 0,
  skipped          bigint      NOT NULL DEFAULT 0,
  last_error       text,
  declared_by      text,
  last_declared_at timestamptz,
  undeclared_at    timestamptz,
  created_at       timestamptz NOT NULL DEFAULT pgdurable.now(),
  updated_at       timestamptz NOT NULL DEFAULT pgdurable.now(),
  CONSTRAINT schedules_cron_or_every CHECK ((cron IS NULL) <> (every IS NULL))
);
CREATE INDEX schedules_due_idx ON pgdurable.schedules (next_fire_at) WHERE NOT paused;
COMMENT ON TABLE pgdurable.schedules IS
  'Schedules: each tick (cron or fixed interval) becomes exactly one run of task, started by whichever worker is up.';
COMMENT ON COLUMN pgdurable.schedules.name IS 'Schedule name (unique).';
COMMENT ON COLUMN pgdurable.schedules.cron IS
  'Cron expression (5 fields, or 6 with seconds first), evaluated in timezone; NULL when every is set.';
COMMENT ON COLUMN pgdurable.schedules.every IS 'Fixed interval between ticks (>= 1 s); NULL when cron is set.';
COMMENT ON COLUMN pgdurable.schedules.timezone IS
  'IANA time zone the cron expression is read in (DST: see docs/schedules.md); ignored for every.';
COMMENT ON COLUMN pgdurable.schedules.task IS 'Task each tick starts a run of.';
COMMENT ON COLUMN pgdurable.schedules.revision IS 'Task revision the runs are started with.';
COMMENT ON COLUMN pgdurable.schedules.state IS 'Start state (JSONB) of every run.';
COMMENT ON COLUMN pgdurable.schedules.queue IS 'Queue of the runs; workers serving it fire the ticks.';
COMMENT ON COLUMN pgdurable.schedules.max_attempts IS 'max_attempts of the runs.';
COMMENT ON COLUMN pgdurable.schedules.overlap IS
  'When the previous run is still going at a tick: skip (no run) | allow (start anyway) | cancel_previous (cancel it, then start).';
COMMENT ON COLUMN pgdurable.schedules.catchup IS
  'Ticks missed while no worker was up (more than a minute late): none (skip them) | latest (fire the newest once) | all (fire each, at most catchup_limit, newest kept).';
COMMENT ON COLUMN pgdurable.schedules.catchup_limit IS 'catchup = all: at most this many missed ticks are fired.';
COMMENT ON COLUMN pgdurable.schedules.paused IS 'Paused schedules fire nothing; resume re-plans from now (missed ticks are not caught up).';
COMMENT ON COLUMN pgdurable.schedules.next_fire_at IS 'The next tick (database clock); advanced only by fire_schedule under its fence.';
COMMENT ON COLUMN pgdurable.schedules.last_tick IS 'The last tick fired (or skipped by the overlap policy).';
COMMENT ON COLUMN pgdurable.schedules.last_run_id IS
  'The latest run started by this schedule (tick or trigger); the overlap policy checks it. May name a pruned run.';
COMMENT ON COLUMN pgdurable.schedules.last_fired_at IS 'When (database clock) a tick was last fired.';
COMMENT ON COLUMN pgdurable.schedules.fired IS 'How many runs ticks and triggers started.';
COMMENT ON COLUMN pgdurable.schedules.skipped IS 'How many ticks the overlap policy skip left without a run.';
COMMENT ON COLUMN pgdurable.schedules.last_error IS
  'Why a worker could not plan the schedule (e.g. a bad cron written by SQL); it was paused. Cleared by resume.';
COMMENT ON COLUMN pgdurable.schedules.declared_by IS
  'Who declared it: ''code'' (app.schedule, upserted at worker start); NULL when made by the CLI or SQL.';
COMMENT ON COLUMN pgdurable.schedules.last_declared_at IS 'When code last declared it (a worker started).';
COMMENT ON COLUMN pgdurable.schedules.undeclared_at IS
  'Set when a worker of an app serving its task started without declaring it: the code no longer declares it (the row is kept).';
COMMENT ON COLUMN pgdurable.schedules.created_at IS 'When the schedule was created.';
COMMENT ON COLUMN pgdurable.schedules.updated_at IS 'Last change (declaration, pause, resume, tick).';

------------------------------------------------------------------------------
-- schedule_runs: which run came from which schedule and tick.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.schedule_runs (
  run_id     uuid        PRIMARY KEY REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  schedule   text        NOT NULL,
  tick       timestamptz NOT NULL,
  triggered  boolean     NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now()
);
CREATE INDEX schedule_runs_schedule_idx ON pgdurable.schedule_runs (schedule, tick);
COMMENT ON TABLE pgdurable.schedule_runs IS
  'Runs started by schedules: the schedule name and tick of each (deleted with the run; kept when the schedule is deleted).';
COMMENT ON COLUMN pgdurable.schedule_runs.run_id IS 'The run.';
COMMENT ON COLUMN pgdurable.schedule_runs.schedule IS 'Name of the schedule that started it.';
COMMENT ON COLUMN pgdurable.schedule_runs.tick IS 'The tick it was started for (for a trigger: when it was triggered).';
COMMENT ON COLUMN pgdurable.schedule_runs.triggered IS 'true: started by trigger_schedule, outside the cadence.';
COMMENT ON COLUMN pgdurable.schedule_runs.created_at IS 'When it was recorded.';
