"""One run by id (``pgdurable.runs`` and its children): :class:`RunInfo`, what
``app.get_run(run_id)`` answers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..affinity import Affinity
from .core import Query, Row

__all__ = ["GET_RUN", "OUTCOME", "TERMINAL", "Outcome", "RunInfo"]

#: The statuses a run never leaves.
TERMINAL = frozenset({"completed", "failed", "cancelled", "incompatible"})


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


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


def _run_info(r: Row) -> RunInfo:
    (id_, task, revision, queue, priority, status, state, step, attempts, max_attempts,
     claims, idempotency_key, available_at, deadline_at, budget, spent, lease_owner,
     lease_token, lease_expires_at, wait_kind, wait_ref, wait_since, wake_at, wake,
     result, error, cancel_requested_at, created_at, updated_at, finished_at, reclaims,
     parent_run_id, root_run_id, child_key, parent_policy, children,
     aff_worker, aff_instance, aff_mode, aff_wait, aff_info, aff_since) = r
    return RunInfo(
        id=str(id_), task=task, revision=revision, queue=queue, priority=priority,
        status=status, state=state, step=step, attempts=attempts,
        max_attempts=max_attempts, claims=claims, idempotency_key=idempotency_key,
        available_at=available_at, deadline_at=deadline_at,
        budget=None if budget is None else float(budget), spent=float(spent),
        lease_owner=lease_owner, lease_token=lease_token,
        lease_expires_at=lease_expires_at, wait_kind=wait_kind, wait_ref=wait_ref,
        wait_since=wait_since, wake_at=wake_at, wake=wake, result=result, error=error,
        cancel_requested_at=cancel_requested_at, created_at=created_at,
        updated_at=updated_at, finished_at=finished_at, reclaims=reclaims,
        parent_run_id=_text(parent_run_id), root_run_id=_text(root_run_id),
        child_key=child_key, parent_policy=parent_policy, children=tuple(children or ()),
        affinity=None if aff_worker is None else Affinity(
            aff_worker, aff_instance, aff_mode, aff_wait, aff_info, aff_since))


# -- one run by id: its RunInfo (its children's ids, oldest first; its affinity), no row
# -- if there is none
GET_RUN = Query("""
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
""", _run_info)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A run's status, and its result and error (None until it ends)."""

    status: str
    result: Any
    error: dict[str, Any] | None


def _outcome(r: Row) -> Outcome:
    status, result, error = r
    return Outcome(status, result, error)


# -- a run's status, result and error (id): its Outcome, no row if there is none
OUTCOME = Query("SELECT status, result, error FROM pgdurable.runs WHERE id = %s::uuid", _outcome)
