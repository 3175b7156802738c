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
--
-- Its functions, trigger functions, triggers and views are no longer here: each has
-- one current body in sql/functions/ or sql/views/, which migrate applies after
-- the numbered files (pgdurable/migrations.py).

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
