-- 0003_runs: the run state machine (start, claim, heartbeat, checkpoint,
-- complete, fail/retry, give back, cancel) and the end of an effect
-- (effect_finish). Parking and signals (park_run, send_signal, signal_run)
-- are in 0005_signals.sql; effect_begin is in 0008_durable_runs.sql.
--
-- Conventions shared by every function here:
--  * Time is pgdurable.now() only.
--  * FENCE: a worker's write applies only while
--      id = p_id AND lease_token = p_token AND lease_owner = p_owner
--      AND status = 'leased' AND lease_expires_at > pgdurable.now();
--    otherwise SQLSTATE PD001 (LeaseLost) is raised and nothing changes.
--  * NOTIFY pgdurable_wake (payload = queue) only when a run becomes runnable,
--    at most once per queue per transaction (identical notifications merge);
--    NOTIFY pgdurable_cancel (payload = run id) when a leased run is asked to
--    cancel. Never a notification per checkpoint.
--  * error jsonb is {type, message, traceback}.

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
ALTER TABLE pgdurable.checkpoints ADD COLUMN wake jsonb;
COMMENT ON COLUMN pgdurable.checkpoints.wake IS
  'The wake outcome (signal or timeout) the step saw in ctx.wake, NULL if none.';

-- Poison runs: crashes are counted apart from step errors. attempts counts
-- failed steps (fail_run) against max_attempts; reclaims counts expired-lease
-- reclaims since the last checkpoint against the task's max_reclaims (passed
-- by the worker to claim_runs); claims counts every claim (information only).
ALTER TABLE pgdurable.runs ADD COLUMN reclaims integer NOT NULL DEFAULT 0
  CHECK (reclaims >= 0);
COMMENT ON COLUMN pgdurable.runs.reclaims IS
  'Expired-lease reclaims (its worker crashed or stalled) since the run''s last checkpoint; '
  'reset by every checkpoint. When a lease expires with reclaims >= the task''s max_reclaims '
  '(default 5) the run fails with error type PoisonRun. Step errors count in attempts instead.';
COMMENT ON COLUMN pgdurable.runs.claims IS
  'How many times a worker claimed the run (every claim: first, after a give-back, retry '
  'or reclaim); information only, bounds nothing (see reclaims and attempts).';
COMMENT ON COLUMN pgdurable.runs.attempts IS
  'Failed steps (exceptions, fail_run) counted against max_attempts; crashes count in reclaims.';

-- Claim branch (a): runnable runs by queue, priority, age.
CREATE INDEX runs_runnable_idx ON pgdurable.runs (queue, priority DESC, available_at)
  WHERE status = 'runnable';
