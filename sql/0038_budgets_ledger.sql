-- 0038_budgets_ledger: running totals of the budget ledger (issue 42, second pass).
--
-- pgdurable.budget_totals keeps, per budget and unit, what its holds add up to
-- (held) and what was settled in its current window (settled, window_start),
-- maintained in the same transaction as every hold and settlement by the
-- statement triggers of sql/functions/budgets.sql. budget_reserve locks a
-- budget's totals rows (in key order) and compares them with the limits: no
-- sum over the ledger or the holds per reservation. `held` counts every hold
-- row, live or left by a lost lease (an over-estimate: it errs on the safe
-- side); a reservation that would not fit deletes the dead holds of its
-- budgets first (and then the count is exact). Rolling windows still sum
-- their settlements in the window from the ledger (an index range scan).
-- Three new fenced functions carry the settlements a step buffered (r.settle)
-- into the step's own write: write_steps_settling (the worker's checkpoint),
-- budget_reserve_settling (the step's next reservation) and
-- budget_settle_pending (before a park or a failure).

CREATE TABLE pgdurable.budget_totals (
  budget_key text NOT NULL REFERENCES pgdurable.budgets (key) ON DELETE CASCADE,
  unit text NOT NULL,
  held numeric NOT NULL DEFAULT 0,
  settled numeric NOT NULL DEFAULT 0,
  window_start timestamptz NOT NULL DEFAULT '-infinity',
  PRIMARY KEY (budget_key, unit)
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
COMMENT ON TABLE pgdurable.budget_totals IS
  'Running totals per budget and unit (one row for each known unit), kept by the triggers of '
  'budget_holds and budget_ledger: what holds add up to and what was settled in the window.';
COMMENT ON COLUMN pgdurable.budget_totals.budget_key IS 'The budget.';
COMMENT ON COLUMN pgdurable.budget_totals.unit IS 'The unit.';
COMMENT ON COLUMN pgdurable.budget_totals.held IS
  'The sum of the budget''s hold rows in this unit, live or dead (dead ones are swept when they '
  'would refuse a reservation).';
COMMENT ON COLUMN pgdurable.budget_totals.settled IS
  'Settled since window_start (none: for all time; fixed: in the window that began at '
  'window_start; rolling: not used, the ledger is summed).';
COMMENT ON COLUMN pgdurable.budget_totals.window_start IS
  'The window `settled` counts (-infinity without a window); a settlement in a later fixed '
  'window starts it again.';

-- every budget gets a row per unit, counted from what exists now
INSERT INTO pgdurable.budget_totals (budget_key, unit, held, settled, window_start)
SELECT b.key, u.unit,
       coalesce((SELECT sum(h.amount) FROM pgdurable.budget_holds h
                  WHERE h.budget_key = b.key AND h.unit = u.unit), 0),
       CASE WHEN b.window_kind = 'rolling' THEN 0 ELSE
         coalesce((SELECT sum(l.amount) FROM pgdurable.budget_ledger l
                    WHERE l.budget_key = b.key AND l.unit = u.unit AND l.kind = 'settle'
                      AND l.at >= w.ws),
                  0) END,
       CASE WHEN b.window_kind = 'fixed' THEN w.ws ELSE timestamptz '-infinity' END
  FROM pgdurable.budgets b,
       -- the start of the current window (functions/budgets.sql: _budget_window_start)
       LATERAL (SELECT CASE b.window_kind
                  WHEN 'fixed' THEN date_bin(b.window_length, pgdurable.now(),
                                             timestamptz '2000-01-01 00:00:00+00')
                  WHEN 'rolling' THEN pgdurable.now() - b.window_length
                  ELSE timestamptz '-infinity' END AS ws) w,
       unnest(ARRAY['usd', 'tokens', 'tokens_in', 'tokens_out', 'calls']::text[]) u(unit);

-- Ledger retention (pgdurable.budget_prune_ledger, run by prune after the runs): the
-- rows of runs deleted by retention go once no window can count them; their
-- settlements are folded here first, so budget_model_spend stays exact (and a
-- windowless budget's total is in budget_totals already).
CREATE TABLE pgdurable.budget_ledger_pruned (
  budget_key text NOT NULL REFERENCES pgdurable.budgets (key) ON DELETE CASCADE,
  unit text NOT NULL,
  model text NOT NULL DEFAULT '',
  settled numeric NOT NULL DEFAULT 0,
  settlements bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (budget_key, unit, model)
);
COMMENT ON TABLE pgdurable.budget_ledger_pruned IS
  'The settlements of pruned ledger rows, folded per budget, unit and model (retention).';
COMMENT ON COLUMN pgdurable.budget_ledger_pruned.budget_key IS 'The budget.';
COMMENT ON COLUMN pgdurable.budget_ledger_pruned.unit IS 'The unit.';
COMMENT ON COLUMN pgdurable.budget_ledger_pruned.model IS 'The model the settlements named (empty: none).';
COMMENT ON COLUMN pgdurable.budget_ledger_pruned.settled IS 'Their total.';
COMMENT ON COLUMN pgdurable.budget_ledger_pruned.settlements IS 'How many settlement rows.';

INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.budget_prune_ledger(integer)', false),
  ('pgdurable.write_steps_settling(text,uuid[],bigint[],jsonb[],numeric[],boolean[],jsonb[],jsonb)',
   false),
  ('pgdurable.budget_reserve_settling(uuid,bigint,text,jsonb,integer,text,jsonb)', false),
  ('pgdurable.budget_settle_pending(uuid,bigint,text,jsonb)', false);
