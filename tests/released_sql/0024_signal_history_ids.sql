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

------------------------------------------------------------------------------
-- Triggers: signal_history's rows with a signal_id, mirrored (one statement
-- each, over the statement's transition table).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._signal_history_ids_add() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  INSERT INTO pgdurable.signal_history_ids AS i (signal_id, consumed_at)
  SELECT DISTINCT ON (n.signal_id) n.signal_id, n.consumed_at
    FROM new_rows n
   WHERE n.signal_id IS NOT NULL
   ORDER BY n.signal_id, n.consumed_at DESC
  ON CONFLICT (signal_id) DO UPDATE SET consumed_at = excluded.consumed_at;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_history_ids_add() IS
  'Internal: add the signal_ids a statement inserted into signal_history to signal_history_ids.';

CREATE FUNCTION pgdurable._signal_history_ids_remove() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  DELETE FROM pgdurable.signal_history_ids i
   USING old_rows o
   WHERE i.signal_id = o.signal_id AND i.consumed_at = o.consumed_at;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._signal_history_ids_remove() IS
  'Internal: remove the signal_ids a statement deleted from signal_history from signal_history_ids.';

CREATE TRIGGER signal_history_ids_add AFTER INSERT ON pgdurable.signal_history
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_add();
CREATE TRIGGER signal_history_ids_remove AFTER DELETE ON pgdurable.signal_history
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_remove();
-- an UPDATE (only by hand: no function updates history) is a remove and an add
CREATE TRIGGER signal_history_ids_update_remove AFTER UPDATE ON pgdurable.signal_history
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_remove();
CREATE TRIGGER signal_history_ids_update_add AFTER UPDATE ON pgdurable.signal_history
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._signal_history_ids_add();

-- The rows already there, read only now: creating the triggers locked
-- signal_history against writers (SHARE ROW EXCLUSIVE, until this migration
-- commits), so a move_consumed_signals that commits while this runs is either
-- seen here or waits and fires the triggers; none of its ids is left out.
INSERT INTO pgdurable.signal_history_ids (signal_id, consumed_at)
SELECT DISTINCT ON (h.signal_id) h.signal_id, h.consumed_at
  FROM pgdurable.signal_history h
 WHERE h.signal_id IS NOT NULL
 ORDER BY h.signal_id, h.consumed_at DESC;

------------------------------------------------------------------------------
-- pgdurable._signal_dup(signal_id, kind, ref, payload, run_id) -> uuid[]
-- Internal (0005's contract, 0022's tables): NULL when no signal with this
-- signal_id exists, in signals or in signal_history. Otherwise the existing
-- signal must carry the same kind, ref (ignored when p_ref is NULL), payload
-- and run_id, and its `woke` ids are returned; any difference raises PD008 and
-- nothing changes. signals first, then signal_history through
-- signal_history_ids (one probe; the history row itself only for a resend).
-- A row only ever moves from signals to signal_history, its id entry in the
-- same transaction, so a miss in signals followed by a miss in the ids means
-- the id does not exist.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._signal_dup(p_signal_id text, p_kind text, p_ref text,
                                                 p_payload jsonb, p_run_id uuid)
RETURNS uuid[]
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  s record;
  v_at timestamptz;
BEGIN
  IF p_signal_id IS NULL THEN
    RETURN NULL;
  END IF;
  SELECT x.kind, x.ref, x.payload, x.run_id, x.woke INTO s
    FROM pgdurable.signals x WHERE x.signal_id = p_signal_id;
  IF NOT FOUND THEN
    SELECT i.consumed_at INTO v_at
      FROM pgdurable.signal_history_ids i WHERE i.signal_id = p_signal_id;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
    SELECT h.kind, h.ref, h.payload, h.run_id, h.woke INTO s
      FROM pgdurable.signal_history h
     WHERE h.signal_id = p_signal_id AND h.consumed_at = v_at
     LIMIT 1;
    IF NOT FOUND THEN
      -- its row is gone (a partition dropped by hand): a new id; the entry is stale
      DELETE FROM pgdurable.signal_history_ids i
       WHERE i.signal_id = p_signal_id AND i.consumed_at = v_at;
      RETURN NULL;
    END IF;
  END IF;
  IF s.kind IS DISTINCT FROM p_kind OR (p_ref IS NOT NULL AND s.ref IS DISTINCT FROM p_ref)
     OR s.payload IS DISTINCT FROM p_payload OR s.run_id IS DISTINCT FROM p_run_id THEN
    RAISE EXCEPTION 'signal_id % was already sent with another kind, ref, payload or run',
      p_signal_id USING ERRCODE = 'PD008';
  END IF;
  RETURN s.woke;
