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

------------------------------------------------------------------------------
-- pgdurable.set_queue(name, concurrency, per_key_concurrency, rate, burst) -> void
-- Set (replace) a queue's limits; all NULL removes them (plain claim again).
-- rate is per second; burst defaults to max(1, rate). Zero or negative
-- values: PD000 naming the argument, nothing written. The next claim uses
-- the new limits; NOTIFY pgdurable_wake(name) so raised limits apply at once.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.set_queue(p_name text, p_concurrency integer,
                                    p_per_key_concurrency integer, p_rate numeric,
                                    p_burst numeric)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_name IS NULL OR p_name = '' THEN
    RAISE EXCEPTION 'set_queue: name must be a non-empty queue name' USING ERRCODE = 'PD000';
  ELSIF p_concurrency IS NOT NULL AND p_concurrency < 1 THEN
    RAISE EXCEPTION 'set_queue: concurrency must be >= 1, got %', p_concurrency
      USING ERRCODE = 'PD000';
  ELSIF p_per_key_concurrency IS NOT NULL AND p_per_key_concurrency < 1 THEN
    RAISE EXCEPTION 'set_queue: per_key_concurrency must be >= 1, got %', p_per_key_concurrency
      USING ERRCODE = 'PD000';
  ELSIF p_rate IS NOT NULL AND p_rate <= 0 THEN
    RAISE EXCEPTION 'set_queue: rate must be > 0, got %', p_rate USING ERRCODE = 'PD000';
  ELSIF p_burst IS NOT NULL AND (p_rate IS NULL OR p_burst < 1) THEN
    RAISE EXCEPTION 'set_queue: burst must be >= 1 and needs a rate, got %', p_burst
      USING ERRCODE = 'PD000';
  END IF;
  IF p_concurrency IS NULL AND p_per_key_concurrency IS NULL AND p_rate IS NULL THEN
    DELETE FROM pgdurable.queues WHERE name = p_name;
  ELSE
    INSERT INTO pgdurable.queues AS q (name, concurrency, per_key_concurrency, rate, burst,
                                       tokens, refilled_at, updated_at)
    VALUES (p_name, p_concurrency, p_per_key_concurrency, p_rate,
            CASE WHEN p_rate IS NOT NULL THEN coalesce(p_burst, greatest(1, p_rate)) END,
            coalesce(p_burst, greatest(1, p_rate), 0), pgdurable.now(), pgdurable.now())
    ON CONFLICT (name) DO UPDATE SET
      concurrency = excluded.concurrency, per_key_concurrency = excluded.per_key_concurrency,
      rate = excluded.rate, burst = excluded.burst,
      tokens = CASE WHEN excluded.rate IS NULL THEN 0
                    WHEN q.rate IS NULL THEN excluded.tokens
                    ELSE least(q.tokens, excluded.burst) END,
      updated_at = excluded.updated_at;
  END IF;
  PERFORM pg_notify('pgdurable_wake', p_name);
END
$$;
COMMENT ON FUNCTION pgdurable.set_queue(text, integer, integer, numeric, numeric) IS
  'Set a queue''s concurrency, per-key concurrency and start rate (per second, burst); all NULL = unlimited.';

------------------------------------------------------------------------------
-- pgdurable.set_bucket(name, rate, burst) -> void
-- Create or change a named token bucket (rate tokens per second, burst the
-- capacity, default max(1, rate)). A new bucket starts full; a changed one
-- keeps its level (capped at the new burst). Bad values: PD000, nothing written.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.set_bucket(p_name text, p_rate numeric, p_burst numeric)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_burst numeric := coalesce(p_burst, greatest(1, p_rate));
BEGIN
  IF p_name IS NULL OR p_name = '' THEN
    RAISE EXCEPTION 'set_bucket: name must be a non-empty bucket name' USING ERRCODE = 'PD000';
  ELSIF p_rate IS NULL OR p_rate <= 0 THEN
    RAISE EXCEPTION 'set_bucket: rate must be > 0, got %', p_rate USING ERRCODE = 'PD000';
  ELSIF v_burst <= 0 THEN
    RAISE EXCEPTION 'set_bucket: burst must be > 0, got %', p_burst USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.buckets AS b (name, rate, burst, tokens, refilled_at, updated_at)
  VALUES (p_name, p_rate, v_burst, v_burst, pgdurable.now(), pgdurable.now())
  ON CONFLICT (name) DO UPDATE SET
    tokens = least(b.burst, b.tokens + b.rate * greatest(0, extract(epoch FROM pgdurable.now() - b.refilled_at)),
                   excluded.burst),
    refilled_at = greatest(b.refilled_at, pgdurable.now()), rate = excluded.rate, burst = excluded.burst,
    updated_at = pgdurable.now();
