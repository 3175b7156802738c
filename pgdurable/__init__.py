"""pgdurable: durable AI-agent runs on PostgreSQL alone.

A run's state lives in Postgres; short-lived workers lease it, execute steps,
checkpoint after each one, and let go. See the README for the concepts.
"""

from __future__ import annotations

from ._runs_sql import MAX_NAME_BYTES
from .affinity import Affinity
from .batch_start import Start
from .children import TreeNode
from .durable_runs import NOT_PERFORMED, DurableRunContext
from .effects import with_idempotency, with_idempotency_sync

# the engine's Worker (pgdurable/worker.py, the `python -m` entry point, is not
# imported here: runpy would warn about a second, already-imported copy)
from .engine.worker import Worker
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
    RevisionNotServed,
    RunCancelled,
    RunFailed,
    RunNotFound,
    ScheduleNotFound,
    SchemaVersionMismatch,
    SignalConflict,
    StepHung,
    StepNotRecorded,
    StepTimeout,
    UnknownTask,
    ValueTooLarge,
)
from .flow import RateLimited
from .fork import ForkedRun
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
from .pooler import Pooler
from .roles import grant_roles
from .runs import Durable, DurableClient, RunInfo, Task
from .schedules import Schedule, ScheduleInfo
from .search import Page, RunSummary
from .steps import Continue, Done, RunContext, Sleep, StepResult, Wait
from .stream import StreamEvent
from .tasks import (
    CancelSignal,
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
from .workflows import (
    NonDeterministicWorkflow,
    StepFailed,
    StepPolicy,
    WaitTimeout,
    WorkflowContext,
)

__version__ = "0.1.0"

__all__ = [
    "MAX_NAME_BYTES",
    "NOT_PERFORMED",
    "Affinity",
    "Continue",
    "Done",
    "Durable",
    "DurableClient",
    "RunContext",
    "RunInfo",
    "Page",
    "RunSummary",
    "Sleep",
    "Start",
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
    "RateLimited",
    "ReconcileFailed",
    "ResultTimeout",
    "RevisionNotServed",
    "StepHung",
    "StepNotRecorded",
    "StepTimeout",
    "ForkedRun",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
    "TreeNode",
    "ScheduleNotFound",
    "SchemaVersionMismatch",
    "SignalConflict",
    "UnknownTask",
    "ValueTooLarge",
    "check_schema",
    "migrate",
    "grant_roles",
    "migration_status",
    "required_version",
    "Pooler",
    "CancelSignal",
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
    "NonDeterministicWorkflow",
    "StepFailed",
    "StepPolicy",
    "WaitTimeout",
    "WorkflowContext",
    "Schedule",
    "ScheduleInfo",
]
