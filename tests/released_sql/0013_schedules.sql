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

------------------------------------------------------------------------------
-- pgdurable.schedule_key(name, tick) -> text
-- The idempotency key of a tick's run: one run per (schedule, tick).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.schedule_key(p_name text, p_tick timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT 'pgdurable:schedule:' || p_name || '@'
         || to_char(p_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;
COMMENT ON FUNCTION pgdurable.schedule_key(text, timestamptz) IS
  'Idempotency key of the run of one schedule tick (schedule name, tick in UTC).';

------------------------------------------------------------------------------
-- pgdurable._schedule_checks(...): PD000 naming the first bad argument.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._schedule_checks(
  p_name text, p_cron text, p_every interval, p_timezone text, p_task text,
  p_overlap text, p_catchup text, p_catchup_limit integer)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_name IS NULL OR p_name = '' THEN
    RAISE EXCEPTION 'schedule name must be non-empty' USING ERRCODE = 'PD000';
  END IF;
  IF (p_cron IS NULL) = (p_every IS NULL) THEN
    RAISE EXCEPTION 'schedule %: give exactly one of cron and every', p_name USING ERRCODE = 'PD000';
  END IF;
  IF p_every IS NOT NULL AND p_every < interval '1 second' THEN
    RAISE EXCEPTION 'schedule %: every must be at least 1 second, got %', p_name, p_every
      USING ERRCODE = 'PD000';
  END IF;
  IF p_timezone IS NULL
     OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names WHERE name = p_timezone) THEN
    RAISE EXCEPTION 'schedule %: unknown time zone %', p_name, coalesce(p_timezone, 'NULL')
      USING ERRCODE = 'PD000';
  END IF;
  IF p_task IS NULL OR p_task = '' THEN
    RAISE EXCEPTION 'schedule %: task must be non-empty', p_name USING ERRCODE = 'PD000';
  END IF;
  IF p_overlap IS NULL OR p_overlap NOT IN ('skip', 'allow', 'cancel_previous') THEN
    RAISE EXCEPTION 'schedule %: overlap must be skip, allow or cancel_previous, got %',
      p_name, coalesce(p_overlap, 'NULL') USING ERRCODE = 'PD000';
  END IF;
  IF p_catchup IS NULL OR p_catchup NOT IN ('none', 'latest', 'all') THEN
    RAISE EXCEPTION 'schedule %: catchup must be none, latest or all, got %',
      p_name, coalesce(p_catchup, 'NULL') USING ERRCODE = 'PD000';
  END IF;
  IF p_catchup_limit IS NULL OR p_catchup_limit NOT BETWEEN 1 AND 10000 THEN
    RAISE EXCEPTION 'schedule %: catchup_limit must be between 1 and 10000, got %',
      p_name, p_catchup_limit USING ERRCODE = 'PD000';
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable._schedule_checks(text, text, interval, text, text, text, text, integer) IS
  'Internal: validate a schedule definition; PD000 naming the first bad argument.';

