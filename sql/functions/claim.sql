-- functions/claim.sql: the current body of each function below.

------------------------------------------------------------------------------
-- claim_runs: as in 0016_flow_control (see 0003 for the header; pairs matched
-- as pairs; limited queues by _claim_flow), with the affinity rule in the
-- runnable (a) and timer (c) branches -- not in the expired-lease branch (b):
-- crash recovery is never reserved -- and `affinity` in its result. search_path
-- and 0021's generic plan are set here, where the function is created.
-- enable_seqscan off (issue 45): in the generic plan the timer branch's bound
-- (wake_at <= v_now) is a parameter, estimated to match a third of the parked
-- timers; with 1,000,000 parked runs the planner then chose a sequential scan
-- of all of runs and a sort for every claim (2.1 s) instead of the range of
-- runs_timer_idx up to now (the due timers only). jit off: the same estimate
-- grows the plan's cost with the parked timers past jit_above_cost (280,000 at
-- 1,000,000 parked runs), and every claim was JIT-compiled (~240 ms of a
-- 360 ms claim on this 2-core machine); a claim never gains from JIT.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.claim_runs(
  p_owner text, p_queues text[], p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[] DEFAULT NULL)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, affinity jsonb, db_now timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_limited text[];
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
  -- one table, no subquery: a query Citus plans on its fast path (a cell)
  SELECT coalesce(array_agg(l.name ORDER BY l.name), '{}') INTO v_limited
    FROM pgdurable.queues l WHERE l.name = ANY (p_queues);
  IF cardinality(v_limited) > 0 THEN
    v_queues := ARRAY(SELECT u FROM unnest(p_queues) u WHERE u <> ALL (v_limited));
  END IF;
  IF cardinality(v_queues) > 0 AND current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus): the same claim in statements Citus plans on its fast path
    RETURN QUERY SELECT f.*, v_now
      FROM pgdurable._claim_cell(p_owner, v_queues, p_tasks, p_revisions, p_limit, p_ttl,
                                 p_max_reclaims, v_now) f;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_left := v_left - v_n;
  ELSIF cardinality(v_queues) > 0 THEN
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
            AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
                 OR r.available_at + r.affinity_wait <= v_now
                 OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now) IS NULL)
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
      -- as (a): per queue an index-ordered, LIMITed walk of runs_timer_idx (queue,
      -- wake_at), then the earliest p_limit across queues. `queue = ANY (...)` in one
      -- scan cannot return wake_at order, so it read and sorted every due timer for
      -- each claim: O(due) per claim, O(due^2) for a storm of timers due at once
      -- (issue 45: 100,000 due timers drained at 0.26x the rate of fresh runs).
      SELECT x.id, 'timer'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
             x.priority, x.wake_at AS due
        FROM unnest(v_queues) AS qn(name)
       CROSS JOIN LATERAL (
         SELECT r.id, r.priority, r.wake_at FROM pgdurable.runs r
          WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = qn.name
            AND r.wake_at <= v_now AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
            AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
                 OR r.wake_at + r.affinity_wait <= v_now
                 OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now) IS NULL)
          ORDER BY r.wake_at
          LIMIT p_limit FOR UPDATE SKIP LOCKED) x
       ORDER BY x.wake_at
       LIMIT p_limit
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
                r.budget, r.spent,
                CASE WHEN r.affinity_worker IS NULL THEN NULL
                         ELSE pgdurable._affinity_record(r.affinity_worker, r.affinity_instance,
                                r.affinity_mode, r.affinity_wait, r.affinity_info, r.affinity_since)
                    END AS affinity
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
-- pgdurable._claim_cell(owner, queues, tasks, revisions, limit, ttl,
--   max_reclaims, now) -> the rows of claim_runs but db_now
-- Internal: claim_runs' unlimited queues in a cell (Citus, pgdurable.cell =
-- on, set by pgdurable/ops/citus.py): the same three branches, the same
-- order and the same verdicts, in statements on ONE table each, which Citus
-- plans on its fast path and whose plans it caches; claim_runs' one statement
-- (CTEs, lateral joins) is planned, deparsed, parsed and planned again on the
-- shard at every call there (~2.5 ms: benchmarks/citus_cells.py, issue 46).
-- Each branch's candidates are locked (FOR UPDATE SKIP LOCKED) and read per
-- queue; the best p_limit are chosen here; one UPDATE takes them, reading each
-- run's verdict, error and wake from one JSON object by id with IMMUTABLE
-- operators only (Citus refuses non-IMMUTABLE calls inside CASE/COALESCE of an
-- UPDATE). (task, revision) pairs are matched as one key, the task's length,
-- ':', the task and the revision (no subquery).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._claim_cell(
  p_owner text, p_queues text[], p_tasks text[], p_revisions text[], p_limit integer,
  p_ttl interval, p_max_reclaims integer[], p_now timestamptz)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, affinity jsonb)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
  v_expires timestamptz := p_now + p_ttl;
  v_keys text[] := ARRAY(SELECT length(u.t)::text || ':' || u.t || u.v
                           FROM unnest(p_tasks, p_revisions) AS u(t, v));
  v_q text;
  v_rec record;
  c_ids uuid[] := '{}';
  c_branch text[] := '{}';
  c_prio integer[] := '{}';
  c_due timestamptz[] := '{}';
  c_verdict text[] := '{}';
  c_error jsonb[] := '{}';
  c_wake jsonb[] := '{}';
  v_bound integer;
  v_map jsonb;
  v_chosen uuid[];
  -- the affinity rule's presence, read once (_presence: not per row, in a cell)
  v_presence jsonb := pgdurable._presence(p_now);
