-- OpenAI Agents SDK sessions (pgdurable.contrib.openai_agents.PgDurableSession):
-- the conversation items of a session, in order, in the pgdurable schema.
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

CREATE TABLE pgdurable.agent_session_items (
  session_id  text        NOT NULL,
  seq         bigint      GENERATED ALWAYS AS IDENTITY,
  item        jsonb       NOT NULL,
  add_key     text,
  created_at  timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (session_id, seq)
);
CREATE INDEX agent_session_items_key_idx ON pgdurable.agent_session_items (session_id, add_key)
  WHERE add_key IS NOT NULL;
COMMENT ON TABLE pgdurable.agent_session_items IS
  'OpenAI Agents SDK session items (pgdurable.contrib.openai_agents.PgDurableSession), '
  'in the order they were added.';
COMMENT ON COLUMN pgdurable.agent_session_items.session_id IS 'The SDK session id.';
COMMENT ON COLUMN pgdurable.agent_session_items.seq IS
  'Order of the item: one add_items call takes consecutive numbers under the session''s '
  'advisory lock, so concurrent calls never interleave.';
COMMENT ON COLUMN pgdurable.agent_session_items.item IS 'The item (a JSON input item).';
COMMENT ON COLUMN pgdurable.agent_session_items.add_key IS
  'Idempotency key of the add_items call that added the item (NULL: none): a repeated '
  'call with the same key adds nothing (a durable run saving its turn after a crash).';
COMMENT ON COLUMN pgdurable.agent_session_items.created_at IS 'When it was added.';
