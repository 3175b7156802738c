-- 0010_children: child runs (fan-out), waiting on them (fan-in), the run
-- tree, cancel propagation, and the terminal notification that app.result()
-- listens for.
--
-- THE TREE. A child run is started by its parent's step (start_child, fenced
-- by the parent's lease token) and records parent_run_id, root_run_id (the
-- parent's root, or the parent itself), child_key (unique per parent: one
-- child per (parent, key), whichever attempt asks) and parent_policy
-- ('cancel' | 'abandon': what happens to it when its parent ends first).
-- A child's deadline is capped by its parent's. Top-level runs keep
-- parent_run_id and root_run_id NULL.
--
-- FAN-IN. A parent parks on its children with park_children: the awaited
-- children that are not finished yet are listed in child_waits and the
-- number still needed is kept in child_wait_sets. A child's terminal
-- transition (trigger runs_child_end, same transaction) removes itself from
-- child_waits, decrements the counter and, when it reaches zero while the
-- parent still waits on its children, makes the parent runnable (one NOTIFY
-- pgdurable_wake): 1,000 children wake the parent once. When the parent
-- leaves the wait (woken, timed out, signalled) the BEFORE trigger
-- runs_children_wake writes wake.children = {id: {status, result, error}}.
--
-- LOCK ORDER (deadlock-free): a child's transaction may wait for its
-- PARENT's row (FOR KEY SHARE, which conflicts only with FOR UPDATE: the lock
-- of park_children, cancel_run and the fenced transitions), never the other
-- way round: a parent's transaction never waits for a child's row (its
-- cancel sweep uses SKIP LOCKED). A child skipped because another
-- transaction held it is caught by that transaction's own check
-- (runs_child_guard waits for the parent's lock, then sees the parent ended)
-- or, if that transaction did not change the child's status or lease (e.g.
-- signal_run storing a pending signal), at the child's next status change.
--
-- TERMINAL NOTIFY. Every run that becomes terminal NOTIFYs pgdurable_done
-- (payload = run id) in the same transaction: result() LISTENs on it.

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN parent_run_id uuid;
ALTER TABLE pgdurable.runs ADD COLUMN root_run_id uuid;
ALTER TABLE pgdurable.runs ADD COLUMN child_key text CHECK (child_key <> '');
ALTER TABLE pgdurable.runs ADD COLUMN parent_policy text
  CHECK (parent_policy IN ('cancel', 'abandon'));
ALTER TABLE pgdurable.runs ADD CONSTRAINT runs_child_shape CHECK (
  (parent_run_id IS NULL) = (child_key IS NULL)
  AND (parent_run_id IS NULL) = (parent_policy IS NULL)
  AND (parent_run_id IS NULL) = (root_run_id IS NULL));
COMMENT ON COLUMN pgdurable.runs.parent_run_id IS
  'The run whose step started this run (start_child); NULL for a top-level run. Not a foreign '
  'key: retention may delete a parent before its children.';
COMMENT ON COLUMN pgdurable.runs.root_run_id IS
  'The top-level run of this run''s tree (the parent''s root, or the parent); NULL for a top-level run.';
COMMENT ON COLUMN pgdurable.runs.child_key IS
  'Key of this child within its parent: start_child with the same (parent, key) returns this run.';
COMMENT ON COLUMN pgdurable.runs.parent_policy IS
  'What happens to this child when its parent ends first (completed, failed, cancelled): '
  'cancel (default: it is cancelled, its own children in turn) or abandon (it runs on).';
-- exactly one child per (parent, key); also the index of "children of a run"
CREATE UNIQUE INDEX runs_parent_key_idx ON pgdurable.runs (parent_run_id, child_key)
  WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_root_idx ON pgdurable.runs (root_run_id) WHERE root_run_id IS NOT NULL;

CREATE TABLE pgdurable.child_waits (
  child_run_id  uuid PRIMARY KEY,
  parent_run_id uuid NOT NULL
);
CREATE INDEX child_waits_parent_idx ON pgdurable.child_waits (parent_run_id);
COMMENT ON TABLE pgdurable.child_waits IS
  'Children a parked parent waits on that had not finished when it parked (park_children); '
  'a child''s row goes when it finishes or the parent parks again or ends.';
COMMENT ON COLUMN pgdurable.child_waits.child_run_id IS 'The awaited child (a child has one parent).';
COMMENT ON COLUMN pgdurable.child_waits.parent_run_id IS 'The waiting parent.';

