-- 0032_run_affinity: a run's affinity to the worker that holds its stateful
-- service (issue 37: browsers, shells and sandboxes need long-lived services).
--
-- A step that keeps a service in its worker process's memory (a browser
-- session, a shell, a sandbox) pins its run to that worker (pin_run, fenced):
-- runs.affinity_* name the holder (worker id + the instance of the process,
-- see below), a mode and a wait. From then on, whenever the run is READY (a
-- runnable run from its available_at; a parked run from its timer's wake_at),
-- only its holder may claim it for `wait` after that moment -- the run is
-- RESERVED for it -- unless the holder is gone:
--   * soft: `wait` is a preference window (default 5 s, pgdurable/affinity.py):
--     a holder that is alive but busy (no free slot) does not starve the run;
--     after the window any worker of its queue takes it;
--   * hard: `wait` is a timeout (default 300 s): the run waits that long for
--     its holder, then any worker takes it.
-- The two modes are one rule with two intents (and defaults); the mode is
-- recorded for the step and for operators.
--
-- Whether the holder is there is decided by the database, never by a client's
-- clock: worker presence (pgdurable.worker_presence, one row per worker id)
-- says which process instance runs under that id and until when it is known
-- alive. A worker announces itself before its first pin and then every
-- heartbeat interval (worker_present: until = now + its lease TTL), and
-- removes itself on a clean stop (worker_absent); a worker that never pins
-- writes nothing. A SIGKILLed worker's row lapses: at most a lease TTL after
-- its last renewal, its reserved runs are claimable by anyone -- the same
-- moment its leases expire. A worker restarted under the same id is a new
-- instance: the runs pinned to the old one are no longer reserved. A lapsed
-- row means the same as no row, so lapsed rows are pruned freely.
--
-- A run claimed by another worker than its holder keeps its affinity (the
-- step sees it: ctx.affinity, ctx.service_lost) until its step pins it again
-- (to the new worker, after rebuilding the service) or unpins it (pin_run with
-- mode NULL). Expired leases (crash recovery) are never reserved: a holder
-- whose lease lapsed is dead or stalled.
--
-- The claim stays ONE statement with the same plan (PITFALLS #7, #10): the
-- runnable and timer branches keep their partial indexes and LIMITs and gain
-- one filter, `affinity_worker IS NULL OR affinity_worker = owner OR not
-- reserved`; for a run without affinity that is one null test, and only an
-- affine candidate reads worker_presence (one primary-key probe: THE RULE
-- below). next_wakeup answers with the same rule, so workers that
-- may not take a reserved run sleep until its reservation ends or its holder's
-- presence would lapse (no busy claim loop, invariant 7), and the holder
-- (p_owner, new optional argument) sees it due at once. A reserved run always
-- has a future (invariant 3): its reservation ends at ready + wait at the
-- latest.
--
-- The affinity columns have no CHECK: every CHECK of runs is prepared again by
-- each statement writing runs (0025), and the columns are written only by
-- pin_run and affine_started_run, which validate what they write.
--
-- MERGE NOTE: claim_runs (its result gains `affinity`, so it is dropped and
-- created; SET plan_cache_mode of 0021 kept), _claim_flow and next_wakeup
-- (now with p_owner DEFAULT NULL) are restated from 0016_flow_control with
-- the affinity filter; nothing else in them changed.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
CREATE TABLE pgdurable.worker_presence (
  worker_id text        PRIMARY KEY CHECK (worker_id <> ''),
  instance  text        NOT NULL CHECK (instance <> ''),
  since     timestamptz NOT NULL,
  until     timestamptz NOT NULL
);
COMMENT ON TABLE pgdurable.worker_presence IS
  'Worker presence: which process instance runs under a worker id, known alive until `until` '
  '(database clock). Written from the worker''s first pin, renewed every heartbeat interval, '
  'removed on a clean stop; a lapsed row means the same as no row.';
COMMENT ON COLUMN pgdurable.worker_presence.worker_id IS 'The worker id (its lease owner name).';
COMMENT ON COLUMN pgdurable.worker_presence.instance IS
  'The process instance (random per Worker object): a restart under the same id is a new instance.';
COMMENT ON COLUMN pgdurable.worker_presence.since IS 'When this instance first announced itself.';
COMMENT ON COLUMN pgdurable.worker_presence.until IS
  'The worker is present until then (now + its lease TTL at its last renewal).';

ALTER TABLE pgdurable.runs
  ADD COLUMN affinity_worker text,
  ADD COLUMN affinity_instance text,
  ADD COLUMN affinity_mode text,
  ADD COLUMN affinity_wait interval,
  ADD COLUMN affinity_info jsonb,
  ADD COLUMN affinity_since timestamptz;
COMMENT ON COLUMN pgdurable.runs.affinity_worker IS
  'Worker id holding the run''s stateful service (pin_run); NULL: no affinity. While the holder '
  'is present, a ready run is reserved for it for affinity_wait.';
COMMENT ON COLUMN pgdurable.runs.affinity_instance IS
  'The holder''s process instance (worker_presence.instance) when it pinned the run.';
COMMENT ON COLUMN pgdurable.runs.affinity_mode IS
  'soft (a preference window) or hard (a timeout): how affinity_wait is meant.';
COMMENT ON COLUMN pgdurable.runs.affinity_wait IS
  'How long after the run is ready (available_at, or a timer''s wake_at) only its holder may claim it.';
COMMENT ON COLUMN pgdurable.runs.affinity_info IS
  'What the holder holds (a JSON object the step chose, e.g. {"service": "browser"}), or NULL.';
COMMENT ON COLUMN pgdurable.runs.affinity_since IS 'When the run was pinned to its holder.';

------------------------------------------------------------------------------
-- The claim and the idle poll, restated from 0016_flow_control with the
-- affinity rule (see the file header). claim_runs' result gains `affinity`
-- (the _affinity_record of the run, NULL without), so it is dropped and
-- created again, with 0021's plan_cache_mode.
------------------------------------------------------------------------------
DROP FUNCTION IF EXISTS pgdurable.claim_runs(text, text[], text[], text[], integer, interval, integer[]);
DROP FUNCTION IF EXISTS pgdurable._claim_flow(text, text, text[], text[], integer, interval, integer[],
                                    timestamptz);
DROP FUNCTION IF EXISTS pgdurable.next_wakeup(text[], text[], text[]);

------------------------------------------------------------------------------
-- The allow-list (0029): the functions the app role may execute. next_wakeup
-- was dropped and created with its new p_owner argument; claim_runs keeps its
-- arguments (its row stands). _affinity_record is a helper of the definer
-- functions: no grant.
------------------------------------------------------------------------------
UPDATE pgdurable.security_api SET routine = 'pgdurable.next_wakeup(text[],text[],text[],text)'
 WHERE routine = 'pgdurable.next_wakeup(text[],text[],text[])';
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.pin_run(uuid,bigint,text,text,text,interval,jsonb)', false),
  ('pgdurable.worker_present(text,text,interval)', false),
  ('pgdurable.worker_absent(text,text,text[])', false),
  ('pgdurable.affine_started_run(uuid,uuid)', false);
