-- functions/mcp_tasks.sql: the current body of each function below.
--
-- MCP tasks (pgdurable.contrib.mcp): a task is a run; these functions are what
-- tasks/get, tasks/update and tasks/cancel call, from any server process. Only
-- runs registered in mcp_tasks answer: a taskId that names another run is
-- unknown, as is one that names nothing.

------------------------------------------------------------------------------
-- pgdurable.mcp_task_register(run_id, tool, ttl, poll_interval_ms) -> timestamptz
-- Make a run (just started, in the same transaction) an MCP task; returns its
-- creation time. Registering it again changes nothing and returns the first
-- time. A run that does not exist: PD002; a bad tool, TTL or interval: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_task_register(p_run_id uuid, p_tool text, p_ttl interval,
                                                       p_poll_interval_ms integer)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_created timestamptz;
BEGIN
  IF p_tool IS NULL OR p_tool = '' OR length(p_tool) > 200
     OR (p_ttl IS NOT NULL AND p_ttl <= interval '0')
     OR p_poll_interval_ms IS NULL OR p_poll_interval_ms NOT BETWEEN 1 AND 86400000 THEN
    RAISE EXCEPTION 'mcp_task_register: a tool name (1-200 chars), a positive TTL or NULL, '
      'and a poll interval of 1 ms to 1 day' USING ERRCODE = 'PD000';
  END IF;
  PERFORM 1 FROM pgdurable.runs r WHERE r.id = p_run_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % not found', p_run_id USING ERRCODE = 'PD002';
  END IF;
  INSERT INTO pgdurable.mcp_tasks AS m (run_id, tool, ttl, poll_interval_ms)
  VALUES (p_run_id, p_tool, p_ttl, p_poll_interval_ms)
  ON CONFLICT (run_id) DO NOTHING
  RETURNING m.created_at INTO v_created;
  IF v_created IS NULL THEN
    SELECT m.created_at INTO v_created FROM pgdurable.mcp_tasks m WHERE m.run_id = p_run_id;
  END IF;
  RETURN v_created;
END
$$;
COMMENT ON FUNCTION pgdurable.mcp_task_register(uuid, text, interval, integer) IS
  'MCP tasks: make a just-started run an MCP task (tool, TTL, poll hint); its creation time.';