BEGIN
  FOREACH v_q IN ARRAY p_queues LOOP
    -- (a) runnable, per queue in runs_runnable_idx order
    FOR v_rec IN
      SELECT r.id, r.priority, r.available_at FROM pgdurable.runs r
       WHERE r.status = 'runnable' AND r.queue = v_q AND r.available_at <= p_now
         AND length(r.task)::text || ':' || r.task || r.revision = ANY (v_keys)
         AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
              OR r.available_at + r.affinity_wait <= p_now
              OR NOT coalesce(v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance,
                              false))
       ORDER BY r.priority DESC, r.available_at
       LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
      c_ids := c_ids || v_rec.id; c_branch := c_branch || 'runnable'::text;
      c_prio := c_prio || v_rec.priority; c_due := c_due || v_rec.available_at;
      c_verdict := c_verdict || 'run'::text; c_error := c_error || NULL::jsonb;
      c_wake := c_wake || NULL::jsonb;
    END LOOP;
    -- (c) due timers, per queue in runs_timer_idx order
    FOR v_rec IN
      SELECT r.id, r.priority, r.wake_at, r.wait_kind, r.wait_ref FROM pgdurable.runs r
       WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = v_q
         AND r.wake_at <= p_now
         AND length(r.task)::text || ':' || r.task || r.revision = ANY (v_keys)
         AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
              OR r.wake_at + r.affinity_wait <= p_now
              OR NOT coalesce(v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance,
                              false))
       ORDER BY r.wake_at
       LIMIT p_limit FOR UPDATE SKIP LOCKED
    LOOP
      c_ids := c_ids || v_rec.id; c_branch := c_branch || 'timer'::text;
      c_prio := c_prio || v_rec.priority; c_due := c_due || v_rec.wake_at;
      c_verdict := c_verdict || 'run'::text; c_error := c_error || NULL::jsonb;
      c_wake := c_wake || jsonb_build_object('type', 'timeout', 'kind', v_rec.wait_kind,
                                             'ref', v_rec.wait_ref, 'at', v_rec.wake_at);
    END LOOP;
  END LOOP;
  -- (b) expired leases (crash recovery), across the queues
  FOR v_rec IN
    SELECT r.id, r.priority, r.lease_expires_at, r.cancel_requested_at, r.reclaims, r.lease_owner,
           length(r.task)::text || ':' || r.task || r.revision AS key
      FROM pgdurable.runs r
     WHERE r.status = 'leased' AND r.queue = ANY (p_queues) AND r.lease_expires_at <= p_now
       AND length(r.task)::text || ':' || r.task || r.revision = ANY (v_keys)
     ORDER BY r.priority DESC, r.lease_expires_at
     LIMIT p_limit FOR UPDATE SKIP LOCKED
  LOOP
    v_bound := coalesce(p_max_reclaims[array_position(v_keys, v_rec.key)], 5);
    c_ids := c_ids || v_rec.id; c_branch := c_branch || 'expired'::text;
    c_prio := c_prio || v_rec.priority; c_due := c_due || v_rec.lease_expires_at;
    c_verdict := c_verdict || CASE WHEN v_rec.cancel_requested_at IS NOT NULL THEN 'cancelled'
                                   WHEN v_rec.reclaims >= v_bound THEN 'poison' ELSE 'run' END;
    c_error := c_error || CASE
      WHEN v_rec.cancel_requested_at IS NOT NULL THEN pgdurable._error('RunCancelled',
        'run was cancelled (its worker''s lease expired before it stopped)')
      WHEN v_rec.reclaims >= v_bound THEN pgdurable._error('PoisonRun', format(
        'lease expired %s times in a row without a checkpoint (max_reclaims %s): '
        'the run keeps crashing or stalling its workers; last worker %s',
        v_rec.reclaims + 1, v_bound, coalesce(v_rec.lease_owner, '?')))
      ELSE pgdurable._error('LeaseExpired',
        'lease of worker ' || coalesce(v_rec.lease_owner, '?') || ' expired (crashed or stalled worker)')
      END;
    c_wake := c_wake || NULL::jsonb;
  END LOOP;
  IF cardinality(c_ids) = 0 THEN
    RETURN;
  END IF;
  -- claim_runs' choice: the best p_limit of (a) (priority, then oldest), the
  -- earliest p_limit of (c), all of (b); then one order across them
  SELECT array_agg(k.cid), jsonb_object_agg(k.cid::text, jsonb_build_object(
           'verdict', k.verdict, 'expired', (k.branch = 'expired')::integer,
           'error', k.error, 'wake', k.wake))
    INTO v_chosen, v_map
    FROM (SELECT u.* FROM (
            (SELECT * FROM unnest(c_ids, c_branch, c_prio, c_due, c_verdict, c_error, c_wake)
                        AS a(cid, branch, prio, due, verdict, error, wake)
              WHERE a.branch = 'runnable' ORDER BY a.prio DESC, a.due LIMIT p_limit)
            UNION ALL
            (SELECT * FROM unnest(c_ids, c_branch, c_prio, c_due, c_verdict, c_error, c_wake)
                        AS b(cid, branch, prio, due, verdict, error, wake)
              WHERE b.branch = 'expired')
            UNION ALL
            (SELECT * FROM unnest(c_ids, c_branch, c_prio, c_due, c_verdict, c_error, c_wake)
                        AS c(cid, branch, prio, due, verdict, error, wake)
              WHERE c.branch = 'timer' ORDER BY c.due LIMIT p_limit)) u
          ORDER BY u.prio DESC, u.due LIMIT p_limit) k;
  FOR v_rec IN
    UPDATE pgdurable.runs r SET
      status = CASE WHEN v_map -> r.id::text ->> 'verdict' = 'cancelled' THEN 'cancelled'
                    WHEN v_map -> r.id::text ->> 'verdict' = 'poison' THEN 'failed'
                    ELSE 'leased' END,
      reclaims = r.reclaims + (v_map -> r.id::text ->> 'expired')::integer,
      error = coalesce(nullif(v_map -> r.id::text -> 'error', 'null'::jsonb), r.error),
      claims = r.claims + 1,
      lease_token = r.lease_token + 1,
      lease_owner = CASE WHEN v_map -> r.id::text ->> 'verdict' = 'run' THEN p_owner END,
      lease_expires_at = CASE WHEN v_map -> r.id::text ->> 'verdict' = 'run' THEN v_expires END,
      finished_at = CASE WHEN v_map -> r.id::text ->> 'verdict' <> 'run' THEN p_now END,
      leased_at = p_now,
      wake = coalesce(nullif(v_map -> r.id::text -> 'wake', 'null'::jsonb), r.wake),
      wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
      updated_at = p_now
    WHERE r.id = ANY (v_chosen)
    RETURNING r.id, r.task, r.revision, r.queue, r.status, r.state, r.step, r.attempts,
              r.max_attempts, r.lease_token, r.lease_expires_at, r.wake, r.deadline_at,
              r.budget, r.spent, r.affinity_worker, r.affinity_instance, r.affinity_mode,
              r.affinity_wait, r.affinity_info, r.affinity_since
  LOOP
    id := v_rec.id; task := v_rec.task; revision := v_rec.revision; queue := v_rec.queue;
    status := v_rec.status; state := v_rec.state; step := v_rec.step;
    attempts := v_rec.attempts; max_attempts := v_rec.max_attempts;
    lease_token := v_rec.lease_token; lease_expires_at := v_rec.lease_expires_at;
    wake := v_rec.wake; deadline_at := v_rec.deadline_at; budget := v_rec.budget;
    spent := v_rec.spent;
    affinity := CASE WHEN v_rec.affinity_worker IS NULL THEN NULL
                     ELSE pgdurable._affinity_record(v_rec.affinity_worker,
                            v_rec.affinity_instance, v_rec.affinity_mode, v_rec.affinity_wait,
                            v_rec.affinity_info, v_rec.affinity_since) END;
    RETURN NEXT;
  END LOOP;
