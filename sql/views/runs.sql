-- views/runs.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.waiting_runs: every parked run and what it waits for.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.waiting_runs AS
  SELECT r.id                                        AS run_id,
         r.task,
         r.queue,
         CASE WHEN r.wait_kind IS NULL THEN 'timer'
              WHEN r.wake_at IS NULL THEN 'signal'
              ELSE 'signal_or_timeout' END           AS waits_for,
         r.wait_kind                                 AS kind,
         r.wait_ref                                  AS ref,
         r.wait_since,
         r.wake_at,
         pgdurable.now() - r.wait_since              AS waited,
         r.wake_at - pgdurable.now()                 AS wakes_in,
         r.deadline_at,
         (SELECT count(*) FROM pgdurable.signals s
           WHERE s.run_id = r.id AND s.consumed_at IS NULL
             AND (s.expires_at IS NULL OR s.expires_at > pgdurable.now())) AS pending_signals
    FROM pgdurable.runs r
   WHERE r.status = 'waiting';
COMMENT ON VIEW pgdurable.waiting_runs IS
  'Parked runs (status waiting): what each waits for (signal kind/ref and/or timer), since when, until when.';
COMMENT ON COLUMN pgdurable.waiting_runs.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.waiting_runs.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.waiting_runs.queue IS 'Queue the run goes back to when it wakes.';
COMMENT ON COLUMN pgdurable.waiting_runs.waits_for IS
  'timer (Sleep) | signal (Wait without timeout) | signal_or_timeout (Wait with timeout).';
COMMENT ON COLUMN pgdurable.waiting_runs.kind IS 'Signal kind awaited (e.g. ci, approval); NULL for a timer.';
COMMENT ON COLUMN pgdurable.waiting_runs.ref IS 'Signal reference awaited (e.g. a build id); NULL for a timer.';
COMMENT ON COLUMN pgdurable.waiting_runs.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.waiting_runs.wake_at IS
  'When the timer fires (Sleep end or Wait timeout, capped at the deadline); NULL = no timer.';
COMMENT ON COLUMN pgdurable.waiting_runs.waited IS 'How long it has been parked (pgdurable.now() - wait_since).';
COMMENT ON COLUMN pgdurable.waiting_runs.wakes_in IS 'Time left until wake_at (negative: due, a worker will claim it).';
COMMENT ON COLUMN pgdurable.waiting_runs.deadline_at IS 'The run''s deadline, if any.';
COMMENT ON COLUMN pgdurable.waiting_runs.pending_signals IS
  'Unexpired signals addressed to this run (signal_run) of another kind than it waits for.';

------------------------------------------------------------------------------
-- pgdurable.run_overview: one readable row per run.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_overview AS
  SELECT r.id,
         r.task,
         r.revision,
         r.queue,
         r.status,
         r.priority,
         r.step,
         r.attempts,
         r.max_attempts,
         r.reclaims,
         r.lease_owner                                                AS worker,
         r.lease_expires_at,
         (r.status = 'leased' AND r.lease_expires_at <= pgdurable.now()) AS lease_expired,
         r.wait_kind,
         r.wait_ref,
         r.wait_since,
         r.wake_at,
         r.cancel_requested_at IS NOT NULL                            AS cancel_requested,
         r.error ->> 'type'                                           AS error_type,
         r.error ->> 'message'                                        AS error_message,
         r.created_at,
         r.updated_at,
         r.finished_at,
         pgdurable.now() - r.created_at                               AS age
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_overview IS
  'One readable row per run: where it runs (worker, lease), what it waits on, why it failed.';
COMMENT ON COLUMN pgdurable.run_overview.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_overview.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_overview.revision IS 'Task revision the run was started with.';
COMMENT ON COLUMN pgdurable.run_overview.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.run_overview.status IS
  'runnable | leased | waiting | completed | failed | cancelled | incompatible.';
COMMENT ON COLUMN pgdurable.run_overview.priority IS 'Higher runs first within a queue.';
COMMENT ON COLUMN pgdurable.run_overview.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_overview.attempts IS 'Failed attempts so far.';
COMMENT ON COLUMN pgdurable.run_overview.max_attempts IS 'Attempts allowed before the run fails.';
COMMENT ON COLUMN pgdurable.run_overview.reclaims IS
  'Lease expiries (crashed or stalled worker) since the last checkpoint: > 0 = the run may crash its workers.';
