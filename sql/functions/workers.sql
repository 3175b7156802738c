-- functions/workers.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.record_heartbeat(id, token, owner, progress) -> void
-- FENCED (PD001). A step's heartbeat: progress and heartbeat_at = now().
-- Step-level liveness only: it does not renew the lease (renew_runs does).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.record_heartbeat(p_id uuid, p_token bigint, p_owner text,
                                           p_progress jsonb)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  UPDATE pgdurable.runs SET progress = coalesce(p_progress, progress),
         heartbeat_at = pgdurable.now()
   WHERE id = r.id;
END
$$;
COMMENT ON FUNCTION pgdurable.record_heartbeat(uuid, bigint, text, jsonb) IS
  'Fenced: record a step heartbeat (progress, heartbeat_at); does not renew the lease.';

------------------------------------------------------------------------------
-- pgdurable.register_worker(worker_id, tasks, revisions) -> void
-- A starting worker registers the (task, revision) pairs it serves
-- (replacing its earlier rows). Arrays of different lengths: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.register_worker(p_worker text, p_tasks text[], p_revisions text[])
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_worker IS NULL OR cardinality(p_tasks) IS DISTINCT FROM cardinality(p_revisions) THEN
    RAISE EXCEPTION 'register_worker: a worker id and tasks/revisions of the same length'
      USING ERRCODE = 'PD000';
  END IF;
  DELETE FROM pgdurable.worker_revisions w WHERE w.worker_id = p_worker;
  INSERT INTO pgdurable.worker_revisions (worker_id, task, revision)
  SELECT p_worker, t, v FROM unnest(p_tasks, p_revisions) AS u(t, v)
  ON CONFLICT DO NOTHING;
END
$$;
COMMENT ON FUNCTION pgdurable.register_worker(text, text[], text[]) IS
  'Register the task revisions a starting worker serves (checked by fork_run to another revision).';

------------------------------------------------------------------------------
-- pgdurable.unregister_worker(worker_id) -> void
-- A worker that stops cleanly removes its worker_revisions rows.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.unregister_worker(p_worker text) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  DELETE FROM pgdurable.worker_revisions w WHERE w.worker_id = p_worker
$$;
COMMENT ON FUNCTION pgdurable.unregister_worker(text) IS
  'Remove the task revisions of a worker that stopped cleanly.';