END
$$;
COMMENT ON FUNCTION pgdurable._claim_cell(text, text[], text[], text[], integer, interval, integer[], timestamptz) IS
  'Internal: claim_runs'' unlimited queues in a Citus cell, in statements on one table each.';

------------------------------------------------------------------------------
-- next_wakeup(queues, tasks, revisions, owner DEFAULT NULL): as in
-- 0016_flow_control (flow-aware), with the affinity rule: a ready run reserved
-- for a present holder other than p_owner is due when its reservation ends
-- (THE RULE: ready + wait, or earlier when its holder's presence would lapse;
-- asked again then if the holder renewed it). For p_owner's own runs, and for
-- runs without affinity, the due time is the same as before.
-- The timers are no longer all read: per queue, the first timer that p_owner
-- may take comes from an ordered walk of runs_timer_idx (LIMIT 1, the claim's
-- filter), and only the timers that walk passed over (reserved for another
-- worker, or of tasks p_owner does not serve) are read for when they are due:
-- O(passed over) instead of O(parked timers). The runnable part reads each
-- runnable run as before (runs_runnable_idx is ordered by priority first).
-- In a cell (pgdurable.cell = on) the holders' presence is read once first
-- (_presence) and each affine run's holder looked up in it, not by
-- _holder_until per row (refused there: it reads a table).
-- enable_seqscan off (issue 45): the passed-over read's bound (wake_at below
-- the first takeable timer) is a parameter the planner cannot see, so with
-- many parked timers it chose a sequential scan of all of runs for it (404 ms
-- at 340,000 runs, on every idle poll of every worker) instead of the range
-- of runs_timer_idx below that bound (empty without affinity: 0.03 ms). jit
-- off: as claim_runs.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.next_wakeup(p_queues text[], p_tasks text[], p_revisions text[],
                                      p_owner text DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp
SET enable_seqscan = off
SET jit = off AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_at   timestamptz;
  -- a cell: the presence read once (_presence), not per row
  v_presence jsonb := CASE WHEN current_setting('pgdurable.cell', true) = 'on'
                           THEN pgdurable._presence(v_now) END;
BEGIN
  IF NOT EXISTS (SELECT FROM pgdurable.queues l WHERE l.name = ANY (p_queues)) THEN
    -- no limited queue: the 0009 query (with affinity)
    WITH pairs AS MATERIALIZED (
      SELECT DISTINCT u.t, u.v FROM unnest(p_tasks, p_revisions) AS u(t, v)
    )
    SELECT least(
      (SELECT min(CASE WHEN r.affinity_worker IS NULL OR r.affinity_worker = p_owner THEN r.available_at
                 ELSE greatest(r.available_at, least(r.available_at + r.affinity_wait, coalesce(
                   (CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now)
                        WHEN v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance
                        THEN (v_presence -> r.affinity_worker ->> 'u')::timestamptz END),
                   r.available_at)))
            END) FROM pgdurable.runs r
        WHERE r.status = 'runnable' AND r.queue = ANY (p_queues)
          AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
      (SELECT min(t.due) FROM unnest(p_queues) AS qn(name) CROSS JOIN LATERAL
        (SELECT least(n.first, (
           -- before it, only runs skipped as reserved for another worker (or of other
           -- tasks): each due when its reservation ends
           SELECT min(greatest(r.wake_at, least(r.wake_at + r.affinity_wait, coalesce(
                         (CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now)
                        WHEN v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance
                        THEN (v_presence -> r.affinity_worker ->> 'u')::timestamptz END),
                         r.wake_at))))
             FROM pgdurable.runs r
            WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = qn.name
              AND r.wake_at < coalesce(n.first, 'infinity') AND r.affinity_worker IS NOT NULL
              AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)))
           FROM (SELECT (
             -- the first timer by wake_at that this worker may take (the claim's filter)
             SELECT r.wake_at FROM pgdurable.runs r
              WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = qn.name
                AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
                AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
                     OR r.wake_at + r.affinity_wait <= v_now
                     OR (CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now)
                        WHEN v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance
                        THEN (v_presence -> r.affinity_worker ->> 'u')::timestamptz END) IS NULL)
              ORDER BY r.wake_at LIMIT 1) AS first) n) AS t(due)),
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
         (SELECT min(CASE WHEN r.affinity_worker IS NULL OR r.affinity_worker = p_owner THEN r.available_at
                 ELSE greatest(r.available_at, least(r.available_at + r.affinity_wait, coalesce(
                   (CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now)
                        WHEN v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance
                        THEN (v_presence -> r.affinity_worker ->> 'u')::timestamptz END),
                   r.available_at)))
            END) FROM pgdurable.runs r
           WHERE r.status = 'runnable' AND r.queue = qs.name
             AND (cardinality(qs.saturated) = 0 OR r.concurrency_key <> ALL (qs.saturated))
             AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
         (SELECT least(n.first, (
            -- before it, only runs skipped as reserved for another worker (or of other
            -- tasks): each due when its reservation ends
            SELECT min(greatest(r.wake_at, least(r.wake_at + r.affinity_wait, coalesce(
                          (CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now)
                        WHEN v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance
                        THEN (v_presence -> r.affinity_worker ->> 'u')::timestamptz END),
                          r.wake_at))))
              FROM pgdurable.runs r
             WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = qs.name
               AND r.wake_at < coalesce(n.first, 'infinity') AND r.affinity_worker IS NOT NULL
               AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)))
            FROM (SELECT (
              -- the first timer by wake_at that this worker may take (the claim's filter)
              SELECT r.wake_at FROM pgdurable.runs r
               WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = qs.name
                 AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
                 AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
                      OR r.wake_at + r.affinity_wait <= v_now
                      OR (CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now)
                        WHEN v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance
                        THEN (v_presence -> r.affinity_worker ->> 'u')::timestamptz END) IS NULL)
               ORDER BY r.wake_at LIMIT 1) AS first) n)) AS at) w
      WHERE NOT qs.full),
    (SELECT min(r.lease_expires_at) FROM pgdurable.runs r
      WHERE r.status = 'leased' AND r.queue = ANY (p_queues)
        AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)))
  INTO v_at;
  RETURN CASE WHEN v_at IS NULL THEN NULL ELSE greatest(0, extract(epoch FROM v_at - v_now)) END;
END
$$;
COMMENT ON FUNCTION pgdurable.next_wakeup(text[], text[], text[], text) IS
  'Seconds until claimable work may appear in these queues for these tasks (NULL: none); '
  'respects queue concurrency, start rate and per-key limits.';
