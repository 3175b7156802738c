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
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

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
