-- 0022_partitioned_signals: finished signals become partitioned history, the
-- history tables lose their foreign keys to runs, and the schema takes the
-- Citus-readiness fixes that need no behaviour change (docs/scaling.md).
--
-- SIGNALS. pgdurable.signals keeps what is live: pending signals and those
-- consumed within the last hour or so. move_consumed_signals() (the workers'
-- maintenance, `pgdurable maintain`) moves consumed signals older than
-- p_min_age (default 1 hour) into pgdurable.signal_history, range-partitioned
-- by consumed_at into the same daily partitions as checkpoints and run_events
-- (created by create_history_partitions, dropped whole by
-- drop_history_partitions under the same rule: rows go only when retention
-- would delete the run that consumed them).
--
-- DEDUP IS UNCHANGED. A signal_id deduplicates for as long as its row exists,
-- as before: in signals or in signal_history, until retention deletes it with
-- the run that consumed it. _signal_dup looks in signals first, then in
-- signal_history (two statements in READ COMMITTED: a row moves only from
-- signals to history, so if the first statement misses it, it was already in
-- history, or did not exist). A concurrent first send of the same signal_id is
-- still refused by signals' UNIQUE (signal_id) (ON CONFLICT): a signal is never
-- moved in the transaction that stores it, only p_min_age later, so a sender
-- whose snapshot predates a row's commit still meets it in signals -- unless
-- the sender's REPEATABLE READ transaction has been open for longer than
-- p_min_age (documented).
--
-- FOREIGN KEYS. checkpoints.run_id and run_events.run_id no longer reference
-- runs. With the keys, every deleted run fired a cascade that probed every
-- partition (pruning slowed down with each partition), every inserted history
-- row ran a check query on runs, and dropping a detached partition dropped its
-- foreign key's triggers on runs: an ACCESS EXCLUSIVE lock on runs that stalled
-- every claim and deadlocked with a worker's complete_run (which holds a runs
-- row and inserts into checkpoints while the drop held checkpoints and waited
-- for runs). Every writer of history inserts under the run's row lock, and
-- prune_runs deletes a run's history explicitly; a run deleted by hand leaves
-- rows that the next drop_history_partitions drops with their partition (its
-- rule keeps only rows whose run still exists and is kept).
--
-- CITUS (no cross-shard foreign keys; keys contain the distribution column):
--   signals.run_id -> runs      dropped (prune_runs deletes by run_id)
--   runs.forked_from -> runs    dropped (prune_runs clears forked_from of the
--                               forks of a pruned run, as ON DELETE SET NULL did)
--   run_rewinds PRIMARY KEY (id) -> (run_id, id)
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Foreign keys that go (found by catalog: their names differ by history).
------------------------------------------------------------------------------
DO $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT x.conrelid::regclass AS tbl, x.conname
             FROM pg_catalog.pg_constraint x
            WHERE x.contype = 'f' AND x.conparentid = 0
              AND x.confrelid = 'pgdurable.runs'::regclass
              AND ((x.conrelid IN ('pgdurable.checkpoints'::regclass, 'pgdurable.run_events'::regclass,
                                   'pgdurable.signals'::regclass)
                    AND x.conkey = ARRAY[(SELECT a.attnum FROM pg_catalog.pg_attribute a
                                           WHERE a.attrelid = x.conrelid AND a.attname = 'run_id')])
                   OR (x.conrelid = 'pgdurable.runs'::regclass
                       AND x.conkey = ARRAY[(SELECT a.attnum FROM pg_catalog.pg_attribute a
                                              WHERE a.attrelid = x.conrelid
                                                AND a.attname = 'forked_from')])) LOOP
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.tbl, c.conname);
  END LOOP;
END
$$;
COMMENT ON COLUMN pgdurable.checkpoints.run_id IS
  'Run the checkpoint belongs to (no foreign key: written under the run''s lock, deleted by prune_runs).';
COMMENT ON COLUMN pgdurable.run_events.run_id IS
  'Run that emitted the event (no foreign key: written under the run''s lock, deleted by prune_runs).';
COMMENT ON COLUMN pgdurable.signals.run_id IS
  'Set when the signal addresses one run (signal_run); no foreign key (prune_runs deletes them).';
COMMENT ON COLUMN pgdurable.runs.forked_from IS
  'The run this one was forked from (fork_run); set to NULL when that run is pruned.';

ALTER TABLE pgdurable.run_rewinds DROP CONSTRAINT run_rewinds_pkey;
ALTER TABLE pgdurable.run_rewinds ADD PRIMARY KEY (run_id, id);
DROP INDEX pgdurable.run_rewinds_run_idx;   -- the primary key serves it now

