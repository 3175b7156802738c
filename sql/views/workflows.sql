-- views/workflows.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.workflow_steps: one row per recorded workflow entry.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.workflow_steps AS
  SELECT c.run_id,
         r.task,
         r.revision,
         c.step                                                      AS position,
         c.state -> 'workflow' ->> 'kind'                            AS kind,
         c.state -> 'workflow' ->> 'name'                            AS name,
         c.state -> 'workflow' -> 'result'                           AS result,
         c.state -> 'workflow' -> 'error'                            AS error,
         CASE WHEN c.state -> 'workflow' ->> 'kind' IN ('wait', 'sleep')
              THEN coalesce(lead(c.wake) OVER w,
                            CASE WHEN c.step = r.step THEN r.wake END) END AS outcome,
         c.token,
         c.created_at
    FROM pgdurable.checkpoints c
    JOIN pgdurable.runs r ON r.id = c.run_id
   WHERE c.state ? 'workflow'
  WINDOW w AS (PARTITION BY c.run_id ORDER BY c.step);
COMMENT ON VIEW pgdurable.workflow_steps IS
  'Workflow histories by name: each recorded step, wait, sleep and patch marker (a checkpoint row), in order.';
COMMENT ON COLUMN pgdurable.workflow_steps.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.workflow_steps.task IS 'Workflow name.';
COMMENT ON COLUMN pgdurable.workflow_steps.revision IS 'Revision the run is pinned to.';
COMMENT ON COLUMN pgdurable.workflow_steps.position IS
  'Checkpoint number (pgdurable.checkpoints.step, 1-based): the order of the history.';
COMMENT ON COLUMN pgdurable.workflow_steps.kind IS 'step | wait | sleep | patch | inbox | return.';
COMMENT ON COLUMN pgdurable.workflow_steps.name IS
  'Step name (repeats as name#2 ...), wait name (signal:KIND#n, sleep#n, inbox-wait#n) or patch id.';
COMMENT ON COLUMN pgdurable.workflow_steps.result IS 'A step''s recorded JSON result.';
COMMENT ON COLUMN pgdurable.workflow_steps.error IS
  'A step''s recorded error {type, message} after its last attempt (replays raise StepFailed).';
COMMENT ON COLUMN pgdurable.workflow_steps.outcome IS
  'A wait''s or sleep''s recorded wake (signal payload or timeout); NULL while it is parked.';
COMMENT ON COLUMN pgdurable.workflow_steps.token IS 'Lease token under which it was recorded.';
COMMENT ON COLUMN pgdurable.workflow_steps.created_at IS 'When it was recorded.';
