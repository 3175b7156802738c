-- functions/pubsub.sql: the current body of each function below.

------------------------------------------------------------------------------
-- functions
------------------------------------------------------------------------------

-- pgdurable.pubsub_check_topic(topic): raise PD000 for a NULL or empty topic
-- (internal helper; text cannot hold NUL, the client refuses those).
CREATE OR REPLACE FUNCTION pgdurable.pubsub_check_topic(p_topic text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
BEGIN
  IF p_topic IS NULL OR p_topic = '' THEN
    RAISE EXCEPTION 'pubsub topic must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  IF octet_length(p_topic) > 100000 THEN
    RAISE EXCEPTION 'pubsub topic is longer than 100000 bytes' USING ERRCODE = 'PD000';
  END IF;
END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_check_topic(text) IS
  'Internal: PD000 for a NULL, empty or over-long pubsub topic.';

-- pgdurable.pubsub_notify_payload(topic, last_offset) -> text: the NOTIFY
-- payload '<offset> <topic>', or '<offset> #<md5(topic)>' for a topic over
-- 7,000 bytes (a payload must stay under 8,000 bytes).
CREATE OR REPLACE FUNCTION pgdurable.pubsub_notify_payload(p_topic text, p_offset bigint) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE WHEN octet_length(p_topic) <= 7000 THEN p_offset::text || ' ' || p_topic
              ELSE p_offset::text || ' #' || md5(p_topic) END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_notify_payload(text, bigint) IS
  'NOTIFY payload of a publish: ''<last offset> <topic>'' (or ''#md5(topic)'' for long topics).';

-- pgdurable.pubsub_publish(topic, events json[]) -> bigint
-- (0011's contract.) Append events to a topic's log: offsets last+1 .. last+n
-- (the first is returned; NULL for no events), one NOTIFY pgdurable_pubsub.
-- Each event must be a JSON object (PD000) of at most 1 MiB (1 048 576 bytes
-- of JSON text; PD013): one publish of a huge event would otherwise be read
-- whole by every subscriber's batch.
CREATE OR REPLACE FUNCTION pgdurable.pubsub_publish(p_topic text, p_events json[])
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n bigint := coalesce(cardinality(p_events), 0);
  v_last bigint;
  v_now timestamptz := pgdurable.now();
  v_big integer;
BEGIN
  PERFORM pgdurable.pubsub_check_topic(p_topic);
  IF v_n = 0 THEN
    RETURN NULL;
  END IF;
  IF EXISTS (SELECT FROM unnest(p_events) e WHERE e IS NULL OR json_typeof(e) <> 'object') THEN
    RAISE EXCEPTION 'pubsub events must be JSON objects' USING ERRCODE = 'PD000';
  END IF;
  SELECT max(octet_length(e::text)) INTO v_big FROM unnest(p_events) e;
  IF v_big > 1048576 THEN
    RAISE EXCEPTION 'pubsub event is % bytes of JSON; at most 1048576 (1 MiB)', v_big
      USING ERRCODE = 'PD013';
  END IF;
  INSERT INTO pgdurable.pubsub_topics AS t (topic, last_offset, created_at, updated_at)
  VALUES (p_topic, v_n - 1, v_now, v_now)
  ON CONFLICT (topic) DO UPDATE SET last_offset = t.last_offset + v_n, updated_at = v_now
  RETURNING t.last_offset INTO v_last;
  INSERT INTO pgdurable.pubsub_events (topic, "offset", event, created_at)
  SELECT p_topic, v_last - v_n + u.ord, u.e, v_now
    FROM unnest(p_events) WITH ORDINALITY AS u(e, ord);
  PERFORM pg_notify('pgdurable_pubsub', pgdurable.pubsub_notify_payload(p_topic, v_last));
  RETURN v_last - v_n + 1;
END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_publish(text, json[]) IS
  'Append events (JSON objects of at most 1 MiB) to a topic; returns the first offset; one NOTIFY.';

-- pgdurable.pubsub_read(topic, after, limit) -> events with offset > after, in
-- order, at most limit (1 .. 10,000) of them.
CREATE OR REPLACE FUNCTION pgdurable.pubsub_read(p_topic text, p_after bigint, p_limit integer,
  OUT "offset" bigint, OUT event json, OUT created_at timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT e."offset", e.event, e.created_at
    FROM pgdurable.pubsub_events e
   WHERE e.topic = p_topic AND e."offset" > coalesce(p_after, -1)
   ORDER BY e."offset"
   LIMIT least(greatest(coalesce(p_limit, 1000), 1), 10000)
$$;
COMMENT ON FUNCTION pgdurable.pubsub_read(text, bigint, integer) IS
  'Events of a topic after an offset, in order, at most limit (1..10000) of them.';

-- pgdurable.pubsub_last_offset(topic) -> the topic's last offset, -1 if none.
CREATE OR REPLACE FUNCTION pgdurable.pubsub_last_offset(p_topic text) RETURNS bigint
LANGUAGE sql STABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT coalesce((SELECT t.last_offset FROM pgdurable.pubsub_topics t WHERE t.topic = p_topic), -1)
$$;
COMMENT ON FUNCTION pgdurable.pubsub_last_offset(text) IS
  'The last offset published to a topic (-1 when none): where a live subscription starts.';

-- pgdurable.pubsub_claim(topic, group, limit, from_latest) -> claimed events
-- Hand the next events of topic (at most limit) to one member of group and
-- advance the group's cursor past them, in one statement. A new group starts
-- at the beginning of the retained events, or at the topic's end with
-- from_latest. Members claiming at once queue on the group row: each event
-- goes to exactly one of them.
CREATE OR REPLACE FUNCTION pgdurable.pubsub_claim(p_topic text, p_group text, p_limit integer,
                                       p_from_latest boolean DEFAULT false,
  OUT "offset" bigint, OUT event json, OUT created_at timestamptz)
RETURNS SETOF record
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_cursor bigint;
BEGIN
  PERFORM pgdurable.pubsub_check_topic(p_topic);
  IF coalesce(p_group, '') = '' THEN
    RAISE EXCEPTION 'pubsub group must be a non-empty string' USING ERRCODE = 'PD000';
  END IF;
  INSERT INTO pgdurable.pubsub_groups (topic, group_name, last_offset)
  VALUES (p_topic, p_group,
          CASE WHEN p_from_latest THEN pgdurable.pubsub_last_offset(p_topic) ELSE -1 END)
  ON CONFLICT DO NOTHING;
  SELECT g.last_offset INTO v_cursor FROM pgdurable.pubsub_groups g
   WHERE g.topic = p_topic AND g.group_name = p_group FOR UPDATE;
  RETURN QUERY
    WITH ev AS MATERIALIZED (
      SELECT * FROM pgdurable.pubsub_read(p_topic, v_cursor, p_limit)
    ), moved AS (
      UPDATE pgdurable.pubsub_groups g
         SET last_offset = (SELECT max(ev."offset") FROM ev), updated_at = pgdurable.now()
       WHERE g.topic = p_topic AND g.group_name = p_group AND EXISTS (SELECT FROM ev)
    )
    SELECT ev."offset", ev.event, ev.created_at
      FROM ev ORDER BY ev."offset";
END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_claim(text, text, integer, boolean) IS
  'Claim the next events of a topic for one member of a consumer group and advance the '
  'group''s cursor (each event goes to one member; at most once per group).';

-- pgdurable.pubsub_clear(topic) -> events deleted
-- Delete a topic's events and consumer groups (Mastra's clearTopic). The
-- counter row stays, so later offsets continue after the cleared ones.
CREATE OR REPLACE FUNCTION pgdurable.pubsub_clear(p_topic text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n bigint;
BEGIN
  PERFORM pgdurable.pubsub_check_topic(p_topic);
  DELETE FROM pgdurable.pubsub_events e WHERE e.topic = p_topic;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  DELETE FROM pgdurable.pubsub_groups g WHERE g.topic = p_topic;
  RETURN v_n;
END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_clear(text) IS
  'Delete a topic''s events and groups (clearTopic); offsets keep growing afterwards.';

-- pgdurable.prune_pubsub(older_than, batch) -> rows deleted
-- Retention for abandoned topics: delete at most batch events of topics with
-- no publish for older_than, then those topics (counter and groups) once
-- empty. Skips topics a publisher holds locked. Call it until it returns 0.
CREATE OR REPLACE FUNCTION pgdurable.prune_pubsub(p_older_than interval, p_batch integer DEFAULT 1000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_cut timestamptz;
  v_events bigint;
  v_topics bigint;
BEGIN
  IF p_older_than IS NULL OR p_older_than < interval '0' OR p_batch IS NULL
     OR p_batch < 1 OR p_batch > 100000 THEN
    RAISE EXCEPTION 'prune_pubsub: older_than >= 0 and batch in 1..100000 required'
      USING ERRCODE = 'PD000';
  END IF;
  v_cut := pgdurable.now() - p_older_than;
  WITH old AS MATERIALIZED (
    SELECT t.topic FROM pgdurable.pubsub_topics t
     WHERE t.updated_at < v_cut
     ORDER BY t.updated_at
     LIMIT p_batch
       FOR UPDATE SKIP LOCKED
  ), doomed AS MATERIALIZED (
    SELECT e.ctid AS row_id FROM pgdurable.pubsub_events e
     WHERE e.topic IN (SELECT o.topic FROM old o)
     LIMIT p_batch
  )
  DELETE FROM pgdurable.pubsub_events e WHERE e.ctid IN (SELECT d.row_id FROM doomed d);
  GET DIAGNOSTICS v_events = ROW_COUNT;
  WITH gone AS (
    DELETE FROM pgdurable.pubsub_topics t
     WHERE t.topic IN (SELECT t2.topic FROM pgdurable.pubsub_topics t2
                        WHERE t2.updated_at < v_cut
                          AND NOT EXISTS (SELECT FROM pgdurable.pubsub_events e
                                           WHERE e.topic = t2.topic)
                        LIMIT p_batch
                          FOR UPDATE SKIP LOCKED)
    RETURNING t.topic
  ), groups AS (
    DELETE FROM pgdurable.pubsub_groups g WHERE g.topic IN (SELECT gone.topic FROM gone)
  )
  SELECT count(*) INTO v_topics FROM gone;
  DELETE FROM pgdurable.pubsub_groups g
   WHERE g.updated_at < v_cut
     AND NOT EXISTS (SELECT FROM pgdurable.pubsub_topics t WHERE t.topic = g.topic);
  RETURN v_events + v_topics;
END
$$;
COMMENT ON FUNCTION pgdurable.prune_pubsub(interval, integer) IS
  'Retention for pubsub: delete up to batch events of topics idle for older_than, then the '
  'emptied topics; returns rows deleted (call until 0).';