END
$$;
COMMENT ON FUNCTION pgdurable.set_bucket(text, numeric, numeric) IS
  'Create or change a named token bucket (rate per second, burst); a new bucket starts full.';

------------------------------------------------------------------------------
-- pgdurable.acquire_tokens(name, cost) -> double precision
-- Take cost tokens from the named bucket: 0 when it held them. Otherwise
-- RESERVE them (the level goes below zero, a debt later callers queue
-- behind) and return the seconds until the level is back at zero: the caller
-- parks until then and goes on without calling again (ctx.acquire parks
-- with wake kind 'pgdurable.acquire', ref = name, which the next attempt of
-- the step reads as "already paid"). So every acquire costs one call, never
-- a poll, and waiters are served first come, first served. The row is
-- locked: takes + reservations never outrun burst + rate * elapsed time.
-- Unknown bucket, cost <= 0 or cost > burst: PD000, nothing changes.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.acquire_tokens(p_name text, p_cost numeric)
RETURNS double precision
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  b pgdurable.buckets;
  v_now timestamptz := pgdurable.now();
  v_tokens numeric;
BEGIN
  SELECT * INTO b FROM pgdurable.buckets WHERE name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'acquire: unknown bucket name %', p_name USING ERRCODE = 'PD000';
  ELSIF p_cost IS NULL OR p_cost <= 0 THEN
    RAISE EXCEPTION 'acquire: cost must be > 0, got %', p_cost USING ERRCODE = 'PD000';
  ELSIF p_cost > b.burst THEN
    RAISE EXCEPTION 'acquire: cost % is larger than the burst % of bucket %', p_cost, b.burst,
      p_name USING ERRCODE = 'PD000';
  END IF;
  -- a caller whose transaction began before the last one's (it waited for
  -- the row lock) refills nothing and keeps refilled_at monotonic: an
  -- interval is never refilled twice
  v_now := greatest(v_now, b.refilled_at);
  v_tokens := least(b.burst, b.tokens + b.rate * extract(epoch FROM v_now - b.refilled_at));
  UPDATE pgdurable.buckets SET tokens = v_tokens - p_cost, refilled_at = v_now
   WHERE name = p_name;
  IF v_tokens >= p_cost THEN
    RETURN 0;
  END IF;
  -- due at v_now + debt / rate, counted from now
  RETURN (extract(epoch FROM v_now - pgdurable.now()) + (p_cost - v_tokens) / b.rate)::double precision;
END
$$;
COMMENT ON FUNCTION pgdurable.acquire_tokens(text, numeric) IS
  'Take cost tokens from a named bucket (returns 0) or reserve them and return the seconds to wait.';

------------------------------------------------------------------------------
-- pgdurable.start_run_flow(... start_run's arguments ..., key, at, delay)
--   -> TABLE(run_id uuid, created boolean)
-- start_run, then (when created) the run's concurrency key and delayed start:
-- available_at = at, else now() + delay, else now. A delayed run is
-- 'runnable' with a future available_at (pgdurable.delayed_runs); workers
-- find it through next_wakeup.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.start_run_flow(
  p_task text, p_revision text, p_state jsonb, p_queue text, p_priority integer,
  p_max_attempts integer, p_idempotency_key text, p_deadline_in interval,
  p_deadline_at timestamptz, p_budget numeric, p_key text, p_at timestamptz,
  p_delay interval)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_id uuid;
  v_created boolean;
BEGIN
  IF p_delay IS NOT NULL AND p_delay < interval '0' THEN
    RAISE EXCEPTION 'start: delay must be >= 0, got %', p_delay USING ERRCODE = 'PD000';
  END IF;
  SELECT s.run_id, s.created INTO v_id, v_created
    FROM pgdurable.start_run(p_task, p_revision, p_state, p_queue, p_priority, p_max_attempts,
                             p_idempotency_key, p_deadline_in, p_deadline_at, p_budget) s;
  IF v_created AND (coalesce(p_key, '') <> '' OR p_at IS NOT NULL OR p_delay IS NOT NULL) THEN
    UPDATE pgdurable.runs SET concurrency_key = coalesce(p_key, ''),
           available_at = coalesce(p_at, pgdurable.now() + p_delay, available_at)
     WHERE id = v_id;
  END IF;
  RETURN QUERY SELECT v_id, v_created;
END
$$;
COMMENT ON FUNCTION pgdurable.start_run_flow(text, text, jsonb, text, integer, integer, text,
                                             interval, timestamptz, numeric, text, timestamptz,
                                             interval) IS
  'start_run with a concurrency key and a delayed start (at, else now + delay).';

------------------------------------------------------------------------------
-- pgdurable._claim_flow(owner, queue, tasks, revisions, limit, ttl, max_reclaims, now)
--   -> claim_runs rows (without db_now)
-- The claim of ONE limited queue (see the file header): lock its row, refill
-- its start bucket, count its live leases (fresh snapshot), allowance =
-- least(limit, concurrency - active, floor(tokens)). Then, in order:
--  1. expired leases and due timers of the queue (as claim_runs' branches b
--     and c; poison/cancelled verdicts always settle and take no slot),
--     within the allowance and the per-key limits;
--  2. runnable runs in rounds over the keys with due work, from key_cursor,
--     one run per key per round (keys at per_key_concurrency skipped); when
--     only one key had work in a round, the rest of the allowance from it.
-- Runs are then leased exactly as claim_runs does (same UPDATE; keep in step).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._claim_flow(
  p_owner text, p_queue text, p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[], p_now timestamptz)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric)
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  qr pgdurable.queues;
  v_tokens numeric;
  v_allow integer;
  v_active jsonb;
  v_per integer;
  v_cur text;
  v_c text;
  v_seg integer;
  v_end boolean;
  v_nsat integer;
  v_first text;
  v_round_keys integer := 0;
  v_round_taken integer := 0;
  v_pass integer := 0;
  v_ids uuid[] := '{}';
  v_branches text[] := '{}';
  v_verdicts text[] := '{}';
  v_bounds integer[] := '{}';
  v_keys text[];
  v_took integer;
  v_room integer;
  c record;
  k text;
  x uuid;
