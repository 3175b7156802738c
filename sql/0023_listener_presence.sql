-- 0023_listener_presence: NOTIFY the watch-only channels only while somebody
-- listens.
--
-- Two channels exist only for watchers:
--   * pgdurable_steps: the dashboard's live timeline (a statement that writes
--     checkpoints);
--   * pgdurable_done: result() waiters and the dashboard (a run's end).
-- Until now, every statement writing checkpoints and every run's end sent them,
-- whether anybody listened or not. A transaction that NOTIFYs takes a
-- cluster-wide lock at commit and holds it until its commit record is flushed,
-- so notifying commits never share a WAL flush: every worker batch serialised
-- with every start() (whose NOTIFY pgdurable_wake is needed).
--
-- Now a listener says it is there: pgdurable.listen_presence(channel, ttl)
-- moves listeners.until to at least now + ttl, and the two triggers notify only
-- while until is in the future (one primary-key lookup). The dashboard renews
-- while its LISTEN connection is up, result() waiters while they wait
-- (pgdurable/presence.py). pgdurable_wake, pgdurable_cancel and
-- pgdurable_events are unchanged: workers and streams always need them.
--
-- An announcement races the transactions already under way: a run that ends
-- in a transaction that looked at listeners just before the announcement
-- committed, and commits just after the waiter's first read, sends nothing.
-- Listeners therefore read again a few times in the seconds after they
-- announce themselves (pgdurable/presence.py RECHECK), besides their slow
-- safety poll.
--
-- secure_schema() learns a third allow-list, security_readonly(): functions
-- the read-only role may execute although no view calls them (listen_presence:
-- a read-only dashboard must announce itself).
------------------------------------------------------------------------------
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

CREATE TABLE pgdurable.listeners (
  channel text PRIMARY KEY CHECK (channel IN ('pgdurable_steps', 'pgdurable_done')),
  until timestamptz
);
COMMENT ON TABLE pgdurable.listeners IS
  'Who listens to the watch-only channels: a NOTIFY on channel is sent only while until is in the future.';
COMMENT ON COLUMN pgdurable.listeners.channel IS
  'pgdurable_steps (live timeline) or pgdurable_done (result() waiters, dashboards).';
COMMENT ON COLUMN pgdurable.listeners.until IS
  'Somebody listens until then (server clock; NULL: nobody ever did); moved forward by '
  'listen_presence(), never back.';
INSERT INTO pgdurable.listeners (channel, until)
VALUES ('pgdurable_steps', NULL), ('pgdurable_done', NULL);
