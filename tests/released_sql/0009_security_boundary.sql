-- 0009_security_boundary: the database boundary (issue 12).
--
-- * Every function in schema pgdurable runs with a pinned search_path
--   (pg_catalog, pgdurable, pg_temp) and as SECURITY DEFINER, except the tiny
--   inlinable LANGUAGE sql helpers listed in pgdurable.security_inlinable(),
--   whose built-ins are all schema-qualified with exact argument types (and
--   whose operators are written OPERATOR(pg_catalog.x)). A function planted in
--   `public` by whoever can create there never runs inside pgdurable.
-- * pgdurable.now() ignores the pgdurable.now setting unless the schema owner
--   (or a superuser) turned on the test clock with pgdurable.set_test_clock(true),
--   which redefines the function: ordinary roles cannot do that.
-- * ack_cancel refuses a run whose cancel nobody requested (a forged NOTIFY
--   pgdurable_cancel must not end a run).
-- * claim_runs and next_wakeup match (task, revision) as pairs, not by
--   concatenation with E'\x1f'.
-- * The role model: pgdurable.grant_roles(owner, app, readonly) hands the
--   schema to a NOLOGIN owner role, lets the app role EXECUTE the functions and
--   SELECT the tables (no DML), and the read-only role SELECT the views.
--   pgdurable.secure_schema() re-applies the function rules; `pgdurable migrate`
--   calls it after every migration it applies, so functions added by later
--   migrations are covered too. See SECURITY.md and docs/security.md.
--
-- MERGE NOTE: claim_runs, next_wakeup and ack_cancel are redefined here from
-- their 0003 text. A migration that changes them must keep the pair matching
-- and the ack_cancel refusal (tests/test_security_boundary.py checks both).
--
-- No role is created here: roles are cluster-wide, their names are the
-- operator's choice (`pgdurable grant --owner-role ... --app-role ...`).

------------------------------------------------------------------------------
-- pgdurable.security_roles: the roles grant_roles set up.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.security_roles (
  role_oid oid  PRIMARY KEY,
  kind     text NOT NULL CHECK (kind IN ('owner', 'app', 'readonly'))
);
COMMENT ON TABLE pgdurable.security_roles IS
  'Roles set up by pgdurable.grant_roles: secure_schema grants the app roles EXECUTE and '
  'SELECT and the read-only roles SELECT on the views, also for functions added later.';
COMMENT ON COLUMN pgdurable.security_roles.role_oid IS
  'pg_roles.oid of the role (a dropped role is ignored).';
COMMENT ON COLUMN pgdurable.security_roles.kind IS
  'owner (owns the schema, runs migrations) | app (EXECUTE + SELECT) | readonly (SELECT on views).';

------------------------------------------------------------------------------
-- pgdurable.security_inlinable() -> SETOF regprocedure
-- The allow-list: LANGUAGE sql functions kept inlinable (no SET clause, no
-- SECURITY DEFINER). Every built-in they call is schema-qualified with exact
-- argument types (tests/test_security_boundary.py checks both).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.security_inlinable() RETURNS SETOF pg_catalog.regprocedure
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT p::regprocedure FROM unnest(ARRAY[
    'pgdurable.now()', 'pgdurable.wait_lock_key(text,text)', 'pgdurable.task_lock_key(text)',
    'pgdurable.is_thread_key(text)', 'pgdurable._error(text,text)',
    'pgdurable._verdict(pgdurable.runs,numeric,boolean)']) AS p
$$;
COMMENT ON FUNCTION pgdurable.security_inlinable() IS
  'The inlinable LANGUAGE sql helpers exempt from the pinned search_path (built-ins schema-qualified).';

------------------------------------------------------------------------------
-- pgdurable.security_invoker() -> SETOF regprocedure
-- Administrative functions that run with the caller's rights (they need the
-- owner's or a superuser's rights on purpose) and that the app role may not
-- execute.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.security_invoker() RETURNS SETOF pg_catalog.regprocedure
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT p::regprocedure FROM unnest(ARRAY[
    'pgdurable.set_test_clock(boolean)', 'pgdurable.secure_schema()',
    'pgdurable.grant_roles(regrole,regrole,regrole)']) AS p
$$;
COMMENT ON FUNCTION pgdurable.security_invoker() IS
  'Administrative functions run with the caller''s rights; never granted to the app role.';

