"""Steps (``sql/functions/steps.sql``): a worker's fenced checkpoints, its batched write
of many runs' steps, and the heartbeat that renews its leases (:mod:`pgdurable.engine`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from .core import Query, Row, scalar

__all__ = ["CHECKPOINT", "RENEW", "RUN_STEP", "WRITE_STEPS", "WRITE_STEPS_SETTLING", "Renewal",
           "RunStep", "StepWritten"]


@dataclass(frozen=True, slots=True)
class Renewal:
    """One lease the heartbeat renewed: the run, its new expiry, and whether a cancel
    was requested for it."""

    run_id: str
    lease_expires_at: datetime
    cancel_requested: bool


def _renewal(r: Row) -> Renewal:
    run_id, expires, cancel = r
    return Renewal(str(run_id), expires, bool(cancel))


class StepWritten(NamedTuple):
    """One run of a batched write: its resulting status (``'lost'`` where the fence
    refused the write). A named tuple, made once per written step on the worker's hot
    path (the statement answers the id as text: no UUID object made and printed)."""

    run_id: str
    status: str


def _written(r: Row) -> StepWritten:
    return StepWritten._make(r)


@dataclass(frozen=True, slots=True)
class RunStep:
    """Where a run is now, to tell whether a write whose answer was lost applied."""

    step: int
    status: str
    lease_token: int
    lease_owner: str | None


def _run_step(r: Row) -> RunStep:
    step, status, token, owner = r
    return RunStep(step, status, token, owner)


# -- heartbeat: renew every lease of (owner, ids, tokens, ttl); one Renewal per lease
# -- still held (a run missing from the answer is lost)
RENEW = Query(
    "SELECT id, lease_expires_at, cancel_requested "
    "FROM pgdurable.renew_runs(%s::text, %s::uuid[], %s::bigint[], %s::interval)", _renewal)
# -- fenced: checkpoint a step (id, token, owner, state, spend); the resulting status
CHECKPOINT = scalar(
    "SELECT pgdurable.checkpoint_run(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::numeric)",
    str)
# -- the worker's batched hot path: (owner, ids, tokens, states, spends, done, results)
# -- -> a StepWritten per run, 'lost' where the fence failed. ids, tokens and done come
# -- as array literals, states and results as ONE JSON array each (built by
# -- engine/batch_writer.batch_params: no per-element escaping in Python), unpacked here in order
WRITE_STEPS = Query(
    "SELECT id::text, status FROM pgdurable.write_steps(%s::text, %s::uuid[], %s::bigint[], "
    "ARRAY(SELECT e FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS a(e, n) ORDER BY n), "
    "%s::numeric[], %s::boolean[], "
    "ARRAY(SELECT e FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS a(e, n) ORDER BY n))",
    _written)
# -- the same with the budget settlements the steps buffered (one JSON array of {run,
# -- token, step, rkey, amounts, model}, sql/functions/budgets.sql), in its transaction
WRITE_STEPS_SETTLING = Query(
    "SELECT id::text, status FROM pgdurable.write_steps_settling(%s::text, %s::uuid[], %s::bigint[], "
    "ARRAY(SELECT e FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS a(e, n) ORDER BY n), "
    "%s::numeric[], %s::boolean[], "
    "ARRAY(SELECT e FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS a(e, n) ORDER BY n), "
    "%s::jsonb)",
    _written)
# -- after a write_steps whose answer was lost: did it apply? the run's RunStep
RUN_STEP = Query(
    "SELECT step, status, lease_token, lease_owner FROM pgdurable.runs WHERE id = %s::uuid",
    _run_step)