------------------------------------------------------------------------------
-- pgdurable.mcp_task_get(run_id) -> one row, or none for an unknown task
-- What tasks/get (and notifications/tasks) show, in one round trip: the run's
-- status and timestamps, its result or error, the progress its steps reported
-- (statusMessage, pollIntervalMs), the task's TTL (expired: past it) and the
-- input requests still outstanding ({key: request}, or NULL).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_task_get(p_run_id uuid)
RETURNS TABLE (status text, tool text, created_at timestamptz, updated_at timestamptz,
               ttl_ms bigint, poll_interval_ms integer, expired boolean, result jsonb,
               error jsonb, progress jsonb, wake_at timestamptz, inputs jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT r.status, m.tool, m.created_at,
         greatest(r.updated_at, m.created_at,
                  (SELECT max(a.answered_at) FROM pgdurable.mcp_task_inputs a
                    WHERE a.run_id = m.run_id)),
         (extract(epoch FROM m.ttl) * 1000)::bigint, m.poll_interval_ms,
         m.ttl IS NOT NULL AND m.created_at + m.ttl <= pgdurable.now(),
         r.result, r.error, r.progress, r.wake_at,
         (SELECT jsonb_object_agg(i.key, i.request ORDER BY i.key)
            FROM pgdurable.mcp_task_inputs i
           WHERE i.run_id = m.run_id AND i.response IS NULL)
    FROM pgdurable.mcp_tasks m JOIN pgdurable.runs r ON r.id = m.run_id
   WHERE m.run_id = p_run_id
$$;
COMMENT ON FUNCTION pgdurable.mcp_task_get(uuid) IS
  'MCP tasks: what tasks/get shows of a task (status, result or error, progress, TTL, '
  'outstanding input requests); no row for an unknown task.';

------------------------------------------------------------------------------
-- pgdurable.mcp_task_ask(run_id, round, requests) -> integer
-- The run asks for input: one row per key of the requests object ({key:
-- request}), all of wait `round`. A key already asked is left as it is (a step
-- replayed after a crash asks again). Returns how many of the round's requests
-- are outstanding: 0 means every one was already answered (the run need not
-- park); otherwise NOTIFY pgdurable_mcp (payload: the run id, once per call) for
-- the processes that push task statuses. Not an MCP task: PD002; requests not a
-- non-empty object of objects: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_task_ask(p_run_id uuid, p_round integer, p_requests jsonb)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_open integer;
BEGIN
  IF p_round IS NULL OR p_round < 1 OR jsonb_typeof(p_requests) IS DISTINCT FROM 'object'
     OR p_requests = '{}'::jsonb
     OR EXISTS (SELECT 1 FROM jsonb_each(p_requests) e
                 WHERE jsonb_typeof(e.value) <> 'object' OR e.key = '' OR length(e.key) > 200) THEN
    RAISE EXCEPTION 'mcp_task_ask: a round >= 1 and a non-empty object of requests (objects) '
      'by key (1-200 chars)' USING ERRCODE = 'PD000';
  END IF;
  PERFORM 1 FROM pgdurable.mcp_tasks m WHERE m.run_id = p_run_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % is not an MCP task', p_run_id USING ERRCODE = 'PD002';
  END IF;
  INSERT INTO pgdurable.mcp_task_inputs (run_id, key, round, request)
  SELECT p_run_id, e.key, p_round, e.value FROM jsonb_each(p_requests) e
  ON CONFLICT (run_id, key) DO NOTHING;
  SELECT count(*) INTO v_open FROM pgdurable.mcp_task_inputs i
   WHERE i.run_id = p_run_id AND i.round = p_round AND i.response IS NULL;
  IF v_open > 0 THEN  -- the task is input_required: a hint to status pushers
    PERFORM pg_notify('pgdurable_mcp', p_run_id::text);
  END IF;
  RETURN v_open;
END
$$;
COMMENT ON FUNCTION pgdurable.mcp_task_ask(uuid, integer, jsonb) IS
  'MCP tasks: record the input requests a run waits on (one wait round); how many are outstanding.';

------------------------------------------------------------------------------
-- pgdurable.mcp_task_update(run_id, responses) -> integer, or NULL for an unknown task
-- tasks/update: record each response ({key: response}) whose key is
-- outstanding; keys never asked or already answered are ignored. A round whose
-- requests are now all answered wakes the run: signal ('mcp.input',
-- '<run>:<round>') with every response of the round as its payload (signal id
-- 'mcp.input:<run>:<round>', so it is sent once). Any response taken: NOTIFY
-- pgdurable_mcp (payload: the run id, once per call). Returns how many
-- responses were taken. responses not an object: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_task_update(p_run_id uuid, p_responses jsonb)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_taken integer;
  v_rounds integer[];
  v_round integer;
  v_payload jsonb;
  v_ref text;
BEGIN
  IF jsonb_typeof(p_responses) IS DISTINCT FROM 'object' THEN
    RAISE EXCEPTION 'mcp_task_update: responses must be an object by key' USING ERRCODE = 'PD000';
  END IF;
  PERFORM 1 FROM pgdurable.mcp_tasks m WHERE m.run_id = p_run_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  WITH taken AS (
    UPDATE pgdurable.mcp_task_inputs i SET response = e.value, answered_at = pgdurable.now()
      FROM jsonb_each(p_responses) e
     WHERE i.run_id = p_run_id AND i.key = e.key AND i.response IS NULL
    RETURNING i.round)
  SELECT count(*), array_agg(DISTINCT taken.round) INTO v_taken, v_rounds FROM taken;
  IF v_taken = 0 THEN
    RETURN 0;
  END IF;
  -- its inputRequests changed (and its status, once a round is answered): a hint
  PERFORM pg_notify('pgdurable_mcp', p_run_id::text);
  -- every round this update completed (in practice the one the run waits on)
  FOR v_round, v_payload IN
    SELECT i.round, jsonb_object_agg(i.key, i.response)
      FROM pgdurable.mcp_task_inputs i
     WHERE i.run_id = p_run_id AND i.round = ANY (v_rounds)
     GROUP BY i.round
    HAVING bool_and(i.response IS NOT NULL)
  LOOP
    v_ref := p_run_id::text || ':' || v_round;
    PERFORM pgdurable.send_signal('mcp.input', v_ref, v_payload, 'mcp.input:' || v_ref);
  END LOOP;
  RETURN v_taken;
END
$$;
COMMENT ON FUNCTION pgdurable.mcp_task_update(uuid, jsonb) IS
  'MCP tasks (tasks/update): take the responses to outstanding input requests; wake the run '
  'when its round is answered; NULL for an unknown task.';

------------------------------------------------------------------------------
-- pgdurable.mcp_task_cancel(run_id) -> text, or NULL for an unknown task
-- tasks/cancel through the run's cancel path (cancel_run): the resulting status.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_task_cancel(p_run_id uuid)
RETURNS text
LANGUAGE sql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT pgdurable.cancel_run(m.run_id) FROM pgdurable.mcp_tasks m WHERE m.run_id = p_run_id
$$;
COMMENT ON FUNCTION pgdurable.mcp_task_cancel(uuid) IS
  'MCP tasks (tasks/cancel): cancel the task''s run (cancel_run); NULL for an unknown task.';

------------------------------------------------------------------------------
-- pgdurable._mcp_task_kept(run_id) -> boolean
-- True while the run is an MCP task whose TTL has not passed (or has none):
-- retention (prune_runs, prune_preview) keeps it whatever its age.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._mcp_task_kept(p_run_id uuid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT EXISTS (SELECT 1 FROM pgdurable.mcp_tasks m
                  WHERE m.run_id = p_run_id
                    AND (m.ttl IS NULL OR m.created_at + m.ttl > pgdurable.now()))
$$;
COMMENT ON FUNCTION pgdurable._mcp_task_kept(uuid) IS
  'Retention: an MCP task run is kept until its TTL has passed.';

------------------------------------------------------------------------------
-- The client side: remote tasks that parked runs await (mcp_remote_tasks).
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable.mcp_remote_watch(run_id, key, server, task_id, round, poll_ms) -> void
-- The run awaits the remote task (for its wait `round`): poll it now. A row of
-- an earlier round is re-armed; one of the same or a later round is left alone
-- (a step replayed after a crash watches again). Bad values: PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_remote_watch(p_run_id uuid, p_key text, p_server text,
                                                      p_task_id text, p_round integer,
                                                      p_poll_ms integer)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  -- v_now, not pgdurable.now(), in DO UPDATE: Citus refuses non-IMMUTABLE calls there (a cell)
  v_now timestamptz := pgdurable.now();
BEGIN
  IF p_run_id IS NULL OR p_key IS NULL OR p_key = '' OR length(p_key) > 200
     OR p_server IS NULL OR p_server = '' OR length(p_server) > 2000
     OR p_task_id IS NULL OR p_task_id = '' OR length(p_task_id) > 1000
     OR p_round IS NULL OR p_round < 1
     OR p_poll_ms IS NULL OR p_poll_ms NOT BETWEEN 1 AND 86400000 THEN
    RAISE EXCEPTION 'mcp_remote_watch: a run, a key (1-200), a server (1-2000), a task id '
      '(1-1000), a round >= 1 and a poll interval of 1 ms to 1 day' USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.mcp_remote_tasks AS t
         (run_id, key, server, task_id, round, state, poll_interval_ms, next_poll_at)
  VALUES (p_run_id, p_key, p_server, p_task_id, p_round, 'polling', p_poll_ms, v_now)
  ON CONFLICT (run_id, key) DO UPDATE
     SET round = EXCLUDED.round, state = 'polling', next_poll_at = v_now,
         updated_at = v_now
   WHERE t.round < EXCLUDED.round;
END
$$;
COMMENT ON FUNCTION pgdurable.mcp_remote_watch(uuid, text, text, text, integer, integer) IS
  'MCP client side: a run awaits a remote task (its wait round): poll it from now on.';

------------------------------------------------------------------------------
-- pgdurable.mcp_remote_due(limit, lease) -> TABLE(run_id, key, server, task_id, round)
-- Take up to `limit` remote tasks due for a poll (SKIP LOCKED: pollers never
-- take the same row), pushing their next poll by `lease`: a poller that dies
-- before it records what it saw leaves them to be polled again then.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_remote_due(p_limit integer, p_lease interval)
RETURNS TABLE (run_id uuid, key text, server text, task_id text, round integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000
     OR p_lease IS NULL OR p_lease <= interval '0' THEN
    RAISE EXCEPTION 'mcp_remote_due: a limit of 1 to 10000 and a positive lease'
      USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  WITH due AS MATERIALIZED (
    SELECT d.run_id, d.key FROM pgdurable.mcp_remote_tasks d
     WHERE d.state = 'polling' AND d.next_poll_at <= pgdurable.now()
     ORDER BY d.next_poll_at
     LIMIT p_limit
       FOR UPDATE SKIP LOCKED)
  UPDATE pgdurable.mcp_remote_tasks t SET next_poll_at = pgdurable.now() + p_lease
    FROM due WHERE t.run_id = due.run_id AND t.key = due.key
  RETURNING t.run_id, t.key, t.server, t.task_id, t.round;
END
$$;
COMMENT ON FUNCTION pgdurable.mcp_remote_due(integer, interval) IS
  'MCP client side: take the remote tasks due for a tasks/get poll, leased for a while.';

------------------------------------------------------------------------------
-- pgdurable.mcp_remote_seen(run_id, key, round, task) -> text (the row's state)
-- Record what tasks/get returned for the round. A terminal task (completed,
-- failed, cancelled) or one that needs input (input_required) wakes the run:
-- signal ('mcp.remote', '<run>:<key>:<round>') with the task as its payload
-- (sent once: signal id 'mcp.remote:<ref>'), and the row is done or asked. Any
-- other status: polled again after its pollIntervalMs (the row's last hint
-- when absent). A round the row has left (a late poller): ignored. A task that
-- is not an object with a status: PD000. No such row: NULL.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_remote_seen(p_run_id uuid, p_key text, p_round integer,
                                                     p_task jsonb)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  t pgdurable.mcp_remote_tasks;
  v_status text := p_task ->> 'status';
  v_hint jsonb := p_task -> 'pollIntervalMs';
  v_ms integer;
  v_ref text;
BEGIN
  IF jsonb_typeof(p_task) IS DISTINCT FROM 'object' OR v_status IS NULL THEN
    RAISE EXCEPTION 'mcp_remote_seen: the task must be an object with a status'
      USING ERRCODE = 'PD000';
  END IF;
  SELECT * INTO t FROM pgdurable.mcp_remote_tasks r
   WHERE r.run_id = p_run_id AND r.key = p_key FOR UPDATE;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF t.round <> p_round OR t.state <> 'polling' THEN
    RETURN t.state;
  END IF;
  v_ms := CASE WHEN jsonb_typeof(v_hint) = 'number' AND (v_hint)::numeric BETWEEN 1 AND 86400000
               THEN round((v_hint)::numeric)::integer ELSE t.poll_interval_ms END;
  IF v_status IN ('completed', 'failed', 'cancelled', 'input_required') THEN
    UPDATE pgdurable.mcp_remote_tasks r
       SET state = CASE WHEN v_status = 'input_required' THEN 'asked' ELSE 'done' END,
           last_task = p_task, poll_interval_ms = v_ms, polls = r.polls + 1,
           updated_at = pgdurable.now()
     WHERE r.run_id = p_run_id AND r.key = p_key
    RETURNING r.state INTO t.state;
    v_ref := p_run_id::text || ':' || p_key || ':' || p_round;
    PERFORM pgdurable.send_signal('mcp.remote', v_ref, p_task, 'mcp.remote:' || v_ref);
    RETURN t.state;
  END IF;
  UPDATE pgdurable.mcp_remote_tasks r
     SET last_task = p_task, poll_interval_ms = v_ms, polls = r.polls + 1,
         next_poll_at = pgdurable.now() + v_ms * interval '1 millisecond',
         updated_at = pgdurable.now()
   WHERE r.run_id = p_run_id AND r.key = p_key;
  RETURN 'polling';
END
$$;
COMMENT ON FUNCTION pgdurable.mcp_remote_seen(uuid, text, integer, jsonb) IS
  'MCP client side: record a tasks/get answer; wake the run when the task ended or needs input.';

------------------------------------------------------------------------------
-- pgdurable.mcp_remote_next_poll() -> timestamptz (NULL: nothing to poll)
-- When the next remote task is due: how long an idle poller may sleep.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_remote_next_poll() RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT min(t.next_poll_at) FROM pgdurable.mcp_remote_tasks t WHERE t.state = 'polling'
$$;
COMMENT ON FUNCTION pgdurable.mcp_remote_next_poll() IS
  'MCP client side: when the next remote task is due for a poll (NULL: none).';

------------------------------------------------------------------------------
-- pgdurable.mcp_remote_get(run_id, key) -> one row, or none
-- A remote task a run awaits (key NULL: the run's latest), for whoever answers
-- its input requests.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mcp_remote_get(p_run_id uuid, p_key text)
RETURNS TABLE (key text, server text, task_id text, round integer, state text,
               last_task jsonb, polls integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT t.key, t.server, t.task_id, t.round, t.state, t.last_task, t.polls
    FROM pgdurable.mcp_remote_tasks t
   WHERE t.run_id = p_run_id AND (p_key IS NULL OR t.key = p_key)
   ORDER BY t.updated_at DESC
   LIMIT 1
$$;
COMMENT ON FUNCTION pgdurable.mcp_remote_get(uuid, text) IS
  'MCP client side: the remote task a run awaits (its round, state and last tasks/get answer).';
