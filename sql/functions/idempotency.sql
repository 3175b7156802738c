-- functions/idempotency.sql: the current body of each function below.

------------------------------------------------------------------------------
-- Idempotency keys (with_idempotency)
--
-- A row is `running` while its owner executes the effect; then expires_at is
-- the owner's LEASE expiry (renewed by heartbeat). Once `succeeded`/`failed`,
-- expires_at is the end of the key's retention (ttl): until then every caller
-- gets the stored result/error; after it the key may execute again.
-- A row whose expires_at <= pgdurable.now() is up for grabs in every status:
-- that is how a waiter takes over from an owner that died.
------------------------------------------------------------------------------

-- pgdurable.idempotency_claim(key, owner, lease) -> (claimed, status, owner, result, error, expires_at)
-- One statement decides: insert a running row owned by p_owner, or take over
-- an existing row whose expires_at has passed (dead owner's lease, or an
-- expired result). claimed = true means the caller must execute the effect;
-- otherwise the existing row is returned as it stands (running by someone
-- else, succeeded with result, failed with error).
CREATE OR REPLACE FUNCTION pgdurable.idempotency_claim(p_key text, p_owner text, p_lease interval)
RETURNS TABLE (claimed boolean, status text, owner text, result jsonb, error jsonb,
               expires_at timestamptz)
LANGUAGE plpgsql AS $$
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
    -- ON CONFLICT locks the existing row before judging the WHERE, so the
    -- follow-up SELECT (same transaction) sees it unchanged.
    RETURN QUERY
      INSERT INTO pgdurable.idempotency_keys AS k
             (key, status, owner, result, error, created_at, expires_at)
      VALUES (p_key, 'running', p_owner, NULL, NULL, pgdurable.now(), pgdurable.now() + p_lease)
      ON CONFLICT (key) DO UPDATE
        SET status = 'running', owner = EXCLUDED.owner, result = NULL, error = NULL,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
        WHERE k.expires_at <= pgdurable.now()
      RETURNING true, k.status, k.owner, k.result, k.error, k.expires_at;
    IF FOUND THEN
      RETURN;
    END IF;
    RETURN QUERY
      SELECT false, k.status, k.owner, k.result, k.error, k.expires_at
        FROM pgdurable.idempotency_keys k WHERE k.key = p_key;
    IF FOUND THEN
      RETURN;
    END IF;
    -- the row vanished in between (released by its owner): try again
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.idempotency_claim(text, text, interval) IS
  'Claim an idempotency key (insert, or take over an expired row) or return the row as it stands.';

-- pgdurable.idempotency_renew(key, owner, lease) -> boolean
-- Heartbeat: extend a running claim to now() + lease. False when p_owner no
-- longer holds the key (the claim was taken over after its lease lapsed).
CREATE OR REPLACE FUNCTION pgdurable.idempotency_renew(p_key text, p_owner text, p_lease interval)
RETURNS boolean
LANGUAGE sql AS $$
  WITH u AS (
    UPDATE pgdurable.idempotency_keys
       SET expires_at = pgdurable.now() + p_lease
     WHERE key = p_key AND owner = p_owner AND status = 'running'
    RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM u)
$$;
COMMENT ON FUNCTION pgdurable.idempotency_renew(text, text, interval) IS
  'Extend the lease of a running idempotency claim; false when the owner lost it.';

-- pgdurable._idempotency_settle(key, owner, succeeded, result, error, ttl) -> boolean
-- Internal (idempotency_finish / idempotency_fail): the owner of a running
-- claim records its outcome, 'succeeded' with result or 'failed' with error,
-- kept until now() + ttl (ttl must be positive: PD000). False when p_owner
-- no longer holds the running claim (it was taken over): nothing is written.
-- Idempotent for its owner: true again when p_owner already settled the key
-- with this outcome (a retry after a lost answer).
CREATE OR REPLACE FUNCTION pgdurable._idempotency_settle(p_key text, p_owner text, p_succeeded boolean,
                                              p_result jsonb, p_error jsonb, p_ttl interval)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
    RAISE EXCEPTION 'ttl must be positive' USING ERRCODE = 'PD000';
  END IF;
  UPDATE pgdurable.idempotency_keys
     SET status = CASE WHEN p_succeeded THEN 'succeeded' ELSE 'failed' END,
         result = p_result, error = p_error,
         expires_at = pgdurable.now() + p_ttl
   WHERE key = p_key AND owner = p_owner AND status = 'running';
  IF FOUND THEN
    RETURN true;
  END IF;
  -- a retry whose first try committed but lost its answer: already settled so
  RETURN EXISTS (SELECT FROM pgdurable.idempotency_keys
                  WHERE key = p_key AND owner = p_owner
                    AND status = CASE WHEN p_succeeded THEN 'succeeded' ELSE 'failed' END);
