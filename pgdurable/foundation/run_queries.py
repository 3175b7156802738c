"""Private: every query the run engine issues, its argument validation and row
parsing, shared by the async app, the sync client and the worker (one copy)."""

from __future__ import annotations

import math
import traceback as _tb
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from . import jsonb as _json
from .affinity import Affinity
from .errors import RunNotFound, recorded_checkpoint
from .queries import engine as _eq
from .queries import schedules as _sq

# -- start a run; returns (run_id, created)
START = (
    "SELECT run_id, created FROM pgdurable.start_run(%s::text, %s::text, %s::jsonb, %s::text, "
    "%s::integer, %s::integer, %s::text, %s::interval, %s::timestamptz, %s::numeric)"
)
# -- one run by id (RunInfo columns)
GET_RUN = """
SELECT id, task, revision, queue, priority, status, state, step, attempts, max_attempts,
       claims, idempotency_key, available_at, deadline_at, budget, spent, lease_owner,
       lease_token, lease_expires_at, wait_kind, wait_ref, wait_since, wake_at, wake,
       result, error, cancel_requested_at, created_at, updated_at, finished_at, reclaims,
       parent_run_id, root_run_id, child_key, parent_policy,
       ARRAY(SELECT c.id::text FROM pgdurable.runs c WHERE c.parent_run_id = r.id
              ORDER BY c.created_at, c.id),
       affinity_worker, affinity_instance, affinity_mode,
       extract(epoch FROM affinity_wait)::float8, affinity_info, affinity_since
  FROM pgdurable.runs r WHERE id = %s::uuid
"""
# -- cancel; returns the resulting status (PD002 if unknown)
CANCEL = "SELECT pgdurable.cancel_run(%s::uuid)"
# -- send a signal (0005: dedup by signal_id, PD008 on conflict); returns the woken run ids
SIGNAL = "SELECT pgdurable.send_signal(%s::text, %s::text, %s::jsonb, %s::text, %s::interval)"
# -- signal one run (0005); returns its id if it woke (PD002 if unknown)
SIGNAL_RUN = "SELECT pgdurable.signal_run(%s::uuid, %s::text, %s::jsonb, %s::text, %s::interval)"
# -- operator opt-in: end unheld runs of (task, revision) as incompatible; returns the count
MARK_INCOMPATIBLE = "SELECT pgdurable.mark_incompatible(%s::text, %s::text, %s::text)"
# -- fenced transitions of the sync client; each returns the resulting status
CHECKPOINT = "SELECT pgdurable.checkpoint_run(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::numeric)"
COMPLETE = "SELECT pgdurable.complete_run(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::jsonb, %s::numeric)"
#: The engine's statements (their SQL text, under the names tests and tools match on):
#: :mod:`pgdurable.foundation.queries.engine` holds them with their typed rows.
CLAIM = _eq.CLAIM.sql
RENEW = _eq.RENEW.sql
NEXT_WAKEUP = _eq.next_wakeup([_sq.WAKEUP_PROBE]).sql  # as the app's worker sends it
WRITE_STEPS = _eq.WRITE_STEPS.sql
RUN_STEP = _eq.RUN_STEP.sql
PARK = _eq.PARK.sql
RELEASE = _eq.RELEASE.sql
FAIL = _eq.FAIL.sql
ACK_CANCEL = _eq.ACK_CANCEL.sql
EFFECT_BEGIN = _eq.EFFECT_BEGIN.sql
EFFECT_FINISH = _eq.EFFECT_FINISH.sql
NOTIFY_QUEUES = _eq.NOTIFY_QUEUES.sql


TERMINAL = frozenset({"completed", "failed", "cancelled", "incompatible"})


MAX_NAME_BYTES = 1000
#: The largest ``max_attempts`` (the column is a 32-bit integer).
MAX_ATTEMPTS = 2**31 - 1
#: The furthest relative deadline accepted (about 1,000 years, as
#: ``MAX_SIGNAL_TTL``): ``now() + deadline`` must stay a timestamp PostgreSQL stores.
MAX_DEADLINE = timedelta(days=365_000)


def check_max_attempts(value: object) -> int:
    """``value`` if it is an int in 1 .. :data:`MAX_ATTEMPTS`, else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise ValueError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS}")
    return value
"""The longest name or key (task, queue, signal kind/ref/id, idempotency key,
message id, ...) in UTF-8 bytes: each is a B-tree index key, some in pairs
(a signal's or a wait's kind and ref), and Postgres refuses index entries over
~2,700 bytes (after compression) with an untyped error."""


def check_name(value: object, what: str) -> str:
    """A non-empty str without NUL, valid UTF-8, at most :data:`MAX_NAME_BYTES`
    bytes; else ``TypeError``/``ValueError`` naming ``what``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value or "\x00" in value:
        raise ValueError(f"{what} must be non-empty and without NUL characters")
    check_size(value, what)
    return value


