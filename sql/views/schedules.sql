-- views/schedules.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.schedule_list: every schedule, without its start state.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.schedule_list AS
  SELECT s.name,
         s.cron,
         s.every,
         s.timezone,
         s.task,
         s.queue,
         s.overlap,
         s.catchup,
         s.paused,
         s.next_fire_at,
         s.last_tick,
         s.last_run_id,
         (SELECT r.status FROM pgdurable.runs r WHERE r.id = s.last_run_id) AS last_run_status,
         s.last_fired_at,
         s.fired,
         s.skipped,
         s.last_error,
         s.declared_by,
         s.undeclared_at
    FROM pgdurable.schedules s;
COMMENT ON VIEW pgdurable.schedule_list IS
  'Schedules for operators (no start state): cadence, next tick, paused, last run, counters.';
COMMENT ON COLUMN pgdurable.schedule_list.name IS 'Schedule name.';
COMMENT ON COLUMN pgdurable.schedule_list.cron IS 'Cron expression (NULL when every is set).';
COMMENT ON COLUMN pgdurable.schedule_list.every IS 'Fixed interval (NULL when cron is set).';
COMMENT ON COLUMN pgdurable.schedule_list.timezone IS 'Time zone the cron expression is read in.';
COMMENT ON COLUMN pgdurable.schedule_list.task IS 'Task each tick starts.';
COMMENT ON COLUMN pgdurable.schedule_list.queue IS 'Queue of its runs.';
COMMENT ON COLUMN pgdurable.schedule_list.overlap IS 'skip | allow | cancel_previous.';
COMMENT ON COLUMN pgdurable.schedule_list.catchup IS 'none | latest | all.';
COMMENT ON COLUMN pgdurable.schedule_list.paused IS 'Paused: fires nothing until resumed.';
COMMENT ON COLUMN pgdurable.schedule_list.next_fire_at IS 'The next tick (database clock).';
COMMENT ON COLUMN pgdurable.schedule_list.last_tick IS 'The last tick fired or skipped.';
COMMENT ON COLUMN pgdurable.schedule_list.last_run_id IS 'Its latest run (may name a pruned run).';
COMMENT ON COLUMN pgdurable.schedule_list.last_run_status IS 'Status of that run (NULL if pruned).';
COMMENT ON COLUMN pgdurable.schedule_list.last_fired_at IS 'When a tick last started a run.';
COMMENT ON COLUMN pgdurable.schedule_list.fired IS 'Runs started by ticks and triggers.';
COMMENT ON COLUMN pgdurable.schedule_list.skipped IS 'Ticks the overlap policy skipped.';
COMMENT ON COLUMN pgdurable.schedule_list.last_error IS 'Why a worker paused it (could not plan it).';
COMMENT ON COLUMN pgdurable.schedule_list.declared_by IS '''code'' (app.schedule) or NULL (CLI, SQL).';
COMMENT ON COLUMN pgdurable.schedule_list.undeclared_at IS 'When the code stopped declaring it.';

------------------------------------------------------------------------------
-- pgdurable.schedule_run_list: the runs schedules started, with their status.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.schedule_run_list AS
  SELECT sr.schedule,
         sr.tick,
         sr.triggered,
         sr.run_id,
         r.status,
         r.created_at,
         r.finished_at
    FROM pgdurable.schedule_runs sr
    JOIN pgdurable.runs r ON r.id = sr.run_id;
COMMENT ON VIEW pgdurable.schedule_run_list IS
  'Runs started by schedule ticks and triggers, with their status (schedule_runs + runs).';
COMMENT ON COLUMN pgdurable.schedule_run_list.schedule IS 'Schedule name.';
COMMENT ON COLUMN pgdurable.schedule_run_list.tick IS 'The tick it was started for (trigger: when).';
COMMENT ON COLUMN pgdurable.schedule_run_list.triggered IS 'Started by trigger_schedule, outside the cadence.';
COMMENT ON COLUMN pgdurable.schedule_run_list.run_id IS 'The run.';
COMMENT ON COLUMN pgdurable.schedule_run_list.status IS 'Its status.';
COMMENT ON COLUMN pgdurable.schedule_run_list.created_at IS 'When it was started.';
COMMENT ON COLUMN pgdurable.schedule_run_list.finished_at IS 'When it ended (NULL while going).';
