"""pgdurable: durable AI-agent runs on PostgreSQL alone.

A run's state lives in Postgres; short-lived workers lease it, execute steps,
checkpoint after each one, and let go. See the README for the concepts.
"""

from __future__ import annotations

from .errors import (
    BudgetExceeded,
    CorruptCheckpoint,
    DatabaseUnavailable,
    DeadlineExceeded,
    EffectFailed,
    IncompatibleCheckpoint,
    InvalidInput,
    LeaseLost,
    MigrationError,
    PgDurableError,
    ProviderClosed,
    ReconcileFailed,
    RunCancelled,
    RunNotFound,
    SchemaVersionMismatch,
    SignalConflict,
    UnknownTask,
)
from .migrations import check_schema, migrate, migration_status, required_version

__version__ = "0.1.0"

__all__ = [
    "BudgetExceeded",
    "CorruptCheckpoint",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "EffectFailed",
    "IncompatibleCheckpoint",
    "InvalidInput",
    "LeaseLost",
    "MigrationError",
    "PgDurableError",
    "ProviderClosed",
    "ReconcileFailed",
    "RunCancelled",
    "RunNotFound",
    "SchemaVersionMismatch",
    "SignalConflict",
    "UnknownTask",
    "check_schema",
    "migrate",
    "migration_status",
    "required_version",
]
