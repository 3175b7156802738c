-- 0027_run_end_trigger: one trigger at a run's end instead of three.
--
-- Until now three AFTER UPDATE OF status triggers on pgdurable.runs fired
-- when a run ended, each its own PL/pgSQL call with its own trigger event:
--   * runs_child_end (0010, 0023): NOTIFY pgdurable_done while a listener is
--     present, count the run down for its waiting parent, apply its
--     children's policy;
--   * runs_flow_slot_freed_trg (0016): a run of a limited queue leaving
--     leased wakes the workers of that queue;
--   * runs_stream_end (0006, 0018, 0022): the final stream event of a run
--     that has a thread or emitted events.
-- They fired in that order (by name). runs_end does the same work, in the same
-- order, as one trigger; a run leaving leased for a live status (parked,
-- released) does only the freed-slot part, as before. A completion pays one
-- trigger event and one function call instead of three (benchmarks/RESULTS.md,
-- "One trigger at a run's end").
------------------------------------------------------------------------------

DROP TRIGGER runs_child_end ON pgdurable.runs;
DROP TRIGGER runs_flow_slot_freed_trg ON pgdurable.runs;
DROP TRIGGER runs_stream_end ON pgdurable.runs;
DROP FUNCTION pgdurable._runs_child_end();
DROP FUNCTION pgdurable._flow_slot_freed();
DROP FUNCTION pgdurable._runs_stream_end();

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
--     {type: 'end', status, result, error} (final = true) and NOTIFY
--     pgdurable_events(run id) (S16: completion after the last event); the
--     lookup reads only the partitions of the run's lifetime.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._runs_end() RETURNS trigger
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
  END IF;
  IF OLD.status = 'leased' AND EXISTS (SELECT FROM pgdurable.queues q WHERE q.name = NEW.queue) THEN
    PERFORM pg_notify('pgdurable_wake', NEW.queue);
  END IF;
  IF v_ended THEN
    SELECT max(e.seq) INTO v_seq FROM pgdurable.run_events e
     WHERE e.run_id = NEW.id AND e.created_at >= NEW.created_at - interval '1 hour'
       AND e.created_at <= pgdurable.now() + interval '1 hour';
    IF v_seq IS NOT NULL OR NEW.thread_key IS NOT NULL THEN
      INSERT INTO pgdurable.run_events (run_id, seq, event, final)
      VALUES (NEW.id, coalesce(v_seq, 0) + 1,
              jsonb_build_object('type', 'end', 'status', NEW.status, 'result', NEW.result,
                                 'error', NEW.error - 'traceback'),
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
