-- functions/children.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable._children_outcomes(ids) -> jsonb
-- Internal: {id: {status, result, error}} of the given runs (error without
-- its traceback; result NULL unless completed).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._children_outcomes(p_ids uuid[]) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT coalesce(jsonb_object_agg(r.id::text, jsonb_build_object(
           'status', r.status, 'result', r.result, 'error', r.error - 'traceback')), '{}'::jsonb)
    FROM pgdurable.runs r WHERE r.id = ANY (p_ids)
$$;
COMMENT ON FUNCTION pgdurable._children_outcomes(uuid[]) IS
  'Internal: the {id: {status, result, error}} map of some runs (wake.children).';

------------------------------------------------------------------------------
-- pgdurable.start_child(parent, token, key, task, revision, state, queue,
--                       priority, max_attempts, deadline_in, deadline_at,
--                       budget, policy) -> TABLE(run_id uuid, created boolean)
-- FENCED by the parent's lease token (PD001 LeaseLost; the token names the
-- claim, so a stale attempt can start nothing). Exactly one child per
-- (parent, key): if it exists, its id is returned with created = false and
-- nothing changes (a retried or replayed step finds its child); the same key
-- with another task -> PD000. Otherwise inserts the runnable child:
-- parent_run_id, root_run_id, child_key, parent_policy set; its deadline is
-- the earliest of its own (deadline_at, else now + deadline_in) and the
-- parent's; NOTIFY pgdurable_wake(queue). policy NULL = 'cancel'.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.start_child(
  p_parent uuid, p_token bigint, p_key text, p_task text, p_revision text, p_state jsonb,
  p_queue text, p_priority integer, p_max_attempts integer, p_deadline_in interval,
  p_deadline_at timestamptz, p_budget numeric, p_policy text DEFAULT NULL)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  p pgdurable.runs := pgdurable._fenced_token(p_parent, p_token);
  c pgdurable.runs;
  v_id uuid;
  v_deadline timestamptz;
BEGIN
  IF p_key IS NULL OR p_key = '' OR p_task IS NULL OR p_task = '' THEN
    RAISE EXCEPTION 'start_child: key and task must be non-empty' USING ERRCODE = 'PD000';
  END IF;
  IF coalesce(p_policy, 'cancel') NOT IN ('cancel', 'abandon') THEN
    RAISE EXCEPTION 'start_child: policy must be cancel or abandon, not %', p_policy
      USING ERRCODE = 'PD000';
  END IF;
  -- the parent's row lock (held by the fence) serialises its own starts
  SELECT * INTO c FROM pgdurable.runs x WHERE x.parent_run_id = p.id AND x.child_key = p_key;
  IF FOUND THEN
    IF c.task <> p_task THEN
      RAISE EXCEPTION 'start_child: key % of run % already started task %, not %',
        p_key, p.id, c.task, p_task USING ERRCODE = 'PD000';
    END IF;
    RETURN QUERY SELECT c.id, false;
    RETURN;
  END IF;
  v_deadline := coalesce(p_deadline_at, pgdurable.now() + p_deadline_in);
  IF p.deadline_at IS NOT NULL AND (v_deadline IS NULL OR v_deadline > p.deadline_at) THEN
    v_deadline := p.deadline_at;
  END IF;
  INSERT INTO pgdurable.runs AS r (task, revision, state, queue, priority, max_attempts,
                                   deadline_at, budget, parent_run_id, root_run_id, child_key,
                                   parent_policy)
  VALUES (p_task, p_revision, coalesce(p_state, '{}'), p_queue, p_priority, p_max_attempts,
          v_deadline, p_budget, p.id, coalesce(p.root_run_id, p.id), p_key,
          coalesce(p_policy, 'cancel'))
  RETURNING r.id INTO v_id;
  PERFORM pg_notify('pgdurable_wake', p_queue);
  RETURN QUERY SELECT v_id, true;
END
$$;
COMMENT ON FUNCTION pgdurable.start_child(uuid, bigint, text, text, text, jsonb, text, integer,
                                          integer, interval, timestamptz, numeric, text) IS
  'Fenced by the parent''s token: start the child (parent, key) once; returns (id, created).';

