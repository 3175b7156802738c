-- functions/clock.sql: the current body of each function below.
-- pgdurable:before-migrations (tables' defaults and CHECKs call these)

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

------------------------------------------------------------------------------
-- pgdurable.set_test_clock(enabled) -> void
-- Test databases only: with true, pgdurable.now() honours the pgdurable.now
-- setting (SET LOCAL pgdurable.now = '2030-01-01 00:00:00+00'); with false it
-- is the transaction clock again. It redefines pgdurable.now(), which only its
-- owner (the schema owner) or a superuser may do: an app role's
-- SET pgdurable.now has no effect in a database where nobody enabled it.
-- pgdurable.testing (the pytest plugin) enables it in its template database.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.set_test_clock(p_enabled boolean) RETURNS void
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
