"""SQLAlchemy Core ``Table`` objects for the pgdurable schema (read them; write through the API).

::

    from sqlalchemy import func, select
    from pgdurable.contrib.sqlalchemy.tables import runs

    stmt = select(runs.c.status, func.count()).group_by(runs.c.status)

Every table lives in ``metadata`` (schema ``pgdurable``). The column meanings are
the ``COMMENT ON`` texts of the SQL migrations (``\\d+ pgdurable.runs`` in psql).
State transitions are SQL functions: insert, update or delete rows through
:class:`pgdurable.Durable`, :mod:`pgdurable.contrib.sqlalchemy` or those
functions, never with these tables, or you bypass the lease fence and the
NOTIFYs. Views (``active_leases``, ``run_overview``, ``queue_stats``,
``waiting_runs``; see ``views``) are declared as tables for ``select()`` only.
Relations added by later migrations (threads, ...) get their ``Table`` here
when they settle; the drift test lists those still missing. A test reflects the migrated schema and compares every table defined
here (columns, types, nullability, defaults, primary and foreign keys), so
they cannot drift; never ``metadata.create_all()`` them: run the migrations.
"""

from __future__ import annotations

from sqlalchemy import (
    TIMESTAMP,
    BigInteger,
    Boolean,
    Column,
    Computed,
    FetchedValue,
    ForeignKey,
    Identity,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, INTERVAL, JSONB, UUID

__all__ = [
    "active_leases",
    "checkpoints",
    "effects",
    "idempotency_keys",
    "leases",
    "metadata",
    "queue_stats",
    "run_events",
    "run_overview",
    "runs",
    "schema_migrations",
    "signal_history",
    "signals",
    "task_checkpoints",
    "views",
    "waiting_runs",
]

#: All pgdurable tables and views, in schema ``pgdurable``.
metadata = MetaData(schema="pgdurable")

_TZ = TIMESTAMP(timezone=True)


def _ts(name: str, *, nullable: bool = True, default: bool = False) -> Column[object]:
    if default:
        return Column(name, _TZ, server_default=FetchedValue(), nullable=nullable)
    return Column(name, _TZ, nullable=nullable)


runs = Table(
    "runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True, server_default=FetchedValue()),
    Column("task", Text, nullable=False),
    Column("revision", Text, nullable=False),
    Column("queue", Text, nullable=False, server_default=FetchedValue()),
    Column("priority", Integer, nullable=False, server_default=FetchedValue()),
    Column("status", Text, nullable=False, server_default=FetchedValue()),
    Column("state", JSONB, nullable=False, server_default=FetchedValue()),
    Column("step", Integer, nullable=False, server_default=FetchedValue()),
    Column("attempts", Integer, nullable=False, server_default=FetchedValue()),
    Column("max_attempts", Integer, nullable=False, server_default=FetchedValue()),
    Column("claims", Integer, nullable=False, server_default=FetchedValue()),
    Column("idempotency_key", Text),
    _ts("available_at", nullable=False, default=True),
    _ts("deadline_at"),
    Column("budget", Numeric),
    Column("spent", Numeric, nullable=False, server_default=FetchedValue()),
    Column("lease_owner", Text),
    Column("lease_token", BigInteger, nullable=False, server_default=FetchedValue()),
    _ts("lease_expires_at"),
    _ts("leased_at"),
    Column("wait_kind", Text),
    Column("wait_ref", Text),
    _ts("wait_since"),
    _ts("wake_at"),
    Column("wake", JSONB),
    Column("result", JSONB),
    Column("error", JSONB),
    _ts("cancel_requested_at"),
    _ts("created_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    _ts("finished_at"),
    Column("reclaims", Integer, nullable=False, server_default=FetchedValue()),
    Column("thread_key", Text),
    Column("thread_no", Integer),
    Column("parent_run_id", UUID(as_uuid=True)),
    Column("root_run_id", UUID(as_uuid=True)),
    Column("child_key", Text),
    Column("parent_policy", Text),
    Column("concurrency_key", Text, nullable=False, server_default=FetchedValue()),
    # no foreign key (0022): set to NULL by retention when the source run is pruned
    Column("forked_from", UUID(as_uuid=True)),
    Column("forked_from_step", Integer),
    Column("progress", JSONB),
    _ts("heartbeat_at"),
    Column("metadata", JSONB),
    Column("trace_context", JSONB),
    # the inserting transaction's id (0029, NULL on older rows): tag_started_run's test
    Column("created_xact", BigInteger, server_default=FetchedValue()),
    # the worker holding the run's stateful service (0032, docs/affinity.md)
    Column("affinity_worker", Text),
    Column("affinity_instance", Text),
    Column("affinity_mode", Text),
    Column("affinity_wait", INTERVAL),
    Column("affinity_info", JSONB),
    _ts("affinity_since"),
    comment="Durable runs: the run lives here, workers only lease it. state is the latest checkpoint.",
)

leases = Table(
    "leases",
    metadata,
    Column("key", BYTEA, nullable=False),
    Column("key_hash", BYTEA, Computed("sha256(key)", persisted=True), primary_key=True),
    Column("owner", BYTEA),
    Column("token", BigInteger, nullable=False, server_default=FetchedValue()),
    _ts("expires_at"),
    _ts("acquired_at"),
    _ts("renewed_at"),
    comment="Distributed leases: at most one live owner per key (keys and owners are UTF-8 bytes).",
)

checkpoints = Table(
    "checkpoints",
    metadata,
    # no foreign key to runs (0022): written under the run's lock, deleted by retention
    Column("run_id", UUID(as_uuid=True), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("token", BigInteger, nullable=False),
    Column("state", JSONB, nullable=False),
    # the partition key (daily partitions): part of the primary key
    Column("created_at", _TZ, primary_key=True, server_default=FetchedValue(), nullable=False),
    Column("wake", JSONB),
    # the lease owner (worker id) that wrote it; NULL before migration 0020 and for fork copies
    Column("owner", Text),
    comment="Per-step checkpoint history of each run (the latest one is also runs.state).",
)

signals = Table(
    "signals",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("kind", Text, nullable=False),
    Column("ref", Text, nullable=False),
    Column("payload", JSONB),
    Column("signal_id", Text),
    Column("run_id", UUID(as_uuid=True)),  # no foreign key (0022)
    _ts("created_at", nullable=False, default=True),
    _ts("expires_at"),
    Column("consumed_by", UUID(as_uuid=True)),
    _ts("consumed_at"),
    Column("woke", ARRAY(UUID(as_uuid=True)), nullable=False, server_default=FetchedValue()),
    comment="Signals: delivered (consumed) and pending ones, by (kind, ref).",
)

signal_history = Table(
    "signal_history",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("ref", Text, nullable=False),
    Column("payload", JSONB),
    Column("signal_id", Text),
    Column("run_id", UUID(as_uuid=True)),
    _ts("created_at", nullable=False),
    _ts("expires_at"),
    Column("consumed_by", UUID(as_uuid=True)),
    # the partition key (daily partitions): part of the primary key
    Column("consumed_at", _TZ, primary_key=True, nullable=False),
    Column("woke", ARRAY(UUID(as_uuid=True)), nullable=False, server_default=FetchedValue()),
    comment="Consumed signals moved out of signals (partitioned by consumed_at).",
)

effects = Table(
    "effects",
    metadata,
    Column("run_id", UUID(as_uuid=True), ForeignKey("pgdurable.runs.id", ondelete="CASCADE"),
           primary_key=True),
    Column("key", Text, primary_key=True),
    Column("status", Text, nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("result", JSONB),
    Column("error", JSONB),
    _ts("created_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    Column("step", Integer),
    comment="Side effects of runs, keyed per run: a recorded result is returned instead of acting twice.",
)

run_events = Table(
    "run_events",
    metadata,
    Column("run_id", UUID(as_uuid=True), primary_key=True),  # no foreign key (0022)
    Column("seq", BigInteger, primary_key=True),
    Column("event", JSONB, nullable=False),
    # the partition key (daily partitions): part of the primary key
    Column("created_at", _TZ, primary_key=True, server_default=FetchedValue(), nullable=False),
    Column("step", Integer),
    Column("idx", Integer),
    Column("token", BigInteger),
    Column("final", Boolean, nullable=False, server_default=FetchedValue()),
    comment="Output stream of each run (tokens, tool calls, progress), replayable from a cursor.",
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", Text, primary_key=True),
    Column("status", Text, nullable=False),
    Column("owner", Text),
    Column("result", JSONB),
    Column("error", JSONB),
    _ts("created_at", nullable=False, default=True),
    _ts("expires_at", nullable=False),
    comment="with_idempotency: one execution per key; later callers get the stored result.",
)

task_checkpoints = Table(
    "task_checkpoints",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("record", JSONB, nullable=False),
    _ts("updated_at", nullable=False, default=True),
    comment="Checkpoint records of durable task definitions (define_durable_task), one per task id.",
)

schema_migrations = Table(
    "schema_migrations",
    metadata,
    Column("version", Integer, primary_key=True),
    Column("name", Text, nullable=False),
    Column("sha256", Text, nullable=False),
    _ts("applied_at", nullable=False, default=True),
    comment="Applied pgdurable migrations: one row per sql/NNNN_name.sql file.",
)

queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("concurrency", Integer),
    Column("per_key_concurrency", Integer),
    Column("rate", Numeric),
    Column("burst", Numeric),
    Column("tokens", Numeric, nullable=False, server_default=FetchedValue()),
    _ts("refilled_at", nullable=False, default=True),
    Column("key_cursor", Text),
    _ts("updated_at", nullable=False, default=True),
    comment="Flow limits of a queue (set_queue), enforced inside claim_runs; no row = unlimited.",
)

buckets = Table(
    "buckets",
    metadata,
    Column("name", Text, primary_key=True),
    Column("rate", Numeric, nullable=False),
    Column("burst", Numeric, nullable=False),
    Column("tokens", Numeric, nullable=False),
    _ts("refilled_at", nullable=False, default=True),
    _ts("updated_at", nullable=False, default=True),
    comment="Named token buckets shared by every process (ctx.acquire); set with set_bucket.",
)

# -- views (read-only) ---------------------------------------------------------

active_leases = Table(
    "active_leases",
    metadata,
    Column("key", Text),
    Column("owner", Text),
    Column("token", BigInteger),
    _ts("acquired_at"),
    _ts("expires_at"),
    Column("ttl_remaining", INTERVAL),
    Column("key_bytes", BYTEA),
    Column("owner_bytes", BYTEA),
    comment="VIEW: live leases with key and owner shown readably (key_bytes/owner_bytes exact).",
)

run_overview = Table(
    "run_overview",
    metadata,
    Column("id", UUID(as_uuid=True)),
    Column("task", Text),
    Column("revision", Text),
    Column("queue", Text),
    Column("status", Text),
    Column("priority", Integer),
    Column("step", Integer),
    Column("attempts", Integer),
    Column("max_attempts", Integer),
    Column("reclaims", Integer),
    Column("worker", Text),
    _ts("lease_expires_at"),
    Column("lease_expired", Boolean),
    Column("wait_kind", Text),
    Column("wait_ref", Text),
    _ts("wait_since"),
    _ts("wake_at"),
    Column("cancel_requested", Boolean),
    Column("error_type", Text),
    Column("error_message", Text),
    _ts("created_at"),
    _ts("updated_at"),
    _ts("finished_at"),
    Column("age", INTERVAL),
    comment="VIEW: one readable line per run (pgdurable runs).",
)

queue_stats = Table(
    "queue_stats",
    metadata,
    Column("queue", Text),
    Column("runnable", BigInteger),
    Column("due", BigInteger),
    Column("leased", BigInteger),
    Column("expired_leases", BigInteger),
    Column("waiting", BigInteger),
    Column("completed", BigInteger),
    Column("failed", BigInteger),
    Column("cancelled", BigInteger),
    Column("oldest_runnable_age", INTERVAL),
    comment="VIEW: run counts per queue and status (pgdurable stats).",
)

waiting_runs = Table(
    "waiting_runs",
    metadata,
    Column("run_id", UUID(as_uuid=True)),
    Column("task", Text),
    Column("queue", Text),
    Column("waits_for", Text),
    Column("kind", Text),
    Column("ref", Text),
    _ts("wait_since"),
    _ts("wake_at"),
    Column("waited", INTERVAL),
    Column("wakes_in", INTERVAL),
    _ts("deadline_at"),
    Column("pending_signals", BigInteger),
    comment="VIEW: parked runs, what each waits for, and pending signals for it.",
)

#: Names of the entries of ``metadata`` that are views, not tables.
views: frozenset[str] = frozenset({"active_leases", "queue_stats", "run_overview", "waiting_runs"})