------------------------------------------------------------------------------
-- signal_history: consumed signals, moved out of signals by
-- move_consumed_signals. Same columns, same order (a signals row fits).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.signal_history (
  id          bigint      NOT NULL,
  kind        text        NOT NULL,
  ref         text        NOT NULL,
  payload     jsonb,
  signal_id   text,
  run_id      uuid,
  created_at  timestamptz NOT NULL,
  expires_at  timestamptz,
  consumed_by uuid,
  consumed_at timestamptz NOT NULL,
  woke        uuid[]      NOT NULL DEFAULT '{}',
  PRIMARY KEY (id, consumed_at)
) PARTITION BY RANGE (consumed_at);
-- _signal_dup: a signal_id is looked up here when signals does not have it
CREATE INDEX signal_history_signal_id_idx ON pgdurable.signal_history (signal_id)
  WHERE signal_id IS NOT NULL;
-- prune_runs: the signals a pruned run consumed (a run-addressed signal is
-- consumed by the run it addresses, so run_id = consumed_by when set)
CREATE INDEX signal_history_consumed_by_idx ON pgdurable.signal_history (consumed_by);
COMMENT ON TABLE pgdurable.signal_history IS
  'Consumed signals, moved from signals by move_consumed_signals. Partitioned by consumed_at (one '
  'partition per UTC day, plus signal_history_default); signal_id is unique across signals and this '
  'table by its writers (_signal_dup).';
COMMENT ON COLUMN pgdurable.signal_history.id IS 'Signal sequence number (signals.id).';
COMMENT ON COLUMN pgdurable.signal_history.kind IS 'Signal kind.';
COMMENT ON COLUMN pgdurable.signal_history.ref IS 'Reference within the kind.';
COMMENT ON COLUMN pgdurable.signal_history.payload IS 'JSON payload delivered to the run.';
COMMENT ON COLUMN pgdurable.signal_history.signal_id IS
  'Caller-chosen id: still deduplicates a resend while the row exists.';
COMMENT ON COLUMN pgdurable.signal_history.run_id IS 'Set when the signal addressed one run (signal_run).';
COMMENT ON COLUMN pgdurable.signal_history.created_at IS 'When the signal was sent.';
COMMENT ON COLUMN pgdurable.signal_history.expires_at IS 'Its TTL while it was pending.';
COMMENT ON COLUMN pgdurable.signal_history.consumed_by IS 'Run that consumed the signal.';
COMMENT ON COLUMN pgdurable.signal_history.consumed_at IS 'When it was consumed (the partition key).';
COMMENT ON COLUMN pgdurable.signal_history.woke IS
  'Runs this signal woke when it was sent (what a duplicate send returns).';

-- move_consumed_signals: consumed signals, oldest first
CREATE INDEX signals_consumed_at_idx ON pgdurable.signals (consumed_at)
  WHERE consumed_at IS NOT NULL;

CREATE TABLE pgdurable.signal_history_default (LIKE pgdurable.signal_history INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING COMMENTS);
ALTER TABLE pgdurable.signal_history_default SET (autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.signal_history_default IS
  'Partition of pgdurable.signal_history (see pgdurable.history_partitions).';
ALTER TABLE pgdurable.signal_history ATTACH PARTITION pgdurable.signal_history_default DEFAULT;

------------------------------------------------------------------------------
-- MOVE. Daily signal_history partitions for the days of existing consumed
-- signals (up to 35 days back, as 0018) and 3 days ahead, aligned with the
-- other history tables; then the consumed signals older than an hour move.
-- One statement over the consumed rows (fine for small tables; large ones:
-- docs/scaling.md, "Moving a large history").
------------------------------------------------------------------------------
SELECT pg_advisory_xact_lock(pg_catalog.hashtextextended('pgdurable.history_partitions', 0));
-- Daily partitions for consumed signals (up to 35 days back) and 3 days
-- ahead, as create_history_partitions made them then.
DO $$
DECLARE
  v_today date := (pgdurable.now() AT TIME ZONE 'UTC')::date;
  v_day   date;
  v_table text;
  v_name  text;
BEGIN
  FOR v_day IN SELECT d::date FROM generate_series(greatest(coalesce((SELECT (min(s.consumed_at) AT TIME ZONE 'UTC')::date
                      FROM pgdurable.signals s WHERE s.consumed_at IS NOT NULL),
                     v_today), v_today - 35), v_today + 3, interval '1 day') d LOOP
    FOREACH v_table IN ARRAY ARRAY['signal_history'] LOOP
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
WITH moved AS (
  DELETE FROM pgdurable.signals s
   WHERE s.consumed_at IS NOT NULL AND s.consumed_at <= pgdurable.now() - interval '1 hour'
  RETURNING s.id, s.kind, s.ref, s.payload, s.signal_id, s.run_id, s.created_at, s.expires_at,
            s.consumed_by, s.consumed_at, s.woke)
INSERT INTO pgdurable.signal_history (id, kind, ref, payload, signal_id, run_id, created_at,
                                      expires_at, consumed_by, consumed_at, woke)
SELECT * FROM moved;
