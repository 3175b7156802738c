"""Searching runs: ``list_runs`` with filters and keyset pagination.

``await app.list_runs(status="failed", task="agent", metadata={"tenant": "acme"},
since=..., until=..., id_prefix="3f2a", limit=50, cursor=page.next_cursor)``
returns a :class:`Page` of :class:`RunSummary`, newest first (``created_at DESC,
id DESC``). ``next_cursor`` is an opaque string (None on the last page); the
next page starts strictly after the last row shown, so rows started meanwhile
never shift a page (keyset, no OFFSET).

Each query reads the ``pgdurable.run_list`` view (the read-only role may) and
contains only the filters given, so that the planner sees them: the keyset
indexes ``runs_created_idx`` / ``runs_task_created_idx`` /
``runs_queue_created_idx`` walk rows in order and stop after ``limit + 1``
matches, and ``metadata`` can use the GIN index ``runs_metadata_idx``. An id
prefix becomes a range on the primary key.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..foundation.queries import search as sq
from ..foundation.queries.search import RunSummary
from ..foundation.run_queries import check_name
from .metadata import check_metadata

__all__ = ["MAX_LIMIT", "STATUSES", "Page", "RunSummary", "list_runs_query", "make_page"]

STATUSES = ("runnable", "leased", "waiting", "completed", "failed", "cancelled", "incompatible")
#: Largest page.
MAX_LIMIT = 1000

@dataclass(frozen=True)
class Page:
    """A page of runs and the cursor of the next one (None: this is the last)."""

    items: list[RunSummary]
    next_cursor: str | None


def encode_cursor(created_at: datetime, run_id: str) -> str:
    """The opaque cursor after a row."""
    raw = f"{created_at.isoformat()}|{run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: object) -> tuple[datetime, uuid.UUID]:
    """(created_at, id) of a cursor; ValueError/TypeError for anything else."""
    if not isinstance(cursor, str):
        raise TypeError(f"cursor must be a str, not {type(cursor).__name__}")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        ts, _, rid = raw.partition("|")
        when = datetime.fromisoformat(ts)
        if when.tzinfo is None:
            raise ValueError
        return when, uuid.UUID(rid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError(f"cursor {cursor[:40]!r} is not a list_runs cursor") from None


def _id_range(prefix: object) -> tuple[uuid.UUID, uuid.UUID]:
    if not isinstance(prefix, str):
        raise TypeError(f"id_prefix must be a str, not {type(prefix).__name__}")
    hexes = prefix.replace("-", "").lower()
    if not hexes or len(hexes) > 32 or any(c not in "0123456789abcdef" for c in hexes):
        raise ValueError(f"id_prefix {prefix[:40]!r} must be 1-32 hex digits of a run id")
    return uuid.UUID(hexes.ljust(32, "0")), uuid.UUID(hexes.ljust(32, "f"))


def _when(value: object, what: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware")
    return value


def list_runs_query(
    *,
    status: str | list[str] | tuple[str, ...] | None = None,
    task: str | None = None,
    queue: str | None = None,
    metadata: dict[str, Any] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    id_prefix: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """Validate the filters (TypeError/ValueError, before any SQL) and build the
    query: only the filters given, every value a parameter; the last
    parameter is ``limit + 1`` (one extra row tells whether a next page exists)."""
    where: list[str] = []  # the names of sq.FILTERS, in the order of their params
    params: list[Any] = []
    if status is not None:
        statuses = [status] if isinstance(status, str) else status
        if not isinstance(statuses, list | tuple) or not statuses:
            raise TypeError("status must be a status name or a non-empty list of them")
        for st in statuses:
            if st not in STATUSES:
                raise ValueError(f"unknown status {st!r}: use one of {', '.join(STATUSES)}")
        where.append("status")
        params.append(list(statuses))
    if task is not None:
        where.append("task")
        params.append(check_name(task, "task"))
    if queue is not None:
        where.append("queue")
        params.append(check_name(queue, "queue"))
    if metadata is not None:
        meta = check_metadata(metadata)
        where.append("metadata")
        params.append(meta)
    if since is not None:
        where.append("since")
        params.append(_when(since, "since"))
    if until is not None:
        where.append("until")
        params.append(_when(until, "until"))
    if id_prefix is not None:
        lo, hi = _id_range(id_prefix)
        where.append("id_prefix")
        params += [lo, hi]
    if cursor is not None:
        when, rid = decode_cursor(cursor)
        where.append("cursor")
        params += [when, rid]
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError("limit must be an int")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be between 1 and {MAX_LIMIT}")
    params.append(limit + 1)
    return sq.list_runs(where).sql, tuple(params)


def make_page(rows: list[tuple[Any, ...]], limit: int) -> Page:
    """A :class:`Page` from ``limit + 1`` rows at most (of :func:`list_runs_query`)."""
    items = [sq.summary(r) for r in rows[:limit]]
    more = len(rows) > limit
    return Page(items, encode_cursor(items[-1].created_at, items[-1].id) if more else None)