BEGIN
  SELECT * INTO qr FROM pgdurable.queues q WHERE q.name = p_queue FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;  -- limits removed meanwhile: the next claim takes the plain path
  END IF;
  -- refilled_at stays monotonic (a claim that waited for the lock may have
  -- an earlier clock than the one before it): never refill an interval twice
  v_tokens := CASE WHEN qr.rate IS NOT NULL THEN
                least(qr.burst, qr.tokens + qr.rate * greatest(0, extract(epoch FROM p_now - qr.refilled_at)))
              END;
  qr.refilled_at := greatest(qr.refilled_at, p_now);
  -- a new statement, so a new snapshot: every claim that held the row before
  -- us has committed and is counted
  SELECT coalesce(jsonb_object_agg(a.k, a.n), '{}'), coalesce(sum(a.n), 0)::integer
    INTO v_active, v_took
    FROM (SELECT r.concurrency_key AS k, count(*) AS n FROM pgdurable.runs r
           WHERE r.status = 'leased' AND r.queue = p_queue AND r.lease_expires_at > p_now
           GROUP BY r.concurrency_key) a;
  v_allow := least(p_limit, coalesce(qr.concurrency - v_took, p_limit),
                   coalesce(floor(v_tokens)::integer, p_limit));
  IF v_allow > 0 THEN
    -- 1. expired leases and due timers
    FOR c IN
      WITH pairs AS MATERIALIZED (
        SELECT u.t, u.v, min(u.n) AS n
          FROM unnest(p_tasks, p_revisions) WITH ORDINALITY AS u(t, v, n) GROUP BY u.t, u.v
      ), b AS MATERIALIZED (
        SELECT r.id, 'expired'::text AS branch,
               CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'cancelled'
                    WHEN r.reclaims >= m.bound THEN 'poison' ELSE 'run' END AS verdict,
               m.bound, r.priority, r.lease_expires_at AS due, r.concurrency_key AS k
          FROM pgdurable.runs r
         CROSS JOIN LATERAL (SELECT coalesce(p_max_reclaims[(SELECT p.n FROM pairs p
                                               WHERE p.t = r.task AND p.v = r.revision)], 5) AS bound) m
         WHERE r.status = 'leased' AND r.queue = p_queue AND r.lease_expires_at <= p_now
           AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
         ORDER BY r.priority DESC, r.lease_expires_at
         LIMIT p_limit FOR UPDATE OF r SKIP LOCKED
      ), t AS MATERIALIZED (
        SELECT r.id, 'timer'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
               r.priority, r.wake_at AS due, r.concurrency_key AS k
          FROM pgdurable.runs r
         WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = p_queue
           AND r.wake_at <= p_now AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
         ORDER BY r.wake_at
         LIMIT v_allow FOR UPDATE SKIP LOCKED
      )
      SELECT * FROM (SELECT * FROM b UNION ALL SELECT * FROM t) u ORDER BY u.priority DESC, u.due
    LOOP
      IF c.verdict = 'run' THEN
        IF v_allow <= 0 OR (qr.per_key_concurrency IS NOT NULL AND c.k <> ''
                            AND coalesce((v_active->>c.k)::integer, 0) >= qr.per_key_concurrency) THEN
          CONTINUE;
        END IF;
        v_allow := v_allow - 1;
        v_active := jsonb_set(v_active, ARRAY[c.k], to_jsonb(coalesce((v_active->>c.k)::integer, 0) + 1));
      END IF;
      v_ids := v_ids || c.id; v_branches := v_branches || c.branch;
      v_verdicts := v_verdicts || c.verdict; v_bounds := v_bounds || c.bound;
    END LOOP;
    -- 2. runnable runs, in rounds over the keys. A round visits the keys
    -- after the cursor C, then (segment 2) the keys up to C from the first.
    v_per := 1;
    v_nsat := (SELECT count(*) FROM jsonb_each_text(v_active) e
                WHERE qr.per_key_concurrency IS NOT NULL AND e.key <> ''
                  AND e.value::integer >= qr.per_key_concurrency);
    v_c := qr.key_cursor;
    <<rounds>>
    WHILE v_allow > 0 AND v_pass < 4 LOOP
      v_pass := v_pass + 1;
      v_round_keys := 0;
      v_round_taken := 0;
      FOR v_seg IN 1..2 LOOP
        CONTINUE WHEN v_seg = 1 AND v_c IS NULL;
        v_cur := CASE WHEN v_seg = 1 THEN v_c END;
        v_end := false;
        WHILE NOT v_end AND v_allow > 0 LOOP
          -- the next keys with due work after v_cur (NULL: from the first),
          -- by a loose index scan (one probe per key)
          v_first := CASE WHEN v_cur IS NULL THEN
                       (SELECT min(r.concurrency_key) FROM pgdurable.runs r
                         WHERE r.status = 'runnable' AND r.queue = p_queue AND r.available_at <= p_now)
                     ELSE
                       (SELECT min(r.concurrency_key) FROM pgdurable.runs r
                         WHERE r.status = 'runnable' AND r.queue = p_queue AND r.available_at <= p_now
                           AND r.concurrency_key > v_cur)
                     END;
          WITH RECURSIVE ks(k, n) AS (
            SELECT v_first, 1
            UNION ALL
            SELECT (SELECT min(r.concurrency_key) FROM pgdurable.runs r
                     WHERE r.status = 'runnable' AND r.queue = p_queue AND r.available_at <= p_now
                       AND r.concurrency_key > ks.k), ks.n + 1
              FROM ks WHERE ks.k IS NOT NULL AND ks.n < v_allow + v_nsat
          )
          SELECT coalesce(array_agg(ks.k ORDER BY ks.n), '{}') INTO v_keys
            FROM ks WHERE ks.k IS NOT NULL;
          v_end := cardinality(v_keys) < v_allow + v_nsat;
          FOREACH k IN ARRAY v_keys LOOP
            IF v_seg = 2 AND v_c IS NOT NULL AND k > v_c THEN
              v_end := true;  -- segment 1 of this round visited it
              EXIT;
            END IF;
            EXIT WHEN v_allow <= 0;
            v_room := least(v_allow, v_per);
            IF qr.per_key_concurrency IS NOT NULL AND k <> '' THEN
              v_room := least(v_room, qr.per_key_concurrency - coalesce((v_active->>k)::integer, 0));
            END IF;
            CONTINUE WHEN v_room <= 0;
            v_took := 0;
            FOR x IN
              SELECT r.id FROM pgdurable.runs r
               WHERE r.status = 'runnable' AND r.queue = p_queue AND r.concurrency_key = k
                 AND r.available_at <= p_now
                 AND (r.task, r.revision) IN (SELECT u.t, u.v FROM unnest(p_tasks, p_revisions) AS u(t, v))
                 AND NOT (r.id = ANY (v_ids))
               ORDER BY r.priority DESC, r.available_at
               LIMIT v_room FOR UPDATE SKIP LOCKED
            LOOP
              v_ids := v_ids || x; v_branches := v_branches || 'runnable'::text;
              v_verdicts := v_verdicts || 'run'::text; v_bounds := v_bounds || NULL::integer;
              v_took := v_took + 1;
            END LOOP;
            IF v_took > 0 THEN
              v_allow := v_allow - v_took;
              v_active := jsonb_set(v_active, ARRAY[k],
                                    to_jsonb(coalesce((v_active->>k)::integer, 0) + v_took));
              v_round_keys := v_round_keys + 1;
              v_round_taken := v_round_taken + v_took;
              qr.key_cursor := k;
            END IF;
          END LOOP;
          IF cardinality(v_keys) > 0 THEN
            v_cur := v_keys[cardinality(v_keys)];
          END IF;
        END LOOP;
        EXIT rounds WHEN v_allow <= 0;
      END LOOP;
      -- a round that served nobody ends the claim; one that served a single
      -- key lets it take the rest (no other key is waiting)
      EXIT WHEN v_round_taken = 0;
      IF v_round_keys <= 1 THEN
        v_per := v_allow;
      END IF;
      v_c := qr.key_cursor;
    END LOOP;
  END IF;
  UPDATE pgdurable.queues q SET
         tokens = CASE WHEN qr.rate IS NULL THEN 0
                       ELSE v_tokens - (SELECT count(*) FROM unnest(v_verdicts) v WHERE v = 'run') END,
         refilled_at = qr.refilled_at, key_cursor = qr.key_cursor
   WHERE q.name = p_queue;
  IF cardinality(v_ids) = 0 THEN
    RETURN;
  END IF;
  RETURN QUERY
  UPDATE pgdurable.runs r SET
    status = CASE k2.verdict WHEN 'cancelled' THEN 'cancelled' WHEN 'poison' THEN 'failed'
                             ELSE 'leased' END,
    reclaims = r.reclaims + (k2.branch = 'expired')::integer,
    error = CASE
      WHEN k2.verdict = 'cancelled' THEN pgdurable._error('RunCancelled',
             'run was cancelled (its worker''s lease expired before it stopped)')
      WHEN k2.verdict = 'poison' THEN pgdurable._error('PoisonRun', format(
             'lease expired %s times in a row without a checkpoint (max_reclaims %s): '
             'the run keeps crashing or stalling its workers; last worker %s',
             r.reclaims + 1, k2.bound, coalesce(r.lease_owner, '?')))
      WHEN k2.branch = 'expired' THEN pgdurable._error('LeaseExpired',
             'lease of worker ' || coalesce(r.lease_owner, '?') || ' expired (crashed or stalled worker)')
      ELSE r.error END,
    claims = r.claims + 1,
    lease_token = r.lease_token + 1,
    lease_owner = CASE WHEN k2.verdict = 'run' THEN p_owner END,
    lease_expires_at = CASE WHEN k2.verdict = 'run' THEN p_now + p_ttl END,
    finished_at = CASE WHEN k2.verdict <> 'run' THEN p_now END,
    leased_at = p_now,
    wake = CASE WHEN k2.branch = 'timer'
                THEN jsonb_build_object('type', 'timeout', 'kind', r.wait_kind,
                                        'ref', r.wait_ref, 'at', r.wake_at)
                ELSE r.wake END,
    wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
    updated_at = p_now
  FROM unnest(v_ids, v_branches, v_verdicts, v_bounds) AS k2(id, branch, verdict, bound)
  WHERE r.id = k2.id
  RETURNING r.id, r.task, r.revision, r.queue, r.status, r.state, r.step, r.attempts,
            r.max_attempts, r.lease_token, r.lease_expires_at, r.wake, r.deadline_at,
            r.budget, r.spent;
