"""What the async app (:mod:`pgdurable.app.durable`) and the sync client
(:mod:`pgdurable.app.client`) share: argument checks and row helpers of the run API."""

from __future__ import annotations

import os
from typing import Any

from ..foundation import run_queries as q
from ..foundation.db import validate_dsn
from ..foundation.pooler import Pooler, connect_kwargs, connect_timeout
from ..foundation.queries import retry as _retry
from ..foundation.queries.core import lead

__all__ = ["RETRY", "conn_kwargs", "env_listen_dsn", "ids", "mark_incompatible_params", "one"]

#: :data:`pgdurable.foundation.queries.retry.RETRY`'s SQL (the app and the sync client
#: read its answer with :func:`one`).
RETRY = _retry.RETRY.sql


def mark_incompatible_params(task: object, revision: object, reason: object) -> tuple[Any, ...]:
    q.check_name(task, "task")
    q.check_name(revision, "revision")
    if reason is not None:
        q.check_name(reason, "reason")
    return (task, revision, reason)


def ids(rows: list[tuple[Any, ...]]) -> list[str]:
    """Run ids (first column) of a signal call's rows, as strings."""
    return [str(lead(r)) for r in rows]


def one(row: tuple[Any, ...] | None) -> Any:
    """The first value of a one-row answer (a function call's value, a start's run id)."""
    return lead(row)


def conn_kwargs(conninfo: str, pooler: Pooler | None) -> dict[str, Any]:
    """A library connection's keyword arguments (the pooler's, plus a connect timeout)."""
    return {**connect_kwargs(pooler), **connect_timeout(conninfo)}


def env_listen_dsn(listen_dsn: str | None) -> str | None:
    """``listen_dsn``, else ``PGDURABLE_LISTEN_DSN``, validated."""
    dsn = listen_dsn if listen_dsn is not None else os.environ.get("PGDURABLE_LISTEN_DSN") or None
    return None if dsn is None else validate_dsn(dsn)
