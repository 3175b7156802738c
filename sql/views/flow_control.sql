-- views/flow_control.sql: the current definition of each view below.

------------------------------------------------------------------------------
-- Views
------------------------------------------------------------------------------
CREATE VIEW pgdurable.queue_limits AS
SELECT q.name AS queue, q.concurrency,
       (SELECT count(*) FROM pgdurable.runs r WHERE r.status = 'leased' AND r.queue = q.name
           AND r.lease_expires_at > pgdurable.now()) AS active,
       q.per_key_concurrency, q.rate AS rate_per_second, q.burst,
       CASE WHEN q.rate IS NOT NULL THEN
         least(q.burst, q.tokens + q.rate * greatest(0, extract(epoch FROM pgdurable.now() - q.refilled_at)))
       END AS tokens,
       (SELECT count(DISTINCT r.concurrency_key) FROM pgdurable.runs r
         WHERE r.status = 'runnable' AND r.queue = q.name) AS keys_queued,
       q.key_cursor, q.updated_at
  FROM pgdurable.queues q;
COMMENT ON VIEW pgdurable.queue_limits IS
  'Limited queues: their limits, live leases (active), start tokens now and keys with queued runs.';
COMMENT ON COLUMN pgdurable.queue_limits.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.queue_limits.concurrency IS 'Cap on leased runs (NULL: none).';
COMMENT ON COLUMN pgdurable.queue_limits.active IS 'Runs leased now under a live lease.';
COMMENT ON COLUMN pgdurable.queue_limits.per_key_concurrency IS 'Cap per concurrency key (NULL: none).';
COMMENT ON COLUMN pgdurable.queue_limits.rate_per_second IS 'Start rate (NULL: none).';
COMMENT ON COLUMN pgdurable.queue_limits.burst IS 'Start bucket capacity.';
COMMENT ON COLUMN pgdurable.queue_limits.tokens IS 'Start tokens available now.';
COMMENT ON COLUMN pgdurable.queue_limits.keys_queued IS 'Distinct keys with runnable runs.';
COMMENT ON COLUMN pgdurable.queue_limits.key_cursor IS 'Last key served (the rotation goes on after it).';
COMMENT ON COLUMN pgdurable.queue_limits.updated_at IS 'When the limits were last set.';

CREATE VIEW pgdurable.queue_keys AS
SELECT r.queue, r.concurrency_key AS key,
       count(*) FILTER (WHERE r.status = 'runnable') AS queued,
       count(*) FILTER (WHERE r.status = 'runnable' AND r.available_at <= pgdurable.now()) AS due,
       count(*) FILTER (WHERE r.status = 'leased' AND r.lease_expires_at > pgdurable.now()) AS active
  FROM pgdurable.runs r
 WHERE r.status IN ('runnable', 'leased')
 GROUP BY r.queue, r.concurrency_key;
COMMENT ON VIEW pgdurable.queue_keys IS
  'Per queue and concurrency key: queued, due and active (live lease) runs.';
COMMENT ON COLUMN pgdurable.queue_keys.queue IS 'Queue name.';
COMMENT ON COLUMN pgdurable.queue_keys.key IS 'Concurrency key ('''' = none).';
COMMENT ON COLUMN pgdurable.queue_keys.queued IS 'Runnable runs (due or delayed).';
COMMENT ON COLUMN pgdurable.queue_keys.due IS 'Runnable runs whose available_at has passed.';
COMMENT ON COLUMN pgdurable.queue_keys.active IS 'Runs leased under a live lease.';

CREATE VIEW pgdurable.bucket_levels AS
SELECT b.name, b.rate AS rate_per_second, b.burst,
       least(b.burst, b.tokens + b.rate * greatest(0, extract(epoch FROM pgdurable.now() - b.refilled_at)))
         AS tokens,
       b.updated_at
  FROM pgdurable.buckets b;
COMMENT ON VIEW pgdurable.bucket_levels IS 'Named token buckets and their level now.';
COMMENT ON COLUMN pgdurable.bucket_levels.name IS 'Bucket name.';
COMMENT ON COLUMN pgdurable.bucket_levels.rate_per_second IS 'Refill, tokens per second.';
COMMENT ON COLUMN pgdurable.bucket_levels.burst IS 'Capacity.';
COMMENT ON COLUMN pgdurable.bucket_levels.tokens IS 'Tokens available now.';
COMMENT ON COLUMN pgdurable.bucket_levels.updated_at IS 'When rate/burst were last set.';
