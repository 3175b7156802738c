"""Private: the checks of a run's arguments (names, ids, start parameters), shared by
the async app, the sync client and the worker (one copy).

The statements the run engine sends live in :mod:`pgdurable.foundation.queries`
(``start``, ``runs``, ``cancel``, ``signals``, ``claim``, ``steps``, ``run_end``,
``effects``) with their typed rows; this module re-exports their SQL text and records
under the old names (``CLAIM``, ``RENEW``, ``GET_RUN``, ``ClaimedRun``, ``RunInfo``, ...)."""

from __future__ import annotations

import math
import traceback as _tb
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from . import jsonb as _json
from .errors import RunNotFound, recorded_checkpoint
from .queries import cancel as _cancel
from .queries import claim as _claim
from .queries import effects as _effects
from .queries import run_end as _run_end
from .queries import runs as _runs
from .queries import signals as _signals
from .queries import start as _start
from .queries import steps as _steps
from .queries.claim import ClaimedRun
from .queries.runs import TERMINAL, RunInfo

__all__ = [
    "ACK_CANCEL", "CANCEL", "CHECKPOINT", "CLAIM", "COMPLETE", "EFFECT_BEGIN", "EFFECT_FINISH",
    "FAIL", "GET_RUN", "MARK_INCOMPATIBLE", "MAX_ATTEMPTS", "MAX_DEADLINE", "MAX_NAME_BYTES",
    "NEXT_WAKEUP", "NOTIFY_QUEUES", "PARK", "RELEASE", "RENEW", "RUN_STEP", "SIGNAL",
    "SIGNAL_RUN", "START", "TERMINAL", "WRITE_STEPS", "ClaimedRun", "RunInfo",
    "check_max_attempts", "check_name", "check_run_id", "check_size", "error_record",
    "jsonb_text", "parse_run", "start_params",
]

#: The statements of the run engine, named in :mod:`pgdurable.foundation.queries` (one
#: module per noun, each with its typed row): their SQL text stays importable here under
#: the old names for the modules that still send it themselves (the engine, the app)
#: until their branches of issue 39 land.
START = _start.START.sql
GET_RUN = _runs.GET_RUN.sql
CANCEL = _cancel.CANCEL.sql
ACK_CANCEL = _cancel.ACK_CANCEL.sql
SIGNAL = _signals.SIGNAL.sql
SIGNAL_RUN = _signals.SIGNAL_RUN.sql
PARK = _signals.PARK.sql
CLAIM = _claim.CLAIM.sql
NEXT_WAKEUP = _claim.NEXT_WAKEUP.sql
NOTIFY_QUEUES = _claim.NOTIFY_QUEUES.sql
RENEW = _steps.RENEW.sql
CHECKPOINT = _steps.CHECKPOINT.sql
WRITE_STEPS = _steps.WRITE_STEPS.sql
RUN_STEP = _steps.RUN_STEP.sql
COMPLETE = _run_end.COMPLETE.sql
RELEASE = _run_end.RELEASE.sql
FAIL = _run_end.FAIL.sql
MARK_INCOMPATIBLE = _run_end.MARK_INCOMPATIBLE.sql
EFFECT_BEGIN = _effects.EFFECT_BEGIN.sql
EFFECT_FINISH = _effects.EFFECT_FINISH.sql


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


def parse_run(row: tuple[Any, ...] | None, run_id: uuid.UUID) -> RunInfo:
    """A :data:`GET_RUN` row as :class:`RunInfo`; RunNotFound for no row."""
    info = _runs.GET_RUN.first(row)
    if info is None:
        raise RunNotFound(f"no run {run_id}")
    return info


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