------------------------------------------------------------------------------
-- pgdurable.listen_presence(channel, ttl_seconds) -> timestamptz
-- "I listen to channel for the next ttl_seconds" (1..3600): until becomes
-- greatest(until, now + ttl), which is returned (the channel's row is made
-- again if somebody deleted it). While until is still more than ttl/2 away,
-- nothing is written (many waiters announcing at once would otherwise queue on
-- the row and each pay a WAL flush). A bad channel or ttl raises PD000 and
-- changes nothing.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.listen_presence(p_channel text, p_ttl_seconds integer DEFAULT 60)
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
-- pgdurable.worker_present(worker, instance, ttl) -> timestamptz
-- "Worker `worker` runs as process `instance` and is alive for `ttl`": its
-- presence row says so until now + ttl (returned; renewed_at = now).
-- Another instance under the same id replaces the old one (a restart): the
-- runs pinned to the old one are no longer reserved (the restarted worker
-- itself claims them first: they still name its id), its details (host, pid,
-- ...) go, and rows lapsed more than an hour ago are pruned then.
-- An empty worker or instance, or a ttl outside (0, 1 day], raises PD000 and
-- changes nothing.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.worker_present(p_worker text, p_instance text, p_ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now timestamptz := pgdurable.now();
  v_old text;
  v_until timestamptz;
BEGIN
  IF coalesce(p_worker, '') = '' OR coalesce(p_instance, '') = '' THEN
    RAISE EXCEPTION 'worker_present: a worker id and an instance are required'
      USING ERRCODE = 'PD000';
  END IF;
  IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 day' THEN
    RAISE EXCEPTION 'worker_present: ttl must be a positive interval of at most 1 day, got %',
      coalesce(p_ttl::text, 'NULL') USING ERRCODE = 'PD000';
  END IF;
  SELECT w.instance INTO v_old FROM pgdurable.worker_presence w
   WHERE w.worker_id = p_worker FOR UPDATE;
  IF FOUND AND v_old = p_instance THEN
    UPDATE pgdurable.worker_presence w SET until = v_now + p_ttl, renewed_at = v_now
     WHERE w.worker_id = p_worker
    RETURNING w.until INTO v_until;
    RETURN v_until;
  END IF;
  -- a new instance: what the old one said about itself (host, pid, ...) is not its
  INSERT INTO pgdurable.worker_presence AS w (worker_id, instance, since, until, renewed_at)
  VALUES (p_worker, p_instance, v_now, v_now + p_ttl, v_now)
  ON CONFLICT (worker_id) DO UPDATE
     SET instance = excluded.instance, since = excluded.since, until = excluded.until,
         renewed_at = excluded.renewed_at, host = NULL, pid = NULL, queues = NULL,
         concurrency = NULL
  RETURNING w.until INTO v_until;
  DELETE FROM pgdurable.worker_presence w WHERE w.until < v_now - interval '1 hour';
  RETURN v_until;
END
$$;
COMMENT ON FUNCTION pgdurable.worker_present(text, text, interval) IS
  'Announce or renew a worker''s presence (this process instance, alive for ttl); returns until.';

------------------------------------------------------------------------------
-- pgdurable.worker_started(worker, instance, ttl, host, pid, queues, concurrency)
--   -> timestamptz
-- A starting worker announces itself: worker_present (same rules, same
-- errors), and its row says where and how it runs (host, pid, queues,
-- concurrency; 0035), for operators (the view worker_list, the dashboard's
-- workers page). Returns until. A pid below 0 or a concurrency below 1 raises
-- PD000 and changes nothing.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.worker_started(p_worker text, p_instance text,
                                                    p_ttl interval, p_host text,
                                                    p_pid integer, p_queues text[],
                                                    p_concurrency integer)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_until timestamptz;
BEGIN
  IF p_pid < 0 OR p_concurrency < 1 THEN
    RAISE EXCEPTION 'worker_started: pid must be >= 0 and concurrency >= 1, got % and %',
      p_pid, p_concurrency USING ERRCODE = 'PD000';
  END IF;
  v_until := pgdurable.worker_present(p_worker, p_instance, p_ttl);
  UPDATE pgdurable.worker_presence w
     SET host = left(p_host, 255), pid = p_pid, queues = p_queues, concurrency = p_concurrency
   WHERE w.worker_id = p_worker AND w.instance = p_instance;
  RETURN v_until;
END
$$;
COMMENT ON FUNCTION pgdurable.worker_started(text, text, interval, text, integer, text[], integer) IS
  'A starting worker announces its presence with its host, pid, queues and concurrency; returns until.';

------------------------------------------------------------------------------
-- pgdurable.worker_absent(worker, instance, queues) -> boolean
-- A worker that stops cleanly removes its presence row (only if it is still
-- the row of this instance: a newer instance under the same id keeps its own):
-- the runs reserved for it are anybody's now, and its queues (where it claimed
-- them) are woken, NOTIFY pgdurable_wake, once per queue. Returns whether a row
-- was removed (nothing is sent otherwise).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.worker_absent(p_worker text, p_instance text, p_queues text[])
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  DELETE FROM pgdurable.worker_presence w
   WHERE w.worker_id = p_worker AND w.instance = p_instance;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('pgdurable_wake', q) FROM (SELECT DISTINCT unnest(p_queues) AS q) u;
  RETURN true;
END
$$;
COMMENT ON FUNCTION pgdurable.worker_absent(text, text, text[]) IS
  'A cleanly stopping worker removes its presence and wakes its queues: its reserved runs are free.';
