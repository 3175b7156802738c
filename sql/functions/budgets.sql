-- functions/budgets.sql: the current body of each function below (the budget
-- ledger, sql/0036_budgets.sql; docs/budgets.md).

------------------------------------------------------------------------------
-- pgdurable._budget_units() -> text[]
-- Internal: the units a budget, a reservation or a settlement may name.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_units() RETURNS text[]
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT ARRAY['usd', 'tokens', 'tokens_in', 'tokens_out', 'calls']::text[]
$$;
COMMENT ON FUNCTION pgdurable._budget_units() IS
  'Internal: the budget units (usd, tokens, tokens_in, tokens_out, calls).';

------------------------------------------------------------------------------
-- pgdurable._budget_amounts(amounts, what) -> jsonb
-- Internal: check a {unit: amount} object (PD000 naming `what` unless every
-- key is a known unit and every value a JSON number >= 0) and return it.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_amounts(p_amounts jsonb, p_what text) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e record;
BEGIN
  IF p_amounts IS NULL OR jsonb_typeof(p_amounts) <> 'object' THEN
    RAISE EXCEPTION '%: amounts must be a JSON object of unit -> number', p_what
      USING ERRCODE = 'PD000';
  END IF;
  FOR e IN SELECT x.key, x.value FROM jsonb_each(p_amounts) x LOOP
    IF NOT e.key = ANY (pgdurable._budget_units()) THEN
      RAISE EXCEPTION '%: unknown unit % (known: %)', p_what, e.key,
        array_to_string(pgdurable._budget_units(), ', ') USING ERRCODE = 'PD000';
    END IF;
    IF jsonb_typeof(e.value) <> 'number' OR (e.value #>> '{}')::numeric < 0 THEN
      RAISE EXCEPTION '%: % must be a number >= 0, not %', p_what, e.key, e.value
        USING ERRCODE = 'PD000';
    END IF;
  END LOOP;
  RETURN p_amounts;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_amounts(jsonb, text) IS
  'Internal: check {unit: amount >= 0} (known units only) or raise PD000.';

------------------------------------------------------------------------------
-- pgdurable._budget_window_start(kind, length) -> timestamptz
-- Internal: where the budget's current window began (database clock): none
-- -> -infinity, fixed -> the calendar bucket of `length` from 2000-01-01 UTC,
-- rolling -> now() - length.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_window_start(p_kind text, p_length interval)
RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE p_kind
    WHEN 'fixed' THEN date_bin(p_length, pgdurable.now(), timestamptz '2000-01-01 00:00:00+00')
    WHEN 'rolling' THEN pgdurable.now() - p_length
    ELSE timestamptz '-infinity' END
$$;
COMMENT ON FUNCTION pgdurable._budget_window_start(text, interval) IS
  'Internal: the start of a budget''s current window (-infinity without a window).';

------------------------------------------------------------------------------
-- pgdurable._budget_keys(run_id) -> text[]
-- Internal: the budgets a run draws from, sorted: those attached to the run,
-- else those of its nearest ancestor with any (children share their parent's
-- budgets unless given their own); NULL when none in its tree.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_keys(p_run_id uuid) RETURNS text[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  WITH RECURSIVE up (id, parent, depth) AS (
    SELECT r.id, r.parent_run_id, 0 FROM pgdurable.runs r WHERE r.id = p_run_id
    UNION ALL
    SELECT r.id, r.parent_run_id, u.depth + 1
      FROM up u JOIN pgdurable.runs r ON r.id = u.parent
     WHERE u.depth < 1000)
  SELECT array_agg(rb.budget_key ORDER BY rb.budget_key)
    FROM pgdurable.run_budgets rb
   WHERE rb.run_id = (SELECT u.id FROM up u
                       WHERE EXISTS (SELECT 1 FROM pgdurable.run_budgets x WHERE x.run_id = u.id)
                       ORDER BY u.depth LIMIT 1)
$$;
COMMENT ON FUNCTION pgdurable._budget_keys(uuid) IS
  'Internal: the budgets a run draws from (its own attachments, else its nearest ancestor''s).';

------------------------------------------------------------------------------
-- pgdurable._budget_key(key) -> text
-- Internal: check a budget key (non-empty, at most 200 characters) or PD000.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_key(p_key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_key IS NULL OR p_key = '' OR length(p_key) > 200 THEN
    RAISE EXCEPTION 'a budget key must be 1 to 200 characters' USING ERRCODE = 'PD000';
  END IF;
  RETURN p_key;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_key(text) IS
  'Internal: check a budget key or raise PD000.';

------------------------------------------------------------------------------
-- pgdurable._budget_totals_init(key, recount) -> void
-- Internal: make sure the budget has its running totals (a budget_totals row
-- per unit); with `recount`, count `settled` of its current window again from
-- the ledger (a budget created or given another window; all time: with the
-- folded settlements of pruned rows; a fixed or rolling window counts the rows
-- kept: pruned ones were outside the window they were pruned under).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_totals_init(p_key text, p_recount boolean)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  b pgdurable.budgets;
  v_ws timestamptz;
BEGIN
  INSERT INTO pgdurable.budget_totals (budget_key, unit)
  SELECT p_key, u FROM unnest(pgdurable._budget_units()) u
  ON CONFLICT DO NOTHING;
  IF p_recount THEN
    SELECT * INTO b FROM pgdurable.budgets x WHERE x.key = p_key;
    IF NOT FOUND THEN
      RETURN;
    END IF;
    PERFORM 1 FROM pgdurable.budget_totals t WHERE t.budget_key = p_key
      ORDER BY t.unit FOR UPDATE;
    -- the window's start computed first: Citus (a cell) refuses a non-IMMUTABLE call
    -- inside the CASE of an UPDATE
    v_ws := pgdurable._budget_window_start(b.window_kind, b.window_length);
    UPDATE pgdurable.budget_totals t
       SET settled = CASE WHEN b.window_kind = 'rolling' THEN 0 ELSE
             coalesce((SELECT sum(l.amount) FROM pgdurable.budget_ledger l
                        WHERE l.budget_key = p_key AND l.unit = t.unit AND l.kind = 'settle'
                          AND l.at >= v_ws), 0)
             -- all time: the settlements of pruned rows too
             + CASE WHEN b.window_kind = 'none' THEN
                 coalesce((SELECT sum(p.settled) FROM pgdurable.budget_ledger_pruned p
                            WHERE p.budget_key = p_key AND p.unit = t.unit), 0)
               ELSE 0 END END,
           window_start = CASE WHEN b.window_kind = 'fixed' THEN v_ws
                               ELSE timestamptz '-infinity' END
     WHERE t.budget_key = p_key;
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_totals_init(text, boolean) IS
  'Internal: a budget''s running totals rows (one per unit); recount the window''s settled spend.';

------------------------------------------------------------------------------
-- pgdurable.budget_set(key, limits, window_kind, window_length, policy) -> void
-- Create or change the named budget: limits {unit: number >= 0}, window
-- none|fixed|rolling (length > 0 for fixed and rolling, NULL for none; no
-- months for fixed), policy park|fail. Bad input: PD000, nothing written.
-- Its running totals (pgdurable.budget_totals) get a row per unit; a new
-- window recounts `settled` from the ledger. Then signals ('pgdurable.budget',
-- key) with no TTL: the runs parked on this budget wake and try again (a
-- raised limit lets them go on).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_set(p_key text, p_limits jsonb, p_window_kind text,
                                                p_window_length interval, p_policy text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_old pgdurable.budgets;
  v_now timestamptz;
BEGIN
  PERFORM pgdurable._budget_key(p_key);
  PERFORM pgdurable._budget_amounts(p_limits, 'budget limit');
  IF p_window_kind IS NULL OR p_window_kind NOT IN ('none', 'fixed', 'rolling') THEN
    RAISE EXCEPTION 'budget window must be none, fixed or rolling, not %', p_window_kind
      USING ERRCODE = 'PD000';
  END IF;
  IF (p_window_kind = 'none') <> (p_window_length IS NULL)
     OR p_window_length <= interval '0'
     OR (p_window_kind = 'fixed' AND extract(month FROM p_window_length) <> 0) THEN
    RAISE EXCEPTION 'budget window %: length % (> 0 for fixed/rolling, without months for fixed, '
      'none without)', p_window_kind, p_window_length USING ERRCODE = 'PD000';
  END IF;
  IF p_policy IS NULL OR p_policy NOT IN ('park', 'fail') THEN
    RAISE EXCEPTION 'budget policy must be park or fail, not %', p_policy USING ERRCODE = 'PD000';
  END IF;
  SELECT * INTO v_old FROM pgdurable.budgets b WHERE b.key = p_key FOR UPDATE;
  -- v_now, not pgdurable.now(), in DO UPDATE: Citus refuses non-IMMUTABLE calls there (a cell)
  v_now := pgdurable.now();
  INSERT INTO pgdurable.budgets AS b (key, limits, window_kind, window_length, policy)
  VALUES (p_key, p_limits, p_window_kind, p_window_length, p_policy)
  ON CONFLICT (key) DO UPDATE SET limits = excluded.limits, window_kind = excluded.window_kind,
         window_length = excluded.window_length, policy = excluded.policy,
         updated_at = v_now;
  PERFORM pgdurable._budget_totals_init(p_key,
    v_old.key IS NULL OR v_old.window_kind <> p_window_kind
    OR v_old.window_length IS DISTINCT FROM p_window_length);
  PERFORM pgdurable.send_signal('pgdurable.budget', p_key,
                                jsonb_build_object('budget', p_key), NULL, interval '0');
END
$$;
COMMENT ON FUNCTION pgdurable.budget_set(text, jsonb, text, interval, text) IS
  'Create or change a named budget (limits, window, policy) and wake the runs parked on it.';

------------------------------------------------------------------------------
-- pgdurable.budget_price_set(model, usd_per_token_in, usd_per_token_out) -> void
-- Set a model's price (>= 0 each, else PD000).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_price_set(p_model text, p_in numeric, p_out numeric)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  -- v_now, not pgdurable.now(), in DO UPDATE: Citus refuses non-IMMUTABLE calls there (a cell)
  v_now timestamptz := pgdurable.now();
BEGIN
  IF p_model IS NULL OR p_model = '' OR length(p_model) > 200
     OR p_in IS NULL OR p_in < 0 OR p_out IS NULL OR p_out < 0 THEN
    RAISE EXCEPTION 'budget_price_set: model 1 to 200 characters, prices >= 0'
      USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.budget_prices AS p (model, usd_per_token_in, usd_per_token_out)
  VALUES (p_model, p_in, p_out)
  ON CONFLICT (model) DO UPDATE SET usd_per_token_in = excluded.usd_per_token_in,
         usd_per_token_out = excluded.usd_per_token_out, updated_at = v_now;
END
$$;
COMMENT ON FUNCTION pgdurable.budget_price_set(text, numeric, numeric) IS
  'Set a model''s price per input and output token in USD (the price table of settlements).';

------------------------------------------------------------------------------
-- pgdurable.budget_started_run(run_id, keys, own) -> uuid
-- Attach budgets to a run just started (start(budgets=..., budget=...), in
-- the start's statement): every named key must exist (else PD016,
-- BudgetNotFound: the start is rolled back with it); `own` (limits, or NULL)
-- creates the run's own budget run:<id> (no window, policy fail). Attaching
-- again (an idempotent start) changes nothing. Returns the run id.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_started_run(p_run_id uuid, p_keys text[], p_own jsonb)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_missing text;
BEGIN
  SELECT k INTO v_missing FROM unnest(coalesce(p_keys, '{}'::text[])) k
   WHERE NOT EXISTS (SELECT 1 FROM pgdurable.budgets b WHERE b.key = k) LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no budget %', v_missing USING ERRCODE = 'PD016';
  END IF;
  IF p_own IS NOT NULL THEN
    PERFORM pgdurable._budget_amounts(p_own, 'start(budget=...)');
    INSERT INTO pgdurable.budgets (key, limits, window_kind, window_length, policy, run_id)
    VALUES ('run:' || p_run_id::text, p_own, 'none', NULL, 'fail', p_run_id)
    ON CONFLICT (key) DO NOTHING;
    PERFORM pgdurable._budget_totals_init('run:' || p_run_id::text, false);
    INSERT INTO pgdurable.run_budgets (run_id, budget_key)
    VALUES (p_run_id, 'run:' || p_run_id::text) ON CONFLICT DO NOTHING;
  END IF;
  INSERT INTO pgdurable.run_budgets (run_id, budget_key)
  SELECT DISTINCT p_run_id, k FROM unnest(coalesce(p_keys, '{}'::text[])) k
  ON CONFLICT DO NOTHING;
  RETURN p_run_id;
END
$$;
COMMENT ON FUNCTION pgdurable.budget_started_run(uuid, text[], jsonb) IS
  'Attach named budgets (PD016 for an unknown key) and the run''s own budget to a run just started.';

------------------------------------------------------------------------------
-- pgdurable._budget_wake(keys) -> integer
-- Internal: capacity of the budgets `keys` came back (a settlement below its
-- reservation, a release, dead holds swept): the (at most 4) longest-parked
-- runs on them (wait ('pgdurable.budget', key)) are made runnable in this
-- transaction, as a signal would (wake: {type: signal, kind, ref, payload:
-- {budget, freed: true}}), with ONE NOTIFY pgdurable_wake per queue (not per
-- run). First parked, first woken; not all of them (a herd would mostly park
-- again); the next freeing transaction wakes the next ones. Those that still
-- do not fit park again. Returns how many woke.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_wake(p_keys text[]) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n integer;
  v_queues text[] := '{}';
  v_q text;
  v record;
  v_now timestamptz;
  v_wake jsonb;
BEGIN
  IF p_keys IS NULL OR cardinality(p_keys) = 0 THEN
    RETURN 0;
  END IF;
  IF current_setting('pgdurable.cell', true) IS DISTINCT FROM 'on' THEN
    -- one server: one statement
    WITH picked AS MATERIALIZED (
      SELECT q.id FROM pgdurable.runs q
       WHERE q.status = 'waiting' AND q.wait_kind = 'pgdurable.budget'
         AND q.wait_ref = ANY (p_keys)
       ORDER BY q.wait_since, q.id LIMIT 4
       FOR UPDATE SKIP LOCKED),
    w AS (
      UPDATE pgdurable.runs r SET status = 'runnable', available_at = pgdurable.now(),
             wake = jsonb_build_object('type', 'signal', 'kind', 'pgdurable.budget',
                                       'ref', r.wait_ref,
                                       'payload', jsonb_build_object('budget', r.wait_ref,
                                                                     'freed', true),
                                       'at', pgdurable.now()),
             wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
             updated_at = pgdurable.now()
        FROM picked p
       WHERE r.id = p.id
      RETURNING r.queue)
    SELECT count(*), coalesce(array_agg(DISTINCT w.queue), '{}') INTO v_n, v_queues FROM w;
  ELSE
    -- a cell: one single-row UPDATE per picked run (at most 4), its values computed
    -- first (Citus refuses a STABLE call with a column reference,
    -- jsonb_build_object(r.wait_ref), in an UPDATE, and an INSERT or UPDATE inside WITH)
    v_now := pgdurable.now();
    v_n := 0;
    FOR v IN
      SELECT q.id, q.wait_ref, q.queue FROM pgdurable.runs q
       WHERE q.status = 'waiting' AND q.wait_kind = 'pgdurable.budget'
         AND q.wait_ref = ANY (p_keys)
       ORDER BY q.wait_since, q.id LIMIT 4
       FOR UPDATE SKIP LOCKED
    LOOP
      v_wake := jsonb_build_object('type', 'signal', 'kind', 'pgdurable.budget',
                                   'ref', v.wait_ref,
                                   'payload', jsonb_build_object('budget', v.wait_ref,
                                                                 'freed', true),
                                   'at', v_now);
      UPDATE pgdurable.runs r SET status = 'runnable', available_at = v_now, wake = v_wake,
             wait_kind = NULL, wait_ref = NULL, wait_since = NULL, wake_at = NULL,
             updated_at = v_now
       WHERE r.id = v.id;
      v_n := v_n + 1;
      IF NOT v.queue = ANY (v_queues) THEN
        v_queues := v_queues || v.queue;
      END IF;
    END LOOP;
  END IF;
  FOREACH v_q IN ARRAY v_queues LOOP
    PERFORM pg_notify('pgdurable_wake', v_q);
  END LOOP;
  RETURN v_n;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_wake(text[]) IS
  'Internal: make the runs parked on these budgets runnable (capacity came back); one NOTIFY '
  'per queue.';

------------------------------------------------------------------------------
-- pgdurable.budget_reserve(id, token, owner, step, rkey, amounts)
--   -> TABLE(status text, budget_key text, policy text, retry_at timestamptz,
--            detail text)
-- FENCED (PD001): a zombie's reservation is refused. Hold `amounts`
-- ({unit: number >= 0}; else PD000, nothing written) of every budget the run
-- draws from (pgdurable._budget_keys). The budgets' running totals rows
-- (pgdurable.budget_totals, every unit) are locked FOR UPDATE in key order:
-- the one point where reservations of a budget take turns. Settled in the
-- window (the totals row; the ledger for a rolling window) + held (the totals
-- row) + the amount never passes a limit, under any concurrency. `held`
-- counts dead holds too (their run no longer leased under their token: a lost
-- lease reclaimed, a run ended); only when that would refuse the reservation
-- are the budgets' dead holds deleted (with a 'release' ledger row each) and
-- the check made again, exact. Status:
--   'reserved'   held (the holds and a 'reserve' ledger row per budget and unit);
--   'settled'    this (run, step, rkey) was settled by an earlier attempt:
--                nothing is held or charged again (a replayed step);
--   'unbudgeted' the run's tree has no budget: nothing written;
--   'exhausted'  a limit would be passed: nothing held; budget_key and its
--                policy say which, retry_at when capacity is expected back
--                (the window's refill; 5 s when live holds block; NULL when
--                only a raised limit helps), detail says how much;
--   'too_large'  the amount alone passes the limit (detail): never fits.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_reserve(p_id uuid, p_token bigint, p_owner text,
                                                    p_step integer, p_rkey text, p_amounts jsonb)
RETURNS TABLE (status text, budget_key text, policy text, retry_at timestamptz, detail text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_keys text[];
  v_swept boolean := false;
  v_blocked boolean;
  b record;
BEGIN
  PERFORM pgdurable._budget_amounts(p_amounts, 'reserve');
  IF p_step IS NULL OR p_step < 0 OR p_rkey IS NULL OR p_rkey = '' OR length(p_rkey) > 200 THEN
    RAISE EXCEPTION 'reserve: step >= 0 and a key of 1 to 200 characters' USING ERRCODE = 'PD000';
  END IF;
  IF EXISTS (SELECT 1 FROM pgdurable.budget_ledger l
              WHERE l.run_id = r.id AND l.step = p_step AND l.rkey = p_rkey AND l.kind = 'settle') THEN
    RETURN QUERY SELECT 'settled'::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text;
    RETURN;
  END IF;
  v_keys := pgdurable._budget_keys(r.id);
  IF v_keys IS NULL THEN
    RETURN QUERY SELECT 'unbudgeted'::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text;
    RETURN;
  END IF;
  PERFORM 1 FROM pgdurable.budget_totals t WHERE t.budget_key = ANY (v_keys)
    ORDER BY t.budget_key, t.unit FOR UPDATE;
  -- the same reservation made again (a step run again under this lease) replaces its hold
  IF EXISTS (SELECT 1 FROM pgdurable.budget_holds h
              WHERE h.run_id = r.id AND h.step = p_step AND h.rkey = p_rkey) THEN
    DELETE FROM pgdurable.budget_holds h
     WHERE h.run_id = r.id AND h.step = p_step AND h.rkey = p_rkey;
  END IF;
  LOOP
    v_blocked := false;
    FOR b IN
      SELECT x.key, x.policy, x.window_kind, x.window_length, u.unit, u.amount,
             (x.limits ->> u.unit)::numeric AS lim, t.held,
             CASE x.window_kind
               WHEN 'rolling' THEN
                 (SELECT coalesce(sum(l.amount), 0) FROM pgdurable.budget_ledger l
                   WHERE l.budget_key = x.key AND l.unit = u.unit AND l.kind = 'settle'
                     AND l.at >= pgdurable.now() - x.window_length)
               WHEN 'fixed' THEN
                 CASE WHEN t.window_start
                           = pgdurable._budget_window_start(x.window_kind, x.window_length)
                      THEN t.settled ELSE 0 END
               ELSE t.settled END AS settled
        FROM pgdurable.budgets x
        CROSS JOIN LATERAL (SELECT e.key AS unit, (e.value #>> '{}')::numeric AS amount
                              FROM jsonb_each(p_amounts) e) u
        JOIN pgdurable.budget_totals t ON t.budget_key = x.key AND t.unit = u.unit
       WHERE x.key = ANY (v_keys) AND x.limits ? u.unit
       ORDER BY (x.policy = 'fail') DESC, x.key, u.unit
    LOOP
      IF b.amount > b.lim THEN
        RETURN QUERY SELECT 'too_large'::text, b.key, b.policy, NULL::timestamptz,
          format('%s %s asked, the limit is %s', b.amount, b.unit, b.lim);
        RETURN;
      END IF;
      IF b.settled + b.held + b.amount > b.lim THEN
        IF NOT v_swept THEN
          v_blocked := true;
          EXIT;
        END IF;
        RETURN QUERY SELECT 'exhausted'::text, b.key, b.policy,
          CASE WHEN b.settled + b.amount <= b.lim THEN pgdurable.now() + interval '5 seconds'
               WHEN b.window_kind = 'fixed'
                 THEN pgdurable._budget_window_start(b.window_kind, b.window_length)
                      + b.window_length
               WHEN b.window_kind = 'rolling'
                 THEN (SELECT min(l.at) FROM pgdurable.budget_ledger l
                        WHERE l.budget_key = b.key AND l.unit = b.unit AND l.kind = 'settle'
                          AND l.at >= pgdurable.now() - b.window_length) + b.window_length
          END,
          format('%s %s asked: %s settled in the window and %s held of %s', b.amount, b.unit,
                 b.settled, b.held, b.lim);
        RETURN;
      END IF;
    END LOOP;
    EXIT WHEN NOT v_blocked;
    -- refused on the totals: they may count holds of runs no longer leased under their
    -- token; delete those (released in the ledger) and check again, exactly
    WITH dead AS (
      DELETE FROM pgdurable.budget_holds h
       WHERE h.budget_key = ANY (v_keys)
         AND NOT EXISTS (SELECT 1 FROM pgdurable.runs q WHERE q.id = h.run_id
                            AND q.status = 'leased' AND q.lease_token = h.token)
      RETURNING h.*)
    INSERT INTO pgdurable.budget_ledger (run_id, step, rkey, budget_key, unit, kind, amount, token)
    SELECT d.run_id, d.step, d.rkey, d.budget_key, d.unit, 'release', d.amount, d.token FROM dead d;
    v_swept := true;
    IF FOUND THEN  -- capacity came back: the runs parked on these budgets try again
      PERFORM pgdurable._budget_wake(v_keys);
    END IF;
  END LOOP;
  INSERT INTO pgdurable.budget_holds (run_id, step, rkey, budget_key, unit, amount, token)
  SELECT r.id, p_step, p_rkey, k, e.key, (e.value #>> '{}')::numeric, p_token
    FROM unnest(v_keys) k, jsonb_each(p_amounts) e;
  INSERT INTO pgdurable.budget_ledger (run_id, step, rkey, budget_key, unit, kind, amount, token)
  SELECT r.id, p_step, p_rkey, k, e.key, 'reserve', (e.value #>> '{}')::numeric, p_token
    FROM unnest(v_keys) k, jsonb_each(p_amounts) e;
  RETURN QUERY SELECT 'reserved'::text, NULL::text, NULL::text, NULL::timestamptz, NULL::text;
END
$$;
COMMENT ON FUNCTION pgdurable.budget_reserve(uuid, bigint, text, integer, text, jsonb) IS
  'Fenced: hold amounts of every budget the run draws from, never past a limit (status: reserved, '
  'settled, unbudgeted, exhausted, too_large).';

------------------------------------------------------------------------------
-- pgdurable._budget_settle(run_id, token, step, rkey, amounts, model) -> text
-- Internal, for a run its caller fenced and locked: charge the actual spend of
-- the reservation (run, step, rkey) held under this token: per budget it
-- holds, a 'settle' ledger row for every unit held or named (a unit held and
-- not named settles at the amount held), a 'release' row for what was held
-- and not spent, and the holds go. With `model` and no usd, usd =
-- tokens_in * usd_per_token_in + tokens_out * usd_per_token_out from
-- pgdurable.budget_prices (unknown model: PD000). Returns 'settled' (also
-- when an earlier attempt settled it: charged once), or 'none' (no live
-- reservation: an unbudgeted run; nothing written). Bad amounts: PD000,
-- nothing written. A settlement above its reservation is recorded as it is:
-- the spend happened.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_settle(p_run_id uuid, p_token bigint,
                                                    p_step integer, p_rkey text, p_amounts jsonb,
                                                    p_model text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_amounts jsonb := pgdurable._budget_amounts(p_amounts, 'settle');
  v_freed text[];
  p pgdurable.budget_prices;
BEGIN
  IF p_model IS NOT NULL AND NOT v_amounts ? 'usd'
     AND (v_amounts ? 'tokens_in' OR v_amounts ? 'tokens_out') THEN
    SELECT * INTO p FROM pgdurable.budget_prices x WHERE x.model = p_model;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'settle: no price for model %', p_model USING ERRCODE = 'PD000';
    END IF;
    v_amounts := v_amounts || jsonb_build_object('usd',
      coalesce((v_amounts ->> 'tokens_in')::numeric, 0) * p.usd_per_token_in
      + coalesce((v_amounts ->> 'tokens_out')::numeric, 0) * p.usd_per_token_out);
  END IF;
  IF EXISTS (SELECT 1 FROM pgdurable.budget_ledger l
              WHERE l.run_id = p_run_id AND l.step = p_step AND l.rkey = p_rkey
                AND l.kind = 'settle') THEN
    RETURN 'settled';
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pgdurable.budget_holds h WHERE h.run_id = p_run_id
                    AND h.step = p_step AND h.rkey = p_rkey AND h.token = p_token) THEN
    RETURN 'none';
  END IF;
  PERFORM 1 FROM pgdurable.budget_totals t
   WHERE t.budget_key IN (SELECT h.budget_key FROM pgdurable.budget_holds h
                           WHERE h.run_id = p_run_id AND h.step = p_step AND h.rkey = p_rkey)
   ORDER BY t.budget_key, t.unit FOR UPDATE;
  WITH held AS (
    SELECT h.budget_key, h.unit, h.amount FROM pgdurable.budget_holds h
     WHERE h.run_id = p_run_id AND h.step = p_step AND h.rkey = p_rkey AND h.token = p_token),
  cells AS (
    SELECT k.budget_key, u.unit,
           coalesce((v_amounts ->> u.unit)::numeric,
                    (SELECT x.amount FROM held x WHERE x.budget_key = k.budget_key
                        AND x.unit = u.unit), 0) AS actual,
           coalesce((SELECT x.amount FROM held x WHERE x.budget_key = k.budget_key
                        AND x.unit = u.unit), 0) AS reserved
      FROM (SELECT DISTINCT h.budget_key FROM held h) k,
           (SELECT h.unit FROM held h UNION SELECT e FROM jsonb_object_keys(v_amounts) e) u),
  logged AS (
    INSERT INTO pgdurable.budget_ledger (run_id, step, rkey, budget_key, unit, kind, amount,
                                         token, model)
    SELECT p_run_id, p_step, p_rkey, c.budget_key, c.unit, 'settle', c.actual, p_token, p_model
      FROM cells c
    UNION ALL
    SELECT p_run_id, p_step, p_rkey, c.budget_key, c.unit, 'release', c.reserved - c.actual,
           p_token, p_model
      FROM cells c WHERE c.reserved > c.actual
    RETURNING budget_ledger.budget_key, budget_ledger.kind)
  SELECT array_agg(DISTINCT l.budget_key) FILTER (WHERE l.kind = 'release') INTO v_freed
    FROM logged l;
  DELETE FROM pgdurable.budget_holds h
   WHERE h.run_id = p_run_id AND h.step = p_step AND h.rkey = p_rkey;
  -- what was held and not spent came back: the runs parked on those budgets try again
  PERFORM pgdurable._budget_wake(v_freed);
  RETURN 'settled';
END
$$;
COMMENT ON FUNCTION pgdurable._budget_settle(uuid, bigint, integer, text, jsonb, text) IS
  'Internal: charge a fenced run''s reservation its actual spend once (the rest is released).';

------------------------------------------------------------------------------
-- pgdurable.budget_settle(id, token, owner, step, rkey, amounts, model) -> text
-- FENCED (PD001). Settle one reservation now (pgdurable._budget_settle: its
-- contract). A worker's step sends its settlements with its checkpoint
-- instead (write_steps_settling).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_settle(p_id uuid, p_token bigint, p_owner text,
                                                   p_step integer, p_rkey text, p_amounts jsonb,
                                                   p_model text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
BEGIN
  RETURN pgdurable._budget_settle(r.id, p_token, p_step, p_rkey, p_amounts, p_model);
END
$$;
COMMENT ON FUNCTION pgdurable.budget_settle(uuid, bigint, text, integer, text, jsonb, text) IS
  'Fenced: charge a reservation''s actual spend once (the rest is released); usd from the price '
  'table when a model is named.';

------------------------------------------------------------------------------
-- pgdurable._budget_settle_many(owner, settles) -> integer
-- Internal: the settlements a worker's steps buffered (r.settle), a JSON
-- array of {"run", "token", "step", "rkey", "amounts", "model"}: each one
-- whose run is leased to `owner` under its token (the fence) is settled
-- (pgdurable._budget_settle); a zombie's are skipped (its write is refused
-- with them). The runs are locked first (so the fence holds to the end of
-- the transaction: the checkpoint that follows sees the same lease), then
-- the totals of every budget they hold, in key order (no deadlock between
-- two workers' batches). NULL or [] does nothing. Returns how many settled.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_settle_many(p_owner text, p_settles jsonb)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e record;
  n integer := 0;
BEGIN
  IF p_settles IS NULL THEN
    RETURN 0;
  END IF;
  IF jsonb_typeof(p_settles) <> 'array' THEN
    RAISE EXCEPTION 'settlements must be a JSON array' USING ERRCODE = 'PD000';
  END IF;
  PERFORM 1 FROM pgdurable.runs q
   WHERE q.id IN (SELECT (x ->> 'run')::uuid FROM jsonb_array_elements(p_settles) x)
   ORDER BY q.id FOR UPDATE;
  PERFORM 1 FROM pgdurable.budget_totals t
   WHERE t.budget_key IN (
     SELECT h.budget_key
       FROM jsonb_to_recordset(p_settles) AS s(run uuid, token bigint, step integer, rkey text)
       JOIN pgdurable.budget_holds h ON h.run_id = s.run AND h.step = s.step
                                    AND h.rkey = s.rkey AND h.token = s.token)
   ORDER BY t.budget_key, t.unit FOR UPDATE;
  FOR e IN
    SELECT s.* FROM jsonb_to_recordset(p_settles)
                    AS s(run uuid, token bigint, step integer, rkey text, amounts jsonb,
                         model text)
     WHERE EXISTS (SELECT 1 FROM pgdurable.runs q
                    WHERE q.id = s.run AND q.lease_token = s.token AND q.lease_owner = p_owner
                      AND q.status IS NOT DISTINCT FROM 'leased'
                      AND q.lease_expires_at > pgdurable.now())
  LOOP
    IF e.step IS NULL OR e.rkey IS NULL THEN
      RAISE EXCEPTION 'a settlement needs run, token, step and rkey' USING ERRCODE = 'PD000';
    END IF;
    PERFORM pgdurable._budget_settle(e.run, e.token, e.step, e.rkey,
                                     coalesce(e.amounts, '{}'::jsonb), e.model);
    n := n + 1;
  END LOOP;
  RETURN n;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_settle_many(text, jsonb) IS
  'Internal: settle a worker''s buffered settlements of the runs it still holds (fenced).';

------------------------------------------------------------------------------
-- pgdurable.write_steps_settling(owner, ids, tokens, states, spends, done,
--                                results, settles) -> TABLE(id uuid, status text)
-- FENCED, BATCHED: write_steps (see there) with the settlements its steps
-- buffered (pgdurable._budget_settle_many: the format), in the same
-- transaction: a step's spend is charged with its checkpoint or not at all,
-- and only while its lease holds (a zombie's settlement is refused with its
-- write: 'lost').
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.write_steps_settling(
  p_owner text, p_ids uuid[], p_tokens bigint[], p_states jsonb[], p_spends numeric[],
  p_done boolean[], p_results jsonb[], p_settles jsonb)
RETURNS TABLE (id uuid, status text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  PERFORM pgdurable._budget_settle_many(p_owner, p_settles);
  RETURN QUERY SELECT w.id, w.status
    FROM pgdurable.write_steps(p_owner, p_ids, p_tokens, p_states, p_spends, p_done,
                               p_results) w;
END
$$;
COMMENT ON FUNCTION pgdurable.write_steps_settling(text, uuid[], bigint[], jsonb[], numeric[], boolean[], jsonb[], jsonb) IS
  'Fenced, batched: write_steps and the budget settlements its steps buffered, in one transaction.';

------------------------------------------------------------------------------
-- pgdurable.budget_settle_pending(id, token, owner, settles) -> integer
-- FENCED (PD001): settle a step's buffered settlements now (before the step
-- ends otherwise than by a checkpoint: a park, a failure); returns how many.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_settle_pending(p_id uuid, p_token bigint,
                                                           p_owner text, p_settles jsonb)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  PERFORM pgdurable._fenced(p_id, p_token, p_owner);
  RETURN pgdurable._budget_settle_many(p_owner, p_settles);
END
$$;
COMMENT ON FUNCTION pgdurable.budget_settle_pending(uuid, bigint, text, jsonb) IS
  'Fenced: settle a step''s buffered settlements now (a park or a failure ends the step).';

------------------------------------------------------------------------------
-- pgdurable.budget_reserve_settling(id, token, owner, settles, step, rkey,
--                                   amounts) -> TABLE(as budget_reserve)
-- FENCED (PD001): a step's next reservation, after the settlements it
-- buffered so far (pgdurable.budget_settle_pending) in the same transaction:
-- the capacity they give back is there for it. One statement.
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_reserve_settling(p_id uuid, p_token bigint,
                                                             p_owner text, p_settles jsonb,
                                                             p_step integer, p_rkey text,
                                                             p_amounts jsonb)
RETURNS TABLE (status text, budget_key text, policy text, retry_at timestamptz, detail text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  PERFORM pgdurable.budget_settle_pending(p_id, p_token, p_owner, p_settles);
  RETURN QUERY SELECT x.status, x.budget_key, x.policy, x.retry_at, x.detail
    FROM pgdurable.budget_reserve(p_id, p_token, p_owner, p_step, p_rkey, p_amounts) x;
END
$$;
COMMENT ON FUNCTION pgdurable.budget_reserve_settling(uuid, bigint, text, jsonb, integer, text, jsonb) IS
  'Fenced: settle a step''s buffered settlements, then reserve (budget_reserve), in one statement.';

------------------------------------------------------------------------------
-- pgdurable.budget_release(id, token, owner, step, rkey) -> integer
-- FENCED (PD001). Give back the reservation (run, step, rkey) held under
-- this token, with a 'release' ledger row per budget and unit; returns how
-- many holds were released (0: none, nothing written).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_release(p_id uuid, p_token bigint, p_owner text,
                                                    p_step integer, p_rkey text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  r pgdurable.runs := pgdurable._fenced(p_id, p_token, p_owner);
  v_n integer;
  v_keys text[];
BEGIN
  PERFORM 1 FROM pgdurable.budget_totals t
   WHERE t.budget_key IN (SELECT h.budget_key FROM pgdurable.budget_holds h
                           WHERE h.run_id = r.id AND h.step = p_step AND h.rkey = p_rkey)
   ORDER BY t.budget_key, t.unit FOR UPDATE;
  WITH gone AS (
    DELETE FROM pgdurable.budget_holds h
     WHERE h.run_id = r.id AND h.step = p_step AND h.rkey = p_rkey AND h.token = p_token
    RETURNING h.*),
  logged AS (
    INSERT INTO pgdurable.budget_ledger (run_id, step, rkey, budget_key, unit, kind, amount, token)
    SELECT g.run_id, g.step, g.rkey, g.budget_key, g.unit, 'release', g.amount, g.token
      FROM gone g RETURNING budget_ledger.budget_key)
  SELECT count(*), array_agg(DISTINCT l.budget_key) INTO v_n, v_keys FROM logged l;
  PERFORM pgdurable._budget_wake(v_keys);  -- the runs parked on them try again
  RETURN v_n;
END
$$;
COMMENT ON FUNCTION pgdurable.budget_release(uuid, bigint, text, integer, text) IS
  'Fenced: give back a reservation (the release is in the ledger); returns the holds released.';

------------------------------------------------------------------------------
-- The running totals (pgdurable.budget_totals), kept by statement triggers in
-- the transaction of every hold and settlement: held += inserted holds,
-- -= deleted ones (also those a deleted run takes with it); settled += the
-- 'settle' ledger rows (a fixed window starts again at its next bucket).
-- The callers lock the totals rows first, in key order; the delete trigger
-- does too (a run deleted by retention takes its holds with it).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable._budget_holds_total() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e record;
BEGIN
  IF current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus): a statement joining a transition table to a distributed table is
    -- refused ("unrecognized RTE kind"): the transition table is read alone, and each
    -- (budget, unit) updated by a single-table statement, in key order
    IF TG_OP = 'INSERT' THEN
      FOR e IN SELECT n.budget_key, n.unit, sum(n.amount) AS amount
                 FROM new_rows n GROUP BY 1, 2 ORDER BY 1, 2 LOOP
        UPDATE pgdurable.budget_totals t SET held = t.held + e.amount
         WHERE t.budget_key = e.budget_key AND t.unit = e.unit;
      END LOOP;
    ELSE
      FOR e IN SELECT o.budget_key, o.unit, sum(o.amount) AS amount
                 FROM old_rows o GROUP BY 1, 2 ORDER BY 1, 2 LOOP
        UPDATE pgdurable.budget_totals t SET held = t.held - e.amount
         WHERE t.budget_key = e.budget_key AND t.unit = e.unit;
      END LOOP;
    END IF;
  ELSIF TG_OP = 'INSERT' THEN
    UPDATE pgdurable.budget_totals t SET held = t.held + d.amount
      FROM (SELECT n.budget_key, n.unit, sum(n.amount) AS amount
              FROM new_rows n GROUP BY 1, 2) d
     WHERE t.budget_key = d.budget_key AND t.unit = d.unit;
  ELSE
    PERFORM 1 FROM pgdurable.budget_totals t
     WHERE (t.budget_key, t.unit) IN (SELECT o.budget_key, o.unit FROM old_rows o)
     ORDER BY t.budget_key, t.unit FOR UPDATE;
    UPDATE pgdurable.budget_totals t SET held = t.held - d.amount
      FROM (SELECT o.budget_key, o.unit, sum(o.amount) AS amount
              FROM old_rows o GROUP BY 1, 2) d
     WHERE t.budget_key = d.budget_key AND t.unit = d.unit;
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_holds_total() IS
  'Internal: keep budget_totals.held equal to the sum of budget_holds (one UPDATE per statement).';
DROP TRIGGER IF EXISTS budget_holds_total_insert ON pgdurable.budget_holds;
CREATE TRIGGER budget_holds_total_insert
  AFTER INSERT ON pgdurable.budget_holds
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._budget_holds_total();
DROP TRIGGER IF EXISTS budget_holds_total_delete ON pgdurable.budget_holds;
CREATE TRIGGER budget_holds_total_delete
  AFTER DELETE ON pgdurable.budget_holds
  REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._budget_holds_total();

CREATE OR REPLACE FUNCTION pgdurable._budget_ledger_total() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  e record;
  v_b pgdurable.budgets;
  v_ws timestamptz;
BEGIN
  IF current_setting('pgdurable.cell', true) = 'on' THEN
    -- a cell (Citus): the transition table read alone, then single-table statements
    -- with the window's start computed first (see _budget_holds_total)
    FOR e IN SELECT n.budget_key, n.unit, sum(n.amount) AS amount
               FROM new_rows n WHERE n.kind = 'settle' GROUP BY 1, 2 ORDER BY 1, 2 LOOP
      SELECT * INTO v_b FROM pgdurable.budgets x WHERE x.key = e.budget_key;
      CONTINUE WHEN NOT FOUND;
      v_ws := pgdurable._budget_window_start(v_b.window_kind, v_b.window_length);
      UPDATE pgdurable.budget_totals t
         SET settled = CASE WHEN v_b.window_kind = 'fixed' AND t.window_start <> v_ws
                            THEN e.amount ELSE t.settled + e.amount END,
             window_start = CASE WHEN v_b.window_kind = 'fixed' THEN v_ws ELSE t.window_start END
       WHERE t.budget_key = e.budget_key AND t.unit = e.unit;
    END LOOP;
    RETURN NULL;
  END IF;
  UPDATE pgdurable.budget_totals t
     SET settled = CASE WHEN b.window_kind = 'fixed' AND t.window_start <> w.ws
                        THEN d.amount ELSE t.settled + d.amount END,
         window_start = CASE WHEN b.window_kind = 'fixed' THEN w.ws ELSE t.window_start END
    FROM (SELECT n.budget_key, n.unit, sum(n.amount) AS amount
            FROM new_rows n WHERE n.kind = 'settle' GROUP BY 1, 2) d
    JOIN pgdurable.budgets b ON b.key = d.budget_key
    CROSS JOIN LATERAL (SELECT pgdurable._budget_window_start(b.window_kind, b.window_length)
                                 AS ws) w
   WHERE t.budget_key = d.budget_key AND t.unit = d.unit;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgdurable._budget_ledger_total() IS
  'Internal: add the settle rows of the ledger to budget_totals.settled (one UPDATE per statement).';
DROP TRIGGER IF EXISTS budget_ledger_total ON pgdurable.budget_ledger;
CREATE TRIGGER budget_ledger_total
  AFTER INSERT ON pgdurable.budget_ledger
  REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION pgdurable._budget_ledger_total();

------------------------------------------------------------------------------
-- pgdurable.budget_prune_ledger(batch) -> bigint
-- Retention of the ledger (run by pgdurable.ops.retention.prune after the
-- runs): delete up to `batch` (1..100000, else PD000) ledger rows of runs
-- that no longer exist (pruned by retention) and that no window can count
-- any more: reserve and release rows, and settle rows of a budget without a
-- window (its total is in budget_totals) or older than its current window's
-- start. Their settlements are folded into budget_ledger_pruned first (per
-- budget, unit and model), so the usage and the per-model views stay exact.
-- Returns how many rows went (fewer than `batch`: nothing more to prune now).
------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION pgdurable.budget_prune_ledger(p_batch integer) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n bigint;
BEGIN
  IF p_batch IS NULL OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'budget_prune_ledger: batch must be between 1 and 100000'
      USING ERRCODE = 'PD000';
  END IF;
  WITH doomed AS MATERIALIZED (
    SELECT x.id FROM pgdurable.budget_ledger x
      JOIN pgdurable.budgets b ON b.key = x.budget_key
     WHERE NOT EXISTS (SELECT 1 FROM pgdurable.runs q WHERE q.id = x.run_id)
       AND (x.kind <> 'settle' OR b.window_kind = 'none'
            OR x.at < pgdurable._budget_window_start(b.window_kind, b.window_length))
     ORDER BY x.id LIMIT p_batch
     FOR UPDATE OF x SKIP LOCKED),
  gone AS (
    DELETE FROM pgdurable.budget_ledger l USING doomed d WHERE l.id = d.id
    RETURNING l.budget_key, l.unit, l.model, l.kind, l.amount),
  folded AS (
    INSERT INTO pgdurable.budget_ledger_pruned AS p (budget_key, unit, model, settled,
                                                     settlements)
    SELECT g.budget_key, g.unit, coalesce(g.model, ''), sum(g.amount), count(*)
      FROM gone g WHERE g.kind = 'settle' GROUP BY 1, 2, 3
    ON CONFLICT (budget_key, unit, model) DO UPDATE
      SET settled = p.settled + excluded.settled,
          settlements = p.settlements + excluded.settlements
    RETURNING 1)
  SELECT count(*) INTO v_n FROM gone;
  RETURN v_n;
END
$$;
COMMENT ON FUNCTION pgdurable.budget_prune_ledger(integer) IS
  'Retention: delete a batch of ledger rows of pruned runs that no window counts (settlements '
  'folded into budget_ledger_pruned).';
