-- views/threads.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- pgdurable.thread_owners: which run owns which thread, its inbox depth and
-- its stream position.
------------------------------------------------------------------------------
CREATE VIEW pgdurable.thread_owners AS
  SELECT t.thread_key,
         CASE WHEN l.owner IS NOT NULL AND l.expires_at > pgdurable.now()
              THEN pgdurable._owner_run(l.owner) END                       AS run_id,
         pgdurable.lease_display(l.owner)                                   AS lease_owner,
         l.token                                                            AS lease_token,
         l.expires_at                                                       AS lease_expires_at,
         (l.owner IS NOT NULL AND l.expires_at > pgdurable.now())           AS owned,
         r.status                                                           AS run_status,
         r.step                                                             AS run_step,
         (SELECT count(*) FROM pgdurable.thread_messages m
           WHERE m.thread_key = t.thread_key AND m.consumed_at IS NULL)     AS inbox_depth,
         t.next_seq - 1                                                     AS last_message_seq,
         (SELECT max(e.seq) FROM pgdurable.run_events e WHERE e.run_id = r.id) AS stream_position,
         t.runs                                                             AS runs_started,
         t.last_message_at
    FROM pgdurable.threads t
    LEFT JOIN pgdurable.leases l ON l.key = pgdurable.thread_lease_key(t.thread_key)
    -- the owning run; when the lease is released, the thread's last run
    LEFT JOIN pgdurable.runs r ON r.id = coalesce(
      pgdurable._owner_run(l.owner),
      (SELECT x.id FROM pgdurable.runs x WHERE x.thread_key = t.thread_key
        ORDER BY x.thread_no DESC LIMIT 1));
COMMENT ON VIEW pgdurable.thread_owners IS
  'One row per thread: the run that owns it (live thread lease), its inbox depth and its stream position.';
COMMENT ON COLUMN pgdurable.thread_owners.thread_key IS
  'Thread key, escaped (\\ is a backslash, \0 is NUL; see threads.thread_key).';
COMMENT ON COLUMN pgdurable.thread_owners.run_id IS 'Run owning the thread now (NULL when the lease is free or lapsed).';
COMMENT ON COLUMN pgdurable.thread_owners.lease_owner IS 'Holder (or last holder) of the thread lease, <run id>:<attempt token>.';
COMMENT ON COLUMN pgdurable.thread_owners.lease_token IS 'Fencing token of the thread lease.';
COMMENT ON COLUMN pgdurable.thread_owners.lease_expires_at IS 'When the thread lease lapses (database clock).';
COMMENT ON COLUMN pgdurable.thread_owners.owned IS 'True while the thread lease is live.';
COMMENT ON COLUMN pgdurable.thread_owners.run_status IS
  'Status of the owning run (of the thread''s last run when the lease is released).';
COMMENT ON COLUMN pgdurable.thread_owners.run_step IS
  'Steps checkpointed by the owning run (the thread''s last run when released).';
COMMENT ON COLUMN pgdurable.thread_owners.inbox_depth IS 'Messages of the thread not consumed yet.';
COMMENT ON COLUMN pgdurable.thread_owners.last_message_seq IS 'Sequence number of the thread''s latest message (0: none).';
COMMENT ON COLUMN pgdurable.thread_owners.stream_position IS
  'Last event seq of the owning run''s output stream (the thread''s last run when released).';
COMMENT ON COLUMN pgdurable.thread_owners.runs_started IS 'How many runs the thread has started.';
COMMENT ON COLUMN pgdurable.thread_owners.last_message_at IS 'When the latest message was sent.';
