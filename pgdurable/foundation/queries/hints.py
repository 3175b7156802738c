"""What a cancel NOTIFY asks the worker to check (:mod:`pgdurable.foundation.hints`): a
NOTIFY is a hint, the database decides."""

from __future__ import annotations

from typing import Any

from .core import Query, column

__all__ = ["CANCELS_REQUESTED"]

# -- of these (run, lease token) pairs, the runs with a cancel requested under that
# -- token (a run that is not ours any more, under another token, is not returned);
# -- one run id (uuid) per row
CANCELS_REQUESTED: Query[Any] = column(
    "SELECT r.id FROM unnest(%s::uuid[], %s::bigint[]) AS a(id, token) "
    "JOIN pgdurable.runs r ON r.id = a.id AND r.lease_token = a.token "
    "WHERE r.cancel_requested_at IS NOT NULL"
)
