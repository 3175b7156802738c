-- 0024_signal_history_ids: a signal_id seen for the first time costs two
-- primary-key probes, however many days of signal history are kept.
--
-- _signal_dup (0022) looked a signal_id up in signals, then in signal_history
-- by signal_id alone. That table is partitioned by consumed_at, so the second
-- lookup opened, locked and probed the signal_id index of every partition:
-- about 35 with 30 days kept and a few made ahead. Every send with a
-- signal_id paid it (every webhook's, whose id is derived when the sender
-- gives none), and most of those ids are new: at 42 partitions send_signal
-- with an id ran at 0.53-0.73x the rate of one without, 0.86-0.95x since
-- (benchmarks/signal_dedup.py).
--
-- Now pgdurable.signal_history_ids holds (signal_id, consumed_at) of every
-- signal_history row that has a signal_id, in one unpartitioned table. A new
-- id misses there with one probe; a resent one is then read from its history
-- row by (signal_id, consumed_at), in the partition that covers consumed_at.
-- Dedup is unchanged: an id deduplicates for as long as its row exists, in
-- signals or in signal_history (0022).
--
-- The index is kept by statement triggers on signal_history: what
-- move_consumed_signals and drop_history_partitions insert is added, what
-- prune_runs deletes is removed. Dropping a partition fires no trigger, so
-- drop_history_partitions (restated here) removes the ids of the rows it drops.
-- An entry whose history row is gone anyway (a partition dropped by hand) is
-- treated by _signal_dup as a new id, and the stale entry removed.
------------------------------------------------------------------------------
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

CREATE TABLE pgdurable.signal_history_ids (
  signal_id   text        PRIMARY KEY,
  consumed_at timestamptz NOT NULL
);
COMMENT ON TABLE pgdurable.signal_history_ids IS
  'The signal_ids of signal_history, unpartitioned: a new id is told in one probe (_signal_dup). '
  'Kept by triggers on signal_history and by drop_history_partitions.';
COMMENT ON COLUMN pgdurable.signal_history_ids.signal_id IS
  'A signal_id that signal_history holds.';
COMMENT ON COLUMN pgdurable.signal_history_ids.consumed_at IS
  'Its row''s consumed_at: the partition to read it from.';

-- The rows already there, read only after signal_history is locked against
-- writers (SHARE ROW EXCLUSIVE, as creating its triggers would, until this
-- migrate commits; the triggers, in functions/signals.sql, are created in
-- the same transaction), so a move_consumed_signals that commits while this
-- runs is either seen here or waits and fires the triggers; none of its ids
-- is left out.
LOCK TABLE pgdurable.signal_history IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO pgdurable.signal_history_ids (signal_id, consumed_at)
SELECT DISTINCT ON (h.signal_id) h.signal_id, h.consumed_at
  FROM pgdurable.signal_history h
 WHERE h.signal_id IS NOT NULL
 ORDER BY h.signal_id, h.consumed_at DESC;

COMMENT ON TABLE pgdurable.signal_history IS
  'Consumed signals, moved from signals by move_consumed_signals. Partitioned by consumed_at (one '
  'partition per UTC day, plus signal_history_default); signal_id is unique across signals and this '
  'table by its writers (_signal_dup, which finds an id here through signal_history_ids).';