-- Claim branch (b): leased runs by queue. lease_expires_at is deliberately NOT
-- indexed so that heartbeats (which change only it) stay HOT updates; the
-- leased set is small (at most the sum of all workers' concurrency).
CREATE INDEX runs_leased_idx ON pgdurable.runs (queue) WHERE status = 'leased';
-- Claim branch (c): parked runs with a timer.
CREATE INDEX runs_timer_idx ON pgdurable.runs (queue, wake_at)
  WHERE status = 'waiting' AND wake_at IS NOT NULL;
-- send_signal (0005): parked runs by what they wait for.
CREATE INDEX runs_waiting_signal_idx ON pgdurable.runs (wait_kind, wait_ref)
  WHERE status = 'waiting' AND wait_kind IS NOT NULL;
-- park_run (0005): pending (unconsumed) signals by (kind, ref), oldest first.
CREATE INDEX signals_pending_idx ON pgdurable.signals (kind, ref, id)
  WHERE consumed_at IS NULL;

------------------------------------------------------------------------------
-- pgdurable.wait_lock_key(kind, ref) -> bigint
-- The transaction advisory-lock key that serialises parking on (kind, ref)
-- with signals sent to (kind, ref). Everyone who parks, signals or consumes
-- signals of (kind, ref) takes pg_advisory_xact_lock(wait_lock_key(kind, ref))
-- first: this is what makes "signal before park" safe (no lost wake-up).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.wait_lock_key(p_kind text, p_ref text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT hashtextextended(p_kind || E'\x1f' || p_ref, 0)
$$;
COMMENT ON FUNCTION pgdurable.wait_lock_key(text, text) IS
  'Advisory lock key serialising park_run and send_signal on one (kind, ref).';

------------------------------------------------------------------------------
-- pgdurable._error(type, message) -> jsonb: an error record made in SQL.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._error(p_type text, p_message text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
  SELECT jsonb_build_object('type', p_type, 'message', p_message, 'traceback', NULL)
$$;
COMMENT ON FUNCTION pgdurable._error(text, text) IS
  'Internal: the {type, message, traceback} record for errors decided in SQL.';

------------------------------------------------------------------------------
-- pgdurable.start_run(task, revision, state, queue, priority, max_attempts,
--                     idempotency_key, deadline_in, deadline_at, budget)
--   -> TABLE(run_id uuid, created boolean)
-- Inserts a runnable run and NOTIFYs pgdurable_wake(queue) (delivered on
-- commit: inside a caller's transaction, workers wake only if it commits).
-- With an idempotency_key that already exists, nothing is written and the
-- existing run's id is returned with created = false (race-safe: INSERT ...
-- ON CONFLICT DO NOTHING waits for a concurrent inserter, then we read its row).
-- The deadline is deadline_at, else now() + deadline_in, else none.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.start_run(
  p_task text, p_revision text, p_state jsonb, p_queue text, p_priority integer,
  p_max_attempts integer, p_idempotency_key text, p_deadline_in interval,
  p_deadline_at timestamptz, p_budget numeric)
RETURNS TABLE (run_id uuid, created boolean)
LANGUAGE plpgsql AS $$
DECLARE
  v_id uuid;
BEGIN
  INSERT INTO pgdurable.runs AS r (task, revision, state, queue, priority, max_attempts,
                                   idempotency_key, deadline_at, budget)
  VALUES (p_task, p_revision, coalesce(p_state, '{}'), p_queue, p_priority, p_max_attempts,
          p_idempotency_key,
          coalesce(p_deadline_at, pgdurable.now() + p_deadline_in), p_budget)
  ON CONFLICT (idempotency_key) DO NOTHING
  RETURNING r.id INTO v_id;
  IF v_id IS NOT NULL THEN
    PERFORM pg_notify('pgdurable_wake', p_queue);
    RETURN QUERY SELECT v_id, true;
    RETURN;
  END IF;
  SELECT r.id INTO v_id FROM pgdurable.runs r WHERE r.idempotency_key = p_idempotency_key;
  RETURN QUERY SELECT v_id, false;
END
$$;
COMMENT ON FUNCTION pgdurable.start_run(text, text, jsonb, text, integer, integer, text,
                                        interval, timestamptz, numeric) IS
  'Start a run (idempotent by idempotency_key); NOTIFY pgdurable_wake on creation.';

------------------------------------------------------------------------------
-- pgdurable.claim_runs(owner, queues, tasks, revisions, limit, ttl)
--   -> rows of claimed runs
-- ONE statement: a MATERIALIZED CTE picks at most p_limit runs with
-- FOR UPDATE SKIP LOCKED from three LIMITed branches, each on its own partial
-- index: (a) runnable and available_at <= now (priority DESC, oldest first),
-- (b) leased with an expired lease (crash recovery), (c) waiting with
-- wake_at <= now (timers; wake = {type: 'timeout', at}). Only runs whose
-- (task, revision) pair is in (p_tasks[i], p_revisions[i]) are taken.
-- The p_limit runs claimed are the best of the three branches together, by
-- priority DESC, then how long they have been due (available_at,
-- lease_expires_at or wake_at): a runnable backlog never starves crash
-- recovery or due timers.
-- Each claimed run gets lease_token + 1, lease_owner = p_owner,
-- lease_expires_at = now + p_ttl, claims + 1.
-- Branch (b) is a reclaim (crash recovery), counted in reclaims, NOT in
-- attempts (error LeaseExpired recorded). POISON RULE: if the run already
-- has reclaims >= max_reclaims (p_max_reclaims[i] for its task, default 5
-- when the array or the element is NULL; reclaims resets at every
-- checkpoint) it fails instead, error {type: 'PoisonRun', message,
-- traceback: NULL}. A run whose cancel was requested becomes cancelled.
-- Failed/cancelled rows are returned with that status and must not be
-- executed. Rows with status 'leased' are the caller's to run.
-- p_ttl NULL or <= 0: PD000, nothing claimed.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.claim_runs(
  p_owner text, p_queues text[], p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[] DEFAULT NULL)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, db_now timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_keys text[] := ARRAY(SELECT t || E'\x1f' || v FROM unnest(p_tasks, p_revisions) AS u(t, v));
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
  RETURN QUERY
  WITH a AS MATERIALIZED (
    -- per queue an index-ordered, LIMITed scan (no sort of the backlog), then
    -- the best p_limit of those across queues
    SELECT x.id, 'runnable'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
           x.priority, x.available_at AS due
      FROM unnest(p_queues) AS qn(name)
     CROSS JOIN LATERAL (
       SELECT r.id, r.priority, r.available_at FROM pgdurable.runs r
        WHERE r.status = 'runnable' AND r.queue = qn.name AND r.available_at <= v_now
          AND r.task || E'\x1f' || r.revision = ANY (v_keys)
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
     CROSS JOIN LATERAL (SELECT coalesce(p_max_reclaims[array_position(
                           v_keys, r.task || E'\x1f' || r.revision)], 5) AS bound) m
     WHERE r.status = 'leased' AND r.queue = ANY (p_queues) AND r.lease_expires_at <= v_now
       AND r.task || E'\x1f' || r.revision = ANY (v_keys)
     ORDER BY r.priority DESC, r.lease_expires_at
     LIMIT p_limit FOR UPDATE SKIP LOCKED
  ), c AS MATERIALIZED (
    SELECT r.id, 'timer'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
           r.priority, r.wake_at AS due
      FROM pgdurable.runs r
     WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (p_queues)
       AND r.wake_at <= v_now AND r.task || E'\x1f' || r.revision = ANY (v_keys)
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
END
$$;
COMMENT ON FUNCTION pgdurable.claim_runs(text, text[], text[], text[], integer, interval, integer[]) IS
  'Claim up to p_limit runs (runnable, expired lease, due timer) for p_owner in one statement.';

------------------------------------------------------------------------------
-- pgdurable.renew_runs(owner, ids, tokens, ttl)
--   -> TABLE(id uuid, lease_expires_at timestamptz, cancel_requested boolean)
-- The heartbeat: ONE UPDATE renewing every listed run the owner still holds
-- under the same token and whose lease has not expired (a lapsed lease is
-- never resurrected). Only lease_expires_at changes (not indexed: HOT).
-- Runs missing from the result are lost: stop them. cancel_requested tells
-- the worker a cancel is pending (backup for a missed NOTIFY).
-- p_ttl NULL or <= 0: PD000, nothing renewed (a NULL expiry would strand
-- the run: leased forever, never reclaimed).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.renew_runs(p_owner text, p_ids uuid[], p_tokens bigint[],
                                     p_ttl interval)
RETURNS TABLE (id uuid, lease_expires_at timestamptz, cancel_requested boolean)
LANGUAGE plpgsql AS $$
BEGIN
  IF p_ttl IS NULL OR p_ttl <= interval '0' THEN
    RAISE EXCEPTION 'renew_runs: ttl must be a positive interval, got %', p_ttl
      USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  UPDATE pgdurable.runs r SET lease_expires_at = pgdurable.now() + p_ttl
  FROM unnest(p_ids, p_tokens) AS u(id, token)
  WHERE r.id = u.id AND r.lease_token = u.token AND r.lease_owner = p_owner
    AND r.status = 'leased' AND r.lease_expires_at > pgdurable.now()
  RETURNING r.id, r.lease_expires_at, r.cancel_requested_at IS NOT NULL;
END
$$;
COMMENT ON FUNCTION pgdurable.renew_runs(text, uuid[], bigint[], interval) IS
  'Heartbeat: renew all of a worker''s live leases in one UPDATE; returns the renewed ones.';

------------------------------------------------------------------------------
-- pgdurable.next_wakeup(queues, tasks, revisions) -> double precision
-- Seconds (>= 0) until the earliest moment a claim in these queues could find
-- work for these tasks: a runnable run's available_at, a parked run's wake_at
-- or a leased run's lease_expires_at; NULL when there is none. Idle workers
-- sleep until min(this, their poll interval): one query per idle interval.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.next_wakeup(p_queues text[], p_tasks text[], p_revisions text[])
RETURNS double precision
LANGUAGE plpgsql STABLE AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_keys text[] := ARRAY(SELECT t || E'\x1f' || v FROM unnest(p_tasks, p_revisions) AS u(t, v));
  v_at   timestamptz;
BEGIN
  SELECT least(
    (SELECT min(r.available_at) FROM pgdurable.runs r
      WHERE r.status = 'runnable' AND r.queue = ANY (p_queues)
        AND r.task || E'\x1f' || r.revision = ANY (v_keys)),
    (SELECT min(r.wake_at) FROM pgdurable.runs r
      WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (p_queues)
        AND r.task || E'\x1f' || r.revision = ANY (v_keys)),
    (SELECT min(r.lease_expires_at) FROM pgdurable.runs r
      WHERE r.status = 'leased' AND r.queue = ANY (p_queues)
        AND r.task || E'\x1f' || r.revision = ANY (v_keys)))
  INTO v_at;
  RETURN CASE WHEN v_at IS NULL THEN NULL ELSE greatest(0, extract(epoch FROM v_at - v_now)) END;
END
$$;
COMMENT ON FUNCTION pgdurable.next_wakeup(text[], text[], text[]) IS
  'Seconds until claimable work may appear in these queues for these tasks (NULL: none).';

------------------------------------------------------------------------------
-- pgdurable._fenced(id, token, owner) -> pgdurable.runs
-- Internal: lock and return the run if the FENCE holds, else raise PD001.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._fenced(p_id uuid, p_token bigint, p_owner text)
RETURNS pgdurable.runs
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs;
BEGIN
  SELECT * INTO r FROM pgdurable.runs
   WHERE id = p_id AND lease_token = p_token AND lease_owner = p_owner
     AND status = 'leased' AND lease_expires_at > pgdurable.now()
   FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'lease lost on run % (token %, owner %)', p_id, p_token, p_owner
      USING ERRCODE = 'PD001';
  END IF;
  RETURN r;
END
$$;
COMMENT ON FUNCTION pgdurable._fenced(uuid, bigint, text) IS
  'Internal: lock the run under the lease fence or raise PD001 (LeaseLost).';

------------------------------------------------------------------------------
-- pgdurable._locked_run(id) -> pgdurable.runs
-- Internal: lock (FOR UPDATE) and return the run, whatever its status;
-- unknown id -> PD002 (RunNotFound). For operations that are not fenced
-- (cancel_run, signal_run, retry_run).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._locked_run(p_id uuid)
RETURNS pgdurable.runs
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs;
BEGIN
  SELECT * INTO r FROM pgdurable.runs x WHERE x.id = p_id FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no run %', p_id USING ERRCODE = 'PD002';
  END IF;
  RETURN r;
END
$$;
COMMENT ON FUNCTION pgdurable._locked_run(uuid) IS
  'Internal: lock and return a run by id, or raise PD002 (RunNotFound).';

------------------------------------------------------------------------------
-- pgdurable._verdict(run, spend, check_deadline) -> jsonb error or NULL
-- Internal: the error that ends a fenced run at a step boundary, in this
-- order: a pending cancel (RunCancelled), spent + spend > budget
-- (BudgetExceeded), the deadline passed (DeadlineExceeded).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._verdict(r pgdurable.runs, p_spend numeric, p_check_deadline boolean)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
  SELECT CASE
    WHEN r.cancel_requested_at IS NOT NULL THEN pgdurable._error('RunCancelled', 'run was cancelled')
    WHEN r.budget IS NOT NULL AND r.spent + coalesce(p_spend, 0) > r.budget THEN
      pgdurable._error('BudgetExceeded', format('spent %s of budget %s',
                       r.spent + coalesce(p_spend, 0), r.budget))
    WHEN p_check_deadline AND r.deadline_at IS NOT NULL AND r.deadline_at <= pgdurable.now() THEN
      pgdurable._error('DeadlineExceeded', format('deadline %s passed', r.deadline_at))
  END
$$;
COMMENT ON FUNCTION pgdurable._verdict(pgdurable.runs, numeric, boolean) IS
  'Internal: cancel/budget/deadline verdict at a step boundary (NULL = go on).';

------------------------------------------------------------------------------
-- pgdurable._end(id, status, error, spend): internal, finish a locked run
-- (failed or cancelled): lease cleared, wait cleared, finished_at set.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._end(p_id uuid, p_status text, p_error jsonb, p_spend numeric)
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
-- pgdurable._checkpoint(run, token, state): internal, write the step's state:
-- runs.state/step + 1/wake := NULL/reclaims := 0 and the checkpoints history row (with the
-- wake the step saw). Returns the new step number.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._checkpoint(r pgdurable.runs, p_token bigint, p_state jsonb,
                                      p_spend numeric)
RETURNS integer
LANGUAGE sql AS $$
  WITH u AS (
    UPDATE pgdurable.runs SET state = p_state, step = r.step + 1, wake = NULL, reclaims = 0,
           spent = spent + coalesce(p_spend, 0), updated_at = pgdurable.now()
     WHERE id = r.id
    RETURNING id, step)
  INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake)
  SELECT u.id, u.step, p_token, p_state, r.wake FROM u
  RETURNING step
$$;
COMMENT ON FUNCTION pgdurable._checkpoint(pgdurable.runs, bigint, jsonb, numeric) IS
  'Internal: write runs.state/step and the checkpoints history row for a locked run.';

------------------------------------------------------------------------------
-- pgdurable.write_steps(owner, ids, tokens, states, spends, done, results)
--   -> TABLE(id uuid, status text)
-- FENCED, BATCHED: the hot path. For each element i (one run each), in ONE
-- statement: if run ids[i] is still leased by owner under tokens[i] with an
-- unexpired lease, checkpoint states[i] (state, step + 1, spent + spends[i],
-- reclaims := 0, history row with the wake the step saw), then
--   * done[i] false (a Continue step): the boundary verdict -- a pending
--     cancel -> 'cancelled', over budget -> 'failed' (BudgetExceeded), past
--     the deadline -> 'failed' (DeadlineExceeded); otherwise 'leased' (the
--     worker may run the next step);
--   * done[i] true (a Done step): 'completed' with results[i]. CANCEL RULE:
--     whichever commits first wins: a cancel committed before this statement
--     ends the run 'cancelled' (state saved, result not stored); committed
--     after, the cancel is a no-op returning 'completed'. Over budget ->
--     'failed'. The deadline is not checked at completion (the work is done).
-- The state is always saved, even when the verdict ends the run. Runs whose
-- fence fails are untouched and reported with status 'lost' (no error: the
-- others in the batch still apply). The verdict is computed from the locked
-- row itself (re-read if the statement waited for its lock), so a cancel that
-- committed first is always seen; the wake recorded with the checkpoint is
-- read from the statement's snapshot (under a valid fence nothing else
-- changes it). One statement and one commit for a whole batch of steps: the
-- worker sends the steps that finished while its previous batch was in
-- flight (group commit from the client side). Arrays of different lengths,
-- a repeated id, or a NULL id/token/state/done: PD000, nothing written.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.write_steps(p_owner text, p_ids uuid[], p_tokens bigint[],
                                      p_states jsonb[], p_spends numeric[], p_done boolean[],
                                      p_results jsonb[])
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql AS $$
DECLARE
  n integer := cardinality(p_ids);
BEGIN
  -- unnest pads shorter arrays with NULL: a missing done[i] would leave run i
  -- 'leased' with no lease owner or expiry (stranded forever), a duplicate id
  -- would report a state as written that was not
  IF n IS NULL OR cardinality(p_tokens) IS DISTINCT FROM n
     OR cardinality(p_states) IS DISTINCT FROM n OR cardinality(p_spends) IS DISTINCT FROM n
     OR cardinality(p_done) IS DISTINCT FROM n OR cardinality(p_results) IS DISTINCT FROM n
     OR array_position(p_ids, NULL) IS NOT NULL OR array_position(p_tokens, NULL) IS NOT NULL
     OR array_position(p_states, NULL) IS NOT NULL OR array_position(p_done, NULL) IS NOT NULL
     OR (SELECT count(DISTINCT x) FROM unnest(p_ids) x) <> n THEN
    RAISE EXCEPTION 'write_steps: ids, tokens, states, spends, done and results must have the '
      'same length, distinct ids and no NULL id, token, state or done' USING ERRCODE = 'PD000';
  END IF;
  RETURN QUERY
  WITH i AS (
    SELECT * FROM unnest(p_ids, p_tokens, p_states, p_spends, p_done, p_results)
                  AS i(id, token, state, spend, done, result)
  ), u AS (
    UPDATE pgdurable.runs r SET
           state = i.state, step = r.step + 1, wake = NULL, reclaims = 0,
           spent = r.spent + coalesce(i.spend, 0),
           status = CASE WHEN pgdurable._verdict(r, i.spend, NOT i.done) IS NULL
                         THEN CASE WHEN i.done THEN 'completed' ELSE 'leased' END
                         WHEN pgdurable._verdict(r, i.spend, NOT i.done)->>'type' = 'RunCancelled'
                         THEN 'cancelled' ELSE 'failed' END,
           result = CASE WHEN i.done AND pgdurable._verdict(r, i.spend, false) IS NULL
                         THEN i.result END,
           error = coalesce(pgdurable._verdict(r, i.spend, NOT i.done), r.error),
           lease_owner = CASE WHEN NOT i.done AND pgdurable._verdict(r, i.spend, true) IS NULL
                              THEN r.lease_owner END,
           lease_expires_at = CASE WHEN NOT i.done AND pgdurable._verdict(r, i.spend, true) IS NULL
                                   THEN r.lease_expires_at END,
           finished_at = CASE WHEN i.done OR pgdurable._verdict(r, i.spend, true) IS NOT NULL
                              THEN pgdurable.now() END,
           updated_at = pgdurable.now()
      FROM i
     WHERE r.id = i.id AND r.lease_token = i.token AND r.lease_owner = p_owner
       AND r.status = 'leased' AND r.lease_expires_at > pgdurable.now()
    RETURNING r.id, r.step, r.status, i.token, i.state
  ), c AS (
    INSERT INTO pgdurable.checkpoints (run_id, step, token, state, wake)
    SELECT u.id, u.step, u.token, u.state,
           (SELECT o.wake FROM pgdurable.runs o WHERE o.id = u.id)
      FROM u
  )
  SELECT i.id, coalesce(u.status, 'lost') FROM i LEFT JOIN u ON u.id = i.id;
END
$$;
COMMENT ON FUNCTION pgdurable.write_steps(text, uuid[], bigint[], jsonb[], numeric[], boolean[], jsonb[]) IS
  'Fenced, batched: checkpoint (and complete) many runs in one statement; fence failures -> lost.';

------------------------------------------------------------------------------
-- pgdurable.checkpoint_run(id, token, owner, state, spend) -> text
-- FENCED (PD001). One Continue step through write_steps (see there):
-- returns leased | cancelled | failed.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.checkpoint_run(p_id uuid, p_token bigint, p_owner text,
                                         p_state jsonb, p_spend numeric DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  v_status text;
BEGIN
  SELECT w.status INTO v_status
    FROM pgdurable.write_steps(p_owner, ARRAY[p_id], ARRAY[p_token], ARRAY[p_state],
                               ARRAY[p_spend], ARRAY[false], ARRAY[NULL::jsonb]) w;
  IF v_status = 'lost' THEN
    RAISE EXCEPTION 'lease lost on run % (token %, owner %)', p_id, p_token, p_owner
      USING ERRCODE = 'PD001';
  END IF;
  RETURN v_status;
END
$$;
COMMENT ON FUNCTION pgdurable.checkpoint_run(uuid, bigint, text, jsonb, numeric) IS
  'Fenced: checkpoint a step (state + history row); returns leased | cancelled | failed.';

------------------------------------------------------------------------------
-- pgdurable.complete_run(id, token, owner, state, result, spend) -> text
-- FENCED (PD001). One Done step through write_steps (see there for the
-- CANCEL RULE: whichever commits first wins): the final checkpoint and the
-- completion in one statement; returns completed | cancelled | failed.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.complete_run(p_id uuid, p_token bigint, p_owner text,
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
CREATE FUNCTION pgdurable.release_run(p_id uuid, p_token bigint, p_owner text)
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
CREATE FUNCTION pgdurable.fail_run(p_id uuid, p_token bigint, p_owner text, p_error jsonb,
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
-- pgdurable.ack_cancel(id, token, owner, spend) -> text
-- FENCED (PD001). The owning worker stopped the step of a run whose cancel
-- was requested: 'cancelled' (error RunCancelled), lease cleared.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.ack_cancel(p_id uuid, p_token bigint, p_owner text,
                                     p_spend numeric DEFAULT 0)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  RETURN pgdurable._end(r.id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), p_spend);
END
$$;
COMMENT ON FUNCTION pgdurable.ack_cancel(uuid, bigint, text, numeric) IS
  'Fenced: the worker stopped a cancelled run''s step; record cancelled.';

------------------------------------------------------------------------------
-- pgdurable.cancel_run(id) -> text (the resulting status)
-- runnable / waiting -> 'cancelled' at once. leased -> cancel_requested_at set,
-- NOTIFY pgdurable_cancel(id), returns 'leased': the owner stops the step and
-- records 'cancelled'; if the owner commits a completion first, the final
-- status is 'completed' (first commit wins; see complete_run). An expired
-- lease with a cancel request becomes 'cancelled' at the next claim.
-- Terminal runs: no-op, returns their status. Unknown id: PD002.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.cancel_run(p_id uuid) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._locked_run(p_id);
BEGIN
  IF r.status IN ('runnable', 'waiting') THEN
    RETURN pgdurable._end(p_id, 'cancelled', pgdurable._error('RunCancelled', 'run was cancelled'), 0);
  ELSIF r.status = 'leased' THEN
    IF r.cancel_requested_at IS NULL THEN
      UPDATE pgdurable.runs SET cancel_requested_at = pgdurable.now() WHERE id = p_id;
      PERFORM pg_notify('pgdurable_cancel', p_id::text);
    END IF;
    RETURN 'leased';
  END IF;
  RETURN r.status;
END
$$;
COMMENT ON FUNCTION pgdurable.cancel_run(uuid) IS
  'Cancel a run: at once if runnable/waiting, by request + NOTIFY if leased; returns the status.';

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
CREATE FUNCTION pgdurable.mark_incompatible(p_task text, p_revision text, p_reason text)
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
-- pgdurable.effect_finish(id, token, owner, key, succeeded, result, error) -> void
-- FENCED (PD001). Record the outcome of a started effect: 'succeeded' with
-- result, or 'failed' with error {type, message}.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.effect_finish(p_id uuid, p_token bigint, p_owner text, p_key text,
                                        p_succeeded boolean, p_result jsonb, p_error jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  UPDATE pgdurable.effects SET
         status = CASE WHEN p_succeeded THEN 'succeeded' ELSE 'failed' END,
         result = p_result, error = p_error, token = p_token, updated_at = pgdurable.now()
   WHERE run_id = r.id AND key = p_key;
END
$$;
COMMENT ON FUNCTION pgdurable.effect_finish(uuid, bigint, text, text, boolean, jsonb, jsonb) IS
  'Fenced: record a started effect as succeeded (result) or failed (error).';
