"""pgdurable: durable AI-agent runs on PostgreSQL alone.

A run's state lives in Postgres; short-lived workers lease it, execute steps,
checkpoint after each one, and let go. See the README for the concepts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._runs_sql import MAX_NAME_BYTES
from .children import TreeNode
from .durable_runs import DurableRunContext
from .effects import with_idempotency, with_idempotency_sync
from .errors import (
    AttemptsExhausted,
    BudgetExceeded,
    CorruptCheckpoint,
    DatabaseUnavailable,
    DeadlineExceeded,
    EffectFailed,
    IncompatibleCheckpoint,
    InvalidInput,
    LeaseLost,
    MigrationError,
    PermissionDenied,
    PgDurableError,
    ProviderClosed,
    ReconcileFailed,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunNotFound,
    SchemaVersionMismatch,
    SignalConflict,
    UnknownTask,
)
from .leases import (
    AsyncLeaseProvider,
    AsyncNoopLeaseProvider,
    AsyncPostgresLeaseProvider,
    LeaseGrant,
    LeaseKeeper,
    LeaseProvider,
    NoopLeaseProvider,
    PostgresLeaseProvider,
    is_lease_provider,
    is_noop_lease_provider,
    keep_lease,
    resolve_async_lease_provider,
    resolve_lease_provider,
)
from .migrations import check_schema, migrate, migration_status, required_version
from .roles import grant_roles
from .runs import Durable, DurableClient, RunInfo, Task
from .search import Page, RunSummary
from .steps import Continue, Done, RunContext, Sleep, StepResult, Wait
from .stream import StreamEvent
from .tasks import (
    DurableCheckpoint,
    DurableContext,
    DurableStep,
    DurableStore,
    DurableTask,
    MemoryDurableStore,
    PostgresDurableStore,
    define_durable_task,
)
from .threads import Delivery, Message, ThreadRoute

if TYPE_CHECKING:
    from .worker import Worker


def __getattr__(name: str) -> Any:
    # pgdurable.worker is imported lazily so that `python -m pgdurable.worker`
    # runs it without a second, already-imported copy (runpy warning).
    if name == "Worker":
        from .worker import Worker

        return Worker
    raise AttributeError(f"module 'pgdurable' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "MAX_NAME_BYTES",
    "Continue",
    "Done",
    "Durable",
    "DurableClient",
    "RunContext",
    "RunInfo",
    "Page",
    "RunSummary",
    "Sleep",
    "StepResult",
    "Task",
    "Wait",
    "Delivery",
    "Message",
    "StreamEvent",
    "ThreadRoute",
    "Worker",
    "AsyncLeaseProvider",
    "AsyncNoopLeaseProvider",
    "AsyncPostgresLeaseProvider",
    "LeaseGrant",
    "LeaseKeeper",
    "LeaseProvider",
    "NoopLeaseProvider",
    "PostgresLeaseProvider",
    "is_lease_provider",
    "is_noop_lease_provider",
    "keep_lease",
    "resolve_async_lease_provider",
    "resolve_lease_provider",
    "AttemptsExhausted",
    "BudgetExceeded",
    "CorruptCheckpoint",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "EffectFailed",
    "IncompatibleCheckpoint",
    "InvalidInput",
    "LeaseLost",
    "MigrationError",
    "PermissionDenied",
    "PgDurableError",
    "ProviderClosed",
    "ReconcileFailed",
    "ResultTimeout",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
    "TreeNode",
    "SchemaVersionMismatch",
    "SignalConflict",
    "UnknownTask",
    "check_schema",
    "migrate",
    "grant_roles",
    "migration_status",
    "required_version",
    "DurableCheckpoint",
    "DurableContext",
    "DurableRunContext",
    "DurableStep",
    "DurableStore",
    "DurableTask",
    "MemoryDurableStore",
    "PostgresDurableStore",
    "define_durable_task",
    "with_idempotency",
    "with_idempotency_sync",
]
