-- 0007_operations: the operator surface in SQL -- inspection views, retry,
-- and retention (pruning terminal runs in batches of short transactions).
--
-- Views answer: what runs where (run_overview, active_leases), what is stuck
-- (run_overview.lease_expired, queue_stats.oldest_runnable_age), what waits on
-- what (waiting_runs, from 0005_signals), what failed and why
-- (run_overview.error_type / error_message).
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- Schema additions
------------------------------------------------------------------------------
-- Retention finds terminal runs by age without scanning live ones. status and
-- finished_at change together (at the terminal transition), so this partial
-- index costs no extra HOT breakage on heartbeats.
CREATE INDEX runs_finished_idx ON pgdurable.runs (finished_at)
  WHERE status IN ('completed', 'failed', 'cancelled', 'incompatible');
-- Retention deletes the signals consumed by pruned runs (consumed_by has no FK).
CREATE INDEX signals_consumed_by_idx ON pgdurable.signals (consumed_by)
  WHERE consumed_by IS NOT NULL;
-- History tables lose rows in batches to retention: vacuum them after 5 % dead
-- rows instead of the default 20 %, without cost throttling (runs and leases
-- already ship aggressive settings in 0001: pitfall 8).
ALTER TABLE pgdurable.checkpoints SET (autovacuum_vacuum_scale_factor = 0.05,
                                       autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pgdurable.effects SET (autovacuum_vacuum_scale_factor = 0.05,
                                   autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pgdurable.run_events SET (autovacuum_vacuum_scale_factor = 0.05,
                                      autovacuum_vacuum_cost_delay = 0);
ALTER TABLE pgdurable.signals SET (autovacuum_vacuum_scale_factor = 0.05,
                                   autovacuum_vacuum_cost_delay = 0);
