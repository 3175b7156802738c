-- pubsub: an event log per topic for the TypeScript PubSub of @pgdurable/mastra
-- (clients/mastra), pushed with LISTEN/NOTIFY.
--
-- A topic is a text name (no NUL). Each published event gets the next offset of
-- its topic (0, 1, 2, ...), assigned from the topic's counter row, which the
-- publishing transaction locks until it commits: a concurrent publisher waits,
-- so offsets become visible in order and a reader that has seen offset n never
-- later finds a committed offset below n (no gap, no skip).
--
-- One publish call (any number of events of one topic) sends ONE notification
-- on channel 'pgdurable_pubsub' whose payload is a position, never the event:
--   '<last offset> <topic>'            (topics up to 7,000 bytes)
--   '<last offset> #<md5(topic)>'      (longer topics)
-- Receivers read the events after their own position in batches
-- (pubsub_read); a receiver that reconnects reads from its position again.
--
-- clearTopic deletes a topic's events (the counter row stays, so offsets keep
-- growing and no reader mistakes new events for old ones); retention deletes
-- topics nobody published to for a while (prune_pubsub), in batches:
--   SELECT pgdurable.prune_pubsub('7 days', 1000);   -- repeat until it returns 0
--
-- Groups (Mastra's SubscribeOptions.group): the members of a group share one
-- cursor per topic (pubsub_groups); pubsub_claim hands each event to exactly
-- one member (delivery is at most once per group: an event is claimed before
-- its callback runs; a nack republishes it).

------------------------------------------------------------------------------
-- tables
------------------------------------------------------------------------------
CREATE TABLE pgdurable.pubsub_topics (
  topic       text        PRIMARY KEY CHECK (octet_length(topic) BETWEEN 1 AND 100000),
  last_offset bigint      NOT NULL DEFAULT -1,
  created_at  timestamptz NOT NULL DEFAULT pgdurable.now(),
  updated_at  timestamptz NOT NULL DEFAULT pgdurable.now()
);
COMMENT ON TABLE pgdurable.pubsub_topics IS
  'PubSub topics (clients/mastra): the offset counter of each topic, locked by publishers '
  'until they commit so that offsets become visible in order.';
COMMENT ON COLUMN pgdurable.pubsub_topics.topic IS 'Topic name (text; Mastra topic names).';
COMMENT ON COLUMN pgdurable.pubsub_topics.last_offset IS
  'Offset of the last event published to the topic (-1: none yet); never decreases, '
  'also across pubsub_clear.';
COMMENT ON COLUMN pgdurable.pubsub_topics.created_at IS 'When the topic was first published to.';
COMMENT ON COLUMN pgdurable.pubsub_topics.updated_at IS
  'Last publish (database clock); retention prunes topics idle longer than its cut-off.';

CREATE TABLE pgdurable.pubsub_events (
  topic            text        NOT NULL REFERENCES pgdurable.pubsub_topics (topic) ON DELETE CASCADE,
  "offset"         bigint      NOT NULL,
  event            json        NOT NULL,
  created_at       timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (topic, "offset")
);
COMMENT ON TABLE pgdurable.pubsub_events IS
  'PubSub events (clients/mastra), one row per published event, in offset order per topic.';
COMMENT ON COLUMN pgdurable.pubsub_events.topic IS 'Topic the event was published to.';
COMMENT ON COLUMN pgdurable.pubsub_events."offset" IS
  'Position of the event in its topic (0-based, gap-free per topic; Mastra''s Event.index).';
COMMENT ON COLUMN pgdurable.pubsub_events.event IS
  'The event as a JSON object {id, type, runId, data, deliveryAttempt}, stored verbatim: '
  'json, not jsonb, because its strings may hold \u0000 (Mastra thread keys do), which '
  'jsonb and text cannot; read it with the client, or with ->> when it has no NUL.';
COMMENT ON COLUMN pgdurable.pubsub_events.created_at IS 'When it was published (database clock).';

CREATE TABLE pgdurable.pubsub_groups (
  topic       text        NOT NULL,
  group_name  text        NOT NULL,
  last_offset bigint      NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT pgdurable.now(),
  PRIMARY KEY (topic, group_name)
);
COMMENT ON TABLE pgdurable.pubsub_groups IS
  'PubSub consumer groups: the shared cursor of the members of a group on a topic.';
COMMENT ON COLUMN pgdurable.pubsub_groups.topic IS 'Topic the group consumes.';
COMMENT ON COLUMN pgdurable.pubsub_groups.group_name IS 'Group name (Mastra''s SubscribeOptions.group).';
COMMENT ON COLUMN pgdurable.pubsub_groups.last_offset IS
  'Offset of the last event handed to a member of the group (-1: none).';
COMMENT ON COLUMN pgdurable.pubsub_groups.updated_at IS 'Last claim (database clock).';

CREATE INDEX pubsub_topics_updated_idx ON pgdurable.pubsub_topics (updated_at);
COMMENT ON INDEX pgdurable.pubsub_topics_updated_idx IS 'Retention: finds idle topics.';

------------------------------------------------------------------------------
-- functions
------------------------------------------------------------------------------

-- pgdurable.pubsub_check_topic(topic): raise PD000 for a NULL or empty topic
-- (internal helper; text cannot hold NUL, the client refuses those).
CREATE FUNCTION pgdurable.pubsub_check_topic(p_topic text) RETURNS void
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
CREATE FUNCTION pgdurable.pubsub_notify_payload(p_topic text, p_offset bigint) RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
  SELECT CASE WHEN octet_length(p_topic) <= 7000 THEN p_offset::text || ' ' || p_topic
              ELSE p_offset::text || ' #' || md5(p_topic) END
$$;
COMMENT ON FUNCTION pgdurable.pubsub_notify_payload(text, bigint) IS
  'NOTIFY payload of a publish: ''<last offset> <topic>'' (or ''#md5(topic)'' for long topics).';

-- pgdurable.pubsub_publish(topic, events json[]) -> first offset
-- Append events (each a JSON object {id, type, runId, data, deliveryAttempt},
-- stored as given)
-- to topic with consecutive offsets and send one NOTIFY with the last offset.
-- The counter row stays locked until the caller's transaction ends, so
-- offsets commit in order. An empty array publishes nothing (returns NULL).
CREATE FUNCTION pgdurable.pubsub_publish(p_topic text, p_events json[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pgdurable, pg_temp AS $$
DECLARE
  v_n bigint := coalesce(cardinality(p_events), 0);
  v_last bigint;
  v_now timestamptz := pgdurable.now();
BEGIN
  PERFORM pgdurable.pubsub_check_topic(p_topic);
  IF v_n = 0 THEN
    RETURN NULL;
  END IF;
  IF EXISTS (SELECT FROM unnest(p_events) e WHERE e IS NULL OR json_typeof(e) <> 'object') THEN
    RAISE EXCEPTION 'pubsub events must be JSON objects' USING ERRCODE = 'PD000';
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
  'Append events to a topic with consecutive offsets (committed in order) and NOTIFY '
  'pgdurable_pubsub once with the last offset; returns the first offset.';

-- pgdurable.pubsub_read(topic, after, limit) -> events with offset > after, in
-- order, at most limit (1 .. 10,000) of them.
CREATE FUNCTION pgdurable.pubsub_read(p_topic text, p_after bigint, p_limit integer,
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
CREATE FUNCTION pgdurable.pubsub_last_offset(p_topic text) RETURNS bigint
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
CREATE FUNCTION pgdurable.pubsub_claim(p_topic text, p_group text, p_limit integer,
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
CREATE FUNCTION pgdurable.pubsub_clear(p_topic text) RETURNS bigint
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
CREATE FUNCTION pgdurable.prune_pubsub(p_older_than interval, p_batch integer DEFAULT 1000)
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