END
$$;
COMMENT ON FUNCTION pgdurable._idempotency_settle(text, text, boolean, jsonb, jsonb, interval) IS
  'Internal: record the outcome of a running idempotency claim (owner only) until now() + ttl.';

-- pgdurable.idempotency_finish(key, owner, result, ttl) -> boolean
-- The owner records the effect's JSON result; the key then answers every
-- caller with it until now() + ttl. False when p_owner no longer holds the
-- running claim (it was taken over): nothing is written.
CREATE OR REPLACE FUNCTION pgdurable.idempotency_finish(p_key text, p_owner text, p_result jsonb,
                                             p_ttl interval)
RETURNS boolean
LANGUAGE sql AS $$
  SELECT pgdurable._idempotency_settle(p_key, p_owner, true, p_result, NULL, p_ttl)
$$;
COMMENT ON FUNCTION pgdurable.idempotency_finish(text, text, jsonb, interval) IS
  'Record the result of an idempotent effect (owner only); kept until now() + ttl.';

-- pgdurable.idempotency_fail(key, owner, error, ttl) -> boolean
-- The owner records the effect's failure ({type, message}); every caller until
-- now() + ttl receives it (EffectFailed) instead of executing again. False when
-- p_owner no longer holds the running claim: nothing is written.
CREATE OR REPLACE FUNCTION pgdurable.idempotency_fail(p_key text, p_owner text, p_error jsonb,
                                           p_ttl interval)
RETURNS boolean
LANGUAGE sql AS $$
  SELECT pgdurable._idempotency_settle(p_key, p_owner, false, NULL, p_error, p_ttl)
$$;
COMMENT ON FUNCTION pgdurable.idempotency_fail(text, text, jsonb, interval) IS
  'Record the failure of an idempotent effect (owner only); kept until now() + ttl.';

-- pgdurable.idempotency_release(key, owner) -> boolean
-- The owner gives up a running claim without an outcome (it was interrupted
-- before the effect could be judged): the row is deleted so the next caller
-- executes at once instead of waiting for the lease to lapse.
CREATE OR REPLACE FUNCTION pgdurable.idempotency_release(p_key text, p_owner text) RETURNS boolean
LANGUAGE sql AS $$
  WITH d AS (
    DELETE FROM pgdurable.idempotency_keys
     WHERE key = p_key AND owner = p_owner AND status = 'running'
    RETURNING 1)
  SELECT EXISTS (SELECT 1 FROM d)
$$;
COMMENT ON FUNCTION pgdurable.idempotency_release(text, text) IS
  'Give up a running idempotency claim without an outcome (owner only).';

-- pgdurable.idempotency_prune(batch) -> integer
-- Delete up to p_batch keys whose expires_at has passed (any status: an
-- expired running row is a dead owner's lapsed claim, which any caller could
-- take over anyway). Returns how many were deleted; call it until it returns
-- less than p_batch. Rows locked by a concurrent claim are skipped.
CREATE OR REPLACE FUNCTION pgdurable.idempotency_prune(p_batch integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
  n integer;
BEGIN
  IF p_batch IS NULL OR p_batch < 1 THEN
    RAISE EXCEPTION 'batch must be at least 1' USING ERRCODE = 'PD000';
  END IF;
  WITH doomed AS MATERIALIZED (
    SELECT key FROM pgdurable.idempotency_keys
     WHERE expires_at <= pgdurable.now()
     ORDER BY expires_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED)
  DELETE FROM pgdurable.idempotency_keys k USING doomed WHERE k.key = doomed.key;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END
$$;
COMMENT ON FUNCTION pgdurable.idempotency_prune(integer) IS
  'Delete up to p_batch expired idempotency keys; returns the number deleted.';

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
CREATE OR REPLACE FUNCTION pgdurable.idempotency_claim_v2(p_key text, p_owner text, p_lease interval,
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
