-- functions/flow_control.sql: the current body of each function below.

------------------------------------------------------------------------------
-- pgdurable.set_queue(name, concurrency, per_key_concurrency, rate, burst) -> void
-- Set (replace) a queue's limits; all NULL removes them (plain claim again).
-- rate is per second; burst defaults to max(1, rate). Zero or negative
-- values: PD000 naming the argument, nothing written. The next claim uses
-- the new limits; NOTIFY pgdurable_wake(name) so raised limits apply at once.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.set_queue(p_name text, p_concurrency integer,
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
CREATE OR REPLACE FUNCTION pgdurable.set_bucket(p_name text, p_rate numeric, p_burst numeric)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_burst numeric := coalesce(p_burst, greatest(1, p_rate));
  -- v_now, not pgdurable.now(), in DO UPDATE: Citus refuses non-IMMUTABLE calls there (a cell)
  v_now timestamptz := pgdurable.now();
BEGIN
  IF p_name IS NULL OR p_name = '' THEN
    RAISE EXCEPTION 'set_bucket: name must be a non-empty bucket name' USING ERRCODE = 'PD000';
  ELSIF p_rate IS NULL OR p_rate <= 0 THEN
    RAISE EXCEPTION 'set_bucket: rate must be > 0, got %', p_rate USING ERRCODE = 'PD000';
  ELSIF v_burst <= 0 THEN
    RAISE EXCEPTION 'set_bucket: burst must be > 0, got %', p_burst USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.buckets AS b (name, rate, burst, tokens, refilled_at, updated_at)
  VALUES (p_name, p_rate, v_burst, v_burst, v_now, v_now)
  ON CONFLICT (name) DO UPDATE SET
    tokens = least(b.burst, b.tokens + b.rate * greatest(0, extract(epoch FROM v_now - b.refilled_at)),
                   excluded.burst),
    refilled_at = greatest(b.refilled_at, v_now), rate = excluded.rate, burst = excluded.burst,
    updated_at = v_now;
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
CREATE OR REPLACE FUNCTION pgdurable.acquire_tokens(p_name text, p_cost numeric)
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
-- pgdurable._claim_flow: as in 0016 (see its header), with the affinity rule in
-- the timer and runnable branches and `affinity` in its result. In a cell
-- (pgdurable.cell = on) the final UPDATE takes _claim_cell's form: each run's
-- verdict, error and wake from a JSON object by id (IMMUTABLE operators only),
-- and the affinity rule reads the holders' presence once (_presence).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._claim_flow(
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
  v_map jsonb;
  v_i integer;
  v_expires timestamptz;
  -- a cell: the affinity rule's presence read once (_presence), not per row
  v_presence jsonb := CASE WHEN current_setting('pgdurable.cell', true) = 'on'
                           THEN pgdurable._presence(p_now) END;
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
                OR CASE WHEN v_presence IS NULL
                        THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, p_now) IS NULL
                        ELSE NOT coalesce(v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance,
                                          false) END)
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
                      OR CASE WHEN v_presence IS NULL
                              THEN pgdurable._holder_until(r.affinity_worker, r.affinity_instance, p_now) IS NULL
                              ELSE NOT coalesce(v_presence -> r.affinity_worker ->> 'i' = r.affinity_instance,
                                                false) END)
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
  -- the tokens left computed first: no subquery in the UPDATE (a cell: Citus' fast path)
  v_tokens := CASE WHEN qr.rate IS NULL THEN 0
                   ELSE v_tokens - cardinality(array_positions(v_verdicts, 'run')) END;
  UPDATE pgdurable.queues q SET tokens = v_tokens, refilled_at = qr.refilled_at,
         key_cursor = qr.key_cursor
   WHERE q.name = p_queue;
  IF cardinality(v_ids) = 0 THEN
    RETURN;
  END IF;
  IF current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus refuses the non-IMMUTABLE calls, _error() and format(), in the CASE of
    -- the UPDATE below): each run's verdict, error and wake computed here first, then one
    -- UPDATE reading them from a JSON object by id, as _claim_cell does
    v_map := '{}';
    FOR c IN
      SELECT r.id, r.reclaims, r.lease_owner, r.wait_kind, r.wait_ref, r.wake_at
        FROM pgdurable.runs r WHERE r.id = ANY (v_ids)
    LOOP
      v_i := array_position(v_ids, c.id);
      v_map := v_map || jsonb_build_object(c.id::text, jsonb_build_object(
        'verdict', v_verdicts[v_i],
        'expired', (v_branches[v_i] = 'expired')::integer,
        'error', CASE
          WHEN v_verdicts[v_i] = 'cancelled' THEN pgdurable._error('RunCancelled',
                 'run was cancelled (its worker''s lease expired before it stopped)')
          WHEN v_verdicts[v_i] = 'poison' THEN pgdurable._error('PoisonRun', format(
                 'lease expired %s times in a row without a checkpoint (max_reclaims %s): '
                 'the run keeps crashing or stalling its workers; last worker %s',
                 c.reclaims + 1, v_bounds[v_i], coalesce(c.lease_owner, '?')))
          WHEN v_branches[v_i] = 'expired' THEN pgdurable._error('LeaseExpired',
                 'lease of worker ' || coalesce(c.lease_owner, '?')
                 || ' expired (crashed or stalled worker)')
          END,
        'wake', CASE WHEN v_branches[v_i] = 'timer'
                     THEN jsonb_build_object('type', 'timeout', 'kind', c.wait_kind,
                                             'ref', c.wait_ref, 'at', c.wake_at) END));
    END LOOP;
    v_expires := p_now + p_ttl;
    FOR c IN
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
      WHERE r.id = ANY (v_ids)
      RETURNING r.*
    LOOP
      id := c.id; task := c.task; revision := c.revision; queue := c.queue;
      status := c.status; state := c.state; step := c.step;
      attempts := c.attempts; max_attempts := c.max_attempts;
      lease_token := c.lease_token; lease_expires_at := c.lease_expires_at;
      wake := c.wake; deadline_at := c.deadline_at; budget := c.budget; spent := c.spent;
      affinity := CASE WHEN c.affinity_worker IS NULL THEN NULL
                       ELSE pgdurable._affinity_record(c.affinity_worker, c.affinity_instance,
                              c.affinity_mode, c.affinity_wait, c.affinity_info,
                              c.affinity_since) END;
      RETURN NEXT;
    END LOOP;
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
