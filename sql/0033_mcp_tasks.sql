-- mcp_tasks: MCP tasks (pgdurable.contrib.mcp) whose ids are runs.
--
-- A durable MCP tool answers tools/call with a task handle whose taskId is the
-- run's id. mcp_tasks says which runs are MCP tasks (tasks/get, tasks/update and
-- tasks/cancel answer for no other run), the tool, the task's TTL (how long its
-- result or error is kept from its creation: retention prunes it only after) and
-- the poll interval the server hints. mcp_task_inputs holds the requests a task
-- waits on (status input_required: an elicitation, a confirmation), one row per
-- key, and the responses tasks/update delivered. Neither has a foreign key to
-- runs (as the history tables): prune_runs deletes their rows with the run.
--
-- Their functions have one current body in sql/functions/mcp_tasks.sql.

CREATE TABLE pgdurable.mcp_tasks (
  run_id           uuid        PRIMARY KEY,
  tool             text        NOT NULL CHECK (tool <> '' AND length(tool) <= 200),
  ttl              interval    CHECK (ttl IS NULL OR ttl > interval '0'),
  poll_interval_ms integer     NOT NULL CHECK (poll_interval_ms BETWEEN 1 AND 86400000),
  created_at       timestamptz NOT NULL DEFAULT pgdurable.now()
);
COMMENT ON TABLE pgdurable.mcp_tasks IS
  'MCP tasks (pgdurable.contrib.mcp): the runs that answer tasks/get, tasks/update and '
  'tasks/cancel, with their tool, TTL and poll-interval hint.';
COMMENT ON COLUMN pgdurable.mcp_tasks.run_id IS 'The run, whose id is the MCP taskId.';
COMMENT ON COLUMN pgdurable.mcp_tasks.tool IS 'The MCP tool the task runs.';
COMMENT ON COLUMN pgdurable.mcp_tasks.ttl IS
  'How long from created_at the task (its result or error) is kept (the wire ttlMs); '
  'NULL: unlimited. Retention prunes the run only after it.';
COMMENT ON COLUMN pgdurable.mcp_tasks.poll_interval_ms IS
  'The poll interval the server suggests (the wire pollIntervalMs), unless the run reports another.';
COMMENT ON COLUMN pgdurable.mcp_tasks.created_at IS 'When the task was created (database clock).';

CREATE TABLE pgdurable.mcp_task_inputs (
  run_id      uuid        NOT NULL,
  key         text        NOT NULL CHECK (key <> '' AND length(key) <= 200),
  round       integer     NOT NULL CHECK (round > 0),
  request     jsonb       NOT NULL CHECK (jsonb_typeof(request) = 'object'),
  response    jsonb,
  asked_at    timestamptz NOT NULL DEFAULT pgdurable.now(),
  answered_at timestamptz,
  PRIMARY KEY (run_id, key)
);
COMMENT ON TABLE pgdurable.mcp_task_inputs IS
  'The input requests of MCP tasks (inputRequests of tasks/get) and their responses '
  '(inputResponses of tasks/update), one row per key; a key is never reused within a task.';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.run_id IS 'The task''s run.';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.key IS 'The request key, unique over the task''s lifetime.';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.round IS
  'The wait the request belongs to: the run is woken (signal mcp.input, ref run:round) once '
  'every request of its round is answered.';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.request IS
  'The server-to-client request ({"method": "elicitation/create", "params": ...}).';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.response IS 'The client''s response; NULL while outstanding.';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.asked_at IS 'When the run asked.';
COMMENT ON COLUMN pgdurable.mcp_task_inputs.answered_at IS 'When tasks/update answered it.';

-- The client side: a run that called a remote MCP tool which answered with a
-- task handle parks; a poller (pgdurable.contrib.mcp.TaskPoller, any process)
-- polls the remote tasks/get at the server's hinted interval and wakes the run
-- (signal mcp.remote) when the task ends or needs input.
CREATE TABLE pgdurable.mcp_remote_tasks (
  run_id           uuid        NOT NULL,
  key              text        NOT NULL CHECK (key <> '' AND length(key) <= 200),
  server           text        NOT NULL CHECK (server <> '' AND length(server) <= 2000),
  task_id          text        NOT NULL CHECK (task_id <> '' AND length(task_id) <= 1000),
  round            integer     NOT NULL CHECK (round > 0),
  state            text        NOT NULL CHECK (state IN ('polling', 'asked', 'done')),
  poll_interval_ms integer     NOT NULL CHECK (poll_interval_ms BETWEEN 1 AND 86400000),
  next_poll_at     timestamptz NOT NULL,
  polls            integer     NOT NULL DEFAULT 0 CHECK (polls >= 0),
  last_task        jsonb,
  updated_at       timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (run_id, key)
);
CREATE INDEX mcp_remote_tasks_due_idx ON pgdurable.mcp_remote_tasks (next_poll_at)
  WHERE state = 'polling';
COMMENT ON TABLE pgdurable.mcp_remote_tasks IS
  'Remote MCP tasks that parked runs await: what the poller polls (tasks/get) and when.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.run_id IS 'The parked run that awaits the task.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.key IS 'The call''s key within the run.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.server IS 'The remote MCP server (Streamable HTTP URL).';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.task_id IS 'The remote taskId (from the CreateTaskResult).';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.round IS
  'The run''s wait for it (signal mcp.remote, ref run:key:round); one more after each input round.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.state IS
  'polling (the poller polls it) | asked (input_required: the run waits for an answer) | done (terminal).';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.poll_interval_ms IS 'The server''s latest pollIntervalMs hint.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.next_poll_at IS
  'When to poll next (database clock); a poller that took it pushed it by its lease.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.polls IS 'tasks/get calls recorded so far.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.last_task IS 'The last task tasks/get returned.';
COMMENT ON COLUMN pgdurable.mcp_remote_tasks.updated_at IS 'When the row last changed.';

INSERT INTO pgdurable.security_api (routine, readonly) VALUES
  ('pgdurable.mcp_remote_watch(uuid,text,text,text,integer,integer)', false),
  ('pgdurable.mcp_remote_due(integer,interval)', false),
  ('pgdurable.mcp_remote_seen(uuid,text,integer,jsonb)', false),
  ('pgdurable.mcp_remote_next_poll()', true),
  ('pgdurable.mcp_remote_get(uuid,text)', true),
  ('pgdurable.mcp_task_register(uuid,text,interval,integer)', false),
  ('pgdurable.mcp_task_get(uuid)', true),
  ('pgdurable.mcp_task_ask(uuid,integer,jsonb)', false),
  ('pgdurable.mcp_task_update(uuid,jsonb)', false),
  ('pgdurable.mcp_task_cancel(uuid)', false);