END
$$;
COMMENT ON FUNCTION pgdurable._claim_flow(text, text, text[], text[], integer, interval, integer[],
                                          timestamptz) IS
  'Internal: claim from one limited queue under its concurrency, per-key and rate limits, keys in rotation.';

------------------------------------------------------------------------------
-- claim_runs: as in 0009_security_boundary (see 0003 for the header; pairs
-- matched as pairs), with flow control: the queues of p_queues that have a
-- pgdurable.queues row are claimed by _claim_flow (one after the other, in
-- name order, with what is left of p_limit); the others by the plain
-- statement below, unchanged. With no limited queue among p_queues the only
-- extra cost is one probe of pgdurable.queues' primary key.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.claim_runs(
  p_owner text, p_queues text[], p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[] DEFAULT NULL)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, db_now timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_limited text[] := ARRAY(SELECT l.name FROM pgdurable.queues l
                             WHERE l.name = ANY (p_queues) ORDER BY l.name);
  v_queues text[] := p_queues;
  v_left integer := p_limit;
  v_n integer;
  v_q text;
BEGIN
  IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
    -- a NULL lease_expires_at would leave the run leased forever (never
    -- renewed, never reclaimed)
    RAISE EXCEPTION 'claim_runs: ttl must be a positive interval, got %', p_ttl
      USING ERRCODE = 'PD000';
  END IF;
  IF p_limit IS NULL OR p_limit < 1 THEN
    RETURN;
  END IF;
  IF cardinality(v_limited) > 0 THEN
    v_queues := ARRAY(SELECT u FROM unnest(p_queues) u WHERE u <> ALL (v_limited));
  END IF;
  IF cardinality(v_queues) > 0 THEN
    RETURN QUERY
    WITH pairs AS MATERIALIZED (
      SELECT u.t, u.v, min(u.n) AS n
        FROM unnest(p_tasks, p_revisions) WITH ORDINALITY AS u(t, v, n)
       GROUP BY u.t, u.v
    ), a AS MATERIALIZED (
      -- per queue an index-ordered, LIMITed scan (no sort of the backlog), then
      -- the best p_limit of those across queues
      SELECT x.id, 'runnable'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
             x.priority, x.available_at AS due
        FROM unnest(v_queues) AS qn(name)
       CROSS JOIN LATERAL (
         SELECT r.id, r.priority, r.available_at FROM pgdurable.runs r
          WHERE r.status = 'runnable' AND r.queue = qn.name AND r.available_at <= v_now
            AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
          ORDER BY r.priority DESC, r.available_at
          LIMIT p_limit FOR UPDATE SKIP LOCKED) x
       ORDER BY x.priority DESC, x.available_at
       LIMIT p_limit
    ), b AS MATERIALIZED (
      SELECT r.id, 'expired'::text AS branch,
             CASE WHEN r.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN r.reclaims >= m.bound THEN 'poison'
                  ELSE 'run' END AS verdict, m.bound,
             r.priority, r.lease_expires_at AS due
        FROM pgdurable.runs r
       CROSS JOIN LATERAL (SELECT coalesce(p_max_reclaims[(SELECT p.n FROM pairs p
                                                            WHERE p.t = r.task AND p.v = r.revision)],
                                           5) AS bound) m
       WHERE r.status = 'leased' AND r.queue = ANY (v_queues) AND r.lease_expires_at <= v_now
         AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
       ORDER BY r.priority DESC, r.lease_expires_at
       LIMIT p_limit FOR UPDATE OF r SKIP LOCKED
    ), c AS MATERIALIZED (
      SELECT r.id, 'timer'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
             r.priority, r.wake_at AS due
        FROM pgdurable.runs r
       WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (v_queues)
         AND r.wake_at <= v_now AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
       ORDER BY r.wake_at
       LIMIT p_limit FOR UPDATE SKIP LOCKED
    ), cand AS MATERIALIZED (
      -- one order across the branches (priority, then longest due), so that a
      -- runnable backlog cannot starve crash recovery (b) or due timers (c)
      SELECT * FROM (SELECT * FROM a UNION ALL SELECT * FROM b UNION ALL SELECT * FROM c) k
       ORDER BY k.priority DESC, k.due
       LIMIT p_limit
    ), upd AS (
      -- k.verdict: 'run' | 'cancelled' | 'poison' (decided in branch b)
      UPDATE pgdurable.runs r SET
        status = CASE k.verdict WHEN 'cancelled' THEN 'cancelled' WHEN 'poison' THEN 'failed'
                                ELSE 'leased' END,
        reclaims = r.reclaims + (k.branch = 'expired')::integer,
        error = CASE
          WHEN k.verdict = 'cancelled' THEN pgdurable._error('RunCancelled',
                 'run was cancelled (its worker''s lease expired before it stopped)')
          WHEN k.verdict = 'poison' THEN pgdurable._error('PoisonRun', format(
                 'lease expired %s times in a row without a checkpoint (max_reclaims %s): '
                 'the run keeps crashing or stalling its workers; last worker %s',
                 r.reclaims + 1, k.bound, coalesce(r.lease_owner, '?')))
          WHEN k.branch = 'expired' THEN pgdurable._error('LeaseExpired',
                 'lease of worker ' || coalesce(r.lease_owner, '?') || ' expired (crashed or stalled worker)')
          ELSE r.error END,
        claims = r.claims + 1,
        lease_token = r.lease_token + 1,
        lease_owner = CASE WHEN k.verdict = 'run' THEN p_owner END,
        lease_expires_at = CASE WHEN k.verdict = 'run' THEN v_now + p_ttl END,
        finished_at = CASE WHEN k.verdict <> 'run' THEN v_now END,
        leased_at = v_now,
        wake = CASE WHEN k.branch = 'timer'
                    THEN jsonb_build_object('type', 'timeout', 'kind', r.wait_kind,
                                            'ref', r.wait_ref, 'at', r.wake_at)
                    ELSE r.wake END,
        wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
        updated_at = v_now
      FROM cand k
      WHERE r.id = k.id
      RETURNING r.id, r.task, r.revision, r.queue, r.status, r.state, r.step, r.attempts,
                r.max_attempts, r.lease_token, r.lease_expires_at, r.wake, r.deadline_at,
                r.budget, r.spent
    )
    SELECT u.*, v_now FROM upd u;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_left := v_left - v_n;
  END IF;
  FOREACH v_q IN ARRAY v_limited LOOP
    EXIT WHEN v_left <= 0;
    RETURN QUERY SELECT f.*, v_now
      FROM pgdurable._claim_flow(p_owner, v_q, p_tasks, p_revisions, v_left, p_ttl,
                                 p_max_reclaims, v_now) f;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_left := v_left - v_n;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable.claim_runs(text, text[], text[], text[], integer, interval, integer[]) IS
  'Claim up to p_limit runs (runnable, expired lease, due timer) for p_owner in one statement; '
  'limited queues (pgdurable.queues) under their concurrency, per-key and rate limits.';

