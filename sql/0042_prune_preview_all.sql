-- 0042_prune_preview_all: prune_preview_all (sql/functions/retention.sql), the dry
-- run of pgdurable.ops.retention.prune in one function (each count its own
-- statement: Citus refuses a query on a cell's tables that calls a function
-- reading tables), is called by the app role (sql/0029_role_boundary.sql: the
-- allow-list).
INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.prune_preview_all(interval)', false);
