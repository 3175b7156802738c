-- 0034_worker_details: what a running worker is, for operators (issue 38: a page of
-- live workers in the dashboard).
--
-- Every worker now announces its presence when it starts (not only before its
-- first pin, as 0032 had it) and renews it every heartbeat interval until it
-- stops; the row also says where and how it runs: host, pid, queues,
-- concurrency, and when it last renewed. pgdurable.worker_started writes a
-- starting worker's row; pgdurable.worker_present (unchanged signature) renews
-- it. The view pgdurable.worker_list (sql/views/workers.sql) joins the rows with
-- the runs each worker holds and the revisions it registered.
--
-- Its functions and views are not here: each has one current body in
-- sql/functions/ or sql/views/.

COMMENT ON TABLE pgdurable.worker_presence IS
  'Worker presence: which process instance runs under a worker id, known alive until `until` '
  '(database clock), and where and how it runs. Written when the worker starts, renewed every '
  'heartbeat interval, removed on a clean stop; a lapsed row means the same as no row.';

ALTER TABLE pgdurable.worker_presence
  ADD COLUMN host text,
  ADD COLUMN pid integer,
  ADD COLUMN queues text[],
  ADD COLUMN concurrency integer,
  ADD COLUMN renewed_at timestamptz;
COMMENT ON COLUMN pgdurable.worker_presence.host IS
  'Host name of the worker''s machine (as the worker saw it at start); NULL for a row written '
  'by a worker older than 0035.';
COMMENT ON COLUMN pgdurable.worker_presence.pid IS 'Process id of the worker on its host.';
COMMENT ON COLUMN pgdurable.worker_presence.queues IS 'The queues the worker claims from.';
COMMENT ON COLUMN pgdurable.worker_presence.concurrency IS 'How many runs it executes at once.';
COMMENT ON COLUMN pgdurable.worker_presence.renewed_at IS
  'When the worker last announced itself (its heartbeat): start, then every heartbeat interval.';

-- The app role calls it (sql/0029_role_boundary.sql: the allow-list).
INSERT INTO pgdurable.security_api (routine, readonly)
VALUES ('pgdurable.worker_started(text,text,interval,text,integer,text[],integer)', false);
