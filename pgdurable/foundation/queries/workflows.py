"""Workflows (:mod:`pgdurable.models.workflows`): a run's whole history in one query."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .core import Query, Row

__all__ = ["LOAD_HISTORY", "Checkpoint"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint of a workflow run: its state (a history entry) and the wake that
    continued from the checkpoint before it (a wait's outcome; None: none)."""

    state: Any
    wake: dict[str, Any] | None


def _history(r: Row) -> list[Checkpoint]:
    (text,) = r
    return [] if text is None else [Checkpoint(s, w) for s, w in json.loads(text)]


# -- a workflow run's whole history (the memo), ONE query per claim: a JSON
# -- array of [state, wake] per checkpoint, in order, as ONE text value (one
# -- json.loads in Python instead of a jsonb loader call per row: 4x faster
# -- for 1,000 rows); NULL (an empty history) when the run has no checkpoint
LOAD_HISTORY = Query(
    "SELECT '[' || string_agg('[' || state::text || ',' || coalesce(wake::text, 'null') || ']',"
    " ',' ORDER BY step) || ']' FROM pgdurable.checkpoints WHERE run_id = %s::uuid", _history)
