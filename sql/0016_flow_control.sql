-- 0016_flow_control: flow control across all workers (issue 13).
--
-- * Queue limits (pgdurable.queues, one row per limited queue): concurrency
--   (at most N runs of the queue leased at once, across every worker),
--   per_key_concurrency (at most N leased runs per concurrency key) and a
--   start rate (a token bucket: rate per second, burst). A queue without a row
--   is unlimited and keeps the plain claim (no lock, no extra query but one
--   primary-key probe of this small table).
-- * The claim of a limited queue (_claim_flow) locks the queue's row
--   (FOR UPDATE, NOT skip locked: claimers of one limited queue take turns),
--   then, in a NEW statement (so a fresh READ COMMITTED snapshot that sees
--   every claim committed before the lock was granted), counts the queue's
--   live leases on runs_leased_idx (the leased set is small: at most the cap).
--   Only claims add leases and they hold the row, so the count can only be
--   too high (a completion committing meanwhile), never too low: the cap
--   holds under any number of workers. An expired lease is not counted: a
--   crashed worker's slots come back when its leases lapse.
-- * Fairness: runs carry concurrency_key ('' = none). A limited queue's
--   claim visits the keys with due work in rotation from queues.key_cursor,
--   one run per key per round (a loose index scan on runs_runnable_key_idx),
--   so a key with 10,000 queued runs delays a key with one by one round.
-- * Named token buckets (pgdurable.buckets) shared by every process;
--   acquire_tokens either takes the tokens or says how long to wait: the
--   worker parks the run with a timer for that long (no worker held).
-- * Delayed start: start_run_flow sets available_at (at / delay) and the key.
-- * A run of a limited queue leaving 'leased' NOTIFYs pgdurable_wake(queue)
--   (trigger runs_flow_slot_freed_trg): the next run starts at once.
--
-- MERGE NOTE: claim_runs and next_wakeup are redefined here from their
-- 0009_security_boundary text (pair matching kept); start_run is not changed
-- (start_run_flow calls it).
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.runs ADD COLUMN concurrency_key text NOT NULL DEFAULT '';
COMMENT ON COLUMN pgdurable.runs.concurrency_key IS
  'Fairness / per-key concurrency key (tenant, user, conversation); '''' = none. In a limited '
  'queue (pgdurable.queues) claims rotate between keys and per_key_concurrency applies '
  '(not to '''').';

-- Fair claim: the keys with runnable work of a queue, in key order (loose
-- index scan), and each key's head (priority DESC, oldest first).
CREATE INDEX runs_runnable_key_idx
  ON pgdurable.runs (queue, concurrency_key, priority DESC, available_at)
  WHERE status = 'runnable';

CREATE TABLE pgdurable.queues (
  name                text        PRIMARY KEY CHECK (name <> ''),
  concurrency         integer     CHECK (concurrency > 0),
  per_key_concurrency integer     CHECK (per_key_concurrency > 0),
  rate                numeric     CHECK (rate > 0),
  burst               numeric     CHECK (burst >= 1),
  tokens              numeric     NOT NULL DEFAULT 0,
  refilled_at         timestamptz NOT NULL DEFAULT pgdurable.now(),
  key_cursor          text,
  updated_at          timestamptz NOT NULL DEFAULT pgdurable.now(),
  CHECK ((rate IS NULL) = (burst IS NULL))
);
COMMENT ON TABLE pgdurable.queues IS
  'Flow limits of a queue, enforced inside claim_runs across every worker. No row = unlimited '
  '(plain claim). Set with pgdurable.set_queue (Durable.set_queue).';
COMMENT ON COLUMN pgdurable.queues.name IS 'Queue name (runs.queue).';
COMMENT ON COLUMN pgdurable.queues.concurrency IS
  'At most this many runs of the queue leased at once (live leases), NULL = no cap.';
COMMENT ON COLUMN pgdurable.queues.per_key_concurrency IS
  'At most this many leased runs per concurrency_key (runs without a key are exempt), NULL = no cap.';
COMMENT ON COLUMN pgdurable.queues.rate IS
  'Start rate: tokens per second of the queue''s bucket; each claimed run takes one. NULL = none.';
COMMENT ON COLUMN pgdurable.queues.burst IS 'Capacity of the queue''s start bucket (runs).';
COMMENT ON COLUMN pgdurable.queues.tokens IS 'Start tokens left at refilled_at.';
COMMENT ON COLUMN pgdurable.queues.refilled_at IS 'When tokens was last brought up to date.';
COMMENT ON COLUMN pgdurable.queues.key_cursor IS
  'The last concurrency key served: the next claim''s round of keys starts after it.';
COMMENT ON COLUMN pgdurable.queues.updated_at IS 'When the limits were last set.';

CREATE TABLE pgdurable.buckets (
  name        text        PRIMARY KEY CHECK (name <> ''),
  rate        numeric     NOT NULL CHECK (rate > 0),
  burst       numeric     NOT NULL CHECK (burst > 0),
  tokens      numeric     NOT NULL,
  refilled_at timestamptz NOT NULL DEFAULT pgdurable.now(),
  updated_at  timestamptz NOT NULL DEFAULT pgdurable.now()
);
COMMENT ON TABLE pgdurable.buckets IS
  'Named token buckets shared by every process (ctx.acquire(name, cost)); set with set_bucket.';
COMMENT ON COLUMN pgdurable.buckets.name IS 'Bucket name, e.g. openai:gpt-4o:tokens.';
COMMENT ON COLUMN pgdurable.buckets.rate IS 'Refill, tokens per second.';
COMMENT ON COLUMN pgdurable.buckets.burst IS 'Capacity: the most tokens the bucket holds (and the largest cost).';
COMMENT ON COLUMN pgdurable.buckets.tokens IS 'Tokens left at refilled_at (below zero: reserved by parked runs).';
COMMENT ON COLUMN pgdurable.buckets.refilled_at IS 'When tokens was last brought up to date.';
COMMENT ON COLUMN pgdurable.buckets.updated_at IS 'When rate/burst were last set.';
