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

------------------------------------------------------------------------------
-- pgdurable.idempotency_claim_v2(key, owner, lease, reconcile)
--   -> (claimed, status, owner, result, error, expires_at, unknown)
-- One statement decides, on the row locked FOR UPDATE:
--   * no row: insert a running row owned by p_owner (claimed, unknown false);
--   * a row whose expires_at has passed, in any status: take it over
--     (claimed); unknown is true when it was still running (a lapsed claim:
--     its owner may have started fn), false for a kept outcome that expired;
--   * with p_reconcile, a failed row of error type 'Interrupted' whose record
--     is still kept: take it over (claimed, unknown true);
--   * otherwise the row is returned as it stands (claimed false: running by
--     someone else, succeeded with result, failed with error).
-- A bad key, owner or lease raises PD000 and changes nothing.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.idempotency_claim_v2(p_key text, p_owner text, p_lease interval,
                                               p_reconcile boolean DEFAULT false)
RETURNS TABLE (claimed boolean, status text, owner text, result jsonb, error jsonb,
               expires_at timestamptz, unknown boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now         timestamptz := pgdurable.now();
  k             pgdurable.idempotency_keys;
  v_interrupted boolean;
BEGIN
  IF p_key IS NULL OR p_key = '' THEN
    RAISE EXCEPTION 'idempotency key must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_owner IS NULL OR p_owner = '' THEN
    RAISE EXCEPTION 'owner must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_lease IS NULL OR p_lease <= interval '0' THEN
    RAISE EXCEPTION 'lease must be positive' USING ERRCODE = 'PD000';
  END IF;
  LOOP
    SELECT * INTO k FROM pgdurable.idempotency_keys i WHERE i.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
      INSERT INTO pgdurable.idempotency_keys (key, status, owner, result, error, created_at,
                                              expires_at)
      VALUES (p_key, 'running', p_owner, NULL, NULL, v_now, v_now + p_lease)
      ON CONFLICT (key) DO NOTHING;
      IF FOUND THEN
        RETURN QUERY SELECT true, 'running'::text, p_owner, NULL::jsonb, NULL::jsonb,
                            v_now + p_lease, false;
        RETURN;
      END IF;
      CONTINUE;  -- another caller inserted it first: read (and lock) its row
    END IF;
    v_interrupted := k.status = 'failed' AND k.error ->> 'type' = 'Interrupted'
                     AND k.expires_at > v_now;
    IF k.expires_at <= v_now OR (p_reconcile AND v_interrupted) THEN
      UPDATE pgdurable.idempotency_keys i
         SET status = 'running', owner = p_owner, result = NULL, error = NULL,
             created_at = v_now, expires_at = v_now + p_lease
       WHERE i.key = p_key;
      RETURN QUERY SELECT true, 'running'::text, p_owner, NULL::jsonb, NULL::jsonb,
                          v_now + p_lease, k.status = 'running' OR v_interrupted;
      RETURN;
    END IF;
    RETURN QUERY SELECT false, k.status, k.owner, k.result, k.error, k.expires_at, false;
    RETURN;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.idempotency_claim_v2(text, text, interval, boolean) IS
  'Claim an idempotency key or return it as it stands; unknown = the claimed key''s outcome is '
  'unknown (a lapsed claim, or with p_reconcile an Interrupted key): reconcile it.';

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
