"""pgdurable: durable AI-agent runs on PostgreSQL alone.

A run's state lives in Postgres; short-lived workers lease it, execute steps,
checkpoint after each one, and let go. See the README for the concepts.
"""

from __future__ import annotations

from .app.durable import Durable, DurableClient, RunInfo, Task

# the engine's Worker (pgdurable/ops/worker_process.py, the `python -m` entry point, is not
# imported here: runpy would warn about a second, already-imported copy)
from .engine.worker import Worker
from .foundation.affinity import Affinity
from .foundation.db import resolve_dsn
from .foundation.effects import with_idempotency, with_idempotency_sync
from .foundation.errors import (
    AttemptsExhausted,
    BudgetExceeded,
    BudgetNotFound,
    CorruptCheckpoint,
    DatabaseUnavailable,
    DeadlineExceeded,
    EffectFailed,
    EventConflict,
    IncompatibleCheckpoint,
    InvalidInput,
    LeaseLost,
    MigrationError,
    PermissionDenied,
    PgDurableError,
    ProviderClosed,
    ReadOnlyDatabase,
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
    ThreadBusy,
    UnknownTask,
    ValueTooLarge,
)
from .foundation.leases import (
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
from .foundation.migrations import check_schema, migrate, migration_status, required_version
from .foundation.pooler import Pooler
from .foundation.run_queries import MAX_NAME_BYTES
from .foundation.schemas import use_schema
from .models.durable_runs import NOT_PERFORMED, DurableRunContext
from .models.durable_tasks import (
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
from .models.workflows import (
    NonDeterministicWorkflow,
    StepFailed,
    StepPolicy,
    WaitTimeout,
    WorkflowContext,
)
from .ops.roles import grant_roles
from .runs.batch_start import Start
from .runs.budgets import write_settlements
from .runs.children import Child, TreeNode
from .runs.events import Event, EventTrigger, SentEvent
from .runs.flow import RateLimited
from .runs.fork import ForkedRun
from .runs.schedules import Schedule, ScheduleInfo
from .runs.search import Page, RunSummary
from .runs.steps import Continue, Done, RunContext, Sleep, StepResult, Wait
from .runs.stream import StreamEvent
from .runs.threads import Delivery, Message, ThreadRoute

__version__ = "0.1.0"

__all__ = [
    "MAX_NAME_BYTES",
    "NOT_PERFORMED",
    "Affinity",
    "Child",
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
    "resolve_dsn",
    "resolve_lease_provider",
    "use_schema",
    "AttemptsExhausted",
    "BudgetExceeded",
    "BudgetNotFound",
    "CorruptCheckpoint",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "EffectFailed",
    "Event",
    "EventConflict",
    "EventTrigger",
    "SentEvent",
    "IncompatibleCheckpoint",
    "InvalidInput",
    "LeaseLost",
    "MigrationError",
    "PermissionDenied",
    "PgDurableError",
    "ProviderClosed",
    "RateLimited",
    "ReadOnlyDatabase",
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
    "ThreadBusy",
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
    "write_settlements",
]