------------------------------------------------------------------------------
-- pgdurable.start_children(parent, token, keys, tasks, revisions, states,
--                          queues, priorities, max_attempts, deadlines_in,
--                          deadlines_at, budgets, policies)
--   -> TABLE(ord integer, run_id uuid, created boolean)
-- start_child for many keys in ONE statement: fenced once by the parent's
-- lease token (PD001: nothing started), the parent's row lock taken once and
-- held to the commit, one INSERT of the new children, at most one NOTIFY
-- pgdurable_wake per queue. Per element exactly as start_child: a key that
-- exists already returns its child (created = false, nothing changes; another
-- task for it -> PD000, nothing started); a new child gets parent_run_id,
-- root_run_id, child_key, parent_policy (NULL = 'cancel'), a deadline capped
-- by the parent's. One row per element in input order (ord from 1). All
-- arrays have the same length, keys are distinct, non-empty, and so are
-- tasks: else PD000 and nothing is written.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.start_children(
  p_parent uuid, p_token bigint, p_keys text[], p_tasks text[], p_revisions text[],
  p_states jsonb[], p_queues text[], p_priorities integer[], p_max_attempts integer[],
  p_deadlines_in interval[], p_deadlines_at timestamptz[], p_budgets numeric[],
  p_policies text[])
