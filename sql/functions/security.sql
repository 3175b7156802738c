-- functions/security.sql: the current body of each function below.

------------------------------------------------------------------------------
-- security_inlinable(): the allow-list (0009) with _runs_check added. Its
-- name predates this entry: every function on it runs with the caller's
-- rights and no SET clause, and resolves nothing through the caller's path.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.security_inlinable() RETURNS SETOF pg_catalog.regprocedure
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT p::regprocedure FROM unnest(ARRAY[
    'pgdurable.now()', 'pgdurable.wait_lock_key(text,text)', 'pgdurable.task_lock_key(text)',
    'pgdurable.is_thread_key(text)', 'pgdurable._error(text,text)',
    'pgdurable._verdict(pgdurable.runs,numeric,boolean)',
    'pgdurable._runs_check(text,text,text,integer,integer,integer,integer,integer,numeric,'
      'text,text,text,uuid,uuid,integer)']) AS p
$$;
COMMENT ON FUNCTION pgdurable.security_inlinable() IS
  'The helpers exempt from the pinned search_path (no SET, caller''s rights, built-ins '
  'schema-qualified): the inlinable LANGUAGE sql ones and the CHECK function _runs_check.';

------------------------------------------------------------------------------
-- pgdurable.security_invoker() -> SETOF regprocedure
-- Administrative functions that run with the caller's rights (they need the
-- owner's or a superuser's rights on purpose) and that the app role may not
-- execute.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.security_invoker() RETURNS SETOF pg_catalog.regprocedure
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT p::regprocedure FROM unnest(ARRAY[
    'pgdurable.set_test_clock(boolean)', 'pgdurable.secure_schema()',
    'pgdurable.grant_roles(regrole,regrole,regrole)']) AS p
$$;
COMMENT ON FUNCTION pgdurable.security_invoker() IS
  'Administrative functions run with the caller''s rights; never granted to the app role.';

------------------------------------------------------------------------------
-- pgdurable.secure_schema() -> integer
-- Re-apply the function rules to EVERY function in schema pgdurable (run by
-- this migration and by `pgdurable migrate` after each later migration):
--   * the allow-list first: a security_api row that names no function, or an
--     administrative one (security_invoker()), raises PD000 and changes nothing;
--   * when an owner role is recorded, the schema and every object in it are
--     handed to it (objects a superuser's later migrate created included);
--   * except the inlinable helpers (security_inlinable()): SET search_path =
--     pg_catalog, pgdurable, pg_temp; SECURITY DEFINER unless in
--     security_invoker();
--   * EXECUTE revoked from PUBLIC, except the inlinable helpers;
--   * the app roles of security_roles get EXECUTE on the routines of
--     security_api and nothing else, the read-only roles on those with
--     readonly and nothing else;
--   * the app roles USAGE on the schema and SELECT on every table and view;
--     the read-only roles USAGE, SELECT on the views, schema_migrations and
--     schema_definitions.
-- Returns the number of functions it looked at. Run by the schema owner or a
-- superuser (it ALTERs functions). SECURITY INVOKER on purpose.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.secure_schema() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  f record;
  o record;
  n integer := 0;
  v_bad text;
  -- the two lists are read first, alone, and the catalogs compared with the
  -- arrays: in a Citus cell these tables live on a worker node, where a join
  -- with this node's pg_proc / pg_roles would compare another node's OIDs
  v_api text[];
  v_api_ro boolean[];
  v_role_oids oid[];
  v_role_kinds text[];
  v_owner regrole;
BEGIN
  -- signatures printed schema-qualified (pgdurable.runs, not runs) in the
  -- ALTERs and GRANTs below: Citus replays them on its nodes, under their
  -- search_path
  PERFORM set_config('search_path', 'pg_catalog, pg_temp', true);
  SELECT coalesce(array_agg(x.routine ORDER BY x.routine), '{}'),
         coalesce(array_agg(x.readonly ORDER BY x.routine), '{}')
    INTO v_api, v_api_ro FROM pgdurable.security_api x;
  SELECT coalesce(array_agg(x.role_oid ORDER BY x.role_oid), '{}'),
         coalesce(array_agg(x.kind ORDER BY x.role_oid), '{}')
    INTO v_role_oids, v_role_kinds FROM pgdurable.security_roles x;
  v_owner := (SELECT s.role_oid::regrole FROM unnest(v_role_oids, v_role_kinds) AS s(role_oid, kind)
                JOIN pg_roles g ON g.oid = s.role_oid
               WHERE s.kind = 'owner' LIMIT 1);
  SELECT string_agg(a.routine, ', ' ORDER BY a.routine) INTO v_bad
    FROM unnest(v_api) AS a(routine)
   WHERE to_regprocedure(a.routine) IS NULL
      OR to_regprocedure(a.routine) NOT IN (SELECT p.oid FROM pg_proc p
                                             WHERE p.pronamespace = 'pgdurable'::regnamespace)
      OR to_regprocedure(a.routine) IN (SELECT * FROM pgdurable.security_invoker());
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION 'secure_schema: security_api lists % (no such pgdurable function, or an '
      'administrative one): correct the list; nothing was changed', v_bad USING ERRCODE = 'PD000';
  END IF;
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
    SELECT p.oid::regprocedure AS sig, p.prosecdef, p.proconfig, p.proowner,
           p.oid IN (SELECT * FROM pgdurable.security_inlinable()) AS inlinable,
           p.oid IN (SELECT * FROM pgdurable.security_invoker()) AS invoker,
           a.oid IS NOT NULL AS app_ok, coalesce(a.readonly, false) AS readonly_ok
      FROM pg_proc p
      LEFT JOIN (SELECT to_regprocedure(x.routine)::oid AS oid, bool_or(x.readonly) AS readonly
                   FROM unnest(v_api, v_api_ro) AS x(routine, readonly) GROUP BY 1) a
        ON a.oid = p.oid
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
      EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f.sig);
    END IF;
    FOR o IN SELECT s.role_oid::regrole AS r, s.kind FROM unnest(v_role_oids, v_role_kinds) AS s(role_oid, kind)
               JOIN pg_roles g ON g.oid = s.role_oid WHERE s.kind IN ('app', 'readonly')
    LOOP
      IF (o.kind = 'app' AND f.app_ok) OR (o.kind = 'readonly' AND f.readonly_ok) THEN
        EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %s', f.sig, o.r);
      ELSE
        EXECUTE format('REVOKE ALL ON ROUTINE %s FROM %s', f.sig, o.r);
      END IF;
    END LOOP;
  END LOOP;
  FOR o IN SELECT s.role_oid::regrole AS r, s.kind FROM unnest(v_role_oids, v_role_kinds) AS s(role_oid, kind)
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
      -- the version check of every connection (the CLI's, the dashboard's)
      EXECUTE format('GRANT SELECT ON pgdurable.schema_migrations TO %s', o.r);
      IF to_regclass('pgdurable.schema_definitions') IS NOT NULL THEN
        EXECUTE format('GRANT SELECT ON pgdurable.schema_definitions TO %s', o.r);
      END IF;
    END IF;
  END LOOP;
  RETURN n;
END
$$;
COMMENT ON FUNCTION pgdurable.secure_schema() IS
  'Pin search_path and SECURITY DEFINER on every pgdurable function, grant the app and read-only '
  'roles exactly the allow-list (security_api) (idempotent; owner or superuser).';

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
CREATE OR REPLACE FUNCTION pgdurable.grant_roles(p_owner regrole, p_app regrole, p_readonly regrole)
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
