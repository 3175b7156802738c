-- 0001_schema: the pgdurable schema, its tables and the database clock.
--
-- Every table lives in the `pgdurable` schema. State transitions are SQL
-- functions added by later migrations (0002_leases, 0003_runs, ...); this file
-- only creates the nouns. An applied migration is never edited: change the
-- schema with a new numbered file.

CREATE SCHEMA IF NOT EXISTS pgdurable;
COMMENT ON SCHEMA pgdurable IS
  'pgdurable: durable agent runs, leases, signals and effects on PostgreSQL alone.';

-- pgdurable.now(): the one clock every lease, timer and deadline is judged by.
-- It is the database's transaction clock; tests may shift it with
--   SET LOCAL pgdurable.now = '2030-01-01 00:00:00+00';
-- inside a transaction. Production never sets it.
CREATE FUNCTION pgdurable.now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT coalesce(nullif(current_setting('pgdurable.now', true), '')::timestamptz,
                  pg_catalog.now())
$$;
COMMENT ON FUNCTION pgdurable.now() IS
  'The database clock used for every lease, timer and deadline (transaction time; '
  'overridable only by SET LOCAL pgdurable.now in tests).';

------------------------------------------------------------------------------
-- leases: one row per lease key (the seed''s LeaseProvider contract).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.leases (
  key         bytea       NOT NULL,
  key_hash    bytea       GENERATED ALWAYS AS (sha256(key)) STORED PRIMARY KEY,
  owner       bytea,
  token       bigint      NOT NULL DEFAULT 0,
  expires_at  timestamptz,
  acquired_at timestamptz,
  renewed_at  timestamptz,
  CHECK ((owner IS NULL) = (expires_at IS NULL))
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.leases IS
  'Distributed leases: at most one live owner per key, judged by pgdurable.now(). '
  'A released lease keeps its row so that tokens stay monotonic per key.';
COMMENT ON COLUMN pgdurable.leases.key IS
  'Lease key as UTF-8 bytes (bytea, so that any string, including NUL, round-trips).';
COMMENT ON COLUMN pgdurable.leases.key_hash IS
  'sha256 of key: the primary key, so that keys of any length (B-tree entries are '
  'limited to about 2.7 kB) are unique; lookups by key use the hash index leases_key_idx.';
COMMENT ON COLUMN pgdurable.leases.owner IS
  'Current holder as UTF-8 bytes; NULL when released. Live only while expires_at > pgdurable.now().';
COMMENT ON COLUMN pgdurable.leases.token IS
  'Fencing token: incremented on every grant to a new owner and on every transfer; never decreases.';
COMMENT ON COLUMN pgdurable.leases.expires_at IS
  'When the grant lapses (database clock); NULL when released.';
COMMENT ON COLUMN pgdurable.leases.acquired_at IS
  'When the current owner was granted the lease (acquire or transfer).';
COMMENT ON COLUMN pgdurable.leases.renewed_at IS
  'When the current owner last renewed or re-acquired the lease.';
-- Equality lookups by key of any length (a hash index stores only the hash).
CREATE INDEX leases_key_idx ON pgdurable.leases USING hash (key);

------------------------------------------------------------------------------
-- runs: one row per durable run; its lease, wait and checkpoint live here.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.runs (
  id                  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
  task                text        NOT NULL CHECK (task <> ''),
  revision            text        NOT NULL,
  queue               text        NOT NULL DEFAULT 'default' CHECK (queue <> ''),
  priority            integer     NOT NULL DEFAULT 0,
  status              text        NOT NULL DEFAULT 'runnable'
                      CHECK (status IN ('runnable', 'leased', 'waiting', 'completed',
                                        'failed', 'cancelled', 'incompatible')),
  state               jsonb       NOT NULL DEFAULT '{}',
  step                integer     NOT NULL DEFAULT 0 CHECK (step >= 0),
  attempts            integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  max_attempts        integer     NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
  claims              integer     NOT NULL DEFAULT 0 CHECK (claims >= 0),
  idempotency_key     text        UNIQUE,
  available_at        timestamptz NOT NULL DEFAULT pgdurable.now(),
  deadline_at         timestamptz,
  budget              numeric     CHECK (budget IS NULL OR budget >= 0),
  spent               numeric     NOT NULL DEFAULT 0,
  lease_owner         text,
  lease_token         bigint      NOT NULL DEFAULT 0,
  lease_expires_at    timestamptz,
  leased_at           timestamptz,
  wait_kind           text,
  wait_ref            text,
  wait_since          timestamptz,
  wake_at             timestamptz,
  wake                jsonb,
  result              jsonb,
  error               jsonb,
  cancel_requested_at timestamptz,
  created_at          timestamptz NOT NULL DEFAULT pgdurable.now(),
  updated_at          timestamptz NOT NULL DEFAULT pgdurable.now(),
  finished_at         timestamptz
) WITH (fillfactor = 70,
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.runs IS
  'Durable runs: the run lives here, workers only lease it. state is the latest checkpoint.';
COMMENT ON COLUMN pgdurable.runs.id IS 'Run id.';
COMMENT ON COLUMN pgdurable.runs.task IS 'Task name the run executes.';
COMMENT ON COLUMN pgdurable.runs.revision IS
  'Task revision the run was started with; only a worker with the same revision claims it.';
COMMENT ON COLUMN pgdurable.runs.queue IS 'Queue name; workers claim from the queues they serve.';
COMMENT ON COLUMN pgdurable.runs.priority IS 'Higher runs first within a queue.';
COMMENT ON COLUMN pgdurable.runs.status IS
  'runnable | leased | waiting | completed | failed | cancelled | incompatible (checkpoint no longer matches its definition).';
COMMENT ON COLUMN pgdurable.runs.state IS 'Latest checkpointed state (JSONB), written after every step under the lease fence.';
COMMENT ON COLUMN pgdurable.runs.step IS 'Number of steps checkpointed so far (the index of the next step).';
COMMENT ON COLUMN pgdurable.runs.attempts IS 'Failed attempts counted against max_attempts.';
COMMENT ON COLUMN pgdurable.runs.max_attempts IS 'Attempts allowed before the run fails.';
COMMENT ON COLUMN pgdurable.runs.claims IS 'How many times a worker claimed the run (bounds poison runs that crash their workers).';
COMMENT ON COLUMN pgdurable.runs.idempotency_key IS 'Caller-chosen key: starting again with the same key returns this run.';
COMMENT ON COLUMN pgdurable.runs.available_at IS 'A runnable run is not claimed before this time (retry backoff).';
COMMENT ON COLUMN pgdurable.runs.deadline_at IS 'The run fails with DeadlineExceeded after this time.';
COMMENT ON COLUMN pgdurable.runs.budget IS 'Spend limit (any unit the task uses); NULL = unlimited.';
COMMENT ON COLUMN pgdurable.runs.spent IS 'Amount spent so far (ctx.spend).';
COMMENT ON COLUMN pgdurable.runs.lease_owner IS 'Worker holding the run while status = leased.';
COMMENT ON COLUMN pgdurable.runs.lease_token IS 'Fencing token of the current claim; every claim increments it.';
COMMENT ON COLUMN pgdurable.runs.lease_expires_at IS 'When the current claim lapses (database clock); renewed by heartbeats.';
COMMENT ON COLUMN pgdurable.runs.leased_at IS 'When the current claim was made.';
COMMENT ON COLUMN pgdurable.runs.wait_kind IS 'Signal kind the parked run waits for (e.g. ci, approval); NULL for a plain timer.';
COMMENT ON COLUMN pgdurable.runs.wait_ref IS 'Signal reference the parked run waits for (e.g. a build id).';
COMMENT ON COLUMN pgdurable.runs.wait_since IS 'When the run parked.';
COMMENT ON COLUMN pgdurable.runs.wake_at IS 'Timer: the parked run becomes runnable at this time (sleep end or wait timeout).';
COMMENT ON COLUMN pgdurable.runs.wake IS 'What woke the run last (signal or timeout), checkpointed so a replay sees the same outcome.';
COMMENT ON COLUMN pgdurable.runs.result IS 'Result of a completed run.';
COMMENT ON COLUMN pgdurable.runs.error IS 'Last error: {type, message, traceback}.';
COMMENT ON COLUMN pgdurable.runs.cancel_requested_at IS 'Set by cancel while the run is leased; the worker stops at its next boundary.';
COMMENT ON COLUMN pgdurable.runs.created_at IS 'When the run was started.';
COMMENT ON COLUMN pgdurable.runs.updated_at IS 'Last state transition.';
COMMENT ON COLUMN pgdurable.runs.finished_at IS 'When the run reached a terminal status.';

------------------------------------------------------------------------------
-- checkpoints: the history of a run's steps, one row per checkpointed step.
------------------------------------------------------------------------------
CREATE TABLE pgdurable.checkpoints (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  step       integer     NOT NULL CHECK (step >= 1),
  token      bigint      NOT NULL,
  state      jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (run_id, step)
);
COMMENT ON TABLE pgdurable.checkpoints IS
  'Per-step checkpoint history of each run (the latest one is also runs.state).';
COMMENT ON COLUMN pgdurable.checkpoints.run_id IS 'Run the checkpoint belongs to.';
COMMENT ON COLUMN pgdurable.checkpoints.step IS 'Step number this checkpoint completes (1-based).';
COMMENT ON COLUMN pgdurable.checkpoints.token IS 'Lease token under which the step was checkpointed.';
COMMENT ON COLUMN pgdurable.checkpoints.state IS 'State after the step.';
COMMENT ON COLUMN pgdurable.checkpoints.created_at IS 'When the checkpoint was written.';

------------------------------------------------------------------------------
-- signals: delivered and pending signals (kind, ref, payload).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.signals (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind        text        NOT NULL CHECK (kind <> ''),
  ref         text        NOT NULL CHECK (ref <> ''),
  payload     jsonb,
  signal_id   text        UNIQUE,
  run_id      uuid        REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  created_at  timestamptz NOT NULL DEFAULT pgdurable.now(),
  expires_at  timestamptz,
  consumed_by uuid,
  consumed_at timestamptz
);
COMMENT ON TABLE pgdurable.signals IS
  'Signals: a signal wakes the runs waiting on (kind, ref); one that arrives before its run parks is kept until expires_at.';
COMMENT ON COLUMN pgdurable.signals.id IS 'Signal sequence number.';
COMMENT ON COLUMN pgdurable.signals.kind IS 'Signal kind, e.g. ci, approval, webhook.';
COMMENT ON COLUMN pgdurable.signals.ref IS 'Reference within the kind, e.g. a build id.';
COMMENT ON COLUMN pgdurable.signals.payload IS 'JSON payload delivered to the run (ctx.wake).';
COMMENT ON COLUMN pgdurable.signals.signal_id IS 'Caller-chosen id: the same id is stored once (deduplication).';
COMMENT ON COLUMN pgdurable.signals.run_id IS 'Set when the signal addresses one run (signal_run).';
COMMENT ON COLUMN pgdurable.signals.created_at IS 'When the signal was sent.';
COMMENT ON COLUMN pgdurable.signals.expires_at IS 'An unconsumed signal is dropped after this time.';
COMMENT ON COLUMN pgdurable.signals.consumed_by IS 'Run that consumed the signal.';
COMMENT ON COLUMN pgdurable.signals.consumed_at IS 'When it was consumed.';

------------------------------------------------------------------------------
-- effects: results of side effects recorded inside runs (ctx.effect).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.effects (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  key        text        NOT NULL CHECK (key <> ''),
  status     text        NOT NULL CHECK (status IN ('started', 'succeeded', 'failed')),
  token      bigint      NOT NULL,
  result     jsonb,
  error      jsonb,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  updated_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (run_id, key)
);
COMMENT ON TABLE pgdurable.effects IS
  'Side effects of runs, keyed per run: a recorded result is returned instead of acting twice.';
COMMENT ON COLUMN pgdurable.effects.run_id IS 'Run that performed the effect.';
COMMENT ON COLUMN pgdurable.effects.key IS 'Idempotency key of the effect within the run.';
COMMENT ON COLUMN pgdurable.effects.status IS 'started (in flight, outcome unknown) | succeeded | failed.';
COMMENT ON COLUMN pgdurable.effects.token IS 'Lease token under which the effect was recorded.';
COMMENT ON COLUMN pgdurable.effects.result IS 'JSON result of a succeeded effect.';
COMMENT ON COLUMN pgdurable.effects.error IS 'Error of a failed effect: {type, message}.';
COMMENT ON COLUMN pgdurable.effects.created_at IS 'When the effect was first recorded.';
COMMENT ON COLUMN pgdurable.effects.updated_at IS 'When its status last changed.';

------------------------------------------------------------------------------
-- idempotency_keys: side effects outside runs (with_idempotency).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.idempotency_keys (
  key        text        PRIMARY KEY CHECK (key <> ''),
  status     text        NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
  owner      text,
  result     jsonb,
  error      jsonb,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  expires_at timestamptz NOT NULL
);
COMMENT ON TABLE pgdurable.idempotency_keys IS
  'with_idempotency: one execution per key; later callers get the stored result until expires_at.';
COMMENT ON COLUMN pgdurable.idempotency_keys.key IS 'Caller-chosen idempotency key.';
COMMENT ON COLUMN pgdurable.idempotency_keys.status IS 'running | succeeded | failed.';
COMMENT ON COLUMN pgdurable.idempotency_keys.owner IS 'Caller executing the effect while running.';
COMMENT ON COLUMN pgdurable.idempotency_keys.result IS 'JSON result once succeeded.';
COMMENT ON COLUMN pgdurable.idempotency_keys.error IS 'Error once failed: {type, message}.';
COMMENT ON COLUMN pgdurable.idempotency_keys.created_at IS 'When the key was first claimed.';
COMMENT ON COLUMN pgdurable.idempotency_keys.expires_at IS 'After this time the key may execute again.';

------------------------------------------------------------------------------
-- task_checkpoints: records of define_durable_task tasks (PostgresDurableStore).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.task_checkpoints (
  task_id    text        PRIMARY KEY CHECK (task_id <> ''),
  record     jsonb       NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT pgdurable.now()
);
COMMENT ON TABLE pgdurable.task_checkpoints IS
  'Checkpoint records of durable task definitions (define_durable_task), one per task id.';
COMMENT ON COLUMN pgdurable.task_checkpoints.task_id IS 'Task id the record belongs to.';
COMMENT ON COLUMN pgdurable.task_checkpoints.record IS
  'The checkpoint record: version, definition_id, revision, next_step_index, attempt_count, '
  'max_attempts, deadline_at_ms, status, state.';
COMMENT ON COLUMN pgdurable.task_checkpoints.updated_at IS 'When the record was last saved.';

------------------------------------------------------------------------------
-- run_events: each run's output stream (ctx.emit).
------------------------------------------------------------------------------
CREATE TABLE pgdurable.run_events (
  run_id     uuid        NOT NULL REFERENCES pgdurable.runs (id) ON DELETE CASCADE,
  seq        bigint      NOT NULL CHECK (seq >= 1),
  event      jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (run_id, seq)
);
COMMENT ON TABLE pgdurable.run_events IS
  'Output stream of each run (tokens, tool calls, progress), replayable from a cursor.';
COMMENT ON COLUMN pgdurable.run_events.run_id IS 'Run that emitted the event.';
COMMENT ON COLUMN pgdurable.run_events.seq IS 'Sequence number within the run, from 1, gapless.';
COMMENT ON COLUMN pgdurable.run_events.event IS 'The event (JSON).';
COMMENT ON COLUMN pgdurable.run_events.created_at IS 'When it was emitted.';