RETURNS TABLE (ord integer, run_id uuid, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  p pgdurable.runs := pgdurable._fenced_token(p_parent, p_token);
  v_n integer := coalesce(cardinality(p_keys), 0);
  v_bad text;
  v_existing text[];
  v_queues text[];
BEGIN
  IF coalesce(cardinality(p_tasks), 0) <> v_n OR coalesce(cardinality(p_revisions), 0) <> v_n
     OR coalesce(cardinality(p_states), 0) <> v_n OR coalesce(cardinality(p_queues), 0) <> v_n
     OR coalesce(cardinality(p_priorities), 0) <> v_n
     OR coalesce(cardinality(p_max_attempts), 0) <> v_n
     OR coalesce(cardinality(p_deadlines_in), 0) <> v_n
     OR coalesce(cardinality(p_deadlines_at), 0) <> v_n
     OR coalesce(cardinality(p_budgets), 0) <> v_n
     OR coalesce(cardinality(p_policies), 0) <> v_n THEN
    RAISE EXCEPTION 'start_children: every array must have % elements', v_n USING ERRCODE = 'PD000';
  END IF;
  IF v_n = 0 THEN
    RETURN;
  END IF;
  IF EXISTS (SELECT FROM unnest(p_keys, p_tasks) AS u(k, t)
              WHERE u.k IS NULL OR u.k = '' OR u.t IS NULL OR u.t = '') THEN
    RAISE EXCEPTION 'start_children: keys and tasks must be non-empty' USING ERRCODE = 'PD000';
  END IF;
  IF (SELECT count(DISTINCT k) FROM unnest(p_keys) k) <> v_n THEN
    RAISE EXCEPTION 'start_children: keys must be distinct' USING ERRCODE = 'PD000';
  END IF;
  SELECT u.x INTO v_bad FROM unnest(p_policies) u(x)
   WHERE coalesce(u.x, 'cancel') NOT IN ('cancel', 'abandon') LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'start_children: policy must be cancel or abandon, not %', v_bad
      USING ERRCODE = 'PD000';
  END IF;
  -- the parent's row lock (held by the fence) serialises its own starts: the
  -- children read here are all there are
  SELECT array_agg(c.child_key),
         min(format('key %s of run %s already started task %s, not %s', c.child_key, p.id,
                    c.task, u.t)) FILTER (WHERE c.task <> u.t)
    INTO v_existing, v_bad
    FROM unnest(p_keys, p_tasks) AS u(k, t)
    JOIN pgdurable.runs c ON c.parent_run_id = p.id AND c.child_key = u.k;
  v_existing := coalesce(v_existing, '{}');
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION 'start_children: %', v_bad USING ERRCODE = 'PD000';
  END IF;
  WITH ins AS (
    INSERT INTO pgdurable.runs AS r (task, revision, state, queue, priority, max_attempts,
                                     deadline_at, budget, parent_run_id, root_run_id, child_key,
                                     parent_policy)
    SELECT i.t, i.v, coalesce(i.s, '{}'), i.q, i.pr, i.ma,
           CASE WHEN p.deadline_at IS NOT NULL AND (d.at IS NULL OR d.at > p.deadline_at)
                THEN p.deadline_at ELSE d.at END,
           i.b, p.id, coalesce(p.root_run_id, p.id), i.k, coalesce(i.pol, 'cancel')
      FROM unnest(p_keys, p_tasks, p_revisions, p_states, p_queues, p_priorities,
                  p_max_attempts, p_deadlines_in, p_deadlines_at, p_budgets, p_policies)
           WITH ORDINALITY AS i(k, t, v, s, q, pr, ma, din, dat, b, pol, n)
     CROSS JOIN LATERAL (SELECT coalesce(i.dat, pgdurable.now() + i.din) AS at) d
     WHERE NOT EXISTS (SELECT FROM pgdurable.runs c
                        WHERE c.parent_run_id = p.id AND c.child_key = i.k)
     ORDER BY i.n
    RETURNING r.queue
  )
  SELECT array_agg(DISTINCT ins.queue) INTO v_queues FROM ins;
  -- at most one NOTIFY per queue that got a child (delivered on commit only)
  PERFORM pg_notify('pgdurable_wake', w) FROM unnest(v_queues) w;
  -- a fresh snapshot: the children inserted above and those that existed
  RETURN QUERY
    SELECT u.n::integer, c.id, e.k IS NULL
      FROM unnest(p_keys) WITH ORDINALITY AS u(k, n)
      JOIN pgdurable.runs c ON c.parent_run_id = p.id AND c.child_key = u.k
      LEFT JOIN unnest(v_existing) AS e(k) ON e.k = u.k
     ORDER BY u.n;
END
$$;
COMMENT ON FUNCTION pgdurable.start_children(uuid, bigint, text[], text[], text[], jsonb[], text[],
                                             integer[], integer[], interval[], timestamptz[],
                                             numeric[], text[]) IS
  'Fenced by the parent''s token: start_child for many keys in one statement (one lock, '
  'one INSERT, one NOTIFY per queue); returns (ord, id, created) in input order.';

------------------------------------------------------------------------------
-- pgdurable.park_children(id, token, owner, state, spend, ids, need, wake_in)
--   -> TABLE(status text, wake_at timestamptz)
-- FENCED (PD001). Checkpoint the state, then wait until `need` of the
-- children `ids` have finished (completed, failed, cancelled, incompatible),
-- or until now + wake_in (NULL: no timeout; capped at the deadline). Every id
-- must be a child of this run (not the run itself), need in 1..#ids, ids
-- distinct: else PD000 and nothing changes. If `need` have already finished
-- the run stays runnable at once (wake = {type: 'children', children: ...});
-- otherwise it parks (wait_kind 'children', wait_ref = its own id) and the
-- children's terminal transitions count down. Verdicts first, as park_run:
-- a pending cancel -> 'cancelled', over budget/deadline -> 'failed'.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.park_children(p_id uuid, p_token bigint, p_owner text, p_state jsonb,
                                        p_spend numeric, p_ids uuid[], p_need integer,
                                        p_wake_in interval DEFAULT NULL)
RETURNS TABLE (status text, wake_at timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_err jsonb := pgdurable._verdict(r, p_spend, true);
  n integer := coalesce(cardinality(p_ids), 0);
  v_bad uuid;
  v_done integer;
  v_wake_at timestamptz := least(pgdurable.now() + p_wake_in, r.deadline_at);
BEGIN
  IF n = 0 OR array_position(p_ids, NULL) IS NOT NULL
     OR (SELECT count(DISTINCT x) FROM unnest(p_ids) x) <> n THEN
    RAISE EXCEPTION 'park_children: ids must be a non-empty list of distinct run ids'
      USING ERRCODE = 'PD000';
  END IF;
  IF p_need IS NULL OR p_need < 1 OR p_need > n THEN
    RAISE EXCEPTION 'park_children: need must be between 1 and %, got %', n, p_need
      USING ERRCODE = 'PD000';
  END IF;
  IF p_id = ANY (p_ids) THEN
    RAISE EXCEPTION 'park_children: run % cannot wait on itself', p_id USING ERRCODE = 'PD000';
  END IF;
  SELECT x INTO v_bad FROM unnest(p_ids) x
   WHERE NOT EXISTS (SELECT FROM pgdurable.runs c WHERE c.id = x AND c.parent_run_id = p_id)
   LIMIT 1;
  IF v_bad IS NOT NULL THEN
    RAISE EXCEPTION 'park_children: run % is not a child of run %', v_bad, p_id
      USING ERRCODE = 'PD000';
  END IF;
  PERFORM pgdurable._checkpoint(r, p_token, p_state, p_spend);
  IF v_err IS NOT NULL THEN
    RETURN QUERY SELECT pgdurable._end(p_id, CASE WHEN v_err->>'type' = 'RunCancelled'
                                   THEN 'cancelled' ELSE 'failed' END, v_err, 0), NULL::timestamptz;
    RETURN;
  END IF;
  -- a new wait replaces any earlier one of this run
  DELETE FROM pgdurable.child_waits w WHERE w.parent_run_id = p_id;
  -- children that finished before this statement (the fence's row lock makes
  -- a child finishing now wait for our commit: its trigger then counts it)
  SELECT count(*) INTO v_done FROM pgdurable.runs c
   WHERE c.id = ANY (p_ids) AND c.status IN ('completed', 'failed', 'cancelled', 'incompatible');
  IF v_done >= p_need THEN
    DELETE FROM pgdurable.child_wait_sets s WHERE s.parent_run_id = p_id;
    UPDATE pgdurable.runs x SET status = 'runnable', available_at = pgdurable.now(),
           lease_owner = NULL, lease_expires_at = NULL,
           wake = jsonb_build_object('type', 'children', 'at', pgdurable.now(),
                                     'children', pgdurable._children_outcomes(p_ids)),
           updated_at = pgdurable.now()
     WHERE x.id = p_id;
    PERFORM pg_notify('pgdurable_wake', r.queue);
    RETURN QUERY SELECT 'runnable'::text, NULL::timestamptz;
    RETURN;
  END IF;
  INSERT INTO pgdurable.child_wait_sets AS s (parent_run_id, remaining, ids)
  VALUES (p_id, p_need - v_done, p_ids)
  ON CONFLICT (parent_run_id) DO UPDATE SET remaining = excluded.remaining, ids = excluded.ids;
  INSERT INTO pgdurable.child_waits (child_run_id, parent_run_id)
  SELECT c.id, p_id FROM pgdurable.runs c
   WHERE c.id = ANY (p_ids) AND c.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible')
  ON CONFLICT (child_run_id) DO UPDATE SET parent_run_id = excluded.parent_run_id;
  UPDATE pgdurable.runs x SET status = 'waiting', lease_owner = NULL, lease_expires_at = NULL,
         wait_kind = 'children', wait_ref = p_id::text, wait_since = pgdurable.now(),
         wake_at = v_wake_at, updated_at = pgdurable.now()
   WHERE x.id = p_id;
  RETURN QUERY SELECT 'waiting'::text, v_wake_at;
END
$$;
COMMENT ON FUNCTION pgdurable.park_children(uuid, bigint, text, jsonb, numeric, uuid[], integer, interval) IS
  'Fenced: checkpoint and wait until need of the run''s children ids have finished (or a timeout).';

------------------------------------------------------------------------------
-- pgdurable._runs_children_wake(): trigger BEFORE UPDATE on pgdurable.runs
-- when a run leaves a wait on its children (woken by them, by its timeout,
-- or by a signal) for a live status: adds wake.children = the outcomes of
-- the awaited children (_children_outcomes), and clears the wait rows.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_children_wake() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ids uuid[];
BEGIN
  DELETE FROM pgdurable.child_wait_sets s WHERE s.parent_run_id = NEW.id RETURNING s.ids INTO v_ids;
  DELETE FROM pgdurable.child_waits w WHERE w.parent_run_id = NEW.id;
  IF v_ids IS NOT NULL THEN
    NEW.wake := coalesce(NEW.wake, '{}'::jsonb)
                || jsonb_build_object('children', pgdurable._children_outcomes(v_ids));
  END IF;
  RETURN NEW;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_children_wake() IS
  'Trigger: when a run leaves its wait on children, put their outcomes in wake.children.';
DROP TRIGGER IF EXISTS runs_children_wake ON pgdurable.runs;
CREATE TRIGGER runs_children_wake
  BEFORE UPDATE ON pgdurable.runs
  FOR EACH ROW
  WHEN (OLD.status = 'waiting' AND OLD.wait_kind = 'children'
        AND NEW.status IN ('runnable', 'leased'))
  EXECUTE FUNCTION pgdurable._runs_children_wake();
COMMENT ON TRIGGER runs_children_wake ON pgdurable.runs IS
  'Writes wake.children (the awaited children''s outcomes) when a parent leaves its wait.';

------------------------------------------------------------------------------
-- pgdurable._runs_child_guard(): trigger BEFORE UPDATE on child runs whose
-- status or lease token changes to a live status (claimed, reclaimed,
-- released, retried, parked, woken). Waits for the parent's row (FOR KEY
-- SHARE: a parent ending in a concurrent transaction is seen once it
-- commits) and, if the parent has ended and this child's policy is
-- 'cancel', ends this child 'cancelled' instead (a claim then returns it
-- as cancelled and the worker does not run it). This catches the children
-- that the parent's cancel sweep skipped because this transaction held them.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_child_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_status text;
BEGIN
  SELECT p.status INTO v_status FROM pgdurable.runs p WHERE p.id = NEW.parent_run_id
     FOR KEY SHARE;
  IF v_status IN ('completed', 'failed', 'cancelled', 'incompatible') THEN
    NEW.status := 'cancelled';
    NEW.error := pgdurable._error('RunCancelled', format(
                   'run was cancelled: its parent %s ended (%s)', NEW.parent_run_id, v_status));
    NEW.lease_owner := NULL;
    NEW.lease_expires_at := NULL;
    NEW.wait_kind := NULL;
    NEW.wait_ref := NULL;
    NEW.wait_since := NULL;
    NEW.wake_at := NULL;
    NEW.finished_at := pgdurable.now();
  END IF;
  RETURN NEW;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_child_guard() IS
  'Trigger: a child with policy cancel whose parent has ended is cancelled at its next transition.';
DROP TRIGGER IF EXISTS runs_child_guard ON pgdurable.runs;
CREATE TRIGGER runs_child_guard
  BEFORE UPDATE ON pgdurable.runs
  FOR EACH ROW
  WHEN (NEW.parent_run_id IS NOT NULL AND NEW.parent_policy = 'cancel'
        AND NEW.status IN ('runnable', 'leased', 'waiting')
        AND (OLD.status IS DISTINCT FROM NEW.status
             OR OLD.lease_token IS DISTINCT FROM NEW.lease_token))
  EXECUTE FUNCTION pgdurable._runs_child_guard();
COMMENT ON TRIGGER runs_child_guard ON pgdurable.runs IS
  'Cancels a child (policy cancel) at its next transition once its parent has ended.';

------------------------------------------------------------------------------
-- pgdurable.run_tree(id) -> rows of the tree below (and including) a run
-- The run and all its descendants, depth-first:
-- id, parent_run_id, depth (0 = the given run), child_key, task, status,
-- parent_policy, created_at, finished_at, error_type, path (the ids from the
-- given run down to this one). Rows come in tree order: every run right after
-- its parent, the children of a run oldest first (by created_at, then id, as
-- fixed-width text: sort_path), each followed by its own subtree. At most 100
-- levels. Unknown id: no rows.
-- From psql: SELECT * FROM pgdurable.run_tree('...');
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.run_tree(p_id uuid)
RETURNS TABLE (id uuid, parent_run_id uuid, depth integer, child_key text, task text,
               status text, parent_policy text, created_at timestamptz,
               finished_at timestamptz, error_type text, path uuid[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH RECURSIVE t AS (
    SELECT r.id, r.parent_run_id, 0 AS depth, r.child_key, r.task, r.status, r.parent_policy,
           r.created_at, r.finished_at, r.error ->> 'type' AS error_type, ARRAY[r.id] AS path,
           ARRAY[to_char(r.created_at AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS') || r.id::text]
             AS sort_path
      FROM pgdurable.runs r WHERE r.id = p_id
    UNION ALL
    SELECT c.id, c.parent_run_id, t.depth + 1, c.child_key, c.task, c.status, c.parent_policy,
           c.created_at, c.finished_at, c.error ->> 'type', t.path || c.id,
           t.sort_path
             || (to_char(c.created_at AT TIME ZONE 'UTC', 'YYYYMMDDHH24MISSUS') || c.id::text)
      FROM t JOIN pgdurable.runs c ON c.parent_run_id = t.id
     WHERE t.depth < 100)
  SELECT t.id, t.parent_run_id, t.depth, t.child_key, t.task, t.status, t.parent_policy,
         t.created_at, t.finished_at, t.error_type, t.path
    FROM t ORDER BY t.sort_path
$$;
COMMENT ON FUNCTION pgdurable.run_tree(uuid) IS
  'A run and its descendants (children, grandchildren, ...) with depth and status, in tree order.';