COMMENT ON COLUMN pgdurable.run_overview.worker IS 'Worker holding the run (status leased), else NULL.';
COMMENT ON COLUMN pgdurable.run_overview.lease_expires_at IS 'When the current claim lapses.';
COMMENT ON COLUMN pgdurable.run_overview.lease_expired IS
  'Leased but the lease has lapsed: its worker died or stalled; the next claim takes it over.';
COMMENT ON COLUMN pgdurable.run_overview.wait_kind IS 'Signal kind a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_overview.wait_ref IS 'Signal reference a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_overview.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.run_overview.wake_at IS 'Timer: when a parked run becomes runnable.';
COMMENT ON COLUMN pgdurable.run_overview.cancel_requested IS 'A cancel is pending (the worker stops at its next boundary).';
COMMENT ON COLUMN pgdurable.run_overview.error_type IS 'Type of the last error (e.g. LeaseExpired, ValueError).';
COMMENT ON COLUMN pgdurable.run_overview.error_message IS 'Message of the last error.';
COMMENT ON COLUMN pgdurable.run_overview.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.run_overview.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.run_overview.finished_at IS 'When it reached a terminal status.';
COMMENT ON COLUMN pgdurable.run_overview.age IS 'pgdurable.now() - created_at.';

------------------------------------------------------------------------------
-- pgdurable.queue_stats: one row per queue.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.queue_stats AS
  SELECT r.queue,
         count(*) FILTER (WHERE r.status = 'runnable')                      AS runnable,
         count(*) FILTER (WHERE r.status = 'runnable'
                            AND r.available_at <= pgdurable.now())          AS due,
         count(*) FILTER (WHERE r.status = 'leased')                        AS leased,
         count(*) FILTER (WHERE r.status = 'leased'
                            AND r.lease_expires_at <= pgdurable.now())      AS expired_leases,
         count(*) FILTER (WHERE r.status = 'waiting')                       AS waiting,
         count(*) FILTER (WHERE r.status = 'completed')                     AS completed,
         count(*) FILTER (WHERE r.status = 'failed')                        AS failed,
         count(*) FILTER (WHERE r.status IN ('cancelled', 'incompatible'))  AS cancelled,
         pgdurable.now() - min(r.available_at) FILTER (
           WHERE r.status = 'runnable' AND r.available_at <= pgdurable.now()) AS oldest_runnable_age
    FROM pgdurable.runs r
   GROUP BY r.queue;
COMMENT ON VIEW pgdurable.queue_stats IS
  'Per queue: how many runs are in each status and how long the oldest due runnable run has waited.';
COMMENT ON COLUMN pgdurable.queue_stats.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.queue_stats.runnable IS 'Runs waiting for a worker (including retries not yet due).';
COMMENT ON COLUMN pgdurable.queue_stats.due IS 'Runnable runs whose available_at has passed (claimable now).';
COMMENT ON COLUMN pgdurable.queue_stats.leased IS 'Runs held by a worker.';
COMMENT ON COLUMN pgdurable.queue_stats.expired_leases IS 'Leased runs whose lease lapsed (dead or stalled worker).';
COMMENT ON COLUMN pgdurable.queue_stats.waiting IS 'Parked runs (signal, approval, timer).';
COMMENT ON COLUMN pgdurable.queue_stats.completed IS 'Completed runs not yet pruned.';
COMMENT ON COLUMN pgdurable.queue_stats.failed IS 'Failed runs not yet pruned.';
COMMENT ON COLUMN pgdurable.queue_stats.cancelled IS 'Cancelled or incompatible runs not yet pruned.';
COMMENT ON COLUMN pgdurable.queue_stats.oldest_runnable_age IS
  'How long the oldest due runnable run has waited for a worker (NULL: none); growing = no worker is serving the queue.';

