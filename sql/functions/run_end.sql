-- functions/run_end.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable._end(id, status, error, spend): internal, finish a locked run
-- (failed or cancelled): lease cleared, wait cleared, finished_at set.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._end(p_id uuid, p_status text, p_error jsonb, p_spend numeric)
RETURNS text
LANGUAGE sql AS $$
  UPDATE pgdurable.runs SET status = p_status, error = p_error,
         spent = spent + coalesce(p_spend, 0),
         lease_owner = NULL, lease_expires_at = NULL,
         wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
         finished_at = pgdurable.now(), updated_at = pgdurable.now()
   WHERE id = p_id
  RETURNING status
$$;
COMMENT ON FUNCTION pgdurable._end(uuid, text, jsonb, numeric) IS
  'Internal: put a locked run in a terminal status (failed/cancelled) with its error.';

------------------------------------------------------------------------------
-- pgdurable.complete_run(id, token, owner, state, result, spend) -> text
-- FENCED (PD001). One Done step through write_steps (see there for the
-- CANCEL RULE: whichever commits first wins): the final checkpoint and the
-- completion in one statement; returns completed | cancelled | failed.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.complete_run(p_id uuid, p_token bigint, p_owner text,
                                       p_state jsonb, p_result jsonb, p_spend numeric DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_status text;
BEGIN
  SELECT w.status INTO v_status
    FROM pgdurable.write_steps(p_owner, ARRAY[p_id], ARRAY[p_token], ARRAY[p_state],
                               ARRAY[p_spend], ARRAY[true], ARRAY[p_result]) w;
  IF v_status = 'lost' THEN
    RAISE EXCEPTION 'lease lost on run % (token %, owner %)', p_id, p_token, p_owner
      USING ERRCODE = 'PD001';
  END IF;
  RETURN v_status;
END
$$;
COMMENT ON FUNCTION pgdurable.complete_run(uuid, bigint, text, jsonb, jsonb, numeric) IS
  'Fenced: final checkpoint + completion in one transaction; returns completed | cancelled | failed.';

------------------------------------------------------------------------------
-- pgdurable.release_run(id, token, owner) -> text
-- FENCED (PD001). Give the run back without a checkpoint (lease window used
-- up, or graceful shutdown): 'runnable', available now, lease cleared,
-- NOTIFY pgdurable_wake(queue) so another worker claims it at once. A pending
-- cancel makes it 'cancelled' instead.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.release_run(p_id uuid, p_token bigint, p_owner text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  IF r.cancel_requested_at IS NOT NULL THEN
    RETURN pgdurable._end(p_id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), 0);
  END IF;
  UPDATE pgdurable.runs SET status = 'runnable', available_at = pgdurable.now(),
         lease_owner = NULL, lease_expires_at = NULL, updated_at = pgdurable.now()
   WHERE id = p_id;
  PERFORM pg_notify('pgdurable_wake', r.queue);
  RETURN 'runnable';
END
$$;
COMMENT ON FUNCTION pgdurable.release_run(uuid, bigint, text) IS
  'Fenced: give a leased run back (runnable + NOTIFY), e.g. at the end of a lease window.';

------------------------------------------------------------------------------
-- pgdurable.fail_run(id, token, owner, error, spend, retry_in, terminal) -> text
-- FENCED (PD001). A step failed with error {type, message, traceback}:
-- attempts + 1 and error recorded. If terminal, or attempts reach
-- max_attempts -> 'failed'. Otherwise 'runnable' with available_at =
-- now + retry_in (backoff chosen by the caller); NOTIFY only when retry_in
-- is zero (a future retry is found by the workers' next_wakeup).
-- A pending cancel -> 'cancelled'. No checkpoint: state stays at the last one.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.fail_run(p_id uuid, p_token bigint, p_owner text, p_error jsonb,
                                   p_spend numeric, p_retry_in interval, p_terminal boolean)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_delay interval := greatest(coalesce(p_retry_in, '0'), '0');
BEGIN
  IF r.cancel_requested_at IS NOT NULL THEN
    RETURN pgdurable._end(p_id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), p_spend);
  END IF;
  UPDATE pgdurable.runs SET attempts = attempts + 1 WHERE id = p_id;
  IF p_terminal OR r.attempts + 1 >= r.max_attempts THEN
    RETURN pgdurable._end(p_id, 'failed', p_error, p_spend);
  END IF;
  UPDATE pgdurable.runs SET status = 'runnable', error = p_error,
         spent = spent + coalesce(p_spend, 0),
         available_at = pgdurable.now() + v_delay,
         lease_owner = NULL, lease_expires_at = NULL, updated_at = pgdurable.now()
   WHERE id = p_id;
  IF v_delay = '0' THEN
    PERFORM pg_notify('pgdurable_wake', r.queue);
  END IF;
  RETURN 'runnable';
END
$$;
COMMENT ON FUNCTION pgdurable.fail_run(uuid, bigint, text, jsonb, numeric, interval, boolean) IS
  'Fenced: record a step failure; retry later (runnable) or fail for good; returns the status.';

------------------------------------------------------------------------------
-- pgdurable.mark_incompatible(task, revision, reason) -> integer
-- VERSIONS (R6). A worker claims only the (task, revision) pairs it has; a
-- run of any other pair is never claimed, never failed by a worker: it stays
-- 'runnable' (or 'waiting') and visible, waiting for a capable worker
-- (pgdurable.queue_stats.oldest_runnable_age grows). A worker never decides
-- on its own that a revision is gone. This function is the operator's
-- explicit opt-in: every run of (task, revision) that no live lease holds
-- (runnable, waiting, or leased with an expired lease) becomes terminal
-- 'incompatible' with error {type: 'IncompatibleCheckpoint', message:
-- reason}; runs held under a live lease are left alone. Returns how many
-- runs were marked. retry_run does not revive them (start a new run).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.mark_incompatible(p_task text, p_revision text, p_reason text)
RETURNS integer
LANGUAGE sql AS $$
  WITH m AS (
    UPDATE pgdurable.runs r SET status = 'incompatible',
           error = pgdurable._error('IncompatibleCheckpoint', format(
             'task %s revision %s: %s', p_task, p_revision,
             coalesce(p_reason, 'no worker runs this revision'))),
           lease_owner = NULL, lease_expires_at = NULL,
           wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
           finished_at = pgdurable.now(), updated_at = pgdurable.now()
     WHERE r.task = p_task AND r.revision = p_revision
       AND (r.status IN ('runnable', 'waiting')
            OR (r.status = 'leased' AND r.lease_expires_at <= pgdurable.now()))
    RETURNING 1)
  SELECT count(*)::integer FROM m
$$;
COMMENT ON FUNCTION pgdurable.mark_incompatible(text, text, text) IS
  'Operator opt-in: end the unheld runs of a (task, revision) no worker will run as incompatible.';

------------------------------------------------------------------------------
-- pgdurable._runs_end(): trigger AFTER UPDATE OF status on pgdurable.runs
-- when a run becomes terminal or leaves leased. In the same transaction:
--  1. (terminal) NOTIFY pgdurable_done (payload = run id) while a listener is
--     present (pgdurable.listeners): result() waiters look again;
--  2. (terminal) a child: lock the parent's row (FOR KEY SHARE: serialises
--     with park_children), leave child_waits and count down the parent's
--     wait; the child that brings it to 0 while the parent waits on its
--     children makes the parent runnable (wake = {type: 'children', at}; the
--     BEFORE trigger runs_children_wake adds the outcomes) and NOTIFYs its
--     queue;
--  3. (terminal) a parent: its wait rows go, and its live children with
--     policy 'cancel' are cancelled (runnable/waiting: at once, recursively
--     through their own children; leased: cancel requested + NOTIFY
--     pgdurable_cancel). Children locked by another transaction are skipped
--     (SKIP LOCKED: a parent never waits for a child), see runs_child_guard;
--  4. (left leased) a run of a limited queue frees a slot: NOTIFY
--     pgdurable_wake(queue), so an idle worker claims the next run now;
--  5. (terminal) a run with a thread or events gets its final stream event
--     {type: 'end', status, result, error} (final = true; error is null for a
--     completed run: runs.error may still hold the error of an attempt it got
--     past, e.g. LeaseExpired after a crash, which is not how it ended) and NOTIFY
--     pgdurable_events(run id) (S16: completion after the last event); the
--     lookup reads only the partitions of the run's lifetime.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._runs_end() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_ended boolean := NEW.status IN ('completed', 'failed', 'cancelled', 'incompatible')
                     AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible');
  p pgdurable.runs;
  v_parent uuid;
  v_left integer;
  v_seq bigint;
  c record;
