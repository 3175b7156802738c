-- functions/langgraph.sql: the current body of each function below.

------------------------------------------------------------------------------
-- lg_fence: raise PD001 unless (key, owner, token) is the live lease
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.lg_fence(p_key bytea, p_owner bytea, p_token bigint) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
BEGIN
  IF p_key IS NULL THEN
    RETURN;
  END IF;
  PERFORM 1 FROM pgdurable.leases l
   WHERE l.key_hash = sha256(p_key) AND l.owner = p_owner AND l.token = p_token
     AND l.expires_at > pgdurable.now();
  IF NOT FOUND THEN
    RAISE EXCEPTION 'the lease of LangGraph thread % (token %) is no longer held',
      pgdurable.lease_display(p_key), p_token USING ERRCODE = 'PD001';
  END IF;
END $$;
COMMENT ON FUNCTION pgdurable.lg_fence(bytea, bytea, bigint) IS
  'Fence for a thread written under its lease: PD001 unless (key, owner, token) is live; '
  'a NULL key means unfenced.';

------------------------------------------------------------------------------
-- lg_put: save one checkpoint (fenced when a lease is given)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.lg_put(p_thread text, p_ns text, p_id text, p_parent text,
                                 p_type text, p_checkpoint bytea, p_metadata jsonb,
                                 p_key bytea DEFAULT NULL, p_owner bytea DEFAULT NULL,
                                 p_token bigint DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
BEGIN
  PERFORM pgdurable.lg_fence(p_key, p_owner, p_token);
  INSERT INTO pgdurable.lg_checkpoints AS c
         (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
          checkpoint, metadata)
  VALUES (p_thread, p_ns, p_id, p_parent, p_metadata ->> 'run_id', p_type, p_checkpoint,
          p_metadata)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE
     SET parent_checkpoint_id = EXCLUDED.parent_checkpoint_id, run_id = EXCLUDED.run_id,
         type = EXCLUDED.type, checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
END $$;
COMMENT ON FUNCTION pgdurable.lg_put(text, text, text, text, text, bytea, jsonb, bytea, bytea,
                                     bigint) IS
  'Save (or overwrite) one LangGraph checkpoint; with a lease (key, owner, token), '
  'only while that lease is live (else PD001).';

------------------------------------------------------------------------------
-- lg_put_writes: save a task's pending writes (fenced when a lease is given)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.lg_put_writes(p_thread text, p_ns text, p_id text, p_task text,
                                        p_path text, p_idx integer[], p_channels text[],
                                        p_types text[], p_values bytea[],
                                        p_key bytea DEFAULT NULL, p_owner bytea DEFAULT NULL,
                                        p_token bigint DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
BEGIN
  PERFORM pgdurable.lg_fence(p_key, p_owner, p_token);
  -- special channels (negative idx) are overwritten; ordinary writes first-wins
  INSERT INTO pgdurable.lg_writes AS w
         (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value,
          task_path)
  SELECT p_thread, p_ns, p_id, p_task, u.idx, u.channel, u.type, u.value, p_path
    FROM unnest(p_idx, p_channels, p_types, p_values) AS u(idx, channel, type, value)
  ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE
     SET channel = EXCLUDED.channel, type = EXCLUDED.type, value = EXCLUDED.value,
         task_path = EXCLUDED.task_path
   WHERE w.idx < 0;
END $$;
COMMENT ON FUNCTION pgdurable.lg_put_writes(text, text, text, text, text, integer[], text[],
                                            text[], bytea[], bytea, bytea, bigint) IS
  'Save a LangGraph task''s pending writes after a checkpoint (special channels overwrite, '
  'others keep the first); fenced like lg_put.';

------------------------------------------------------------------------------
-- lg_list: checkpoints with their pending writes, newest first
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.lg_list(p_thread text, p_ns text, p_id text, p_before text,
                                  p_filter jsonb, p_limit integer)
RETURNS TABLE (thread_id text, checkpoint_ns text, checkpoint_id text,
               parent_checkpoint_id text, type text, checkpoint bytea, metadata jsonb,
               w_task text[], w_channel text[], w_type text[], w_value bytea[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type,
         c.checkpoint, c.metadata, w.tasks, w.channels, w.types, w."values"
    FROM pgdurable.lg_checkpoints c
    LEFT JOIN LATERAL (
      SELECT array_agg(x.task_id ORDER BY x.task_path, x.task_id, x.idx) AS tasks,
             array_agg(x.channel ORDER BY x.task_path, x.task_id, x.idx) AS channels,
             array_agg(x.type ORDER BY x.task_path, x.task_id, x.idx) AS types,
             array_agg(x.value ORDER BY x.task_path, x.task_id, x.idx) AS "values"
        FROM pgdurable.lg_writes x
       WHERE x.thread_id = c.thread_id AND x.checkpoint_ns = c.checkpoint_ns
         AND x.checkpoint_id = c.checkpoint_id
    ) w ON true
   WHERE (p_thread IS NULL OR c.thread_id = p_thread)
     AND (p_ns IS NULL OR c.checkpoint_ns = p_ns)
     AND (p_id IS NULL OR c.checkpoint_id = p_id)
     AND (p_before IS NULL OR c.checkpoint_id < p_before)
     AND (p_filter IS NULL OR c.metadata @> p_filter)
   ORDER BY c.checkpoint_id DESC
   LIMIT p_limit
$$;
COMMENT ON FUNCTION pgdurable.lg_list(text, text, text, text, jsonb, integer) IS
  'LangGraph checkpoints matching (thread, namespace, id, before id, metadata filter; NULL '
  'matches all), newest first, at most p_limit (NULL: all), with their writes as arrays.';

------------------------------------------------------------------------------
-- lg_get: one checkpoint (the newest of the thread namespace when p_id is NULL)
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.lg_get(p_thread text, p_ns text, p_id text)
RETURNS TABLE (checkpoint_id text, parent_checkpoint_id text, type text, checkpoint bytea,
               metadata jsonb, w_task text[], w_channel text[], w_type text[],
               w_value bytea[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
BEGIN
  -- PL/pgSQL (not SQL) so that the session caches the plan of this hot read
  IF p_id IS NULL THEN
    SELECT k.checkpoint_id INTO p_id FROM pgdurable.lg_checkpoints k
     WHERE k.thread_id = p_thread AND k.checkpoint_ns = p_ns
     ORDER BY k.checkpoint_id DESC LIMIT 1;
    IF NOT FOUND THEN
      RETURN;
    END IF;
  END IF;
  RETURN QUERY
  SELECT c.checkpoint_id, c.parent_checkpoint_id, c.type, c.checkpoint, c.metadata,
         w.tasks, w.channels, w.types, w.vals
    FROM pgdurable.lg_checkpoints c
    LEFT JOIN LATERAL (
      SELECT array_agg(x.task_id ORDER BY x.task_path, x.task_id, x.idx) AS tasks,
             array_agg(x.channel ORDER BY x.task_path, x.task_id, x.idx) AS channels,
             array_agg(x.type ORDER BY x.task_path, x.task_id, x.idx) AS types,
             array_agg(x.value ORDER BY x.task_path, x.task_id, x.idx) AS vals
        FROM pgdurable.lg_writes x
       WHERE x.thread_id = p_thread AND x.checkpoint_ns = p_ns AND x.checkpoint_id = p_id
    ) w ON true
   WHERE c.thread_id = p_thread AND c.checkpoint_ns = p_ns AND c.checkpoint_id = p_id;
END $$;
COMMENT ON FUNCTION pgdurable.lg_get(text, text, text) IS
  'One LangGraph checkpoint with its writes: p_id, or the newest of (thread, namespace).';

------------------------------------------------------------------------------
-- lg_delete_threads / lg_delete_for_runs / lg_copy_thread / lg_prune
------------------------------------------------------------------------------
-- lg_delete_threads: delete every checkpoint and write of the threads
CREATE OR REPLACE FUNCTION pgdurable.lg_delete_threads(p_threads text[]) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  WITH w AS (DELETE FROM pgdurable.lg_writes WHERE thread_id = ANY (p_threads) RETURNING 1),
       c AS (DELETE FROM pgdurable.lg_checkpoints WHERE thread_id = ANY (p_threads)
             RETURNING 1)
  SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM w)
$$;
COMMENT ON FUNCTION pgdurable.lg_delete_threads(text[]) IS
  'Delete every checkpoint and write of the threads; returns the rows deleted.';

-- lg_delete_for_runs: delete the checkpoints (and writes) saved by the runs
CREATE OR REPLACE FUNCTION pgdurable.lg_delete_for_runs(p_runs text[]) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  WITH c AS (DELETE FROM pgdurable.lg_checkpoints WHERE run_id = ANY (p_runs)
             RETURNING thread_id, checkpoint_ns, checkpoint_id),
       w AS (DELETE FROM pgdurable.lg_writes x USING c
              WHERE x.thread_id = c.thread_id AND x.checkpoint_ns = c.checkpoint_ns
                AND x.checkpoint_id = c.checkpoint_id RETURNING 1)
  SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM w)
$$;
COMMENT ON FUNCTION pgdurable.lg_delete_for_runs(text[]) IS
  'Delete the checkpoints whose metadata.run_id is one of p_runs, with their writes.';

-- lg_copy_thread: copy a thread's whole parent chain and writes to another thread id
CREATE OR REPLACE FUNCTION pgdurable.lg_copy_thread(p_source text, p_target text) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  WITH c AS (
    INSERT INTO pgdurable.lg_checkpoints
           (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
            checkpoint, metadata, created_at)
    SELECT p_target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type,
           checkpoint, metadata, created_at
      FROM pgdurable.lg_checkpoints WHERE thread_id = p_source
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO NOTHING
    RETURNING 1),
  w AS (
    INSERT INTO pgdurable.lg_writes
           (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value,
            task_path)
    SELECT p_target, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, value,
           task_path
      FROM pgdurable.lg_writes WHERE thread_id = p_source
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING
    RETURNING 1)
  SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM w)
$$;
COMMENT ON FUNCTION pgdurable.lg_copy_thread(text, text) IS
  'Copy every checkpoint and write of thread p_source to thread p_target (the whole '
  'parent chain); rows the target already has are kept.';

-- lg_prune_keep_latest: keep only the newest checkpoint of each namespace
CREATE OR REPLACE FUNCTION pgdurable.lg_prune_keep_latest(p_threads text[]) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  WITH heads AS (
    SELECT DISTINCT ON (thread_id, checkpoint_ns) thread_id, checkpoint_ns, checkpoint_id
      FROM pgdurable.lg_checkpoints WHERE thread_id = ANY (p_threads)
     ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC),
  c AS (
    DELETE FROM pgdurable.lg_checkpoints k
     WHERE k.thread_id = ANY (p_threads)
       AND NOT EXISTS (SELECT 1 FROM heads h
                        WHERE h.thread_id = k.thread_id AND h.checkpoint_ns = k.checkpoint_ns
                          AND h.checkpoint_id = k.checkpoint_id)
    RETURNING 1),
  w AS (
    DELETE FROM pgdurable.lg_writes x
     WHERE x.thread_id = ANY (p_threads)
       AND NOT EXISTS (SELECT 1 FROM heads h
                        WHERE h.thread_id = x.thread_id AND h.checkpoint_ns = x.checkpoint_ns
                          AND h.checkpoint_id = x.checkpoint_id)
    RETURNING 1),
  orphan AS (
    UPDATE pgdurable.lg_checkpoints k SET parent_checkpoint_id = NULL
      FROM heads h
     WHERE k.thread_id = h.thread_id AND k.checkpoint_ns = h.checkpoint_ns
       AND k.checkpoint_id = h.checkpoint_id AND k.parent_checkpoint_id IS NOT NULL
    RETURNING 1)
  SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM w) + 0 * (SELECT count(*) FROM orphan)
$$;
COMMENT ON FUNCTION pgdurable.lg_prune_keep_latest(text[]) IS
  'Keep only the newest checkpoint (and its writes) of each namespace of the threads; the '
  'kept checkpoint loses its (deleted) parent. Returns the rows deleted.';

------------------------------------------------------------------------------
-- retention: policy and one batch
------------------------------------------------------------------------------
-- lg_set_retention: set (or, with two NULLs, remove) the retention policy
CREATE OR REPLACE FUNCTION pgdurable.lg_set_retention(p_keep_last integer, p_max_age interval)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
BEGIN
  IF p_keep_last IS NOT NULL AND p_keep_last < 1 THEN
    RAISE EXCEPTION 'keep_last must be >= 1, got %', p_keep_last USING ERRCODE = 'PD000';
  END IF;
  IF p_max_age IS NOT NULL AND p_max_age < interval '0' THEN
    RAISE EXCEPTION 'max_age must not be negative' USING ERRCODE = 'PD000';
  END IF;
  IF p_keep_last IS NULL AND p_max_age IS NULL THEN
    DELETE FROM pgdurable.lg_retention;
    RETURN;
  END IF;
  INSERT INTO pgdurable.lg_retention (id, keep_last, max_age)
  VALUES (true, p_keep_last, p_max_age)
  ON CONFLICT (id) DO UPDATE SET keep_last = EXCLUDED.keep_last, max_age = EXCLUDED.max_age;
END $$;
COMMENT ON FUNCTION pgdurable.lg_set_retention(integer, interval) IS
  'Set the LangGraph checkpoint retention policy (both NULL: no policy, keep everything).';

-- prune_graph_checkpoints: one retention batch of LangGraph checkpoints
CREATE OR REPLACE FUNCTION pgdurable.prune_graph_checkpoints(p_batch integer) RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  WITH policy AS (
    SELECT coalesce(r.keep_last, 1) AS keep_last, r.max_age FROM pgdurable.lg_retention r),
  ranked AS (
    SELECT k.thread_id, k.checkpoint_ns, k.checkpoint_id, k.created_at,
           row_number() OVER (PARTITION BY k.thread_id, k.checkpoint_ns
                              ORDER BY k.checkpoint_id DESC) AS rn
      FROM pgdurable.lg_checkpoints k
     WHERE EXISTS (SELECT 1 FROM policy)),
  victims AS (
    SELECT r.thread_id, r.checkpoint_ns, r.checkpoint_id
      FROM ranked r, policy p
     WHERE r.rn > p.keep_last
       AND (p.max_age IS NULL OR r.created_at <= pgdurable.now() - p.max_age)
     LIMIT p_batch),
  c AS (
    DELETE FROM pgdurable.lg_checkpoints k USING victims v
     WHERE k.thread_id = v.thread_id AND k.checkpoint_ns = v.checkpoint_ns
       AND k.checkpoint_id = v.checkpoint_id
    RETURNING 1),
  w AS (
    DELETE FROM pgdurable.lg_writes x USING victims v
     WHERE x.thread_id = v.thread_id AND x.checkpoint_ns = v.checkpoint_ns
       AND x.checkpoint_id = v.checkpoint_id
    RETURNING 1)
  SELECT (SELECT count(*) FROM c) + 0 * (SELECT count(*) FROM w)
$$;
COMMENT ON FUNCTION pgdurable.prune_graph_checkpoints(integer) IS
  'One retention batch: delete at most p_batch LangGraph checkpoints (with their writes) '
  'that the policy in pgdurable.lg_retention does not keep (beyond the last keep_last of '
  'their thread namespace and, with max_age, older than it). Returns the checkpoints deleted.';

-- prune_graph_checkpoints_preview: what the policy would delete now (dry run)
CREATE OR REPLACE FUNCTION pgdurable.prune_graph_checkpoints_preview() RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  WITH policy AS (
    SELECT coalesce(r.keep_last, 1) AS keep_last, r.max_age FROM pgdurable.lg_retention r),
  ranked AS (
    SELECT k.created_at,
           row_number() OVER (PARTITION BY k.thread_id, k.checkpoint_ns
                              ORDER BY k.checkpoint_id DESC) AS rn
      FROM pgdurable.lg_checkpoints k
     WHERE EXISTS (SELECT 1 FROM policy))
  SELECT count(*) FROM ranked r, policy p
   WHERE r.rn > p.keep_last
     AND (p.max_age IS NULL OR r.created_at <= pgdurable.now() - p.max_age)
$$;
COMMENT ON FUNCTION pgdurable.prune_graph_checkpoints_preview() IS
  'How many LangGraph checkpoints the retention policy would delete now (dry run).';
