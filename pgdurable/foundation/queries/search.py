"""Searching runs (``list_runs``, ``pgdurable runs``, the dashboard's runs page): one page of
the ``run_list`` view, newest first, filtered by what was given
(:mod:`pgdurable.runs.search` validates the filters)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import sql

from .core import Query, Row

__all__ = ["FILTERS", "RunSummary", "list_runs", "summary"]


@dataclass(frozen=True)
class RunSummary:
    """One row of :meth:`~pgdurable.Durable.list_runs` (the ``run_list`` view)."""

    id: str
    task: str
    queue: str
    status: str
    step: int
    attempts: int
    max_attempts: int
    worker: str | None
    lease_expired: bool
    wait_kind: str | None
    wait_ref: str | None
    wake_at: datetime | None
    error_type: str | None
    error_message: str | None
    metadata: dict[str, Any] | None
    parent_run_id: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


def summary(r: Row) -> RunSummary:
    """A row of :func:`list_runs` as a :class:`RunSummary` (its ids as strings)."""
    v = list(r)
    v[0] = str(v[0])
    v[15] = None if v[15] is None else str(v[15])  # parent_run_id
    return RunSummary(*v)


_COLUMNS = (
    "id, task, queue, status, step, attempts, max_attempts, worker, lease_expired, "
    "wait_kind, wait_ref, wake_at, error_type, error_message, metadata, parent_run_id, "
    "created_at, updated_at, finished_at"
)

#: The filters, by name: each a condition on ``run_list`` and its parameters, in order.
FILTERS = {
    "status": "status = ANY(%s::text[])",
    "task": "task = %s::text",
    "queue": "queue = %s::text",
    "metadata": "metadata @> %s::jsonb",
    "since": "created_at >= %s::timestamptz",
    "until": "created_at < %s::timestamptz",
    "id_prefix": "id BETWEEN %s::uuid AND %s::uuid",  # the prefix's lowest and highest id
    "cursor": "(created_at, id) < (%s::timestamptz, %s::uuid)",  # after the last row shown
}


def list_runs(filters: Sequence[str]) -> Query[RunSummary]:
    """A page of runs newest first, under these :data:`FILTERS` (their parameters in
    this order), then the LIMIT (the page's size + 1: one more row says whether a next
    page exists); one RunSummary per row."""
    where = [sql.SQL(FILTERS[name]) for name in filters]
    query = sql.SQL("SELECT {} FROM pgdurable.run_list{} ORDER BY created_at DESC, id DESC "
                    "LIMIT %s").format(
        sql.SQL(_COLUMNS),
        sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where) if where else sql.SQL(""),
    )
    return Query(query.as_string(None), summary)
