-- functions/leases.sql: the current body of each function below.

------------------------------------------------------------------------------
-- Bounded sizes: PD013 (pgdurable.ValueTooLarge), nothing changes.
------------------------------------------------------------------------------

-- pgdurable.lease_check(key, owner, ttl_ms, check_owner, check_ttl) -> interval
-- (0002's contract.) PD000 for an empty or NULL key or owner, or a TTL outside
-- 1 .. 86 400 000 ms; PD013 for an owner over 64 KiB (65 536 bytes: any
-- string, as the LeaseProvider contract says, but not a megabyte per lease row;
-- every acquire, renew and transfer checks its owners here, so none is ever
-- stored); returns the TTL as an interval.
CREATE OR REPLACE FUNCTION pgdurable.lease_check(p_key bytea, p_owner bytea, p_ttl_ms bigint,
                                                 p_check_owner boolean, p_check_ttl boolean)
RETURNS interval
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_key IS NULL OR length(p_key) = 0 THEN
    RAISE EXCEPTION 'lease key must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_check_owner AND (p_owner IS NULL OR length(p_owner) = 0) THEN
    RAISE EXCEPTION 'lease owner must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF p_check_owner AND length(p_owner) > 65536 THEN
    RAISE EXCEPTION 'lease owner is % bytes long; at most 65536 (64 KiB of UTF-8)',
      length(p_owner) USING ERRCODE = 'PD013';
  END IF;
  IF p_check_ttl THEN
    IF p_ttl_ms IS NULL OR p_ttl_ms < 1 OR p_ttl_ms > 86400000 THEN
      RAISE EXCEPTION 'ttl_ms must be between 1 and 86400000 (24 h), got %', p_ttl_ms
        USING ERRCODE = 'PD000';
    END IF;
    RETURN make_interval(secs => p_ttl_ms / 1000.0);
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable.lease_check(bytea, bytea, bigint, boolean, boolean) IS
  'Internal: validate a lease key/owner/TTL (PD000 bad input, PD013 owner over 64 KiB) and '
  'return the TTL as an interval.';

-- pgdurable.acquire_lease(key, owner, ttl_ms) -> (acquired, owner, token, expires_at)
-- Atomically claim the lease on key for owner, or report the live holder.
-- * free, released or expired key: granted; token = previous token + 1 (1 for a new key).
-- * held by the same owner (live): granted again; TTL refreshed, token kept.
-- * held by another live owner: acquired = false; owner/token/expires_at are the
--   holder's, read in the same call. A loser never sees owner = NULL while the key
--   is free: the failed ON CONFLICT DO UPDATE leaves the holder's row locked by us,
--   so the holder cannot release it between our upsert and our read; should the
--   read still find no live holder, the upsert is retried.
CREATE OR REPLACE FUNCTION pgdurable.acquire_lease(p_key bytea, p_owner bytea, p_ttl_ms bigint,
  OUT acquired boolean, OUT owner bytea, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_ttl interval := pgdurable.lease_check(p_key, p_owner, p_ttl_ms, true, true);
  v_now timestamptz := pgdurable.now();
BEGIN
  FOR attempt IN 1..100 LOOP
    INSERT INTO pgdurable.leases AS l (key, owner, token, expires_at, acquired_at, renewed_at)
    VALUES (p_key, p_owner, 1, v_now + v_ttl, v_now, v_now)
    ON CONFLICT (key_hash) DO UPDATE SET
      owner       = excluded.owner,
      token       = CASE WHEN l.owner = excluded.owner AND l.expires_at > v_now
                         THEN l.token ELSE l.token + 1 END,
      acquired_at = CASE WHEN l.owner = excluded.owner AND l.expires_at > v_now
                         THEN l.acquired_at ELSE v_now END,
      expires_at  = excluded.expires_at,
      renewed_at  = v_now
    WHERE l.owner = excluded.owner OR l.owner IS NULL OR l.expires_at <= v_now
    RETURNING true, l.owner, l.token, l.expires_at
    INTO acquired, owner, token, expires_at;
    IF FOUND THEN
      RETURN;
    END IF;
    SELECT false, l.owner, l.token, l.expires_at
      INTO acquired, owner, token, expires_at
      FROM pgdurable.leases l
     WHERE l.key = p_key AND l.owner IS NOT NULL AND l.expires_at > v_now;
    IF FOUND THEN
      RETURN;
    END IF;
  END LOOP;
  RAISE EXCEPTION 'acquire_lease: no stable answer after 100 attempts' USING ERRCODE = '40001';
END
$$;
COMMENT ON FUNCTION pgdurable.acquire_lease(bytea, bytea, bigint) IS
  'Acquire the lease on key for owner for ttl_ms ms, or return the live holder (acquired = false). '
  'Same-owner re-acquire refreshes the TTL and keeps the token; a new owner gets token + 1.';

-- pgdurable.get_lease_owner(key) -> owner: the live holder, NULL when free,
-- released or expired (judged by pgdurable.now()).
CREATE OR REPLACE FUNCTION pgdurable.get_lease_owner(p_key bytea) RETURNS bytea
LANGUAGE sql STABLE AS $$
  SELECT l.owner FROM pgdurable.leases l
   WHERE l.key = p_key AND l.owner IS NOT NULL AND l.expires_at > pgdurable.now()
$$;
COMMENT ON FUNCTION pgdurable.get_lease_owner(bytea) IS
  'The live holder of the lease on key, or NULL when it is free, released or expired.';

-- pgdurable.get_lease(key) -> (owner, token, expires_at): the live grant, no row
-- when free, released or expired.
CREATE OR REPLACE FUNCTION pgdurable.get_lease(p_key bytea,
  OUT owner bytea, OUT token bigint, OUT expires_at timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE AS $$
  SELECT l.owner, l.token, l.expires_at FROM pgdurable.leases l
   WHERE l.key = p_key AND l.owner IS NOT NULL AND l.expires_at > pgdurable.now()
$$;
COMMENT ON FUNCTION pgdurable.get_lease(bytea) IS
  'The live grant (owner, token, expires_at) on key; no row when free, released or expired.';

-- pgdurable.release_lease(key, owner [, token]) -> released
-- Release the lease if owner holds it now (and, when token is given, holds that
-- exact grant); otherwise a no-op (false). The row stays, so the token stays.
CREATE OR REPLACE FUNCTION pgdurable.release_lease(p_key bytea, p_owner bytea, p_token bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  WITH r AS (
    UPDATE pgdurable.leases l SET owner = NULL, expires_at = NULL
     WHERE l.key = p_key AND l.owner = p_owner AND l.expires_at > pgdurable.now()
       AND (p_token IS NULL OR l.token = p_token)
    RETURNING 1)
  SELECT EXISTS (SELECT FROM r)
$$;
COMMENT ON FUNCTION pgdurable.release_lease(bytea, bytea, bigint) IS
  'Release the lease if owner (and token, when given) holds it now; otherwise a no-op returning false.';

-- pgdurable.renew_lease(key, owner, ttl_ms [, token]) -> renewed
-- Extend a live lease held by owner (and token, when given) to now + ttl.
-- Never resurrects: an expired, released or taken-over lease returns false and
-- is left as it is.
CREATE OR REPLACE FUNCTION pgdurable.renew_lease(p_key bytea, p_owner bytea, p_ttl_ms bigint,
                                      p_token bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_ttl interval := pgdurable.lease_check(p_key, p_owner, p_ttl_ms, true, true);
  v_now timestamptz := pgdurable.now();
BEGIN
  UPDATE pgdurable.leases l SET expires_at = v_now + v_ttl, renewed_at = v_now
   WHERE l.key = p_key AND l.owner = p_owner AND l.expires_at > v_now
     AND (p_token IS NULL OR l.token = p_token);
  RETURN FOUND;
END
$$;
COMMENT ON FUNCTION pgdurable.renew_lease(bytea, bytea, bigint, bigint) IS
  'Extend the live lease of owner (and token, when given) to now + ttl_ms; false (and no change) when lost.';

-- pgdurable.transfer_lease(key, from_owner, to_owner, ttl_ms [, token]) -> new token
-- Hand a live lease from from_owner to to_owner in one UPDATE (the key is never
-- free in between), with a fresh TTL and token + 1. NULL when from_owner (with
-- token, when given) does not hold it now; nothing changes then.
-- a -> a is a refresh: TTL renewed, token kept (like a same-owner re-acquire).
CREATE OR REPLACE FUNCTION pgdurable.transfer_lease(p_key bytea, p_from bytea, p_to bytea,
                                         p_ttl_ms bigint, p_token bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_ttl interval := pgdurable.lease_check(p_key, p_from, p_ttl_ms, true, true);
  v_now timestamptz := pgdurable.now();
  v_token bigint;
BEGIN
  PERFORM pgdurable.lease_check(p_key, p_to, NULL, true, false);
  UPDATE pgdurable.leases l SET
      owner       = p_to,
      token       = CASE WHEN p_to = p_from THEN l.token ELSE l.token + 1 END,
      acquired_at = CASE WHEN p_to = p_from THEN l.acquired_at ELSE v_now END,
      expires_at  = v_now + v_ttl,
      renewed_at  = v_now
   WHERE l.key = p_key AND l.owner = p_from AND l.expires_at > v_now
     AND (p_token IS NULL OR l.token = p_token)
  RETURNING l.token INTO v_token;
  RETURN v_token;
END
$$;
COMMENT ON FUNCTION pgdurable.transfer_lease(bytea, bytea, bytea, bigint, bigint) IS
  'Atomically move the live lease from from_owner to to_owner with a fresh TTL and token + 1 '
  '(a -> a keeps the token); returns the new token, NULL when from_owner does not hold it.';

-- pgdurable.lease_display(bytes) -> text: a key or owner made readable for
-- humans: UTF-8 decoded, each NUL byte shown as U+2400 (␀); bytes that are not
-- UTF-8 are shown with encode(..., 'escape'). Display only: never parse it back.
CREATE OR REPLACE FUNCTION pgdurable.lease_display(p bytea) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
  v_out text := '';
  v_rest bytea := p;
  v_pos integer;
BEGIN
  LOOP
    v_pos := position('\x00'::bytea IN v_rest);
    EXIT WHEN v_pos = 0;
    v_out := v_out || convert_from(substring(v_rest FROM 1 FOR v_pos - 1), 'UTF8') || '␀';
    v_rest := substring(v_rest FROM v_pos + 1);
  END LOOP;
  RETURN v_out || convert_from(v_rest, 'UTF8');
EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
  RETURN encode(p, 'escape');
END
$$;
COMMENT ON FUNCTION pgdurable.lease_display(bytea) IS
  'Readable text for a lease key or owner: UTF-8 with NUL shown as ␀ (display only).';

-- Text overloads for psql users (text cannot hold NUL; use the bytea versions
-- with convert_to for such keys). Owners come back readable (lease_display).

-- pgdurable.acquire_lease(text, text, ttl_ms): text overload of acquire_lease(bytea, ...).
CREATE OR REPLACE FUNCTION pgdurable.acquire_lease(p_key text, p_owner text, p_ttl_ms bigint,
  OUT acquired boolean, OUT owner text, OUT token bigint, OUT expires_at timestamptz)
LANGUAGE sql VOLATILE AS $$
  SELECT a.acquired, pgdurable.lease_display(a.owner), a.token, a.expires_at
    FROM pgdurable.acquire_lease(convert_to(p_key, 'UTF8'), convert_to(p_owner, 'UTF8'),
                                 p_ttl_ms) a
$$;
COMMENT ON FUNCTION pgdurable.acquire_lease(text, text, bigint) IS
  'Text overload of acquire_lease(bytea, bytea, bigint) for psql; owner shown with lease_display.';

-- pgdurable.get_lease_owner(text): text overload of get_lease_owner(bytea).
CREATE OR REPLACE FUNCTION pgdurable.get_lease_owner(p_key text) RETURNS text
LANGUAGE sql STABLE AS $$
  SELECT pgdurable.lease_display(pgdurable.get_lease_owner(convert_to(p_key, 'UTF8')))
$$;
COMMENT ON FUNCTION pgdurable.get_lease_owner(text) IS
  'Text overload of get_lease_owner(bytea) for psql; owner shown with lease_display.';

-- pgdurable.release_lease(text, text [, token]): text overload of release_lease(bytea, ...).
CREATE OR REPLACE FUNCTION pgdurable.release_lease(p_key text, p_owner text, p_token bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT pgdurable.release_lease(convert_to(p_key, 'UTF8'), convert_to(p_owner, 'UTF8'), p_token)
$$;
COMMENT ON FUNCTION pgdurable.release_lease(text, text, bigint) IS
  'Text overload of release_lease(bytea, bytea, bigint) for psql.';

-- pgdurable.renew_lease(text, text, ttl_ms [, token]): text overload of renew_lease(bytea, ...).
CREATE OR REPLACE FUNCTION pgdurable.renew_lease(p_key text, p_owner text, p_ttl_ms bigint,
                                      p_token bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE sql VOLATILE AS $$
  SELECT pgdurable.renew_lease(convert_to(p_key, 'UTF8'), convert_to(p_owner, 'UTF8'),
                               p_ttl_ms, p_token)
$$;
COMMENT ON FUNCTION pgdurable.renew_lease(text, text, bigint, bigint) IS
  'Text overload of renew_lease(bytea, bytea, bigint, bigint) for psql.';

-- pgdurable.transfer_lease(text, text, text, ttl_ms [, token]): text overload of transfer_lease(bytea, ...).
CREATE OR REPLACE FUNCTION pgdurable.transfer_lease(p_key text, p_from text, p_to text, p_ttl_ms bigint,
                                         p_token bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  SELECT pgdurable.transfer_lease(convert_to(p_key, 'UTF8'), convert_to(p_from, 'UTF8'),
                                  convert_to(p_to, 'UTF8'), p_ttl_ms, p_token)
$$;
COMMENT ON FUNCTION pgdurable.transfer_lease(text, text, text, bigint, bigint) IS
  'Text overload of transfer_lease(bytea, bytea, bytea, bigint, bigint) for psql.';
