-- functions/task_checkpoints.sql: the current body of each function below.

CREATE OR REPLACE FUNCTION pgdurable.task_lock_key(p_task_id text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT pg_catalog.hashtextextended(
    pg_catalog.textcat('pgdurable.task_checkpoints:'::pg_catalog.text, p_task_id),
    0::pg_catalog.int8)
$$;
COMMENT ON FUNCTION pgdurable.task_lock_key(text) IS
  'Advisory-lock key of a durable task id (held by PostgresDurableStore.exclusive).';

-- pgdurable.task_checkpoint_load(task_id) -> jsonb
-- The stored record of a task id, or NULL when there is none.
CREATE OR REPLACE FUNCTION pgdurable.task_checkpoint_load(p_task_id text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT record FROM pgdurable.task_checkpoints WHERE task_id = p_task_id
$$;
COMMENT ON FUNCTION pgdurable.task_checkpoint_load(text) IS
  'Load the checkpoint record of a durable task id (NULL when none).';

-- pgdurable.task_checkpoint_save(task_id, record) -> void
-- Insert or replace the record of a task id (JSONB upsert), stamping
-- updated_at. Raises PD000 (InvalidInput) for an empty id or a record that is
-- not a JSON object. The caller holds the task's advisory lock.
CREATE OR REPLACE FUNCTION pgdurable.task_checkpoint_save(p_task_id text, p_record jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  IF p_task_id IS NULL OR p_task_id = '' THEN
    RAISE EXCEPTION 'task id must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_record IS NULL OR jsonb_typeof(p_record) <> 'object' THEN
    RAISE EXCEPTION 'checkpoint record must be a JSON object' USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.task_checkpoints AS t (task_id, record, updated_at)
  VALUES (p_task_id, p_record, pgdurable.now())
  ON CONFLICT (task_id) DO UPDATE
    SET record = EXCLUDED.record, updated_at = EXCLUDED.updated_at;
END
$$;
COMMENT ON FUNCTION pgdurable.task_checkpoint_save(text, jsonb) IS
  'Save (upsert) the checkpoint record of a durable task id.';