BEGIN
  IF v_ended THEN
    -- PERFORM ... LIMIT 1 / FOUND rather than IF EXISTS (subquery): a query on
    -- one table, which Citus plans on its fast path with a cached plan (a
    -- cell, issue 46); the same work on one server
    PERFORM FROM pgdurable.listeners l
      WHERE l.channel = 'pgdurable_done' AND l.until > pg_catalog.statement_timestamp() LIMIT 1;
    IF FOUND THEN
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
  END IF;
  IF OLD.status = 'leased' THEN
    PERFORM FROM pgdurable.queues q WHERE q.name = NEW.queue LIMIT 1;
    IF FOUND THEN
      PERFORM pg_notify('pgdurable_wake', NEW.queue);
    END IF;
  END IF;
  IF v_ended THEN
    SELECT max(e.seq) INTO v_seq FROM pgdurable.run_events e
     WHERE e.run_id = NEW.id AND e.created_at >= NEW.created_at - interval '1 hour'
       AND e.created_at <= pgdurable.now() + interval '1 hour';
    IF v_seq IS NOT NULL OR NEW.thread_key IS NOT NULL THEN
      INSERT INTO pgdurable.run_events (run_id, seq, event, final)
      VALUES (NEW.id, coalesce(v_seq, 0) + 1,
              jsonb_build_object('type', 'end', 'status', NEW.status, 'result', NEW.result,
                                 'error', CASE WHEN NEW.status <> 'completed'
                                               THEN NEW.error - 'traceback' END),
              true);
      PERFORM pg_notify('pgdurable_events', NEW.id::text);
    END IF;
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._runs_end() IS
  'Trigger: at a run''s end, notify result() waiters (while any listen), count it for its waiting '
  'parent, apply its children''s policy, wake a limited queue''s workers, append its final stream '
  'event; a run leaving leased for a live status only wakes a limited queue''s workers.';
DROP TRIGGER IF EXISTS runs_end ON pgdurable.runs;
CREATE TRIGGER runs_end
  AFTER UPDATE OF status ON pgdurable.runs
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND (OLD.status = 'leased'
             OR (NEW.status IN ('completed', 'failed', 'cancelled', 'incompatible')
                 AND OLD.status NOT IN ('completed', 'failed', 'cancelled', 'incompatible'))))
  EXECUTE FUNCTION pgdurable._runs_end();
COMMENT ON TRIGGER runs_end ON pgdurable.runs IS
  'At a run''s end: NOTIFY pgdurable_done, fan-in to its waiting parent, cancel policy for its '
  'children, final stream event; leaving leased: NOTIFY pgdurable_wake for a limited queue.';