CREATE TABLE pgdurable.child_wait_sets (
  parent_run_id uuid    PRIMARY KEY,
  remaining     integer NOT NULL,
  ids           uuid[]  NOT NULL
);
COMMENT ON TABLE pgdurable.child_wait_sets IS
  'One row per parent parked on its children: how many more must finish before it wakes.';
COMMENT ON COLUMN pgdurable.child_wait_sets.parent_run_id IS 'The waiting parent.';
COMMENT ON COLUMN pgdurable.child_wait_sets.remaining IS
  'Awaited children that must still finish; the one that brings it to 0 wakes the parent.';
COMMENT ON COLUMN pgdurable.child_wait_sets.ids IS
  'Every child id of the wait (their outcomes make wake.children when the parent wakes).';

------------------------------------------------------------------------------
-- pgdurable._children_outcomes(ids) -> jsonb
-- Internal: {id: {status, result, error}} of the given runs (error without
-- its traceback; result NULL unless completed).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._children_outcomes(p_ids uuid[]) RETURNS jsonb
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
CREATE FUNCTION pgdurable.start_child(
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
CREATE FUNCTION pgdurable.park_children(p_id uuid, p_token bigint, p_owner text, p_state jsonb,
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
CREATE FUNCTION pgdurable._runs_children_wake() RETURNS trigger
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
CREATE FUNCTION pgdurable._runs_child_guard() RETURNS trigger
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
-- pgdurable._runs_child_end(): trigger AFTER UPDATE OF status on
-- pgdurable.runs when a run becomes terminal. In the same transaction:
--  1. NOTIFY pgdurable_done (payload = run id): result() waiters look again;
--  2. a child: lock the parent's row (FOR KEY SHARE: serialises with
--     park_children), leave child_waits and count down the parent's wait;
--     the child that brings it to 0 while the parent waits on its children
--     makes the parent runnable (wake = {type: 'children', at}; the BEFORE
--     trigger adds the outcomes) and NOTIFYs its queue;
--  3. a parent: its wait rows go, and its live children with policy
--     'cancel' are cancelled (runnable/waiting: at once, recursively through
--     their own children; leased: cancel requested + NOTIFY
--     pgdurable_cancel). Children locked by another transaction are skipped
--     (SKIP LOCKED: a parent never waits for a child), see runs_child_guard.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._runs_child_end() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  p pgdurable.runs;
  v_parent uuid;
  v_left integer;
  c record;
BEGIN
  PERFORM pg_notify('pgdurable_done', NEW.id::text);
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
  'Trigger: at a run''s end, notify result() waiters, count it for its waiting parent, apply its '
  'children''s policy.';

CREATE TRIGGER runs_child_end
  AFTER UPDATE OF status ON pgdurable.runs
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status IN ('completed', 'failed', 'cancelled', 'incompatible')
        AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible'))
  EXECUTE FUNCTION pgdurable._runs_child_end();
COMMENT ON TRIGGER runs_child_end ON pgdurable.runs IS
  'At a run''s end: NOTIFY pgdurable_done, fan-in to its waiting parent, cancel policy for its children.';

------------------------------------------------------------------------------
-- pgdurable.run_tree(id) -> rows of the tree below (and including) a run
-- The run and all its descendants, depth-first:
-- id, parent_run_id, depth (0 = the given run), child_key, task, status,
-- parent_policy, created_at, finished_at, error_type, path (the ids from the
-- given run down to this one; rows are ordered by it, so every run comes
-- right after its parent's subtree starts). At most 100 levels. Unknown id:
-- no rows.
-- From psql: SELECT * FROM pgdurable.run_tree('...');
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.run_tree(p_id uuid)
RETURNS TABLE (id uuid, parent_run_id uuid, depth integer, child_key text, task text,
               status text, parent_policy text, created_at timestamptz,
               finished_at timestamptz, error_type text, path uuid[])
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH RECURSIVE t AS (
    SELECT r.id, r.parent_run_id, 0 AS depth, r.child_key, r.task, r.status, r.parent_policy,
           r.created_at, r.finished_at, r.error ->> 'type' AS error_type, ARRAY[r.id] AS path
      FROM pgdurable.runs r WHERE r.id = p_id
    UNION ALL
    SELECT c.id, c.parent_run_id, t.depth + 1, c.child_key, c.task, c.status, c.parent_policy,
           c.created_at, c.finished_at, c.error ->> 'type', t.path || c.id
      FROM t JOIN pgdurable.runs c ON c.parent_run_id = t.id
     WHERE t.depth < 100)
  SELECT * FROM t ORDER BY path
$$;
COMMENT ON FUNCTION pgdurable.run_tree(uuid) IS
  'A run and its descendants (children, grandchildren, ...) with depth and status, in tree order.';