------------------------------------------------------------------------------
-- pgdurable.upsert_schedule(name, cron, every, timezone, task, revision,
--   state, queue, max_attempts, overlap, catchup, catchup_limit,
--   next_fire_at, declared_by) -> text ('created' | 'updated' | 'unchanged')
-- Create or update a schedule. next_fire_at (computed by the caller from the
-- cron or interval, after pgdurable.now()) is used for a new schedule and
-- when cron, every or timezone changed; otherwise the schedule keeps its
-- cadence (declaring the same schedule again is idempotent). paused is never
-- changed here. declared_by 'code' records last_declared_at and clears
-- undeclared_at. NOTIFYs pgdurable_wake(queue) so idle workers re-read their
-- next wake-up. Bad input: PD000, nothing written.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.upsert_schedule(
  p_name text, p_cron text, p_every interval, p_timezone text, p_task text, p_revision text,
  p_state jsonb, p_queue text, p_max_attempts integer, p_overlap text, p_catchup text,
  p_catchup_limit integer, p_next_fire_at timestamptz, p_declared_by text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_old  pgdurable.schedules;
  v_what text;
BEGIN
  PERFORM pgdurable._schedule_checks(p_name, p_cron, p_every, p_timezone, p_task,
                                     p_overlap, p_catchup, p_catchup_limit);
  IF p_next_fire_at IS NULL THEN
    RAISE EXCEPTION 'schedule %: next_fire_at must be given', p_name USING ERRCODE = 'PD000';
  END IF;
  SELECT * INTO v_old FROM pgdurable.schedules s WHERE s.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    INSERT INTO pgdurable.schedules AS s (name, cron, every, timezone, task, revision, state,
      queue, max_attempts, overlap, catchup, catchup_limit, next_fire_at, declared_by,
      last_declared_at)
    VALUES (p_name, p_cron, p_every, p_timezone, p_task, coalesce(p_revision, '1'),
      coalesce(p_state, '{}'), coalesce(p_queue, 'default'), coalesce(p_max_attempts, 3),
      p_overlap, p_catchup, p_catchup_limit, p_next_fire_at, p_declared_by,
      CASE WHEN p_declared_by IS NOT NULL THEN v_now END)
    ON CONFLICT (name) DO NOTHING;
    IF FOUND THEN
      PERFORM pg_notify('pgdurable_wake', coalesce(p_queue, 'default'));
      RETURN 'created';
    END IF;
    -- a concurrent declaration inserted it first: update that row
    SELECT * INTO v_old FROM pgdurable.schedules s WHERE s.name = p_name FOR UPDATE;
  END IF;
  v_what := CASE WHEN (v_old.cron, v_old.every, v_old.timezone, v_old.task, v_old.revision,
                       v_old.state, v_old.queue, v_old.max_attempts, v_old.overlap,
                       v_old.catchup, v_old.catchup_limit, v_old.declared_by)
                      IS NOT DISTINCT FROM
                      (p_cron, p_every, p_timezone, p_task, coalesce(p_revision, '1'),
                       coalesce(p_state, '{}'), coalesce(p_queue, 'default'),
                       coalesce(p_max_attempts, 3), p_overlap, p_catchup, p_catchup_limit,
                       p_declared_by)
                 THEN 'unchanged' ELSE 'updated' END;
  UPDATE pgdurable.schedules s SET
    cron = p_cron, every = p_every, timezone = p_timezone, task = p_task,
    revision = coalesce(p_revision, '1'), state = coalesce(p_state, '{}'),
    queue = coalesce(p_queue, 'default'), max_attempts = coalesce(p_max_attempts, 3),
    overlap = p_overlap, catchup = p_catchup, catchup_limit = p_catchup_limit,
    next_fire_at = CASE WHEN (v_old.cron, v_old.every, v_old.timezone)
                             IS NOT DISTINCT FROM (p_cron, p_every, p_timezone)
                        THEN v_old.next_fire_at ELSE p_next_fire_at END,
    declared_by = p_declared_by,
    last_declared_at = CASE WHEN p_declared_by IS NOT NULL THEN v_now ELSE s.last_declared_at END,
    undeclared_at = NULL,
    updated_at = CASE WHEN v_what = 'updated' THEN v_now ELSE s.updated_at END
  WHERE s.name = p_name;
  IF v_what = 'updated' THEN
    PERFORM pg_notify('pgdurable_wake', coalesce(p_queue, 'default'));
  END IF;
  RETURN v_what;
END
$$;
COMMENT ON FUNCTION pgdurable.upsert_schedule(text, text, interval, text, text, text, jsonb,
  text, integer, text, text, integer, timestamptz, text) IS
  'Create or update a schedule (idempotent; keeps its cadence unless cron/every/timezone changed).';

------------------------------------------------------------------------------
-- pgdurable.mark_undeclared(declared_by, tasks, names) -> integer
-- After a worker declared its app's schedules (names) for its tasks: every
-- schedule declared by the same declarer for one of these tasks that is not
-- among names gets undeclared_at (kept, still firing; the CLI lists it as no
-- longer declared in code). Returns how many rows were newly marked.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.mark_undeclared(p_declared_by text, p_tasks text[], p_names text[])
RETURNS integer
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH m AS (
    UPDATE pgdurable.schedules s SET undeclared_at = pgdurable.now()
     WHERE s.declared_by = p_declared_by AND s.task = ANY (p_tasks)
       AND NOT (s.name = ANY (p_names)) AND s.undeclared_at IS NULL
    RETURNING 1)
  SELECT count(*)::integer FROM m
$$;
COMMENT ON FUNCTION pgdurable.mark_undeclared(text, text[], text[]) IS
  'Mark the schedules of these tasks that this declarer no longer declares (undeclared_at); returns the count.';

------------------------------------------------------------------------------
-- pgdurable._schedule(name) -> pgdurable.schedules
-- Internal: lock and return the schedule, or raise PD160 (ScheduleNotFound).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._schedule(p_name text) RETURNS pgdurable.schedules
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s pgdurable.schedules;
BEGIN
  SELECT * INTO s FROM pgdurable.schedules x WHERE x.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no schedule %', coalesce(p_name, 'NULL') USING ERRCODE = 'PD160';
  END IF;
  RETURN s;
END
$$;
COMMENT ON FUNCTION pgdurable._schedule(text) IS
  'Internal: lock and return a schedule; PD160 (ScheduleNotFound) if there is none.';

------------------------------------------------------------------------------
-- pgdurable.pause_schedule(name) -> boolean (true if it was running)
-- A paused schedule fires nothing (ticks, catch-up); trigger still works.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.pause_schedule(p_name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s pgdurable.schedules := pgdurable._schedule(p_name);
BEGIN
  IF s.paused THEN
    RETURN false;
  END IF;
  UPDATE pgdurable.schedules SET paused = true, updated_at = pgdurable.now() WHERE name = p_name;
  RETURN true;
END
$$;
COMMENT ON FUNCTION pgdurable.pause_schedule(text) IS
  'Pause a schedule (PD160 if unknown); returns false if it was already paused.';

------------------------------------------------------------------------------
-- pgdurable.resume_schedule(name, next_fire_at) -> boolean (true if it was paused)
-- Resume from next_fire_at (the caller computes the first tick after now):
-- ticks that fell in the pause are not caught up. Clears last_error.
-- NOTIFYs pgdurable_wake(queue). A running schedule is left alone.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.resume_schedule(p_name text, p_next_fire_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s pgdurable.schedules := pgdurable._schedule(p_name);
BEGIN
  IF NOT s.paused THEN
    RETURN false;
  END IF;
  IF p_next_fire_at IS NULL THEN
    RAISE EXCEPTION 'resume_schedule: next_fire_at must be given' USING ERRCODE = 'PD000';
  END IF;
  UPDATE pgdurable.schedules SET paused = false, next_fire_at = p_next_fire_at,
         last_error = NULL, updated_at = pgdurable.now()
   WHERE name = p_name;
  PERFORM pg_notify('pgdurable_wake', s.queue);
  RETURN true;
END
$$;
COMMENT ON FUNCTION pgdurable.resume_schedule(text, timestamptz) IS
  'Resume a paused schedule from next_fire_at (missed ticks are not caught up); false if it was not paused.';

------------------------------------------------------------------------------
-- pgdurable.delete_schedule(name) -> boolean (false if there was none)
-- Its runs and their schedule_runs rows are kept.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.delete_schedule(p_name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH d AS (DELETE FROM pgdurable.schedules s WHERE s.name = p_name RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM d)
$$;
COMMENT ON FUNCTION pgdurable.delete_schedule(text) IS
  'Delete a schedule (its runs stay); false if there was none.';

------------------------------------------------------------------------------
-- pgdurable._schedule_start(s, tick, triggered) -> TABLE(run_id, created)
-- Internal: start the run of one tick (idempotent by schedule_key) and record
-- it in schedule_runs. A trigger has no idempotency key.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._schedule_start(s pgdurable.schedules, p_tick timestamptz,
                                          p_triggered boolean)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_id      uuid;
  v_created boolean;
BEGIN
  SELECT r.run_id, r.created INTO v_id, v_created
    FROM pgdurable.start_run(s.task, s.revision, s.state, s.queue, 0, s.max_attempts,
                             CASE WHEN p_triggered THEN NULL
                                  ELSE pgdurable.schedule_key(s.name, p_tick) END,
                             NULL, NULL, NULL) r;
  INSERT INTO pgdurable.schedule_runs (run_id, schedule, tick, triggered)
  VALUES (v_id, s.name, p_tick, p_triggered)
  ON CONFLICT ON CONSTRAINT schedule_runs_pkey DO NOTHING;
  RETURN QUERY SELECT v_id, v_created;
END
$$;
COMMENT ON FUNCTION pgdurable._schedule_start(pgdurable.schedules, timestamptz, boolean) IS
  'Internal: start (idempotently) and record the run of one schedule tick or trigger.';

------------------------------------------------------------------------------
-- pgdurable.fire_schedule(name, expected, ticks, next)
--   -> TABLE(tick timestamptz, run_id uuid, outcome text)
-- Fire due ticks of one schedule, in ONE transaction:
--   1. lock the row FOR UPDATE SKIP LOCKED, only if it is not paused and its
--      next_fire_at still equals p_expected (the value the caller planned
--      from). Otherwise (another worker fires or fired it, or it changed):
--      no rows, nothing written.
--   2. for each tick of p_ticks (ascending, each >= p_expected and <= now;
--      empty = the missed ticks are dropped by catchup none), apply the
--      overlap policy against the schedule's latest run (last_run_id):
--      while it is runnable, leased or waiting, 'skip' starts nothing
--      (outcome 'skipped'), 'cancel_previous' cancels it (cancel_run) and
--      starts, 'allow' starts. A start goes through start_run with the
--      idempotency key schedule_key(name, tick): outcome 'started', or
--      'existing' if that tick's run already existed.
--   3. advance next_fire_at to p_next (> every tick and > p_expected),
--      record last_tick, last_run_id, last_fired_at, fired, skipped.
-- Bad arguments: PD000, nothing written.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.fire_schedule(p_name text, p_expected timestamptz,
                                        p_ticks timestamptz[], p_next timestamptz)
RETURNS TABLE (tick timestamptz, run_id uuid, outcome text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now     timestamptz := pgdurable.now();
  s         pgdurable.schedules;
  v_tick    timestamptz;
  v_prev    timestamptz;
  v_last    uuid;
  v_status  text;
  v_id      uuid;
  v_created boolean;
  v_fired   integer := 0;
  v_skipped integer := 0;
BEGIN
  IF p_expected IS NULL OR p_next IS NULL OR p_next <= p_expected THEN
    RAISE EXCEPTION 'fire_schedule %: next (%) must be after the expected tick (%)',
      p_name, p_next, p_expected USING ERRCODE = 'PD000';
  END IF;
  v_prev := NULL;
  FOREACH v_tick IN ARRAY coalesce(p_ticks, '{}') LOOP
    IF v_tick IS NULL OR v_tick < p_expected OR v_tick > v_now OR v_tick >= p_next
       OR v_tick <= v_prev THEN
      RAISE EXCEPTION 'fire_schedule %: tick % is not a due tick in [%, now] in ascending order before next %',
        p_name, v_tick, p_expected, p_next USING ERRCODE = 'PD000';
    END IF;
    v_prev := v_tick;
  END LOOP;

  SELECT * INTO s FROM pgdurable.schedules x
   WHERE x.name = p_name AND x.next_fire_at = p_expected AND NOT x.paused
   FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  v_last := s.last_run_id;
  FOREACH v_tick IN ARRAY coalesce(p_ticks, '{}') LOOP
    IF v_last IS NOT NULL AND s.overlap <> 'allow' THEN
      SELECT r.status INTO v_status FROM pgdurable.runs r WHERE r.id = v_last;
      IF v_status IN ('runnable', 'leased', 'waiting') THEN
        IF s.overlap = 'skip' THEN
          v_skipped := v_skipped + 1;
          tick := v_tick; run_id := NULL; outcome := 'skipped';
          RETURN NEXT;
          CONTINUE;
        END IF;
        PERFORM pgdurable.cancel_run(v_last);
      END IF;
    END IF;
    SELECT x.run_id, x.created INTO v_id, v_created FROM pgdurable._schedule_start(s, v_tick, false) x;
    v_last := v_id;
    v_fired := v_fired + 1;
    tick := v_tick; run_id := v_id;
    outcome := CASE WHEN v_created THEN 'started' ELSE 'existing' END;
    RETURN NEXT;
  END LOOP;
  UPDATE pgdurable.schedules x SET
    next_fire_at = p_next,
    last_tick = coalesce(v_prev, x.last_tick),
    last_run_id = v_last,
    last_fired_at = CASE WHEN v_fired > 0 THEN v_now ELSE x.last_fired_at END,
    fired = x.fired + v_fired,
    skipped = x.skipped + v_skipped,
    updated_at = v_now
  WHERE x.name = p_name;
END
$$;
COMMENT ON FUNCTION pgdurable.fire_schedule(text, timestamptz, timestamptz[], timestamptz) IS
  'Fire due ticks of a schedule once (fenced on next_fire_at, SKIP LOCKED), apply overlap, advance next_fire_at.';

------------------------------------------------------------------------------
-- pgdurable.trigger_schedule(name) -> uuid
-- Start a run of the schedule now, outside its cadence (paused or not; no
-- overlap check, no idempotency key). Recorded in schedule_runs with
-- triggered = true and tick = now; becomes the schedule's last_run_id (so
-- the next tick's overlap policy sees it). PD160 if unknown.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.trigger_schedule(p_name text) RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s    pgdurable.schedules := pgdurable._schedule(p_name);
  v_id uuid;
BEGIN
  SELECT x.run_id INTO v_id FROM pgdurable._schedule_start(s, pgdurable.now(), true) x;
  UPDATE pgdurable.schedules SET last_run_id = v_id, fired = fired + 1,
         updated_at = pgdurable.now()
   WHERE name = p_name;
  RETURN v_id;
END
$$;
COMMENT ON FUNCTION pgdurable.trigger_schedule(text) IS
  'Start a run of a schedule now, outside its cadence; returns the run id (PD160 if unknown).';

------------------------------------------------------------------------------
-- pgdurable.disable_schedule(name, expected, error) -> boolean
-- A worker could not plan the schedule (e.g. a cron expression written by
-- SQL that the cron library rejects): pause it with last_error, fenced on
-- next_fire_at like fire_schedule, so that it does not stay due forever.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.disable_schedule(p_name text, p_expected timestamptz, p_error text)
RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH u AS (
    UPDATE pgdurable.schedules s SET paused = true, last_error = p_error,
           updated_at = pgdurable.now()
     WHERE s.name = p_name AND s.next_fire_at = p_expected AND NOT s.paused
    RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM u)
$$;
COMMENT ON FUNCTION pgdurable.disable_schedule(text, timestamptz, text) IS
  'Pause a schedule that cannot be planned, recording why (last_error); fenced on next_fire_at.';

------------------------------------------------------------------------------
-- pgdurable.due_schedules(queues, limit)
--   -> TABLE(name, cron, every, timezone, catchup, catchup_limit, next_fire_at, db_now)
-- The unpaused schedules of these queues whose next tick is due, oldest
-- first (read without locks: fire_schedule fences on next_fire_at).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.due_schedules(p_queues text[], p_limit integer)
RETURNS TABLE (name text, cron text, every interval, timezone text, catchup text,
               catchup_limit integer, next_fire_at timestamptz, db_now timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT s.name, s.cron, s.every, s.timezone, s.catchup, s.catchup_limit, s.next_fire_at,
         pgdurable.now()
    FROM pgdurable.schedules s
   WHERE NOT s.paused AND s.next_fire_at <= pgdurable.now() AND s.queue = ANY (p_queues)
   ORDER BY s.next_fire_at
   LIMIT p_limit
$$;
COMMENT ON FUNCTION pgdurable.due_schedules(text[], integer) IS
  'Due, unpaused schedules of these queues (no locks; fire_schedule fences).';

------------------------------------------------------------------------------
-- pgdurable.schedule_wakeup(queues) -> double precision
-- Seconds (>= 0) until the next tick of an unpaused schedule in these queues;
-- NULL when there is none. Part of an idle worker's next wake-up.
------------------------------------------------------------------------------
-- (plpgsql: its plan is cached per session; it runs in every idle poll)
CREATE FUNCTION pgdurable.schedule_wakeup(p_queues text[]) RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_at timestamptz;
BEGIN
  SELECT min(s.next_fire_at) INTO v_at
    FROM pgdurable.schedules s
   WHERE NOT s.paused AND s.queue = ANY (p_queues);
  -- (greatest() ignores NULLs: no schedule must stay NULL, not become 0)
  RETURN CASE WHEN v_at IS NOT NULL
              THEN greatest(0, extract(epoch FROM v_at - pgdurable.now()))::float8 END;
END
$$;
COMMENT ON FUNCTION pgdurable.schedule_wakeup(text[]) IS
  'Seconds until the next tick of an unpaused schedule in these queues (NULL: none).';
