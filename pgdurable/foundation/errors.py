"""The pgdurable error tree: one base class, a shallow hierarchy.

Every error pgdurable raises derives from :class:`PgDurableError`. Errors raised
inside SQL functions carry a custom SQLSTATE (``PD001`` ...); :func:`translate`
maps a psycopg error to its pgdurable class by ``sqlstate``, in one place.

Bad input is reported with the builtin :class:`TypeError` / :class:`ValueError`
*before* any SQL runs, as Python users expect; :class:`InvalidInput` is the
pgdurable flavour of ``ValueError`` for input rejected by the database itself.
"""

from __future__ import annotations

from typing import Any, ClassVar

import psycopg

__all__ = [
    "is_terminal",
    "mark_terminal",
    "AttemptsExhausted",
    "BudgetExceeded",
    "BudgetNotFound",
    "CorruptCheckpoint",
    "DatabaseUnavailable",
    "DeadlineExceeded",
    "EffectFailed",
    "EventConflict",
    "IncompatibleCheckpoint",
    "InvalidInput",
    "LeaseLost",
    "MigrationError",
    "PermissionDenied",
    "PgDurableError",
    "ProviderClosed",
    "ReadOnlyDatabase",
    "ReconcileFailed",
    "ResultTimeout",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
    "ScheduleNotFound",
    "SchemaVersionMismatch",
    "SignalConflict",
    "ThreadBusy",
    "UnknownTask",
    "ValueTooLarge",
    "translate",
]


