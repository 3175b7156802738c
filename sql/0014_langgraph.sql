-- LangGraph checkpoints (pgdurable.contrib.langgraph), stored in the pgdurable schema.
--
-- A checkpoint is one row: LangGraph's own serializer (saver.serde) turns the
-- checkpoint (with its channel values) into (type, bytes); the metadata is
-- JSONB so that list(filter=...) is a containment query. Pending writes are
-- one row each. A thread written under its pgdurable lease is fenced: the put
-- names the lease key, owner and token and fails with PD001 (LeaseLost) when
-- that lease is no longer live, so a stale writer can never interleave.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

------------------------------------------------------------------------------
-- tables
------------------------------------------------------------------------------
CREATE TABLE pgdurable.lg_checkpoints (
  thread_id            text        NOT NULL,
  checkpoint_ns        text        NOT NULL DEFAULT '',
  checkpoint_id        text        NOT NULL,
  parent_checkpoint_id text,
  run_id               text,
  type                 text        NOT NULL,
  checkpoint           bytea       NOT NULL,
  metadata             jsonb       NOT NULL DEFAULT '{}',
  created_at           timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX lg_checkpoints_run_idx ON pgdurable.lg_checkpoints (run_id)
  WHERE run_id IS NOT NULL;
COMMENT ON TABLE pgdurable.lg_checkpoints IS
  'LangGraph checkpoints saved by pgdurable.contrib.langgraph.PgDurableSaver: one row per '
  '(thread, namespace, checkpoint id).';
COMMENT ON COLUMN pgdurable.lg_checkpoints.thread_id IS 'LangGraph thread_id.';
COMMENT ON COLUMN pgdurable.lg_checkpoints.checkpoint_ns IS
  'LangGraph checkpoint namespace ('''' for the root graph, ''node:task'' for subgraphs).';
COMMENT ON COLUMN pgdurable.lg_checkpoints.checkpoint_id IS
  'LangGraph checkpoint id (uuid6: sorts by creation time).';
COMMENT ON COLUMN pgdurable.lg_checkpoints.parent_checkpoint_id IS
  'The checkpoint this one follows (NULL for the first, or after its parent was pruned).';
COMMENT ON COLUMN pgdurable.lg_checkpoints.run_id IS
  'metadata.run_id, copied out for delete_for_runs.';
COMMENT ON COLUMN pgdurable.lg_checkpoints.type IS
  'Type tag from the saver''s serializer (serde.dumps_typed), e.g. ''msgpack''.';
COMMENT ON COLUMN pgdurable.lg_checkpoints.checkpoint IS
  'The serialized checkpoint, channel values included.';
COMMENT ON COLUMN pgdurable.lg_checkpoints.metadata IS
  'Checkpoint metadata as JSONB (list(filter=...) is metadata @> filter).';
COMMENT ON COLUMN pgdurable.lg_checkpoints.created_at IS
  'When it was saved (pgdurable.now()); retention by age reads it.';

CREATE TABLE pgdurable.lg_writes (
  thread_id     text    NOT NULL,
  checkpoint_ns text    NOT NULL DEFAULT '',
  checkpoint_id text    NOT NULL,
  task_id       text    NOT NULL,
  idx           integer NOT NULL,
  channel       text    NOT NULL,
  type          text    NOT NULL,
  value         bytea   NOT NULL,
  task_path     text    NOT NULL DEFAULT '',
  PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
COMMENT ON TABLE pgdurable.lg_writes IS
  'LangGraph pending writes: what a task wrote after a checkpoint, before the next one.';
COMMENT ON COLUMN pgdurable.lg_writes.thread_id IS 'LangGraph thread_id.';
COMMENT ON COLUMN pgdurable.lg_writes.checkpoint_ns IS 'Checkpoint namespace.';
COMMENT ON COLUMN pgdurable.lg_writes.checkpoint_id IS 'The checkpoint the writes follow.';
COMMENT ON COLUMN pgdurable.lg_writes.task_id IS 'The task that wrote.';
COMMENT ON COLUMN pgdurable.lg_writes.idx IS
  'Index of the write in the task''s batch; negative for special channels (WRITES_IDX_MAP), '
  'which are overwritten, while ordinary writes are kept first-wins.';
COMMENT ON COLUMN pgdurable.lg_writes.channel IS 'Channel written.';
COMMENT ON COLUMN pgdurable.lg_writes.type IS 'Serializer type tag of value.';
COMMENT ON COLUMN pgdurable.lg_writes.value IS 'The serialized value.';
COMMENT ON COLUMN pgdurable.lg_writes.task_path IS 'The task''s path (write ordering).';

CREATE TABLE pgdurable.lg_retention (
  id          boolean  PRIMARY KEY DEFAULT true CHECK (id),
  keep_last   integer  CHECK (keep_last >= 1),
  max_age     interval CHECK (max_age >= interval '0')
);
COMMENT ON TABLE pgdurable.lg_retention IS
  'Retention policy for LangGraph checkpoints (one row at most), applied by '
  'pgdurable.prune_graph_checkpoints in every retention batch (pgdurable prune).';
COMMENT ON COLUMN pgdurable.lg_retention.id IS 'Always true: the table holds one row.';
COMMENT ON COLUMN pgdurable.lg_retention.keep_last IS
  'Keep the last N checkpoints of each thread namespace (NULL: keep only the newest, '
  'unless younger than max_age).';
COMMENT ON COLUMN pgdurable.lg_retention.max_age IS
  'Keep every checkpoint younger than this (NULL: age does not protect).';