------------------------------------------------------------------------------
-- next_wakeup: as in 0009_security_boundary (pairs), flow-aware: a limited
-- queue at its concurrency contributes only its lease expiries (a freed slot
-- NOTIFYs); a rate-limited queue's runnable work is due no earlier than its
-- next start token; runnable runs of keys at per_key_concurrency are not due.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.next_wakeup(p_queues text[], p_tasks text[],
                                                 p_revisions text[])
RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_at   timestamptz;
BEGIN
  IF NOT EXISTS (SELECT FROM pgdurable.queues l WHERE l.name = ANY (p_queues)) THEN
    -- no limited queue: exactly the 0009 query
    WITH pairs AS MATERIALIZED (
      SELECT DISTINCT u.t, u.v FROM unnest(p_tasks, p_revisions) AS u(t, v)
    )
    SELECT least(
      (SELECT min(r.available_at) FROM pgdurable.runs r
        WHERE r.status = 'runnable' AND r.queue = ANY (p_queues)
          AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
      (SELECT min(r.wake_at) FROM pgdurable.runs r
        WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (p_queues)
          AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
      (SELECT min(r.lease_expires_at) FROM pgdurable.runs r
        WHERE r.status = 'leased' AND r.queue = ANY (p_queues)
          AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)))
    INTO v_at;
    RETURN CASE WHEN v_at IS NULL THEN NULL ELSE greatest(0, extract(epoch FROM v_at - v_now)) END;
  END IF;
  WITH pairs AS MATERIALIZED (
    SELECT DISTINCT u.t, u.v FROM unnest(p_tasks, p_revisions) AS u(t, v)
  ), lim AS MATERIALIZED (
    SELECT l.name, l.per_key_concurrency,
           CASE WHEN l.rate IS NULL THEN NULL
                ELSE l.refilled_at + make_interval(secs => greatest(0, (1 - l.tokens) / l.rate))
           END AS token_at,
           (l.concurrency IS NOT NULL AND l.concurrency <= (
              SELECT count(*) FROM pgdurable.runs r WHERE r.status = 'leased'
                 AND r.queue = l.name AND r.lease_expires_at > v_now)) AS full,
           ARRAY(SELECT r.concurrency_key FROM pgdurable.runs r
                  WHERE l.per_key_concurrency IS NOT NULL AND r.status = 'leased'
                    AND r.queue = l.name AND r.lease_expires_at > v_now AND r.concurrency_key <> ''
                  GROUP BY r.concurrency_key
                 HAVING count(*) >= l.per_key_concurrency) AS saturated
      FROM pgdurable.queues l WHERE l.name = ANY (p_queues)
  ), qs AS MATERIALIZED (
    SELECT qn.name, lim.token_at, coalesce(lim.full, false) AS full,
           coalesce(lim.saturated, '{}') AS saturated
      FROM unnest(p_queues) AS qn(name) LEFT JOIN lim ON lim.name = qn.name
  )
  SELECT least(
    (SELECT min(greatest(w.at, qs.token_at)) FROM qs CROSS JOIN LATERAL (
       SELECT least(
         (SELECT min(r.available_at) FROM pgdurable.runs r
           WHERE r.status = 'runnable' AND r.queue = qs.name
             AND (cardinality(qs.saturated) = 0 OR r.concurrency_key <> ALL (qs.saturated))
             AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
         (SELECT min(r.wake_at) FROM pgdurable.runs r
           WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = qs.name
             AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p))) AS at) w
      WHERE NOT qs.full),
    (SELECT min(r.lease_expires_at) FROM pgdurable.runs r
      WHERE r.status = 'leased' AND r.queue = ANY (p_queues)
        AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)))
  INTO v_at;
  RETURN CASE WHEN v_at IS NULL THEN NULL ELSE greatest(0, extract(epoch FROM v_at - v_now)) END;
