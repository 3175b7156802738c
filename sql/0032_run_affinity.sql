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

-- No index on the affinity columns: every statement that writes runs opens
-- every index of runs, and nothing needs to find the runs pinned to a worker
-- (a stopping worker wakes its own queues, worker_absent).

------------------------------------------------------------------------------
-- THE RULE, written out where it is used (the runnable and timer branches of
-- claim_runs and _claim_flow, the runnable and timer parts of next_wakeup:
-- keep them in step). An affine run r is ready at X (available_at, or wake_at
-- for a timer); U = _holder_until(r.affinity_worker, r.affinity_instance, now)
-- is its holder's presence until, NULL when the holder (that worker id, that
-- process instance) is not present. r is reserved for its holder while
-- U IS NOT NULL and X + r.affinity_wait > now. The claim takes r when
-- affinity_worker IS NULL, or is the claimer, or X + affinity_wait <= now, or
-- U IS NULL; next_wakeup reports r due at
-- greatest(X, least(X + affinity_wait, coalesce(U, X))): when its window ends,
-- or when its holder's presence would lapse (asked again then if it was renewed).
--
-- Why a function: the OR stops at the null test for a run without affinity,
-- so _holder_until runs only for affine candidates, and a function call is
-- nothing to the executor until then. Measured (benchmarks/RESULTS.md):
--   * a correlated subquery is costed per candidate row by the planner: the
--     estimate of the claim's timer branch (a generic plan) passed
--     jit_above_cost, and every claim was JIT-compiled (~50 ms);
--   * an uncorrelated one (an InitPlan: evaluated once, lazily) is costed once,
--     but its plan nodes are set up, and worker_presence opened and locked, at
--     every claim: 5-7 us more per claim of runs without affinity.
-- COST 1 keeps the planner's estimate of the filter at an operator's.
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- pgdurable._holder_until(worker, instance, now) -> timestamptz
-- Until when the worker `worker`, process `instance`, is present (its
-- worker_presence row's until, if that is after `now`), else NULL. One
-- primary-key probe.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._holder_until(p_worker text, p_instance text, p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE COST 1
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT w.until FROM pgdurable.worker_presence w
   WHERE w.worker_id = p_worker AND w.instance = p_instance AND w.until > p_now
$$;
COMMENT ON FUNCTION pgdurable._holder_until(text, text, timestamptz) IS
  'Internal: until when a worker process instance is present (NULL: it is not).';

------------------------------------------------------------------------------
-- pgdurable._affinity_record(worker, instance, mode, wait, info, since) -> jsonb
-- The affinity as the engine hands it to a step: {worker, instance, mode,
-- wait (seconds), info, since}.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._affinity_record(p_worker text, p_instance text, p_mode text,
                                           p_wait interval, p_info jsonb, p_since timestamptz)
RETURNS jsonb
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE WHEN p_worker IS NULL THEN NULL
              ELSE jsonb_build_object('worker', p_worker, 'instance', p_instance, 'mode', p_mode,
                                      'wait', extract(epoch FROM p_wait), 'info', p_info,
                                      'since', p_since) END
$$;
COMMENT ON FUNCTION pgdurable._affinity_record(text, text, text, interval, jsonb, timestamptz) IS
  'Internal: a run''s affinity columns as one JSON object (NULL without affinity).';

------------------------------------------------------------------------------
-- pgdurable.worker_present(worker, instance, ttl) -> timestamptz
-- "Worker `worker` runs as process `instance` and is alive for `ttl`": its
-- presence row says so until now + ttl (returned). Another instance under the
-- same id replaces the old one (a restart): the runs pinned to the old one
-- are no longer reserved (the restarted worker itself claims them first: they
-- still name its id), and rows lapsed more than an hour ago are pruned then.
-- An empty worker or instance, or a ttl outside (0, 1 day], raises PD000 and
-- changes nothing.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.worker_present(p_worker text, p_instance text, p_ttl interval)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now timestamptz := pgdurable.now();
  v_old text;
  v_until timestamptz;
BEGIN
  IF coalesce(p_worker, '') = '' OR coalesce(p_instance, '') = '' THEN
    RAISE EXCEPTION 'worker_present: a worker id and an instance are required'
      USING ERRCODE = 'PD000';
  END IF;
  IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 day' THEN
    RAISE EXCEPTION 'worker_present: ttl must be a positive interval of at most 1 day, got %',
      coalesce(p_ttl::text, 'NULL') USING ERRCODE = 'PD000';
  END IF;
  SELECT w.instance INTO v_old FROM pgdurable.worker_presence w
   WHERE w.worker_id = p_worker FOR UPDATE;
  IF FOUND AND v_old = p_instance THEN
    UPDATE pgdurable.worker_presence w SET until = v_now + p_ttl
     WHERE w.worker_id = p_worker
    RETURNING w.until INTO v_until;
    RETURN v_until;
  END IF;
  INSERT INTO pgdurable.worker_presence AS w (worker_id, instance, since, until)
  VALUES (p_worker, p_instance, v_now, v_now + p_ttl)
  ON CONFLICT (worker_id) DO UPDATE
     SET instance = excluded.instance, since = excluded.since, until = excluded.until
  RETURNING w.until INTO v_until;
  DELETE FROM pgdurable.worker_presence w WHERE w.until < v_now - interval '1 hour';
  RETURN v_until;
END
$$;
COMMENT ON FUNCTION pgdurable.worker_present(text, text, interval) IS
  'Announce or renew a worker''s presence (this process instance, alive for ttl); returns until.';

------------------------------------------------------------------------------
-- pgdurable.worker_absent(worker, instance, queues) -> boolean
-- A worker that stops cleanly removes its presence row (only if it is still
-- the row of this instance: a newer instance under the same id keeps its own):
-- the runs reserved for it are anybody's now, and its queues (where it claimed
-- them) are woken, NOTIFY pgdurable_wake, once per queue. Returns whether a row
-- was removed (nothing is sent otherwise).
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.worker_absent(p_worker text, p_instance text, p_queues text[])
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  DELETE FROM pgdurable.worker_presence w
   WHERE w.worker_id = p_worker AND w.instance = p_instance;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('pgdurable_wake', q) FROM (SELECT DISTINCT unnest(p_queues) AS q) u;
  RETURN true;
END
$$;
COMMENT ON FUNCTION pgdurable.worker_absent(text, text, text[]) IS
  'A cleanly stopping worker removes its presence and wakes its queues: its reserved runs are free.';

------------------------------------------------------------------------------
-- pgdurable.pin_run(id, token, owner, instance, mode, wait, info) -> jsonb
-- FENCED (PD001). Pin the run to its current lease holder, process instance
-- `instance`: mode 'soft' or 'hard', wait in (0, 1 day], info a JSON object
-- (at most 8 KB) or NULL. mode NULL unpins (clears the affinity; instance,
-- wait and info are ignored). Returns the affinity record (_affinity_record)
-- or NULL. Bad input raises PD000 and changes nothing.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.pin_run(p_id uuid, p_token bigint, p_owner text, p_instance text,
                                  p_mode text, p_wait interval, p_info jsonb)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs;
  v_now timestamptz := pgdurable.now();
BEGIN
  IF p_mode IS NOT NULL THEN
    IF p_mode NOT IN ('soft', 'hard') THEN
      RAISE EXCEPTION 'pin_run: mode must be soft or hard (or NULL to unpin), not %',
        quote_literal(p_mode) USING ERRCODE = 'PD000';
    END IF;
    IF coalesce(p_instance, '') = '' THEN
      RAISE EXCEPTION 'pin_run: the holder''s instance is required' USING ERRCODE = 'PD000';
    END IF;
    IF p_wait IS NULL OR p_wait <= interval '0' OR p_wait > interval '1 day' THEN
      RAISE EXCEPTION 'pin_run: wait must be a positive interval of at most 1 day, got %',
        coalesce(p_wait::text, 'NULL') USING ERRCODE = 'PD000';
    END IF;
    IF p_info IS NOT NULL AND (jsonb_typeof(p_info) <> 'object' OR octet_length(p_info::text) > 8192) THEN
      RAISE EXCEPTION 'pin_run: info must be a JSON object of at most 8192 bytes'
        USING ERRCODE = 'PD000';
    END IF;
  END IF;
  r := pgdurable._fenced(p_id, p_token, p_owner);
  UPDATE pgdurable.runs SET
         affinity_worker = CASE WHEN p_mode IS NULL THEN NULL ELSE p_owner END,
         affinity_instance = CASE WHEN p_mode IS NULL THEN NULL ELSE p_instance END,
         affinity_mode = p_mode,
         affinity_wait = CASE WHEN p_mode IS NULL THEN NULL ELSE p_wait END,
         affinity_info = CASE WHEN p_mode IS NULL THEN NULL ELSE p_info END,
         affinity_since = CASE WHEN p_mode IS NULL THEN NULL ELSE v_now END
   WHERE id = r.id;
  RETURN pgdurable._affinity_record(CASE WHEN p_mode IS NULL THEN NULL ELSE p_owner END,
                                    p_instance, p_mode, p_wait, p_info, v_now);
END
$$;
COMMENT ON FUNCTION pgdurable.pin_run(uuid, bigint, text, text, text, interval, jsonb) IS
  'Fenced: pin the run to the worker holding its service (soft/hard, wait, info), or unpin (mode NULL).';

------------------------------------------------------------------------------
-- pgdurable.affine_started_run(id, from) -> uuid
-- Give a run THIS transaction has just inserted (composed with a start in one
-- statement, as tag_started_run is) the affinity of run `from`: same holder,
-- instance, mode, wait and info. Only a row inserted by the current
-- transaction (created_xact, created_at = now(), as tag_started_run checks
-- since 0029: a run this transaction merely updated does not pass) that has
-- no affinity yet is changed (an idempotent repeat of a start finds the old
-- row: nothing changes); `from` without affinity gives none; an unknown `from`
-- raises PD002 (the start is rolled back with it). from NULL: nothing.
-- Returns p_id.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.affine_started_run(p_id uuid, p_from uuid)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  f pgdurable.runs;
BEGIN
  IF p_from IS NULL THEN
    RETURN p_id;
  END IF;
  SELECT * INTO f FROM pgdurable.runs x WHERE x.id = p_from;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no run %', p_from USING ERRCODE = 'PD002';
  END IF;
  IF f.affinity_worker IS NOT NULL THEN
    UPDATE pgdurable.runs r SET affinity_worker = f.affinity_worker,
           affinity_instance = f.affinity_instance, affinity_mode = f.affinity_mode,
           affinity_wait = f.affinity_wait, affinity_info = f.affinity_info,
           affinity_since = pgdurable.now()
     WHERE r.id = p_id AND r.affinity_worker IS NULL
       AND r.created_xact = (pg_catalog.pg_current_xact_id())::text::bigint
       AND r.created_at = pgdurable.now();
  END IF;
  RETURN p_id;
END
$$;
COMMENT ON FUNCTION pgdurable.affine_started_run(uuid, uuid) IS
  'Give a run inserted by this very transaction the affinity of another run (composed with a start).';

------------------------------------------------------------------------------
-- The claim and the idle poll, restated from 0016_flow_control with the
-- affinity rule (see the file header). claim_runs' result gains `affinity`
-- (the _affinity_record of the run, NULL without), so it is dropped and
-- created again, with 0021's plan_cache_mode.
------------------------------------------------------------------------------
DROP FUNCTION pgdurable.claim_runs(text, text[], text[], text[], integer, interval, integer[]);
DROP FUNCTION pgdurable._claim_flow(text, text, text[], text[], integer, interval, integer[],
                                    timestamptz);
DROP FUNCTION pgdurable.next_wakeup(text[], text[], text[]);

------------------------------------------------------------------------------
-- pgdurable._claim_flow: as in 0016 (see its header), with the affinity rule in
-- the timer and runnable branches and `affinity` in its result.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable._claim_flow(
  p_owner text, p_queue text, p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[], p_now timestamptz)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, affinity jsonb)
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
           AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
                OR r.wake_at + r.affinity_wait <= p_now
                OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, p_now) IS NULL)
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
                 AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
                      OR r.available_at + r.affinity_wait <= p_now
                      OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, p_now) IS NULL)
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
            r.budget, r.spent,
            CASE WHEN r.affinity_worker IS NULL THEN NULL
                     ELSE pgdurable._affinity_record(r.affinity_worker, r.affinity_instance,
                            r.affinity_mode, r.affinity_wait, r.affinity_info, r.affinity_since)
                END AS affinity;
