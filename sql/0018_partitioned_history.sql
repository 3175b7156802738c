-- 0018_partitioned_history: checkpoints and run_events, the append-mostly
-- history, become range-partitioned by created_at (native declarative
-- partitioning, one partition per UTC day, plus a DEFAULT partition that
-- catches anything outside the daily ones). Retention drops whole partitions
-- (drop_history_partitions) instead of deleting rows; partitions ahead of time
-- come from create_history_partitions (`pgdurable maintain`, or the workers'
-- leader-elected maintenance: pgdurable/partitions.py). docs/scaling.md.
--
-- KEYS. A partitioned table's primary key must include the partition key:
--   checkpoints  PRIMARY KEY (run_id, step)  ->  (run_id, step, created_at)
--   run_events   PRIMARY KEY (run_id, seq)   ->  (run_id, seq, created_at)
--   run_events_step_idx UNIQUE (run_id, step, idx) -> a plain index.
-- Uniqueness of (run_id, step) and (run_id, seq) still holds, by the writers:
-- every insert happens in a transaction that holds the run's row lock
-- (_fenced / FOR UPDATE) and computes the next step/seq under it; no SQL
-- function relies on ON CONFLICT against these keys, and no foreign key
-- points to these tables. checkpoints.run_id and run_events.run_id still
-- REFERENCE runs ON DELETE CASCADE (allowed from a partitioned table).
--
-- MOVE. Existing rows are copied into the partitioned tables and the names are
-- swapped in this one transaction (fine for small tables: it holds an ACCESS
-- EXCLUSIVE lock on both tables while it copies). Daily partitions are created
-- for up to 35 days of existing history and 3 days ahead; older rows land in
-- the DEFAULT partition and are pruned row by row by prune_runs as before.
-- Large installations: see docs/scaling.md ("Moving a large history").
-- Views that read these tables are dropped before and made again after the
-- numbered migrations by migrate (sql/views/).
--
-- Signals stay unpartitioned: pending signals are not history, and the
-- deduplication of send_signal/signal_run (ON CONFLICT (signal_id)) needs a
-- table-wide unique signal_id, which a time-partitioned table cannot have.
-- Consumed signals are deleted with their runs by prune_runs.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

ALTER TABLE pgdurable.checkpoints RENAME TO checkpoints_unpartitioned;
ALTER INDEX pgdurable.checkpoints_pkey RENAME TO checkpoints_unpartitioned_pkey;
ALTER TABLE pgdurable.run_events RENAME TO run_events_unpartitioned;
ALTER INDEX pgdurable.run_events_pkey RENAME TO run_events_unpartitioned_pkey;
ALTER INDEX pgdurable.run_events_step_idx RENAME TO run_events_unpartitioned_step_idx;

------------------------------------------------------------------------------
-- checkpoints: the history of a run's steps, one row per checkpointed step.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.checkpoints (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  step       integer     NOT NULL CHECK (step >= 1),
  token      bigint      NOT NULL,
  state      jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  wake       jsonb,
  PRIMARY KEY (run_id, step, created_at)
) PARTITION BY RANGE (created_at);
COMMENT ON TABLE pgdurable.checkpoints IS
  'History of each run''s steps: one row per checkpointed step. Partitioned by created_at (one '
  'partition per UTC day, plus checkpoints_default); (run_id, step) is unique by its writers.';
COMMENT ON COLUMN pgdurable.checkpoints.run_id IS 'Run the checkpoint belongs to.';
COMMENT ON COLUMN pgdurable.checkpoints.step IS 'Step number this checkpoint completes (1-based).';
COMMENT ON COLUMN pgdurable.checkpoints.token IS 'Lease token under which the step was checkpointed.';
COMMENT ON COLUMN pgdurable.checkpoints.state IS 'State after the step.';
COMMENT ON COLUMN pgdurable.checkpoints.created_at IS
  'When the checkpoint was written (the partition key).';
COMMENT ON COLUMN pgdurable.checkpoints.wake IS
  'What woke the run before this step ran (signal payload, timer), or NULL.';

------------------------------------------------------------------------------
-- run_events: each run's output stream (ctx.emit).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.run_events (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  seq        bigint      NOT NULL CHECK (seq >= 1),
  event      jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  step       integer,
  idx        integer,
  token      bigint,
  final      boolean     NOT NULL DEFAULT false,
  PRIMARY KEY (run_id, seq, created_at)
) PARTITION BY RANGE (created_at);
-- emit_event's overwrite of a retried step's idx-th event (unique by its writer).
CREATE INDEX run_events_step_idx ON pgdurable.run_events (run_id, step, idx)
  WHERE step IS NOT NULL;