END
$$;
COMMENT ON FUNCTION pgdurable.next_wakeup(text[], text[], text[]) IS
  'Seconds until claimable work may appear in these queues for these tasks (NULL: none); '
  'respects queue concurrency, start rate and per-key limits.';

------------------------------------------------------------------------------
-- Trigger: a run of a limited queue leaving 'leased' (completed, failed,
-- parked, released, cancelled) frees a slot: NOTIFY pgdurable_wake(queue) so
-- an idle worker claims the next run now, not at its next poll.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._flow_slot_freed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT FROM pgdurable.queues q WHERE q.name = NEW.queue) THEN
    PERFORM pg_notify('pgdurable_wake', NEW.queue);
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._flow_slot_freed() IS
  'Trigger: NOTIFY pgdurable_wake(queue) when a run of a limited queue leaves leased.';
CREATE TRIGGER runs_flow_slot_freed_trg AFTER UPDATE OF status ON pgdurable.runs
  FOR EACH ROW WHEN (OLD.status = 'leased' AND NEW.status <> 'leased')
  EXECUTE FUNCTION pgdurable._flow_slot_freed();
COMMENT ON TRIGGER runs_flow_slot_freed_trg ON pgdurable.runs IS
  'Flow control: a freed slot of a limited queue wakes the workers (NOTIFY) at once.';