class PgDurableError(Exception):
    """Base class of every error pgdurable raises.

    ``sqlstate`` is the custom SQLSTATE a SQL function raises for this error
    (``None`` when the error only originates in Python).
    """

    sqlstate: ClassVar[str | None] = None
    _by_sqlstate: ClassVar[dict[str, type[PgDurableError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("sqlstate")
        if code is not None:
            if code in PgDurableError._by_sqlstate:
                raise RuntimeError(f"duplicate pgdurable SQLSTATE {code}")
            PgDurableError._by_sqlstate[code] = cls


class MigrationError(PgDurableError):
    """A migration could not be applied, or an applied migration was edited."""


class SchemaVersionMismatch(PgDurableError):
    """The database schema is older than this library needs: run ``pgdurable migrate``."""


class DatabaseUnavailable(PgDurableError):
    """The database could not be reached (wrong host, port, database, or it went away).

    Raised by a write (``start``, ``signal``, ``send``, ...), the outcome is
    unknown: the connection may have dropped after the commit. Retry with the
    same ``idempotency_key`` / ``signal_id`` / ``message_id``: it takes effect once.
    """


class ProviderClosed(PgDurableError):
    """The provider, client or pool was closed; no operation was attempted."""


class InvalidInput(PgDurableError, ValueError):
    """Input rejected by the database (checked again there, after Python's checks)."""

    sqlstate = "PD000"


class LeaseLost(PgDurableError):
    """The lease (or run claim) is no longer held by this owner/token: stop writing."""

    sqlstate = "PD001"


class RunNotFound(PgDurableError, LookupError):
    """No run has this id."""

    sqlstate = "PD002"


class UnknownTask(PgDurableError, LookupError):
    """No task of this name is registered."""

    sqlstate = "PD003"


class IncompatibleCheckpoint(PgDurableError):
    """A checkpoint belongs to another definition id or revision; it is not repaired."""

    sqlstate = "PD004"


class CorruptCheckpoint(PgDurableError):
    """A checkpoint's state fails the task's validator; it is not repaired."""

    sqlstate = "PD005"


class DeadlineExceeded(PgDurableError):
    """The run's or task's deadline has passed."""

    sqlstate = "PD006"


class BudgetExceeded(PgDurableError):
    """The run spent more than its budget, or a reservation could not be had
    from a budget whose policy is ``fail`` (``budget`` names it)."""

    sqlstate = "PD007"
    #: The budget's key when a ledger budget decided (``ctx.reserve``), else None.
    budget: str | None = None


class BudgetNotFound(PgDurableError, LookupError):
    """No budget has this key (``start(budgets=[...])``): nothing was written."""

    sqlstate = "PD016"


class SignalConflict(PgDurableError):
    """The same signal or message id was sent again with a different payload."""

    sqlstate = "PD008"


class RunCancelled(PgDurableError):
    """The run was cancelled."""

    sqlstate = "PD009"
    #: The cancel signal's ``reason`` (a durable task's AbortSignal), when known.
    reason: Any = None


class EffectFailed(PgDurableError):
    """A recorded side effect failed; its stored error is re-raised to later callers."""

    sqlstate = "PD010"
    #: The stored error, ``{"type": ..., "message": ...}``, when known.
    error: dict[str, Any] | None = None


class ReconcileFailed(PgDurableError):
    """A ``reconcile`` step could not establish the real outcome; the application decides."""

    sqlstate = "PD011"


class AttemptsExhausted(PgDurableError):
    """A task or run was attempted more than its ``max_attempts``; it is failed, not retried."""

    sqlstate = "PD012"


class ValueTooLarge(InvalidInput):
    """A value is larger than pgdurable stores (a pubsub event over 1 MiB of JSON,
    a lease owner over 64 KiB): nothing changed. A :class:`ValueError` too."""

    sqlstate = "PD013"


class ThreadBusy(PgDurableError):
    """A message sent with ``double_text="reject"`` to a thread whose owner run is
    answering (unfinished and not parked on its inbox): nothing was stored."""

    sqlstate = "PD014"


class EventConflict(PgDurableError):
    """An event was sent with the id of an earlier event of the same name but other
    data: nothing was stored (a resend with the same data is a no-op)."""

    sqlstate = "PD015"


class PermissionDenied(PgDurableError):
    """The database role lacks a privilege for this operation (SQLSTATE 42501,
    ``insufficient_privilege``): grant it, or connect as the role that has it."""

    sqlstate = "42501"
class ReadOnlyDatabase(PgDurableError):
    """The server refused a write because it is read-only (SQLSTATE 25006,
    ``read_only_sql_transaction``): a standby, or an old primary that came back
    read-only after a failover. Nothing was written. Retrying on the same
    server cannot succeed: point the DSN at the primary, or list every host and
    let libpq find the one that takes writes
    (``host=a,b target_session_attrs=read-write``). A worker that meets it
    stops (see docs/scaling.md, "Failover")."""

    sqlstate = "25006"

    def __init__(self, message: str = "the server is read-only") -> None:
        super().__init__(f"{message} (the server is read-only: a standby, or an old primary "
                         "after a failover; point the DSN at the primary or use "
                         "host=a,b target_session_attrs=read-write)")


class RunFailed(PgDurableError):
    """The awaited run ended ``failed`` (or ``incompatible``); ``error`` is its recorded error.

    Raised by ``result()``. ``error`` is ``{"type", "message", "traceback"}``
    as stored in ``runs.error``; ``run_id`` the run's id.
    """

    def __init__(self, message: str, error: dict[str, Any] | None = None,
                 run_id: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.run_id = run_id


class ResultTimeout(PgDurableError, TimeoutError):
    """``result()`` gave up: the run was not finished within the timeout (it goes on)."""
class ScheduleNotFound(PgDurableError, LookupError):
    """No schedule has this name (``pgdurable.schedules``)."""

    sqlstate = "PD160"


def translate(exc: BaseException) -> BaseException:
    """Map a psycopg error to its pgdurable error; return other errors unchanged.

    Custom SQLSTATEs (``PDnnn``) and 42501 (:class:`PermissionDenied`) map to
    their class with the server's message;
    a program limit (SQLSTATE 54000, e.g. a key too large to index) becomes
    :class:`InvalidInput`; connection failures become :class:`DatabaseUnavailable`.
    """
    if isinstance(exc, PgDurableError):
        return exc
    if isinstance(exc, psycopg.Error):
        code = exc.sqlstate
        if code is not None and code in PgDurableError._by_sqlstate:
            diag = exc.diag.message_primary or str(exc)
            err = PgDurableError._by_sqlstate[code](diag)
            err.__cause__ = exc
            return err
        if code == "54000":  # program_limit_exceeded: e.g. an index entry over ~2.7 kB
            err1 = InvalidInput("a value is too large for the database to index "
                                f"(use a shorter key or name): {first_line(str(exc))}")
            err1.__cause__ = exc
            return err1
        if isinstance(exc, psycopg.OperationalError) and (
            code is None or code.startswith(("08", "57P"))
        ):
            err2 = DatabaseUnavailable(first_line(str(exc)) or type(exc).__name__)
            err2.__cause__ = exc
            return err2
    return exc


def first_line(text: str) -> str:
    """The first non-empty line of ``text`` (server messages can span lines)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


class StepNotRecorded(InvalidInput):
    """A fork or rewind named a step the run never checkpointed (see :mod:`pgdurable.runs.fork`)."""

    sqlstate = "PDF01"


class RevisionNotServed(PgDurableError, LookupError):
    """A fork or rewind asked for a revision no worker registered (pass ``force=True``)."""

    sqlstate = "PDF02"


class StepTimeout(PgDurableError, TimeoutError):
    """A step ran past its task's ``step_timeout`` (a failed attempt, retried; see :mod:`pgdurable.runs.liveness`)."""


class StepHung(PgDurableError, TimeoutError):
    """A step did not call ``ctx.heartbeat`` within its task's ``heartbeat_timeout`` (a failed attempt, retried)."""


def mark_terminal(exc: BaseException) -> BaseException:
    """Flag ``exc`` so that the worker ends the run ``failed`` without retrying it."""
    exc.pgdurable_terminal = True  # type: ignore[attr-defined]
    return exc


def is_terminal(exc: BaseException) -> bool:
    """True if ``exc`` was flagged by :func:`mark_terminal`."""
    return getattr(exc, "pgdurable_terminal", False) is True


def mark_recorded(exc: BaseException, checkpoint: int) -> BaseException:
    """Flag ``exc`` as the error recorded by the run's checkpoint ``checkpoint``.

    A workflow step's last error is recorded as a checkpoint; when nobody
    catches it, that record is what fails the run. The run's error then says
    ``"checkpoint": N``, and a retry or a fork of the failed run continues
    from checkpoint N - 1: the step runs again instead of replaying its error
    (``pgdurable._resume_step``, sql/0030).
    """
    exc.pgdurable_checkpoint = checkpoint  # type: ignore[attr-defined]
    return exc


def recorded_checkpoint(exc: BaseException) -> int | None:
    """The checkpoint :func:`mark_recorded` gave ``exc``, or None."""
    n = getattr(exc, "pgdurable_checkpoint", None)
    return n if isinstance(n, int) and not isinstance(n, bool) else None
