-- views/budgets.sql: the current definition of each view below (the budget
-- ledger, sql/0036_budgets.sql; docs/budgets.md).

------------------------------------------------------------------------------
-- pgdurable.budget_usage: per budget and unit, its limit, its window, what is
-- settled in the window, what live reservations hold, and what is left.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.budget_usage AS
SELECT b.key AS budget_key, u.unit, (b.limits ->> u.unit)::numeric AS limit_amount,
       b.window_kind, b.window_length, w.window_start, b.policy,
       CASE b.window_kind
         WHEN 'rolling' THEN
           coalesce((SELECT sum(l.amount) FROM pgdurable.budget_ledger l
                      WHERE l.budget_key = b.key AND l.unit = u.unit AND l.kind = 'settle'
                        AND l.at >= w.window_start), 0)
         -- the running totals (budget_totals): exact after the ledger's retention too
         ELSE coalesce((SELECT t.settled FROM pgdurable.budget_totals t
                         WHERE t.budget_key = b.key AND t.unit = u.unit
                           AND (b.window_kind = 'none' OR t.window_start = w.window_start)),
                       0) END AS settled,
       coalesce((SELECT sum(h.amount) FROM pgdurable.budget_holds h
                   JOIN pgdurable.runs q ON q.id = h.run_id AND q.status = 'leased'
                                        AND q.lease_token = h.token
                  WHERE h.budget_key = b.key AND h.unit = u.unit), 0) AS held
  FROM pgdurable.budgets b
  CROSS JOIN LATERAL (
    SELECT CASE b.window_kind
             WHEN 'fixed' THEN date_bin(b.window_length, pgdurable.now(),
                                        timestamptz '2000-01-01 00:00:00+00')
             WHEN 'rolling' THEN pgdurable.now() - b.window_length
             ELSE timestamptz '-infinity' END AS window_start) w
  CROSS JOIN LATERAL (
    SELECT k AS unit FROM jsonb_object_keys(b.limits) k
    UNION
    SELECT t.unit FROM pgdurable.budget_totals t
     WHERE t.budget_key = b.key AND (t.settled <> 0 OR t.held <> 0)
    UNION
    SELECT DISTINCT l.unit FROM pgdurable.budget_ledger l WHERE l.budget_key = b.key) u;
COMMENT ON VIEW pgdurable.budget_usage IS
  'Per budget and unit: limit, window, settled in the window, held by live reservations.';
COMMENT ON COLUMN pgdurable.budget_usage.budget_key IS 'The budget.';
COMMENT ON COLUMN pgdurable.budget_usage.unit IS 'The unit (limited, or only recorded).';
COMMENT ON COLUMN pgdurable.budget_usage.limit_amount IS 'The limit (NULL: the unit is not limited).';
COMMENT ON COLUMN pgdurable.budget_usage.window_kind IS 'none, fixed or rolling.';
COMMENT ON COLUMN pgdurable.budget_usage.window_length IS 'The window''s length (NULL: none).';
COMMENT ON COLUMN pgdurable.budget_usage.window_start IS 'Where the current window began (-infinity: none).';
COMMENT ON COLUMN pgdurable.budget_usage.policy IS 'park or fail.';
COMMENT ON COLUMN pgdurable.budget_usage.settled IS 'Spend settled in the current window.';
COMMENT ON COLUMN pgdurable.budget_usage.held IS 'Held by live reservations (their run leased under their token).';

------------------------------------------------------------------------------
-- pgdurable.budget_tree_spend: settled spend per run tree (its root run),
-- budget and unit, for all time.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.budget_tree_spend AS
SELECT coalesce(q.root_run_id, q.id) AS root_run_id, l.budget_key, l.unit,
       sum(l.amount) AS settled, count(DISTINCT l.run_id) AS runs
  FROM pgdurable.budget_ledger l
  JOIN pgdurable.runs q ON q.id = l.run_id
 WHERE l.kind = 'settle'
 GROUP BY 1, 2, 3;
COMMENT ON VIEW pgdurable.budget_tree_spend IS
  'Settled spend per run tree (root run), budget and unit (runs deleted by retention drop out).';
COMMENT ON COLUMN pgdurable.budget_tree_spend.root_run_id IS 'The tree''s top-level run.';
COMMENT ON COLUMN pgdurable.budget_tree_spend.budget_key IS 'The budget charged.';
COMMENT ON COLUMN pgdurable.budget_tree_spend.unit IS 'The unit.';
COMMENT ON COLUMN pgdurable.budget_tree_spend.settled IS 'Total settled.';
COMMENT ON COLUMN pgdurable.budget_tree_spend.runs IS 'Runs of the tree that settled spend.';

------------------------------------------------------------------------------
-- pgdurable.budget_model_spend: settled spend per model (as settlements name
-- it), budget and unit, for all time (pruned ledger rows folded in).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.budget_model_spend AS
SELECT x.model, x.budget_key, x.unit, sum(x.settled) AS settled,
       sum(x.settlements)::bigint AS settlements
  FROM (SELECT l.model, l.budget_key, l.unit, l.amount AS settled, 1 AS settlements
          FROM pgdurable.budget_ledger l
         WHERE l.kind = 'settle' AND l.model IS NOT NULL
        UNION ALL  -- the settlements of pruned rows (retention), folded
        SELECT p.model, p.budget_key, p.unit, p.settled, p.settlements
          FROM pgdurable.budget_ledger_pruned p WHERE p.model <> '') x
 GROUP BY 1, 2, 3;
COMMENT ON VIEW pgdurable.budget_model_spend IS 'Settled spend per model, budget and unit.';
COMMENT ON COLUMN pgdurable.budget_model_spend.model IS 'The model the settlements named.';
COMMENT ON COLUMN pgdurable.budget_model_spend.budget_key IS 'The budget charged.';
COMMENT ON COLUMN pgdurable.budget_model_spend.unit IS 'The unit.';
COMMENT ON COLUMN pgdurable.budget_model_spend.settled IS 'Total settled.';
COMMENT ON COLUMN pgdurable.budget_model_spend.settlements IS 'How many settlement rows.';

------------------------------------------------------------------------------
-- pgdurable.budget_run_spend: settled spend per run, budget and unit (the
-- dashboard's run page; a filter on run_id uses the ledger's run index).
------------------------------------------------------------------------------
CREATE VIEW pgdurable.budget_run_spend AS
SELECT l.run_id, l.budget_key, l.unit,
       coalesce(sum(l.amount) FILTER (WHERE l.kind = 'settle'), 0) AS settled,
       count(*) FILTER (WHERE l.kind = 'settle') AS settlements
  FROM pgdurable.budget_ledger l
 GROUP BY 1, 2, 3;
COMMENT ON VIEW pgdurable.budget_run_spend IS 'Settled spend per run, budget and unit.';
COMMENT ON COLUMN pgdurable.budget_run_spend.run_id IS 'The run charged.';
COMMENT ON COLUMN pgdurable.budget_run_spend.budget_key IS 'The budget.';
COMMENT ON COLUMN pgdurable.budget_run_spend.unit IS 'The unit.';
COMMENT ON COLUMN pgdurable.budget_run_spend.settled IS 'Total settled.';
COMMENT ON COLUMN pgdurable.budget_run_spend.settlements IS 'How many settlement rows.';
