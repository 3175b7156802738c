"""What the demo's driver reads to narrate a run (:mod:`pgdurable.ops.demo`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .core import record, scalar

__all__ = ["RUN", "STEPS", "TOOL", "DemoRun", "DemoStep"]


@dataclass(frozen=True, slots=True)
class DemoRun:
    """The run as the timeline polls it."""

    status: str
    step: int
    lease_owner: str | None
    lease_token: int | None
    wait_kind: str | None
    wait_ref: str | None
    claims: int
    result: Any
    error: Any


@dataclass(frozen=True, slots=True)
class DemoStep:
    """One checkpoint for the closing table: its workflow entry and what woke it."""

    step: int
    token: int
    entry: str | None
    woken_by: str


# -- the run as the timeline polls it; one DemoRun
RUN = record("""
SELECT status, step, lease_owner, lease_token, wait_kind, wait_ref, claims, result, error
  FROM pgdurable.runs WHERE id = %s::uuid
""", DemoRun)
# -- whether the tool step is recorded (its checkpoint), under which token (no row: not yet)
TOOL = scalar("SELECT token FROM pgdurable.checkpoints WHERE run_id = %s::uuid "
              "AND state->'workflow'->>'name' = 'web_search'", int)
# -- checkpoint history for the closing table (the workflow's entries); one DemoStep per row
STEPS = record("""
SELECT step, token, (state->'workflow'->>'kind') || ' ' || (state->'workflow'->>'name'),
       coalesce(wake->>'type', '') || coalesce(' ' || (wake->>'kind'), '')
  FROM pgdurable.checkpoints WHERE run_id = %s::uuid ORDER BY step
""", DemoStep)