------------------------------------------------------------------------------
-- The inlinable helpers, redefined with schema-qualified built-ins and the
-- same results (wait_lock_key and task_lock_key return the same keys, so old
-- and new code still serialise on the same advisory locks).
------------------------------------------------------------------------------

-- pgdurable.now(): the database's transaction clock. The test clock
-- (SET LOCAL pgdurable.now = '...') is honoured only after the schema owner ran
-- SELECT pgdurable.set_test_clock(true) (test databases; see there).
CREATE OR REPLACE FUNCTION pgdurable.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT pg_catalog.now()
$$;
COMMENT ON FUNCTION pgdurable.now() IS
  'The database clock used for every lease, timer and deadline (transaction time). '
  'SET pgdurable.now is honoured only where the owner enabled the test clock (set_test_clock).';

CREATE OR REPLACE FUNCTION pgdurable.wait_lock_key(p_kind text, p_ref text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT pg_catalog.hashtextextended(
    pg_catalog.textcat(pg_catalog.textcat(p_kind, E'\x1f'::pg_catalog.text), p_ref),
    0::pg_catalog.int8)
$$;

CREATE OR REPLACE FUNCTION pgdurable.task_lock_key(p_task_id text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT pg_catalog.hashtextextended(
    pg_catalog.textcat('pgdurable.task_checkpoints:'::pg_catalog.text, p_task_id),
    0::pg_catalog.int8)
$$;

CREATE OR REPLACE FUNCTION pgdurable.is_thread_key(p text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
  SELECT pg_catalog.textregexeq(p, '^([^\\]|\\[\\0])+$'::pg_catalog.text)
$$;

CREATE OR REPLACE FUNCTION pgdurable._error(p_type text, p_message text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT pg_catalog.jsonb_build_object('type'::pg_catalog.text, p_type,
                                       'message'::pg_catalog.text, p_message,
                                       'traceback'::pg_catalog.text, NULL::pg_catalog.text)
$$;

CREATE OR REPLACE FUNCTION pgdurable._verdict(r pgdurable.runs, p_spend numeric,
                                              p_check_deadline boolean)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT CASE
    WHEN r.cancel_requested_at IS NOT NULL
      THEN pgdurable._error('RunCancelled'::pg_catalog.text, 'run was cancelled'::pg_catalog.text)
    WHEN r.budget IS NOT NULL AND pg_catalog.numeric_gt(
           pg_catalog.numeric_add(r.spent, coalesce(p_spend, 0::pg_catalog.numeric)), r.budget) THEN
      pgdurable._error('BudgetExceeded'::pg_catalog.text, pg_catalog.format(
        'spent %s of budget %s'::pg_catalog.text,
        pg_catalog.numeric_add(r.spent, coalesce(p_spend, 0::pg_catalog.numeric)), r.budget))
    WHEN p_check_deadline AND r.deadline_at IS NOT NULL
         AND pg_catalog.timestamptz_le(r.deadline_at, pgdurable.now()) THEN
      pgdurable._error('DeadlineExceeded'::pg_catalog.text, pg_catalog.format(
        'deadline %s passed'::pg_catalog.text, r.deadline_at))
  END
$$;

------------------------------------------------------------------------------
-- pgdurable.set_test_clock(enabled) -> void
-- Test databases only: with true, pgdurable.now() honours the pgdurable.now
-- setting (SET LOCAL pgdurable.now = '2030-01-01 00:00:00+00'); with false it
-- is the transaction clock again. It redefines pgdurable.now(), which only its
-- owner (the schema owner) or a superuser may do: an app role's
-- SET pgdurable.now has no effect in a database where nobody enabled it.
-- pgdurable.testing (the pytest plugin) enables it in its template database.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.set_test_clock(p_enabled boolean) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $fn$
BEGIN
  IF p_enabled THEN
    CREATE OR REPLACE FUNCTION pgdurable.now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
      SELECT coalesce(CASE WHEN pg_catalog.texteq(
                             pg_catalog.current_setting('pgdurable.now'::pg_catalog.text, true),
                             ''::pg_catalog.text)
                           THEN NULL
                           ELSE pg_catalog.current_setting('pgdurable.now'::pg_catalog.text, true)
                      END::pg_catalog.timestamptz,
                      pg_catalog.now())
    $$;
  ELSE
    CREATE OR REPLACE FUNCTION pgdurable.now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
      SELECT pg_catalog.now()
    $$;
  END IF;
END
$fn$;
COMMENT ON FUNCTION pgdurable.set_test_clock(boolean) IS
  'Test databases: make pgdurable.now() honour SET pgdurable.now (true) or not (false); owner only.';

------------------------------------------------------------------------------
-- ack_cancel: as in 0003, but a run whose cancel nobody requested is refused
-- (PD000, nothing changes): a forged NOTIFY pgdurable_cancel must not end it.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.ack_cancel(p_id uuid, p_token bigint, p_owner text,
                                                p_spend numeric DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  IF r.cancel_requested_at IS NULL THEN
    RAISE EXCEPTION 'ack_cancel: nobody requested a cancel of run %', p_id
      USING ERRCODE = 'PD000';
  END IF;
  RETURN pgdurable._end(r.id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), p_spend);
END
$$;
COMMENT ON FUNCTION pgdurable.ack_cancel(uuid, bigint, text, numeric) IS
  'Fenced: the worker stopped a cancelled run''s step; record cancelled (only if a cancel was requested).';

------------------------------------------------------------------------------
-- claim_runs: as in 0003 (see its header), with (task, revision) matched as
-- pairs: task 'a\x1fb' at revision 'c' is not task 'a' at revision 'b\x1fc'.
-- p_max_reclaims[i] belongs to the first i with (p_tasks[i], p_revisions[i]).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.claim_runs(
  p_owner text, p_queues text[], p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[] DEFAULT NULL)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, db_now timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
BEGIN
  IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
    -- a NULL lease_expires_at would leave the run leased forever (never
    -- renewed, never reclaimed)
    RAISE EXCEPTION 'claim_runs: ttl must be a positive interval, got %', p_ttl
      USING ERRCODE = 'PD000';
  END IF;
  IF p_limit IS NULL OR p_limit < 1 THEN
    RETURN;
  END IF;
  RETURN QUERY
  WITH pairs AS MATERIALIZED (
    SELECT u.t, u.v, min(u.n) AS n
      FROM unnest(p_tasks, p_revisions) WITH ORDINALITY AS u(t, v, n)
     GROUP BY u.t, u.v
  ), a AS MATERIALIZED (
    -- per queue an index-ordered, LIMITed scan (no sort of the backlog), then
    -- the best p_limit of those across queues
    SELECT x.id, 'runnable'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
           x.priority, x.available_at AS due
      FROM unnest(p_queues) AS qn(name)
     CROSS JOIN LATERAL (
       SELECT r.id, r.priority, r.available_at FROM pgdurable.runs r
        WHERE r.status = 'runnable' AND r.queue = qn.name AND r.available_at <= v_now
          AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
        ORDER BY r.priority DESC, r.available_at
        LIMIT p_limit FOR UPDATE SKIP LOCKED) x
     ORDER BY x.priority DESC, x.available_at
     LIMIT p_limit
  ), b AS MATERIALIZED (
    SELECT r.id, 'expired'::text AS branch,
           CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN r.reclaims >= m.bound THEN 'poison'
                ELSE 'run' END AS verdict, m.bound,
           r.priority, r.lease_expires_at AS due
      FROM pgdurable.runs r
     CROSS JOIN LATERAL (SELECT coalesce(p_max_reclaims[(SELECT p.n FROM pairs p
                                                          WHERE p.t = r.task AND p.v = r.revision)],
                                         5) AS bound) m
     WHERE r.status = 'leased' AND r.queue = ANY (p_queues) AND r.lease_expires_at <= v_now
       AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
     ORDER BY r.priority DESC, r.lease_expires_at
     LIMIT p_limit FOR UPDATE OF r SKIP LOCKED
  ), c AS MATERIALIZED (
    SELECT r.id, 'timer'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
           r.priority, r.wake_at AS due
      FROM pgdurable.runs r
     WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (p_queues)
       AND r.wake_at <= v_now AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
     ORDER BY r.wake_at
     LIMIT p_limit FOR UPDATE SKIP LOCKED
  ), cand AS MATERIALIZED (
    -- one order across the branches (priority, then longest due), so that a
    -- runnable backlog cannot starve crash recovery (b) or due timers (c)
    SELECT * FROM (SELECT * FROM a UNION ALL SELECT * FROM b UNION ALL SELECT * FROM c) k
     ORDER BY k.priority DESC, k.due
     LIMIT p_limit
  ), upd AS (
    -- k.verdict: 'run' | 'cancelled' | 'poison' (decided in branch b)
    UPDATE pgdurable.runs r SET
      status = CASE k.verdict WHEN 'cancelled' THEN 'cancelled' WHEN 'poison' THEN 'failed'
                              ELSE 'leased' END,
      reclaims = r.reclaims + (k.branch = 'expired')::integer,
      error = CASE
        WHEN k.verdict = 'cancelled' THEN pgdurable._error('RunCancelled',
               'run was cancelled (its worker''s lease expired before it stopped)')
        WHEN k.verdict = 'poison' THEN pgdurable._error('PoisonRun', format(
               'lease expired %s times in a row without a checkpoint (max_reclaims %s): '
               'the run keeps crashing or stalling its workers; last worker %s',
               r.reclaims + 1, k.bound, coalesce(r.lease_owner, '?')))
        WHEN k.branch = 'expired' THEN pgdurable._error('LeaseExpired',
               'lease of worker ' || coalesce(r.lease_owner, '?') || ' expired (crashed or stalled worker)')
        ELSE r.error END,
      claims = r.claims + 1,
      lease_token = r.lease_token + 1,
      lease_owner = CASE WHEN k.verdict = 'run' THEN p_owner END,
      lease_expires_at = CASE WHEN k.verdict = 'run' THEN v_now + p_ttl END,
      finished_at = CASE WHEN k.verdict <> 'run' THEN v_now END,
      leased_at = v_now,
      wake = CASE WHEN k.branch = 'timer'
                  THEN jsonb_build_object('type', 'timeout', 'kind', r.wait_kind,
                                          'ref', r.wait_ref, 'at', r.wake_at)
                  ELSE r.wake END,
      wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
      updated_at = v_now
    FROM cand k
    WHERE r.id = k.id
    RETURNING r.id, r.task, r.revision, r.queue, r.status, r.state, r.step, r.attempts,
              r.max_attempts, r.lease_token, r.lease_expires_at, r.wake, r.deadline_at,
              r.budget, r.spent
  )
  SELECT u.*, v_now FROM upd u;
END
$$;
COMMENT ON FUNCTION pgdurable.claim_runs(text, text[], text[], text[], integer, interval, integer[]) IS
  'Claim up to p_limit runs (runnable, expired lease, due timer) for p_owner in one statement.';

------------------------------------------------------------------------------
-- next_wakeup: as in 0003 (see its header), (task, revision) matched as pairs.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.next_wakeup(p_queues text[], p_tasks text[],
                                                 p_revisions text[])
RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_at   timestamptz;
BEGIN
  WITH pairs AS MATERIALIZED (
    SELECT DISTINCT u.t, u.v FROM unnest(p_tasks, p_revisions) AS u(t, v)
  )
  SELECT least(
    (SELECT min(r.available_at) FROM pgdurable.runs r
      WHERE r.status = 'runnable' AND r.queue = ANY (p_queues)
        AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
    (SELECT min(r.wake_at) FROM pgdurable.runs r
      WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (p_queues)
        AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
    (SELECT min(r.lease_expires_at) FROM pgdurable.runs r
      WHERE r.status = 'leased' AND r.queue = ANY (p_queues)
        AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)))
  INTO v_at;
  RETURN CASE WHEN v_at IS NULL THEN NULL ELSE greatest(0, extract(epoch FROM v_at - v_now)) END;
END
$$;
COMMENT ON FUNCTION pgdurable.next_wakeup(text[], text[], text[]) IS
  'Seconds until claimable work may appear in these queues for these tasks (NULL: none).';

------------------------------------------------------------------------------
-- pgdurable.secure_schema() -> integer
-- Re-apply the function rules to EVERY function in schema pgdurable (run by
-- this migration and by `pgdurable migrate` after each later migration):
--   * except the inlinable allow-list: SET search_path = pg_catalog,
--     pgdurable, pg_temp; SECURITY DEFINER unless in security_invoker();
--   * EXECUTE revoked from PUBLIC, except the inlinable helpers and the
--     functions that pgdurable's views call (lease_display, ...);
--   * the app roles of security_roles get EXECUTE on every function but the
--     administrative ones, SELECT on every table and view, USAGE on the schema;
--     the read-only roles USAGE and SELECT on the views (and EXECUTE on the
--     functions those views call);
--   * when an owner role is recorded, every object in the schema is handed
--     to it (functions a superuser's later migrate created included).
-- Returns the number of functions it looked at. Run by the schema owner or a
-- superuser (it ALTERs functions). SECURITY INVOKER on purpose.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.secure_schema() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  f record;
  o record;
  n integer := 0;
  v_owner regrole := (SELECT s.role_oid::regrole FROM pgdurable.security_roles s
                        JOIN pg_roles g ON g.oid = s.role_oid
                       WHERE s.kind = 'owner' LIMIT 1);
BEGIN
  IF v_owner IS NOT NULL THEN
    IF (SELECT nspowner FROM pg_namespace WHERE nspname = 'pgdurable') <> v_owner THEN
      EXECUTE format('ALTER SCHEMA pgdurable OWNER TO %s', v_owner);
    END IF;
    FOR o IN
      SELECT c.oid::regclass AS obj, c.relkind FROM pg_class c
       WHERE c.relnamespace = 'pgdurable'::regnamespace AND c.relowner <> v_owner
         AND (c.relkind IN ('r', 'p', 'v', 'm', 'f')
              OR (c.relkind = 'S' AND NOT EXISTS (
                    SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass
                       AND d.objid = c.oid AND d.deptype IN ('a', 'i'))))
    LOOP
      EXECUTE format('ALTER %s %s OWNER TO %s',
                     CASE o.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                                    WHEN 'S' THEN 'SEQUENCE' WHEN 'f' THEN 'FOREIGN TABLE'
                                    ELSE 'TABLE' END, o.obj, v_owner);
    END LOOP;
  END IF;
  FOR f IN
    SELECT p.oid::regprocedure AS sig, p.prokind, p.prosecdef, p.proconfig, p.proowner,
           p.oid IN (SELECT * FROM pgdurable.security_inlinable()) AS inlinable,
           p.oid IN (SELECT * FROM pgdurable.security_invoker()) AS invoker,
           p.oid IN (SELECT d.refobjid FROM pg_depend d
                       JOIN pg_rewrite w ON d.classid = 'pg_rewrite'::regclass AND d.objid = w.oid
                       JOIN pg_class v ON v.oid = w.ev_class
                      WHERE d.refclassid = 'pg_proc'::regclass
                        AND v.relnamespace = 'pgdurable'::regnamespace) AS in_view
      FROM pg_proc p
     WHERE p.pronamespace = 'pgdurable'::regnamespace AND p.prokind IN ('f', 'p')
  LOOP
    n := n + 1;
    IF v_owner IS NOT NULL AND f.proowner <> v_owner THEN
      EXECUTE format('ALTER ROUTINE %s OWNER TO %s', f.sig, v_owner);
    END IF;
    IF NOT f.inlinable THEN
      IF f.proconfig IS NULL
         OR NOT 'search_path=pg_catalog, pgdurable, pg_temp' = ANY (f.proconfig) THEN
        EXECUTE format('ALTER ROUTINE %s SET search_path = pg_catalog, pgdurable, pg_temp', f.sig);
      END IF;
      IF NOT f.invoker AND NOT f.prosecdef THEN
        EXECUTE format('ALTER ROUTINE %s SECURITY DEFINER', f.sig);
      END IF;
    END IF;
    IF NOT f.inlinable AND NOT f.in_view THEN
      EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f.sig);
    END IF;
    FOR o IN SELECT s.role_oid::regrole AS r, s.kind FROM pgdurable.security_roles s
               JOIN pg_roles g ON g.oid = s.role_oid WHERE s.kind IN ('app', 'readonly')
    LOOP
      IF (o.kind = 'app' AND NOT f.invoker) OR (o.kind = 'readonly' AND (f.in_view OR f.inlinable)) THEN
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %s', f.sig, o.r);
      ELSE
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %s', f.sig, o.r);
      END IF;
    END LOOP;
  END LOOP;
  FOR o IN SELECT s.role_oid::regrole AS r, s.kind FROM pgdurable.security_roles s
             JOIN pg_roles g ON g.oid = s.role_oid WHERE s.kind IN ('app', 'readonly')
  LOOP
    EXECUTE format('GRANT USAGE ON SCHEMA pgdurable TO %s', o.r);
    IF o.kind = 'app' THEN
      EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA pgdurable TO %s', o.r);
    ELSE
      FOR f IN SELECT c.oid::regclass AS obj FROM pg_class c
                WHERE c.relnamespace = 'pgdurable'::regnamespace AND c.relkind IN ('v', 'm')
      LOOP
        EXECUTE format('GRANT SELECT ON %s TO %s', f.obj, o.r);
      END LOOP;
    END IF;
  END LOOP;
  RETURN n;
END
$$;
COMMENT ON FUNCTION pgdurable.secure_schema() IS
  'Pin search_path, SECURITY DEFINER and grants on every pgdurable function (idempotent; owner or superuser).';

------------------------------------------------------------------------------
-- pgdurable.grant_roles(owner, app, readonly) -> void
-- Set up the role model on existing roles (any argument may be NULL):
--   * owner (NOLOGIN, runs migrations via SET ROLE): owns the schema and every
--     object in it; the SECURITY DEFINER functions run as it;
--   * app (the application and its workers): USAGE on the schema, SELECT on
--     every table and view, EXECUTE on the functions; every other privilege
--     on the tables (INSERT, UPDATE, DELETE, TRUNCATE, ...) is revoked;
--   * readonly (operators): USAGE, SELECT on the views only.
-- Then secure_schema(). Run it as a superuser (or a member of the owner role
-- that owns the schema); SECURITY INVOKER on purpose. Idempotent.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.grant_roles(p_owner regrole, p_app regrole, p_readonly regrole)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r regrole;
BEGIN
  IF p_owner IS NOT NULL AND (p_owner = p_app OR p_owner = p_readonly)
     OR (p_app IS NOT NULL AND p_app = p_readonly) THEN
    RAISE EXCEPTION 'grant_roles: owner, app and read-only roles must be different roles'
      USING ERRCODE = 'PD000';
  END IF;
  FOREACH r IN ARRAY ARRAY[p_app, p_readonly] LOOP
    IF r IS NOT NULL AND (SELECT rolsuper FROM pg_roles WHERE oid = r) THEN
      RAISE EXCEPTION 'grant_roles: % is a superuser; the app and read-only roles must not be', r
        USING ERRCODE = 'PD000';
    END IF;
  END LOOP;
  IF p_owner IS NOT NULL THEN
    DELETE FROM pgdurable.security_roles WHERE kind = 'owner';
    INSERT INTO pgdurable.security_roles VALUES (p_owner, 'owner')
      ON CONFLICT (role_oid) DO UPDATE SET kind = excluded.kind;
  END IF;
  IF p_app IS NOT NULL THEN
    INSERT INTO pgdurable.security_roles VALUES (p_app, 'app')
      ON CONFLICT (role_oid) DO UPDATE SET kind = excluded.kind;
  END IF;
  IF p_readonly IS NOT NULL THEN
    INSERT INTO pgdurable.security_roles VALUES (p_readonly, 'readonly')
      ON CONFLICT (role_oid) DO UPDATE SET kind = excluded.kind;
  END IF;
  FOREACH r IN ARRAY ARRAY[p_app, p_readonly] LOOP
    IF r IS NOT NULL THEN
      EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgdurable FROM %s', r);
      EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgdurable FROM %s', r);
      EXECUTE format('REVOKE CREATE ON SCHEMA pgdurable FROM %s', r);
    END IF;
  END LOOP;
  EXECUTE 'REVOKE ALL ON ALL TABLES IN SCHEMA pgdurable FROM PUBLIC';
  EXECUTE 'REVOKE CREATE ON SCHEMA pgdurable FROM PUBLIC';
  PERFORM pgdurable.secure_schema();
  IF p_owner IS NOT NULL THEN
    -- functions a later migration creates as the owner: no EXECUTE for PUBLIC
    -- until secure_schema (run by `pgdurable migrate`) grants it to the app
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %s REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC',
                   p_owner);
    FOREACH r IN ARRAY ARRAY[p_app] LOOP
      IF r IS NOT NULL THEN
        EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA pgdurable '
                       'GRANT SELECT ON TABLES TO %s', p_owner, r);
      END IF;
    END LOOP;
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable.grant_roles(regrole, regrole, regrole) IS
  'Role model: owner owns the schema, app gets EXECUTE + SELECT (no DML), readonly SELECT on views.';

------------------------------------------------------------------------------
-- Existing deployments: a role that could UPDATE pgdurable.runs (an app role
-- set up by hand before this migration) keeps working through the functions
-- once EXECUTE is no longer PUBLIC's: it is recorded as an app role.
------------------------------------------------------------------------------
INSERT INTO pgdurable.security_roles (role_oid, kind)
SELECT DISTINCT a.grantee, 'app'
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.oid = 'pgdurable.runs'::regclass AND a.privilege_type = 'UPDATE'
   AND a.grantee <> 0 AND a.grantee <> c.relowner
ON CONFLICT DO NOTHING;

SELECT pgdurable.secure_schema();