END
$$;
COMMENT ON FUNCTION pgdurable._claim_flow(text, text, text[], text[], integer, interval, integer[],
                                          timestamptz) IS
  'Internal: claim from one limited queue under its concurrency, per-key and rate limits, keys in rotation.';


------------------------------------------------------------------------------
-- claim_runs: as in 0016_flow_control (see 0003 for the header; pairs matched
-- as pairs; limited queues by _claim_flow), with the affinity rule in the
-- runnable (a) and timer (c) branches -- not in the expired-lease branch (b):
-- crash recovery is never reserved -- and `affinity` in its result. search_path
-- and 0021's generic plan are set here, where the function is created.
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.claim_runs(
  p_owner text, p_queues text[], p_tasks text[], p_revisions text[],
  p_limit integer, p_ttl interval, p_max_reclaims integer[] DEFAULT NULL)
RETURNS TABLE (id uuid, task text, revision text, queue text, status text, state jsonb,
               step integer, attempts integer, max_attempts integer, lease_token bigint,
               lease_expires_at timestamptz, wake jsonb, deadline_at timestamptz,
               budget numeric, spent numeric, affinity jsonb, db_now timestamptz)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
SET plan_cache_mode = force_generic_plan AS $$
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
      SELECT r.id, 'timer'::text AS branch, 'run'::text AS verdict, NULL::integer AS bound,
             r.priority, r.wake_at AS due
        FROM pgdurable.runs r
       WHERE r.status = 'waiting' AND r.wake_at IS NOT NULL AND r.queue = ANY (v_queues)
         AND r.wake_at <= v_now AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)
         AND (r.affinity_worker IS NULL OR r.affinity_worker = p_owner
              OR r.wake_at + r.affinity_wait <= v_now
              OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now) IS NULL)
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
------------------------------------------------------------------------------
CREATE FUNCTION pgdurable.next_wakeup(p_queues text[], p_tasks text[], p_revisions text[],
                                      p_owner text DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_now  timestamptz := pgdurable.now();
  v_at   timestamptz;
BEGIN
  IF NOT EXISTS (SELECT FROM pgdurable.queues l WHERE l.name = ANY (p_queues)) THEN
    -- no limited queue: the 0009 query (with affinity)
    WITH pairs AS MATERIALIZED (
      SELECT DISTINCT u.t, u.v FROM unnest(p_tasks, p_revisions) AS u(t, v)
    )
    SELECT least(
      (SELECT min(CASE WHEN r.affinity_worker IS NULL OR r.affinity_worker = p_owner THEN r.available_at
                 ELSE greatest(r.available_at, least(r.available_at + r.affinity_wait, coalesce(
                   pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now),
                   r.available_at)))
            END) FROM pgdurable.runs r
        WHERE r.status = 'runnable' AND r.queue = ANY (p_queues)
          AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
      (SELECT min(t.due) FROM unnest(p_queues) AS qn(name) CROSS JOIN LATERAL
        (SELECT least(n.first, (
           -- before it, only runs skipped as reserved for another worker (or of other
           -- tasks): each due when its reservation ends
           SELECT min(greatest(r.wake_at, least(r.wake_at + r.affinity_wait, coalesce(
                         pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now),
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
                     OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now) IS NULL)
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
                   pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now),
                   r.available_at)))
            END) FROM pgdurable.runs r
           WHERE r.status = 'runnable' AND r.queue = qs.name
             AND (cardinality(qs.saturated) = 0 OR r.concurrency_key <> ALL (qs.saturated))
             AND (r.task, r.revision) IN (SELECT p.t, p.v FROM pairs p)),
         (SELECT least(n.first, (
            -- before it, only runs skipped as reserved for another worker (or of other
            -- tasks): each due when its reservation ends
            SELECT min(greatest(r.wake_at, least(r.wake_at + r.affinity_wait, coalesce(
                          pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now),
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
                      OR pgdurable._holder_until(r.affinity_worker, r.affinity_instance, v_now) IS NULL)
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