def check_size(value: str, what: str) -> None:
    """``ValueError`` naming ``what`` if ``value`` is not UTF-8 encodable or
    longer than :data:`MAX_NAME_BYTES` bytes."""
    if len(value) * 4 <= MAX_NAME_BYTES and value.isascii():
        return
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode (it contains a lone surrogate)") from None
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{what} is {size} bytes long; the limit is {MAX_NAME_BYTES} bytes (UTF-8)")


def check_run_id(run_id: object) -> uuid.UUID:
    """A run id (UUID or its string), else TypeError/ValueError."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    if not isinstance(run_id, str):
        raise TypeError(f"run_id must be a str or UUID, not {type(run_id).__name__}")
    try:
        return uuid.UUID(run_id)
    except ValueError:
        raise ValueError(f"run_id {run_id!r} is not a UUID") from None


def start_params(
    task: object,
    revision: str,
    state: object,
    queue: object,
    priority: object,
    max_attempts: int,
    idempotency_key: object,
    deadline: object,
    budget: object,
) -> tuple[Any, ...]:
    """Validate start arguments (before any SQL) and return the START parameters."""
    check_name(task, "task")
    check_name(queue, "queue")
    check_max_attempts(max_attempts)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError("priority must be an int")
    if not -(2**31) <= priority < 2**31:
        raise ValueError("priority must fit in a 32-bit integer")
    if idempotency_key is not None:
        check_name(idempotency_key, "idempotency_key")
    deadline_in: timedelta | None = None
    deadline_at: datetime | None = None
    if deadline is None:
        pass
    elif isinstance(deadline, timedelta):
        if deadline.total_seconds() <= 0:
            raise ValueError("deadline must be a positive timedelta")
        if deadline > MAX_DEADLINE:
            raise ValueError(f"deadline must be at most {MAX_DEADLINE.days} days away")
        deadline_in = deadline
    elif isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError("deadline datetime must be timezone-aware")
        deadline_at = deadline
    else:
        raise TypeError("deadline must be a timedelta, an aware datetime or None")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int | float | Decimal):
            raise TypeError("budget must be a number or None")
        if not math.isfinite(float(budget)) or budget < 0:
            raise ValueError("budget must be finite and >= 0")
    state_json = _json.dumps({} if state is None else state, "state")
    return (
        task, revision, state_json, queue, priority, max_attempts, idempotency_key,
        deadline_in, deadline_at, budget,
    )


@dataclass(frozen=True)
class RunInfo:
    """A snapshot of one run (``get_run``)."""

    id: str
    task: str
    revision: str
    queue: str
    priority: int
    status: str
    state: Any
    step: int
    attempts: int
    max_attempts: int
    claims: int
    idempotency_key: str | None
    available_at: datetime
    deadline_at: datetime | None
    budget: float | None
    spent: float
    lease_owner: str | None
    lease_token: int
    lease_expires_at: datetime | None
    wait_kind: str | None
    wait_ref: str | None
    wait_since: datetime | None
    wake_at: datetime | None
    wake: dict[str, Any] | None
    result: Any
    error: dict[str, Any] | None
    cancel_requested_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    reclaims: int = 0  # expired-lease reclaims since the last checkpoint
    #: The run whose step started this one (``ctx.start_child``), else None.
    parent_run_id: str | None = None
    #: The top-level run of its tree (None for a top-level run).
    root_run_id: str | None = None
    #: Its key within its parent.
    child_key: str | None = None
    #: What happens to it when its parent ends first: "cancel" | "abandon".
    parent_policy: str | None = None
    #: Ids of its children, oldest first.
    children: tuple[str, ...] = ()
    #: Its affinity to the worker holding its service (pgdurable.affinity), or None.
    affinity: Affinity | None = None

    @property
    def terminal(self) -> bool:
        """True when the run is completed, failed, cancelled or incompatible."""
        return self.status in TERMINAL


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def parse_run(row: tuple[Any, ...] | None, run_id: uuid.UUID) -> RunInfo:
    """A GET_RUN row as RunInfo; RunNotFound for no row."""
    if row is None:
        raise RunNotFound(f"no run {run_id}")
    v = list(row)
    v[0] = str(v[0])
    v[14] = _num(v[14])
    v[15] = float(v[15])
    if len(v) > 31:
        v[31] = None if v[31] is None else str(v[31])
        v[32] = None if v[32] is None else str(v[32])
        v[35] = tuple(v[35] or ())
    if len(v) > 36:
        worker, instance, mode, wait, info, since = v[36:42]
        v[36:42] = [None if worker is None else Affinity(worker, instance, mode, wait, info, since)]
    return RunInfo(*v)


def error_record(exc: BaseException) -> dict[str, Any]:
    """``{type, message, traceback}`` of an exception, for runs.error, and
    ``checkpoint`` when the error is a checkpoint's record (:func:`~pgdurable.foundation.errors.mark_recorded`)."""
    record: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(_tb.format_exception(exc))[-16000:],
    }
    checkpoint = recorded_checkpoint(exc)
    if checkpoint is not None:
        record["checkpoint"] = checkpoint
    return record


def jsonb_text(value: Any, what: str) -> str:
    """Validated JSON text for a jsonb parameter."""
    return _json.dumps(value, what)