COMMENT ON TABLE pgdurable.run_events IS
  'Each run''s output stream (ctx.emit). Partitioned by created_at (one partition per UTC day, '
  'plus run_events_default); (run_id, seq) is unique by its writers.';
COMMENT ON COLUMN pgdurable.run_events.run_id IS 'Run that emitted the event.';
COMMENT ON COLUMN pgdurable.run_events.seq IS 'Sequence number within the run, from 1, gapless.';
COMMENT ON COLUMN pgdurable.run_events.event IS 'The event (JSON).';
COMMENT ON COLUMN pgdurable.run_events.created_at IS 'When it was emitted (the partition key).';
COMMENT ON COLUMN pgdurable.run_events.step IS
  'Step that emitted it (0-based runs.step at the time); NULL for the final event.';
COMMENT ON COLUMN pgdurable.run_events.idx IS
  'Position among the events of its step (a retried step overwrites its events by idx).';
COMMENT ON COLUMN pgdurable.run_events.token IS 'Lease token of the attempt that wrote the event.';
COMMENT ON COLUMN pgdurable.run_events.final IS
  'True for the run''s last event, written in the transaction that made the run terminal '
  '(cleared by retry_run, which revives the run).';

CREATE TABLE pgdurable.checkpoints_default (LIKE pgdurable.checkpoints INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING COMMENTS);
ALTER TABLE pgdurable.checkpoints_default SET (autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.checkpoints_default IS
  'Partition of pgdurable.checkpoints (see pgdurable.history_partitions).';
ALTER TABLE pgdurable.checkpoints ATTACH PARTITION pgdurable.checkpoints_default DEFAULT;
CREATE TABLE pgdurable.run_events_default (LIKE pgdurable.run_events INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING COMMENTS);
ALTER TABLE pgdurable.run_events_default SET (autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.run_events_default IS
  'Partition of pgdurable.run_events (see pgdurable.history_partitions).';
ALTER TABLE pgdurable.run_events ATTACH PARTITION pgdurable.run_events_default DEFAULT;

-- The partitions for existing history (up to 35 days back) and 3 days ahead
-- (as create_history_partitions made them then), then the rows, then the
-- old tables go.
DO $$
DECLARE
  v_today date := (pgdurable.now() AT TIME ZONE 'UTC')::date;
  v_day   date;
  v_table text;
  v_name  text;
BEGIN
  FOR v_day IN SELECT d::date FROM generate_series(v_today - least(35, greatest(0, v_today - (
    SELECT (min(m) AT TIME ZONE 'UTC')::date FROM (
      SELECT min(created_at) AS m FROM pgdurable.checkpoints_unpartitioned
      UNION ALL SELECT min(created_at) FROM pgdurable.run_events_unpartitioned) x))), v_today + 3, interval '1 day') d LOOP
    FOREACH v_table IN ARRAY ARRAY['checkpoints', 'run_events'] LOOP
      v_name := v_table || '_p' || to_char(v_day, 'YYYYMMDD');
      EXECUTE format('CREATE TABLE pgdurable.%I (LIKE pgdurable.%I INCLUDING DEFAULTS '
                     'INCLUDING CONSTRAINTS INCLUDING COMMENTS)', v_name, v_table);
      EXECUTE format('ALTER TABLE pgdurable.%I SET (autovacuum_vacuum_scale_factor = 0.05, '
                     'autovacuum_vacuum_cost_delay = 0)', v_name);
      EXECUTE format('COMMENT ON TABLE pgdurable.%I IS %L', v_name,
                     'Partition of pgdurable.' || v_table || ' (see pgdurable.history_partitions).');
      EXECUTE format('ALTER TABLE pgdurable.%I ATTACH PARTITION pgdurable.%I FOR VALUES FROM (%L) TO (%L)',
                     v_table, v_name, v_day::timestamp AT TIME ZONE 'UTC',
                     (v_day + 1)::timestamp AT TIME ZONE 'UTC');
    END LOOP;
  END LOOP;
END
$$;
INSERT INTO pgdurable.checkpoints (run_id, step, token, state, created_at, wake)
  SELECT run_id, step, token, state, created_at, wake FROM pgdurable.checkpoints_unpartitioned;
INSERT INTO pgdurable.run_events (run_id, seq, event, created_at, step, idx, token, final)
  SELECT run_id, seq, event, created_at, step, idx, token, final
    FROM pgdurable.run_events_unpartitioned;

DROP TABLE pgdurable.checkpoints_unpartitioned;
DROP TABLE pgdurable.run_events_unpartitioned;
