"""Flow control (``sql/functions/flow_control.sql``): queue limits, token buckets, and the
start of a run with a concurrency key or a delay."""

from __future__ import annotations

from .core import nullable, statement
from .start import started

__all__ = ["ACQUIRE", "SET_BUCKET", "SET_QUEUE", "START_FLOW"]

# -- set a queue's limits (queue, concurrency, per-key concurrency, rate per second,
# -- burst; all NULL: unlimited)
SET_QUEUE = statement(
    "SELECT pgdurable.set_queue(%s::text, %s::integer, %s::integer, %s::numeric, %s::numeric)"
)
# -- set a named token bucket: (name, rate per second, burst)
SET_BUCKET = statement("SELECT pgdurable.set_bucket(%s::text, %s::numeric, %s::numeric)")
# -- take cost tokens from a bucket, or reserve them: 0 when taken, else the seconds
# -- until they are due (PD000: unknown bucket, bad cost)
ACQUIRE = nullable("SELECT pgdurable.acquire_tokens(%s::text, %s::numeric)", float)
# -- start a run with a concurrency key, at a time or after a delay (the start's
# -- parameters, then key, at, delay); answers Started
START_FLOW = started(
    "SELECT run_id, created FROM pgdurable.start_run_flow(%s::text, %s::text, %s::jsonb, "
    "%s::text, %s::integer, %s::integer, %s::text, %s::interval, %s::timestamptz, "
    "%s::numeric, %s::text, %s::timestamptz, %s::interval)"
)
