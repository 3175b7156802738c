-- 0004_durable_tasks: checkpoint records of define_durable_task tasks, and
-- the idempotency-key state machine of with_idempotency.
--
-- Tables live in 0001_schema (task_checkpoints, idempotency_keys); this file
-- adds one SQL function per transition. Time is pgdurable.now() only.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

-- The record gained two fields since 0001 described it.
COMMENT ON COLUMN pgdurable.task_checkpoints.record IS
  'The checkpoint record (JSON object): version, definition_id, revision, next_step_index, '
  'attempt_count, max_attempts, deadline_at_ms (epoch ms or null), status '
  '(ready|running|completed|failed), state, in_flight_step (id of a reconcile step started '
  'but not confirmed, else null), error (last failure {type, message, step?}, else null).';

-- Expired keys are found by expires_at (pruning; pitfall 18: no unbounded growth).
CREATE INDEX idempotency_keys_expires_at_idx ON pgdurable.idempotency_keys (expires_at);
