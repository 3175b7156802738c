-- functions/retention.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.prune_lock_key() -> bigint
-- The transaction advisory-lock key taken by exclusive prune batches, so that
-- at most one automatic pruner works at a time across the fleet. Transaction
-- scoped (pg_try_advisory_xact_lock): safe behind PgBouncer in transaction mode.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT hashtextextended('pgdurable.prune', 0)
$$;
COMMENT ON FUNCTION pgdurable.prune_lock_key() IS
  'Advisory lock key held (per transaction) by exclusive prune batches.';

------------------------------------------------------------------------------
-- pgdurable.prune_runs(older_than, batch, exclusive)
--   -> TABLE(runs, checkpoints, effects, events, signals bigint, locked boolean)
-- (0007's contract.) Also deletes the pruned runs' consumed signals from
-- signal_history, and clears forked_from of their forks (the foreign key's
-- ON DELETE SET NULL, gone in 0022). History rows have no foreign key to runs
-- any more, so deleting a run fires no cascade over every partition.
-- BOUND: a run's history is written while the run lives, in transactions that
-- (then or later) update its row, so none of it is newer than the run's last
-- update (greatest(finished_at, updated_at)). The deletes are bounded by the
-- batch's latest such time plus a day (clock steps): the planner skips every
-- newer partition (with 30 days kept, about 30 of them). A row newer than the
-- bound (a run edited by hand) is left behind, and dropped with its partition
-- by drop_history_partitions (its run is gone).
-- MCP tasks (mcp_tasks) are kept until their TTL has passed too
-- (_mcp_task_kept's test, written out), and their rows go with the run.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_runs(p_older_than interval, p_batch integer DEFAULT 1000,
                                                p_exclusive boolean DEFAULT false)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint,
               signals bigint, locked boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ids uuid[];
  v_until timestamptz;
  v_runs bigint := 0;
  v_cp bigint := 0;
  v_eff bigint := 0;
  v_ev bigint := 0;
  v_sig bigint := 0;
  v_sig1 bigint := 0;
  v_sig2 bigint := 0;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'prune_runs: older_than must be a non-negative interval' USING ERRCODE = 'PD000';
  END IF;
  IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_runs: batch must be between 1 and 100000' USING ERRCODE = 'PD000';
  END IF;
  IF p_exclusive AND NOT pg_try_advisory_xact_lock(pgdurable.prune_lock_key()) THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, false;
    RETURN;
  END IF;
  SELECT array_agg(d.id), max(d.last) + interval '1 day' INTO v_ids, v_until FROM (
    SELECT r.id, greatest(r.finished_at, r.updated_at) AS last FROM pgdurable.runs r
     WHERE r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       AND r.finished_at <= pgdurable.now() - p_older_than
       -- _mcp_task_kept's test written out: a function that reads a table, called per
       -- row, is refused in a cell ("cannot execute a distributed query from a query
       -- on a shard")
       AND NOT EXISTS (SELECT 1 FROM pgdurable.mcp_tasks m WHERE m.run_id = r.id
                          AND (m.ttl IS NULL OR m.created_at + m.ttl > pgdurable.now()))
     ORDER BY r.finished_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED) d;
  IF v_ids IS NOT NULL THEN
    DELETE FROM pgdurable.checkpoints c WHERE c.run_id = ANY (v_ids) AND c.created_at <= v_until;
    GET DIAGNOSTICS v_cp = ROW_COUNT;
    DELETE FROM pgdurable.effects e WHERE e.run_id = ANY (v_ids);
    GET DIAGNOSTICS v_eff = ROW_COUNT;
    DELETE FROM pgdurable.run_events e WHERE e.run_id = ANY (v_ids) AND e.created_at <= v_until;
    GET DIAGNOSTICS v_ev = ROW_COUNT;
    DELETE FROM pgdurable.signals s WHERE s.run_id = ANY (v_ids) OR s.consumed_by = ANY (v_ids);
    GET DIAGNOSTICS v_sig = ROW_COUNT;
    DELETE FROM pgdurable.signal_history h
     WHERE h.consumed_by = ANY (v_ids) AND h.consumed_at <= v_until;
    GET DIAGNOSTICS v_sig1 = ROW_COUNT;
    DELETE FROM pgdurable.mcp_task_inputs i WHERE i.run_id = ANY (v_ids);
    DELETE FROM pgdurable.mcp_tasks m WHERE m.run_id = ANY (v_ids);
    DELETE FROM pgdurable.mcp_remote_tasks m WHERE m.run_id = ANY (v_ids);
    UPDATE pgdurable.runs f SET forked_from = NULL
     WHERE f.forked_from = ANY (v_ids) AND NOT f.id = ANY (v_ids);
    DELETE FROM pgdurable.runs r WHERE r.id = ANY (v_ids);
    GET DIAGNOSTICS v_runs = ROW_COUNT;
  END IF;
  -- pending signals that nobody consumed before their TTL
  WITH doomed AS MATERIALIZED (
    SELECT s.id FROM pgdurable.signals s
     WHERE s.consumed_at IS NULL AND s.expires_at <= pgdurable.now() - p_older_than
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED)
  DELETE FROM pgdurable.signals s USING doomed WHERE s.id = doomed.id;
  GET DIAGNOSTICS v_sig2 = ROW_COUNT;
  RETURN QUERY SELECT v_runs, v_cp, v_eff, v_ev, v_sig + v_sig1 + v_sig2, true;
END
$$;
COMMENT ON FUNCTION pgdurable.prune_runs(interval, integer, boolean) IS
  'Retention: delete one batch of old terminal runs with their history; returns the counts.';

------------------------------------------------------------------------------
-- pgdurable.prune_preview(older_than) (0007's contract, with signal_history).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_preview(p_older_than interval)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint, signals bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' THEN
    RAISE EXCEPTION 'prune_preview: older_than must be a non-negative interval' USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  WITH d AS MATERIALIZED (
    SELECT r.id FROM pgdurable.runs r
     WHERE r.status IN ('completed', 'failed', 'cancelled', 'incompatible')
       AND r.finished_at <= pgdurable.now() - p_older_than
       -- _mcp_task_kept's test written out: a function that reads a table, called per
       -- row, is refused in a cell ("cannot execute a distributed query from a query
       -- on a shard")
       AND NOT EXISTS (SELECT 1 FROM pgdurable.mcp_tasks m WHERE m.run_id = r.id
                          AND (m.ttl IS NULL OR m.created_at + m.ttl > pgdurable.now())))
  SELECT (SELECT count(*) FROM d),
         (SELECT count(*) FROM pgdurable.checkpoints c WHERE c.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.effects e WHERE e.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.run_events e WHERE e.run_id IN (SELECT id FROM d)),
         (SELECT count(*) FROM pgdurable.signals s
           WHERE s.run_id IN (SELECT id FROM d) OR s.consumed_by IN (SELECT id FROM d)
              OR (s.consumed_at IS NULL AND s.expires_at <= pgdurable.now() - p_older_than))
         + (SELECT count(*) FROM pgdurable.signal_history h WHERE h.consumed_by IN (SELECT id FROM d));
END
$$;
COMMENT ON FUNCTION pgdurable.prune_preview(interval) IS
  'Dry run of retention: how many runs and history rows prune_runs would delete.';

------------------------------------------------------------------------------
-- pgdurable.prune_preview_all(older_than)
--   -> TABLE(runs, checkpoints, effects, events, signals, messages, pubsub,
--            graph_checkpoints bigint)
-- The dry run of pgdurable.ops.retention.prune: prune_preview's counts, the
-- consumed thread messages older than the cut-off (prune_thread_messages),
-- the rows of pubsub topics idle that long (prune_pubsub: topics and their
-- events) and the LangGraph checkpoints the policy would delete
-- (prune_graph_checkpoints_preview). Each count is its own statement: in a
-- cell, a query on a table that calls a function reading tables is refused
-- ("cannot execute a distributed query from a query on a shard").
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.prune_preview_all(p_older_than interval)
RETURNS TABLE (runs bigint, checkpoints bigint, effects bigint, events bigint, signals bigint,
               messages bigint, pubsub bigint, graph_checkpoints bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_cut timestamptz;
BEGIN
  SELECT p.runs, p.checkpoints, p.effects, p.events, p.signals
    INTO runs, checkpoints, effects, events, signals
    FROM pgdurable.prune_preview(p_older_than) p;
  v_cut := pgdurable.now() - p_older_than;
  SELECT count(*) INTO messages FROM pgdurable.thread_messages m
   WHERE m.consumed_at IS NOT NULL AND m.consumed_at <= v_cut;
  SELECT count(*) INTO pubsub FROM pgdurable.pubsub_topics t WHERE t.updated_at < v_cut;
  pubsub := pubsub + (SELECT count(*) FROM pgdurable.pubsub_events e
                       WHERE e.topic IN (SELECT t.topic FROM pgdurable.pubsub_topics t
                                          WHERE t.updated_at < v_cut));
  graph_checkpoints := pgdurable.prune_graph_checkpoints_preview();
  RETURN NEXT;
END
$$;
COMMENT ON FUNCTION pgdurable.prune_preview_all(interval) IS
  'Dry run of pgdurable.ops.retention.prune: the runs and history, thread messages, pubsub rows '
  'and LangGraph checkpoints it would delete.';
