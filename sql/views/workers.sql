-- views/workers.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.worker_list: one row per worker that announced its presence in the
-- last hour (a lapsed row is pruned an hour after it lapsed): where it runs,
-- what it serves, how many runs it holds now, when it last renewed.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.worker_list AS
  SELECT w.worker_id,
         w.instance,
         w.host,
         w.pid,
         w.queues,
         w.concurrency,
         w.since,
         w.renewed_at,
         w.until,
         w.until > pgdurable.now()                                    AS alive,
         (SELECT count(*) FROM pgdurable.runs r
           WHERE r.lease_owner = w.worker_id AND r.status = 'leased'
             AND r.lease_expires_at > pgdurable.now())                AS runs_held,
         (SELECT coalesce(jsonb_object_agg(v.task, v.revision ORDER BY v.task), '{}'::jsonb)
            FROM pgdurable.worker_revisions v WHERE v.worker_id = w.worker_id) AS revisions
    FROM pgdurable.worker_presence w;
COMMENT ON VIEW pgdurable.worker_list IS
  'Workers that announced themselves (pgdurable.worker_presence): host, pid, queues, '
  'concurrency, runs held now, last renewal, the task revisions they serve.';
COMMENT ON COLUMN pgdurable.worker_list.worker_id IS 'The worker id (its lease owner name).';
COMMENT ON COLUMN pgdurable.worker_list.instance IS 'Its process instance (new at every start).';
COMMENT ON COLUMN pgdurable.worker_list.host IS 'Host name of its machine (NULL: a worker older than 0035).';
COMMENT ON COLUMN pgdurable.worker_list.pid IS 'Its process id on that host.';
COMMENT ON COLUMN pgdurable.worker_list.queues IS 'The queues it claims from.';
COMMENT ON COLUMN pgdurable.worker_list.concurrency IS 'How many runs it executes at once.';
COMMENT ON COLUMN pgdurable.worker_list.since IS 'When this instance first announced itself.';
COMMENT ON COLUMN pgdurable.worker_list.renewed_at IS 'Its last heartbeat (presence renewal).';
COMMENT ON COLUMN pgdurable.worker_list.until IS 'It counts as alive until then (database clock).';
COMMENT ON COLUMN pgdurable.worker_list.alive IS
  'until is still ahead: false for a worker that stopped renewing (killed, stalled, cut off).';
COMMENT ON COLUMN pgdurable.worker_list.runs_held IS 'Runs it holds under a live lease now.';
COMMENT ON COLUMN pgdurable.worker_list.revisions IS
  'The task revisions it registered at start ({task: revision}; pgdurable.worker_revisions).';