------------------------------------------------------------------------------
-- Views
------------------------------------------------------------------------------
CREATE VIEW pgdurable.queue_limits AS
SELECT q.name AS queue, q.concurrency,
       (SELECT count(*) FROM pgdurable.runs r WHERE r.status = 'leased' AND r.queue = q.name
           AND r.lease_expires_at > pgdurable.now()) AS active,
       q.per_key_concurrency, q.rate AS rate_per_second, q.burst,
       CASE WHEN q.rate IS NOT NULL THEN
         least(q.burst, q.tokens + q.rate * greatest(0, extract(epoch FROM pgdurable.now() - q.refilled_at)))
       END AS tokens,
       (SELECT count(DISTINCT r.concurrency_key) FROM pgdurable.runs r
         WHERE r.status = 'runnable' AND r.queue = q.name) AS keys_queued,
       q.key_cursor, q.updated_at
  FROM pgdurable.queues q;
COMMENT ON VIEW pgdurable.queue_limits IS
  'Limited queues: their limits, live leases (active), start tokens now and keys with queued runs.';
COMMENT ON COLUMN pgdurable.queue_limits.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.queue_limits.concurrency IS 'Cap on leased runs (NULL: none).';
COMMENT ON COLUMN pgdurable.queue_limits.active IS 'Runs leased now under a live lease.';
COMMENT ON COLUMN pgdurable.queue_limits.per_key_concurrency IS 'Cap per concurrency key (NULL: none).';
COMMENT ON COLUMN pgdurable.queue_limits.rate_per_second IS 'Start rate (NULL: none).';
COMMENT ON COLUMN pgdurable.queue_limits.burst IS 'Start bucket capacity.';
COMMENT ON COLUMN pgdurable.queue_limits.tokens IS 'Start tokens available now.';
COMMENT ON COLUMN pgdurable.queue_limits.keys_queued IS 'Distinct keys with runnable runs.';
COMMENT ON COLUMN pgdurable.queue_limits.key_cursor IS 'Last key served (the rotation goes on after it).';
COMMENT ON COLUMN pgdurable.queue_limits.updated_at IS 'When the limits were last set.';

