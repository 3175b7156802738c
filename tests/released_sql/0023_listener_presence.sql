-- 0023_listener_presence: NOTIFY the watch-only channels only while somebody
-- listens.
--
-- Two channels exist only for watchers:
--   * pgdurable_steps: the dashboard's live timeline (a statement that writes
--     checkpoints);
--   * pgdurable_done: result() waiters and the dashboard (a run's end).
-- Until now, every statement writing checkpoints and every run's end sent them,
-- whether anybody listened or not. A transaction that NOTIFYs takes a
-- cluster-wide lock at commit and holds it until its commit record is flushed,
-- so notifying commits never share a WAL flush: every worker batch serialised
-- with every start() (whose NOTIFY pgdurable_wake is needed).
--
-- Now a listener says it is there: pgdurable.listen_presence(channel, ttl)
-- moves listeners.until to at least now + ttl, and the two triggers notify only
-- while until is in the future (one primary-key lookup). The dashboard renews
-- while its LISTEN connection is up, result() waiters while they wait
-- (pgdurable/presence.py). pgdurable_wake, pgdurable_cancel and
-- pgdurable_events are unchanged: workers and streams always need them.
--
-- An announcement races the transactions already under way: a run that ends
-- in a transaction that looked at listeners just before the announcement
-- committed, and commits just after the waiter's first read, sends nothing.
-- Listeners therefore read again a few times in the seconds after they
-- announce themselves (pgdurable/presence.py RECHECK), besides their slow
-- safety poll.
--
-- secure_schema() learns a third allow-list, security_readonly(): functions
-- the read-only role may execute although no view calls them (listen_presence:
-- a read-only dashboard must announce itself).
------------------------------------------------------------------------------

CREATE TABLE pgdurable.listeners (
  channel text PRIMARY KEY CHECK (channel IN ('pgdurable_steps', 'pgdurable_done')),
  until timestamptz
);
COMMENT ON TABLE pgdurable.listeners IS
  'Who listens to the watch-only channels: a NOTIFY on channel is sent only while until is in the future.';
COMMENT ON COLUMN pgdurable.listeners.channel IS
  'pgdurable_steps (live timeline) or pgdurable_done (result() waiters, dashboards).';
COMMENT ON COLUMN pgdurable.listeners.until IS
  'Somebody listens until then (server clock; NULL: nobody ever did); moved forward by '
  'listen_presence(), never back.';
INSERT INTO pgdurable.listeners (channel, until)
VALUES ('pgdurable_steps', NULL), ('pgdurable_done', NULL);

------------------------------------------------------------------------------
-- pgdurable.listen_presence(channel, ttl_seconds) -> timestamptz
-- "I listen to channel for the next ttl_seconds" (1..3600): until becomes
-- greatest(until, now + ttl), which is returned (the channel's row is made
-- again if somebody deleted it). While until is still more than ttl/2 away,
-- nothing is written (many waiters announcing at once would otherwise queue on
-- the row and each pay a WAL flush). A bad channel or ttl raises PD000 and
-- changes nothing.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.listen_presence(p_channel text, p_ttl_seconds integer DEFAULT 60)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
  v_until timestamptz;
BEGIN
  IF p_channel IS NULL OR p_channel NOT IN ('pgdurable_steps', 'pgdurable_done') THEN
    RAISE EXCEPTION 'listen_presence: channel must be pgdurable_steps or pgdurable_done, not %',
      coalesce(quote_literal(p_channel), 'NULL') USING ERRCODE = 'PD000';
  END IF;
  IF p_ttl_seconds IS NULL OR p_ttl_seconds < 1 OR p_ttl_seconds > 3600 THEN
    RAISE EXCEPTION 'listen_presence: ttl_seconds must be between 1 and 3600, not %',
      coalesce(p_ttl_seconds::text, 'NULL') USING ERRCODE = 'PD000';
  END IF;
  SELECT l.until INTO v_until FROM pgdurable.listeners l
   WHERE l.channel = p_channel
     AND l.until >= pg_catalog.statement_timestamp() + make_interval(secs => p_ttl_seconds / 2.0);
  IF FOUND THEN
    RETURN v_until;  -- announced recently enough: no write
  END IF;
  INSERT INTO pgdurable.listeners AS l (channel, until)
  VALUES (p_channel, pg_catalog.statement_timestamp() + make_interval(secs => p_ttl_seconds))
  ON CONFLICT (channel) DO UPDATE
     SET until = greatest(l.until, excluded.until)
  RETURNING l.until INTO v_until;
  RETURN v_until;
END
$$;
COMMENT ON FUNCTION pgdurable.listen_presence(text, integer) IS
  'Announce a listener on pgdurable_steps or pgdurable_done for ttl seconds; returns until.';

------------------------------------------------------------------------------
-- The watch-only NOTIFYs, sent only while somebody listens.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._checkpoints_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ids text;
BEGIN
  IF coalesce(current_setting('pgdurable.live_steps', true), '') = 'off'
     OR NOT EXISTS (SELECT FROM pgdurable.listeners l
                     WHERE l.channel = 'pgdurable_steps'
                       AND l.until > pg_catalog.statement_timestamp()) THEN
    RETURN NULL;
  END IF;
  SELECT string_agg(DISTINCT n.run_id::text, ',') INTO v_ids FROM new_rows n;
  IF v_ids IS NOT NULL THEN
    PERFORM pg_notify('pgdurable_steps', CASE WHEN length(v_ids) <= 7000 THEN v_ids ELSE '' END);
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._checkpoints_notify() IS
  'Internal: one NOTIFY pgdurable_steps per statement writing checkpoints, while a dashboard listens.';

CREATE OR REPLACE FUNCTION pgdurable._runs_child_end() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  p pgdurable.runs;
  v_parent uuid;
  v_left integer;
  c record;
BEGIN
  IF EXISTS (SELECT FROM pgdurable.listeners l
              WHERE l.channel = 'pgdurable_done' AND l.until > pg_catalog.statement_timestamp()) THEN
    PERFORM pg_notify('pgdurable_done', NEW.id::text);
  END IF;
  IF NEW.parent_run_id IS NOT NULL THEN
    SELECT * INTO p FROM pgdurable.runs x WHERE x.id = NEW.parent_run_id FOR KEY SHARE;
    DELETE FROM pgdurable.child_waits w WHERE w.child_run_id = NEW.id
    RETURNING w.parent_run_id INTO v_parent;
    IF v_parent IS NOT NULL THEN
      UPDATE pgdurable.child_wait_sets s SET remaining = s.remaining - 1
       WHERE s.parent_run_id = v_parent
      RETURNING s.remaining INTO v_left;
      IF v_left = 0 AND p.status = 'waiting' AND p.wait_kind = 'children' THEN
        UPDATE pgdurable.runs x SET status = 'runnable', available_at = pgdurable.now(),
               wake = jsonb_build_object('type', 'children', 'at', pgdurable.now()),
               wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
               updated_at = pgdurable.now()
         WHERE x.id = v_parent AND x.status = 'waiting' AND x.wait_kind = 'children';
        PERFORM pg_notify('pgdurable_wake', p.queue);
      END IF;
    END IF;
  END IF;
  IF OLD.wait_kind = 'children' THEN
    -- ended while waiting on its children (a wake clears these rows itself)
    DELETE FROM pgdurable.child_wait_sets s WHERE s.parent_run_id = NEW.id;
    DELETE FROM pgdurable.child_waits w WHERE w.parent_run_id = NEW.id;
  END IF;
  FOR c IN
    SELECT x.id, x.status, x.cancel_requested_at FROM pgdurable.runs x
     WHERE x.parent_run_id = NEW.id AND x.parent_policy = 'cancel'
       AND x.status IN ('runnable', 'waiting', 'leased')
       FOR UPDATE SKIP LOCKED
  LOOP
    IF c.status = 'leased' THEN
      IF c.cancel_requested_at IS NULL THEN
        UPDATE pgdurable.runs x SET cancel_requested_at = pgdurable.now() WHERE x.id = c.id;
        PERFORM pg_notify('pgdurable_cancel', c.id::text);
      END IF;
    ELSE
      PERFORM pgdurable._end(c.id, 'cancelled', pgdurable._error('RunCancelled', format(
        'run was cancelled: its parent %s ended (%s)', NEW.id, NEW.status)), 0);
    END IF;
  END LOOP;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_child_end() IS
  'Trigger: at a run''s end, notify result() waiters (while any listen), count it for its waiting '
  'parent, apply its children''s policy.';

------------------------------------------------------------------------------
-- pgdurable.security_readonly() -> SETOF regprocedure
-- Functions the read-only role may execute although no view calls them.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.security_readonly() RETURNS SETOF pg_catalog.regprocedure
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT p::regprocedure FROM unnest(ARRAY['pgdurable.listen_presence(text,integer)']) AS p
$$;
COMMENT ON FUNCTION pgdurable.security_readonly() IS
  'Functions granted to the read-only role beyond those its views call (a dashboard''s presence).';

------------------------------------------------------------------------------
-- secure_schema(): as in 0009, plus the security_readonly() allow-list.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.secure_schema() RETURNS integer
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
           p.oid IN (SELECT * FROM pgdurable.security_readonly()) AS readonly_ok,
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
      IF (o.kind = 'app' AND NOT f.invoker) OR (o.kind = 'readonly' AND (f.in_view OR f.inlinable OR f.readonly_ok)) THEN
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
