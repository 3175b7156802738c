-- OpenAI Agents SDK sessions (pgdurable.contrib.openai_agents.PgDurableSession):
-- the conversation items of a session, in order, in the pgdurable schema.

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

------------------------------------------------------------------------------
-- agent sessions (OpenAI Agents SDK)
------------------------------------------------------------------------------
-- session_add_items: append a call's items in order (idempotent per key)
CREATE FUNCTION pgdurable.session_add_items(p_session text, p_items jsonb[],
                                            p_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
DECLARE
  n bigint;
BEGIN
  -- one writer per session at a time: the items of one call get consecutive seqs
  PERFORM pg_advisory_xact_lock(hashtextextended('pgdurable.session:' || p_session, 0));
  IF p_key IS NOT NULL AND EXISTS (
       SELECT 1 FROM pgdurable.agent_session_items s
        WHERE s.session_id = p_session AND s.add_key = p_key) THEN
    RETURN 0;
  END IF;
  INSERT INTO pgdurable.agent_session_items (session_id, item, add_key)
  SELECT p_session, u.item, p_key FROM unnest(p_items) WITH ORDINALITY AS u(item, ord)
   ORDER BY u.ord;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
COMMENT ON FUNCTION pgdurable.session_add_items(text, jsonb[], text) IS
  'Append items to an agent session in order, atomically; concurrent calls on one session '
  'are serialised (advisory transaction lock), so a call''s items stay together. With '
  'p_key, a call whose key the session already has adds nothing (returns 0).';

-- session_get_items: the last n items of a session, oldest first
CREATE FUNCTION pgdurable.session_get_items(p_session text, p_limit integer)
RETURNS TABLE (seq bigint, item jsonb)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
  SELECT t.seq, t.item FROM (
    SELECT s.seq, s.item FROM pgdurable.agent_session_items s
     WHERE s.session_id = p_session
     ORDER BY s.seq DESC LIMIT p_limit) t
   ORDER BY t.seq
$$;
COMMENT ON FUNCTION pgdurable.session_get_items(text, integer) IS
  'The last p_limit items of a session (NULL: all), oldest first.';

-- session_pop_item: remove and return the newest item
CREATE FUNCTION pgdurable.session_pop_item(p_session text) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
DECLARE
  v jsonb;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended('pgdurable.session:' || p_session, 0));
  DELETE FROM pgdurable.agent_session_items s
   WHERE s.session_id = p_session
     AND s.seq = (SELECT max(m.seq) FROM pgdurable.agent_session_items m
                   WHERE m.session_id = p_session)
  RETURNING s.item INTO v;
  RETURN v;
END $$;
COMMENT ON FUNCTION pgdurable.session_pop_item(text) IS
  'Remove and return the newest item of a session (NULL when empty).';

-- session_clear: remove every item of a session
CREATE FUNCTION pgdurable.session_clear(p_session text) RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp
AS $$
DECLARE
  n bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended('pgdurable.session:' || p_session, 0));
  DELETE FROM pgdurable.agent_session_items WHERE session_id = p_session;
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
COMMENT ON FUNCTION pgdurable.session_clear(text) IS
  'Delete every item of a session; returns how many.';
