-- 0031_idempotency_reconcile: an idempotency key whose outcome is unknown can
-- be resolved by the caller's reconcile function (issue 37).
--
-- A key's outcome is unknown in two cases: its owner's running claim lapsed
-- (the owner died or stalled after it may have started fn), or its owner was
-- interrupted while fn ran and recorded it failed with type 'Interrupted'.
-- Until now a lapsed claim was simply taken over (fn ran again) and an
-- Interrupted key answered EffectFailed until its ttl, even when the caller
-- could have found out what happened.
--
-- pgdurable.idempotency_claim_v2 claims like idempotency_claim and says
-- whether the key it claimed had an unknown outcome (`unknown`). A caller that
-- reconciles (p_reconcile) may also take over an Interrupted key while its
-- record is kept; it then asks its reconcile function instead of executing.
-- idempotency_claim stays as it was for libraries of earlier versions.
--
-- The checkpoint record of define_durable_task may also be the kit's own
-- (camelCase, version 2); the column comment says so.
------------------------------------------------------------------------------
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

COMMENT ON COLUMN pgdurable.task_checkpoints.record IS
  'The checkpoint record (JSON object), in one of two formats. pgdurable''s (version 1): '
  'version, definition_id, revision, next_step_index, attempt_count, max_attempts, '
  'deadline_at_ms (epoch ms or null), status (ready|running|completed|failed), state, '
  'in_flight_step (id of a reconcile step started but not confirmed, else null), error (last '
  'failure {type, message, step?}, else null). The kit''s (version 2): version, definitionId, '
  'revision, nextStepIndex, attemptCount, maxAttempts, deadlineAtMs, status, state.';

-- The app role calls it (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly)
VALUES ('pgdurable.idempotency_claim_v2(text,text,interval,boolean)', false);
