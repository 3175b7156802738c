"""Start many runs in one statement: ``start_many``.

``await app.start_many([Start("agent", {"n": 1}), Start("agent", {"n": 2}), ...])``
(and ``client.start_many`` / ``pgdurable.contrib.sqlalchemy.start_many``)
validates every start exactly as :meth:`pgdurable.Durable.start` does (the same
helpers: :func:`pgdurable.app.durable.start_params`, :func:`pgdurable.runs.flow.start_flow_params`,
:func:`pgdurable.runs.metadata.check_metadata`), then inserts all the runs with ONE
call of ``pgdurable.start_runs`` (``sql/0021_start_many.sql``): one INSERT of N
rows and at most one ``NOTIFY pgdurable_wake`` per queue, in one transaction.

Contract:

* All or nothing: bad input in any start raises its typed error (``TypeError``,
  ``ValueError``, :class:`~pgdurable.UnknownTask`, with a note naming the
  start's index) before any SQL, and nothing is written; a start the database
  refuses fails the whole call, nothing written.
* The ids come back in input order. An ``idempotency_key`` that exists already
  returns that run's id (nothing written for it); a key repeated inside one
  call starts one run, and every position with that key gets its id.
* ``conn=`` inserts inside the caller's transaction (workers wake on commit
  only), as ``start(conn=...)``.
* Everything :meth:`~pgdurable.Durable.start` accepts per run is accepted per
  :class:`Start`: state, queue, priority, idempotency key, deadline, budget,
  revision, max_attempts, metadata, flow-control key, ``at``/``delay``. The
  caller's trace context (when OpenTelemetry is in use) is stored on every run.

:func:`start_many_sync` (the sync client's) is generated from :func:`start_many` by
``tools/async_to_sync.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, fields
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg

from ..foundation import jsonb as _json
from ..foundation import metrics
from ..foundation.db import translated
from ..foundation.ports import Database, SyncDatabase
from ..foundation.queries.batch_start import START_MANY, START_MANY_BUDGETED
from ..foundation.queries.core import Query, many, many_sync
from ..foundation.registry import TaskRegistry, start_params
from . import flow
from .budgets import budgets_json, split_budget
from .metadata import check_metadata
from .tracing import current_trace_context

__all__ = ["START_MANY", "Start", "start_many", "start_many_params", "start_many_query",
           "start_many_sync"]

_PLAIN = 15  # start_many_params' parameters without budgets



@dataclass(frozen=True)
class Start:
    """One run for :meth:`pgdurable.Durable.start_many`: the arguments of
    :meth:`~pgdurable.Durable.start`, with the same defaults and meaning."""

    task: str
    state: Any = None
    _: KW_ONLY
    queue: str = "default"
    priority: int = 0
    idempotency_key: str | None = None
    deadline: Any = None
    budget: float | Mapping[str, float] | None = None
    revision: str | None = None
    max_attempts: int | None = None
    metadata: dict[str, Any] | None = None
    key: str | None = None
    at: datetime | None = None
    delay: timedelta | None = None
    budgets: list[str] | None = None


R = TypeVar("R")


def as_record(cls: type[R], item: object, required: tuple[str, ...], noun: str) -> R:
    """``item`` as a ``cls`` (a dataclass of a batch's arguments: :class:`Start`,
    :class:`~pgdurable.Child`): itself, or built from a dict of its fields; an unknown or
    missing field, or anything else, is a TypeError naming the ``noun``."""
    if isinstance(item, cls):
        return item
    if isinstance(item, Mapping):
        known = sorted(f.name for f in fields(cls))  # type: ignore[arg-type]
        unknown = sorted(str(k) for k in item if k not in known)
        if unknown:
            raise TypeError(f"unknown {noun} argument(s) {unknown}; known: {known}")
        if any(r not in item for r in required):
            raise TypeError(f"a {noun} needs " + " and ".join(f"a {r!r}" for r in required))
        return cls(**item)
    raise TypeError(f"each {noun} must be a pgdurable.{cls.__name__} or a dict, "
                    f"not {type(item).__name__}")


def _as_start(item: object) -> Start:
    return as_record(Start, item, ("task",), "start")


def start_many_params(registry: TaskRegistry, starts: Iterable[object]) -> tuple[Any, ...] | None:
    """Validate every start (before any SQL) and return the parameters of
    :data:`~pgdurable.foundation.queries.batch_start.START_MANY`, or ``None`` for no starts. The first bad start raises its
    error (with a note ``start_many: start #i``)."""
    if isinstance(starts, str | bytes | Mapping) or not isinstance(starts, Iterable):
        raise TypeError("start_many takes a list of pgdurable.Start (or dicts)")
    columns: list[list[Any]] = [[] for _ in range(14)]
    budgeted: list[str] = []  # each start's budgets (JSON), when any start has some
    for i, item in enumerate(starts):
        try:
            s = _as_start(item)
            spend_limit, own = split_budget(s.budget)
            params = start_params(
                registry, s.task, s.state, s.queue, s.priority, s.idempotency_key, s.deadline,
                spend_limit, s.revision, s.max_attempts,
            )
            budgets = budgets_json(s.budgets, own)
            flow_params = flow.start_flow_params(params, s.key, s.at, s.delay)
            key, at, delay = (None, None, None) if flow_params is None else flow_params[10:]
            meta = check_metadata(s.metadata)
        except Exception as exc:
            exc.add_note(f"start_many: start #{i}")
            raise
        budget = params[9]
        row = (*params[:9], None if budget is None else str(budget), key, at, delay, meta)
        for col, value in zip(columns, row, strict=True):
            col.append(value)
        if budgets is not None and not budgeted:
            budgeted = ["{}"] * (len(columns[0]) - 1)
        if budgeted:
            budgeted.append(budgets or "{}")
    if not columns[0]:
        return None
    trace = current_trace_context()
    params = (*columns, None if trace is None else _json.dumps(trace, "trace"))
    return (*params, "[" + ",".join(budgeted) + "]") if budgeted else params


def start_many_query(params: tuple[Any, ...]) -> Query[str]:
    """The statement for :func:`start_many_params`' answer: with the runs' budgets
    (one more parameter) when a start named some."""
    return START_MANY_BUDGETED if len(params) > _PLAIN else START_MANY


def _counted(params: tuple[Any, ...], run_ids: list[str]) -> list[str]:
    for task in params[0]:
        metrics.run_started(task)
    return run_ids


# async-to-sync: source
async def start_many(
    db: Database, registry: TaskRegistry, starts: Iterable[object],
    conn: psycopg.AsyncConnection[Any] | None,
) -> list[str]:
    """:meth:`pgdurable.Durable.start_many`: one statement on ``db``'s pool or ``conn``."""
    params = start_many_params(registry, starts)
    if params is None:
        return []
    if conn is None:
        return _counted(params, await many(db, start_many_query(params), params))
    with translated():
        return _counted(params, await many(conn, start_many_query(params), params))
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def start_many_sync(
    db: SyncDatabase, registry: TaskRegistry, starts: Iterable[object],
    conn: psycopg.Connection[Any] | None,
) -> list[str]:
    """:meth:`pgdurable.Durable.start_many`: one statement on ``db``'s pool or ``conn``."""
    params = start_many_params(registry, starts)
    if params is None:
        return []
    if conn is None:
        return _counted(params, many_sync(db, start_many_query(params), params))
    with translated():
        return _counted(params, many_sync(conn, start_many_query(params), params))
# async-to-sync: end