END
$$;

------------------------------------------------------------------------------
-- pgdurable.drop_history_partitions(older_than)
--   -> TABLE(history_table, partition_name, rows_dropped, rows_kept bigint)
-- (0022's contract and body.) Also removes from signal_history_ids the ids of
-- a dropped signal_history partition's rows, before the rows it keeps go to
-- the DEFAULT partition (whose insert adds theirs back): a DROP fires no
-- trigger.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.drop_history_partitions(p_older_than interval)
RETURNS TABLE (history_table text, partition_name text, rows_dropped bigint, rows_kept bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET lock_timeout = '5s' AS $$
DECLARE
  v_cutoff timestamptz;
  p record;
  v_col text;
  v_total bigint;
  v_keep bigint;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'drop_history_partitions: older_than must be a non-negative interval'
      USING ERRCODE = 'PD000';
  END IF;
  v_cutoff := pgdurable.now() - p_older_than;
  PERFORM pg_advisory_xact_lock(pgdurable.history_lock_key());
  FOR p IN SELECT h.history_table AS tbl, h.partition_name AS part
             FROM pgdurable.history_partitions h
            WHERE NOT h.is_default AND h.range_to <= v_cutoff
            ORDER BY h.range_to, h.history_table LOOP
    v_col := CASE p.tbl WHEN 'signal_history' THEN 'consumed_by' ELSE 'run_id' END;
    EXECUTE format('SELECT count(*), count(*) FILTER (WHERE r.id IS NOT NULL AND NOT ('
                   'r.status IN (''completed'', ''failed'', ''cancelled'', ''incompatible'') '
                   'AND r.finished_at <= $1)) '
                   'FROM pgdurable.%I d LEFT JOIN pgdurable.runs r ON r.id = d.%I',
                   p.part, v_col) INTO v_total, v_keep USING v_cutoff;
    EXECUTE format('ALTER TABLE pgdurable.%I DETACH PARTITION pgdurable.%I', p.tbl, p.part);
    IF p.tbl = 'signal_history' THEN
      EXECUTE format('DELETE FROM pgdurable.signal_history_ids i USING pgdurable.%I d '
                     'WHERE i.signal_id = d.signal_id AND i.consumed_at = d.consumed_at',
                     p.part);
    END IF;
    IF v_keep > 0 THEN
      -- the range is no longer covered: these rows land in the DEFAULT partition
      EXECUTE format('INSERT INTO pgdurable.%I SELECT d.* FROM pgdurable.%I d '
                     'JOIN pgdurable.runs r ON r.id = d.%I WHERE NOT ('
                     'r.status IN (''completed'', ''failed'', ''cancelled'', ''incompatible'') '
                     'AND r.finished_at <= $1)', p.tbl, p.part, v_col) USING v_cutoff;
      GET DIAGNOSTICS v_keep = ROW_COUNT;
    END IF;
    EXECUTE format('DROP TABLE pgdurable.%I', p.part);
    history_table := p.tbl;
    partition_name := p.part;
    rows_dropped := v_total - v_keep;
    rows_kept := v_keep;
    RETURN NEXT;
  END LOOP;
END
$$;

COMMENT ON TABLE pgdurable.signal_history IS
  'Consumed signals, moved from signals by move_consumed_signals. Partitioned by consumed_at (one '
  'partition per UTC day, plus signal_history_default); signal_id is unique across signals and this '
  'table by its writers (_signal_dup, which finds an id here through signal_history_ids).';