CREATE VIEW pgdurable.queue_keys AS
SELECT r.queue, r.concurrency_key AS key,
       count(*) FILTER (WHERE r.status = 'runnable') AS queued,
       count(*) FILTER (WHERE r.status = 'runnable' AND r.available_at <= pgdurable.now()) AS due,
       count(*) FILTER (WHERE r.status = 'leased' AND r.lease_expires_at > pgdurable.now()) AS active
  FROM pgdurable.runs r
 WHERE r.status IN ('runnable', 'leased')
 GROUP BY r.queue, r.concurrency_key;
COMMENT ON VIEW pgdurable.queue_keys IS
  'Per queue and concurrency key: queued, due and active (live lease) runs.';
COMMENT ON COLUMN pgdurable.queue_keys.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.queue_keys.key IS 'Concurrency key ('''' = none).';
COMMENT ON COLUMN pgdurable.queue_keys.queued IS 'Runnable runs (due or delayed).';
COMMENT ON COLUMN pgdurable.queue_keys.due IS 'Runnable runs whose available_at has passed.';
COMMENT ON COLUMN pgdurable.queue_keys.active IS 'Runs leased under a live lease.';

CREATE VIEW pgdurable.bucket_levels AS
SELECT b.name, b.rate AS rate_per_second, b.burst,
       least(b.burst, b.tokens + b.rate * greatest(0, extract(epoch FROM pgdurable.now() - b.refilled_at)))
         AS tokens,
       b.updated_at
  FROM pgdurable.buckets b;
COMMENT ON VIEW pgdurable.bucket_levels IS 'Named token buckets and their level now.';
COMMENT ON COLUMN pgdurable.bucket_levels.name IS 'Bucket name.';
COMMENT ON COLUMN pgdurable.bucket_levels.rate_per_second IS 'Refill, tokens per second.';
COMMENT ON COLUMN pgdurable.bucket_levels.burst IS 'Capacity.';
COMMENT ON COLUMN pgdurable.bucket_levels.tokens IS 'Tokens available now.';
COMMENT ON COLUMN pgdurable.bucket_levels.updated_at IS 'When rate/burst were last set.';

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