CREATE VIEW pgdurable.delayed_runs AS
SELECT r.id, r.task, r.queue, r.concurrency_key AS key, r.available_at AS starts_at,
       r.available_at - pgdurable.now() AS starts_in, r.created_at
  FROM pgdurable.runs r
 WHERE r.status = 'runnable' AND r.available_at > pgdurable.now() AND r.step = 0
   AND r.attempts = 0;
COMMENT ON VIEW pgdurable.delayed_runs IS
  'Runs started with at=/delay= that have not started yet.';
COMMENT ON COLUMN pgdurable.delayed_runs.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.delayed_runs.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.delayed_runs.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.delayed_runs.key IS 'Concurrency key ('''' = none).';
COMMENT ON COLUMN pgdurable.delayed_runs.starts_at IS 'When it becomes claimable.';
COMMENT ON COLUMN pgdurable.delayed_runs.starts_in IS 'How long until then.';
COMMENT ON COLUMN pgdurable.delayed_runs.created_at IS 'When it was started.';

------------------------------------------------------------------------------
-- pgdurable.run_lineage: lineage, rewinds and step liveness per run (a view:
-- readable by the read-only operator role too).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_lineage AS
  SELECT r.id,
         r.task,
         r.revision,
         r.status,
         r.step,
         r.forked_from,
         r.forked_from_step,
         (SELECT count(*) FROM pgdurable.runs f WHERE f.forked_from = r.id)    AS forks,
         (SELECT count(*) FROM pgdurable.run_rewinds w WHERE w.run_id = r.id)  AS rewinds,
         r.progress,
         r.heartbeat_at,
         pgdurable.now() - r.heartbeat_at                                      AS heartbeat_age
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_lineage IS
  'Per run: where it was forked from, how often it was forked and rewound, its last step heartbeat.';
COMMENT ON COLUMN pgdurable.run_lineage.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_lineage.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_lineage.revision IS 'Task revision.';
COMMENT ON COLUMN pgdurable.run_lineage.status IS 'Run status.';
COMMENT ON COLUMN pgdurable.run_lineage.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_lineage.forked_from IS 'The run it was forked from, if any.';
COMMENT ON COLUMN pgdurable.run_lineage.forked_from_step IS 'The source checkpoint it continues from.';
COMMENT ON COLUMN pgdurable.run_lineage.forks IS 'How many runs were forked from it.';
COMMENT ON COLUMN pgdurable.run_lineage.rewinds IS 'How many times it was rewound in place (pgdurable.run_rewinds).';
COMMENT ON COLUMN pgdurable.run_lineage.progress IS 'Last progress reported by ctx.heartbeat.';
COMMENT ON COLUMN pgdurable.run_lineage.heartbeat_at IS 'When a step last called ctx.heartbeat.';
COMMENT ON COLUMN pgdurable.run_lineage.heartbeat_age IS 'pgdurable.now() - heartbeat_at.';

------------------------------------------------------------------------------
-- pgdurable.run_list: one row per run for searching (list_runs, dashboard).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_list AS
  SELECT r.id,
         r.task,
         r.queue,
         r.status,
         r.step,
         r.attempts,
         r.max_attempts,
         r.lease_owner                                                AS worker,
         (r.status = 'leased' AND r.lease_expires_at <= pgdurable.now()) AS lease_expired,
         r.wait_kind,
         r.wait_ref,
         r.wake_at,
         r.error ->> 'type'                                           AS error_type,
         r.error ->> 'message'                                        AS error_message,
         r.metadata,
         r.parent_run_id,
         r.root_run_id,
         r.created_at,
         r.updated_at,
         r.finished_at
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_list IS
  'Searchable runs (metadata, status, task, queue, time): list_runs and the dashboard read it.';
COMMENT ON COLUMN pgdurable.run_list.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_list.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_list.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.run_list.status IS 'runnable | leased | waiting | completed | failed | cancelled | incompatible.';
COMMENT ON COLUMN pgdurable.run_list.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_list.attempts IS 'Failed attempts so far.';
COMMENT ON COLUMN pgdurable.run_list.max_attempts IS 'Attempts allowed.';
COMMENT ON COLUMN pgdurable.run_list.worker IS 'Worker holding the run (leased), else NULL.';
COMMENT ON COLUMN pgdurable.run_list.lease_expired IS 'Leased but the lease lapsed.';
COMMENT ON COLUMN pgdurable.run_list.wait_kind IS 'Signal kind a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_list.wait_ref IS 'Signal reference a parked run waits for.';
COMMENT ON COLUMN pgdurable.run_list.wake_at IS 'Timer of a parked run.';
COMMENT ON COLUMN pgdurable.run_list.error_type IS 'Type of the last error.';
COMMENT ON COLUMN pgdurable.run_list.error_message IS 'Message of the last error.';
COMMENT ON COLUMN pgdurable.run_list.metadata IS 'Caller labels set at start.';
COMMENT ON COLUMN pgdurable.run_list.parent_run_id IS 'Parent run (child runs).';
COMMENT ON COLUMN pgdurable.run_list.root_run_id IS 'Top-level run of its tree.';
COMMENT ON COLUMN pgdurable.run_list.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.run_list.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.run_list.finished_at IS 'When it reached a terminal status.';

------------------------------------------------------------------------------
-- pgdurable.run_detail: one run for the dashboard, without state or result.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_detail AS
  SELECT r.id,
         r.task,
         r.revision,
         r.queue,
         r.priority,
         r.status,
         r.step,
         r.attempts,
         r.max_attempts,
         r.claims,
         r.reclaims,
         r.lease_owner,
         r.lease_token,
         r.lease_expires_at,
         r.wait_kind,
         r.wait_ref,
         r.wait_since,
         r.wake_at,
         r.deadline_at,
         r.cancel_requested_at IS NOT NULL   AS cancel_requested,
         r.error ->> 'type'                  AS error_type,
         r.error ->> 'message'               AS error_message,
         r.error ->> 'traceback'             AS error_traceback,
         r.metadata,
         r.trace_context ->> 'traceparent'   AS traceparent,
         r.parent_run_id,
         r.root_run_id,
         r.child_key,
         r.created_at,
         r.updated_at,
         r.finished_at
    FROM pgdurable.runs r;
COMMENT ON VIEW pgdurable.run_detail IS
  'One run for operators: status, lease, wait, error with traceback, metadata, tree (no state or result).';
COMMENT ON COLUMN pgdurable.run_detail.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_detail.task IS 'Task name.';
COMMENT ON COLUMN pgdurable.run_detail.revision IS 'Task revision.';
COMMENT ON COLUMN pgdurable.run_detail.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.run_detail.priority IS 'Priority within the queue.';
COMMENT ON COLUMN pgdurable.run_detail.status IS 'Run status.';
COMMENT ON COLUMN pgdurable.run_detail.step IS 'Steps checkpointed so far.';
COMMENT ON COLUMN pgdurable.run_detail.attempts IS 'Failed attempts so far.';
COMMENT ON COLUMN pgdurable.run_detail.max_attempts IS 'Attempts allowed.';
COMMENT ON COLUMN pgdurable.run_detail.claims IS 'Claims so far.';
COMMENT ON COLUMN pgdurable.run_detail.reclaims IS 'Lease expiries since the last checkpoint.';
COMMENT ON COLUMN pgdurable.run_detail.lease_owner IS 'Worker holding the run.';
COMMENT ON COLUMN pgdurable.run_detail.lease_token IS 'Fencing token of the current (or last) claim.';
COMMENT ON COLUMN pgdurable.run_detail.lease_expires_at IS 'When the claim lapses.';
COMMENT ON COLUMN pgdurable.run_detail.wait_kind IS 'Signal kind awaited.';
COMMENT ON COLUMN pgdurable.run_detail.wait_ref IS 'Signal reference awaited.';
COMMENT ON COLUMN pgdurable.run_detail.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.run_detail.wake_at IS 'Timer of a parked run.';
COMMENT ON COLUMN pgdurable.run_detail.deadline_at IS 'Deadline.';
COMMENT ON COLUMN pgdurable.run_detail.cancel_requested IS 'A cancel is pending.';
COMMENT ON COLUMN pgdurable.run_detail.error_type IS 'Type of the last error.';
COMMENT ON COLUMN pgdurable.run_detail.error_message IS 'Message of the last error.';
COMMENT ON COLUMN pgdurable.run_detail.error_traceback IS 'Traceback of the last error.';
COMMENT ON COLUMN pgdurable.run_detail.metadata IS 'Caller labels set at start.';
COMMENT ON COLUMN pgdurable.run_detail.traceparent IS 'W3C traceparent of the starter.';
COMMENT ON COLUMN pgdurable.run_detail.parent_run_id IS 'Parent run.';
COMMENT ON COLUMN pgdurable.run_detail.root_run_id IS 'Top-level run of its tree.';
COMMENT ON COLUMN pgdurable.run_detail.child_key IS 'Key within its parent.';
COMMENT ON COLUMN pgdurable.run_detail.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.run_detail.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.run_detail.finished_at IS 'When it reached a terminal status.';

------------------------------------------------------------------------------
-- pgdurable.run_steps: each checkpoint of each run, without its state (0019's
-- columns, then owner and step_name).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_steps AS
  SELECT c.run_id,
         c.step,
         c.token,
         c.wake ->> 'type'  AS wake_type,
         c.wake ->> 'kind'  AS wake_kind,
         c.wake ->> 'ref'   AS wake_ref,
         c.created_at,
         c.owner,
         c.state -> 'workflow' ->> 'name' AS step_name
    FROM pgdurable.checkpoints c;
COMMENT ON VIEW pgdurable.run_steps IS
  'Checkpoint history without states: step, lease token, the wake that started the step, when.';
COMMENT ON COLUMN pgdurable.run_steps.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_steps.step IS 'Step number (1-based).';
COMMENT ON COLUMN pgdurable.run_steps.token IS 'Lease token under which the step was checkpointed.';
COMMENT ON COLUMN pgdurable.run_steps.wake_type IS 'What woke the run before this step (signal | timeout), else NULL.';
COMMENT ON COLUMN pgdurable.run_steps.wake_kind IS 'Signal kind of that wake.';
COMMENT ON COLUMN pgdurable.run_steps.wake_ref IS 'Signal reference of that wake.';
COMMENT ON COLUMN pgdurable.run_steps.created_at IS 'When the checkpoint was written.';
COMMENT ON COLUMN pgdurable.run_steps.owner IS
  'Lease owner (worker id) that wrote the checkpoint; NULL before migration 0020 and for history a fork copied.';
COMMENT ON COLUMN pgdurable.run_steps.step_name IS
  'Name of the step a workflow recorded (step name, wait or sleep name, patch id); NULL for '
  'an @app.task, whose steps are numbered, not named.';

------------------------------------------------------------------------------
-- pgdurable.run_effects: each recorded effect, without its result (0019's
-- columns, then step).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.run_effects AS
  SELECT e.run_id,
         e.key,
         e.status,
         e.token,
         e.error ->> 'type'     AS error_type,
         e.error ->> 'message'  AS error_message,
         e.created_at,
         e.updated_at,
         e.step
    FROM pgdurable.effects e;
COMMENT ON VIEW pgdurable.run_effects IS
  'Side effects of runs without their results: key, outcome, lease token, when.';
COMMENT ON COLUMN pgdurable.run_effects.run_id IS 'Run id.';
COMMENT ON COLUMN pgdurable.run_effects.key IS 'Effect key.';
COMMENT ON COLUMN pgdurable.run_effects.status IS 'started | succeeded | failed.';
COMMENT ON COLUMN pgdurable.run_effects.token IS 'Lease token under which it was recorded.';
COMMENT ON COLUMN pgdurable.run_effects.error_type IS 'Error type of a failed effect.';
COMMENT ON COLUMN pgdurable.run_effects.error_message IS 'Error message of a failed effect.';
COMMENT ON COLUMN pgdurable.run_effects.created_at IS 'When first recorded.';
COMMENT ON COLUMN pgdurable.run_effects.updated_at IS 'When its status last changed.';
COMMENT ON COLUMN pgdurable.run_effects.step IS
  'runs.step when the effect was first recorded (0-based index of the running step: it '
  'belongs to checkpoint step + 1); NULL for effects recorded before migration 0017.';
