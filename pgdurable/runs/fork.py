"""Fork or rewind a run from any recorded step (SQL in ``sql/0017_fork.sql``, ``sql/0030``).

A run keeps every checkpoint (``pgdurable.checkpoints``, step 1..N). Forking
run R at step N starts a NEW run whose history is R's checkpoints 1..N and
whose state is checkpoint N's (optionally patched); it continues with step
N+1, with the wake that continued from checkpoint N in R (the outcome of a
wait recorded there). Effects R recorded in steps 1..N are copied to the
fork, so they return their recorded result instead of acting again; effects
of later steps are not copied and run again in the fork. R is only read.
Lineage: ``runs.forked_from`` / ``runs.forked_from_step``.

The resume point: ``from_step=None`` forks from where :meth:`Durable.retry
<pgdurable.Durable.retry>` would continue R: its last checkpoint, or, when R
failed because a workflow step's recorded error was not caught, the
checkpoint before that record (the fork runs the step again). A fork at the
resume point is R's retry as a new run: it also gets the effects R recorded
after that checkpoint, as a retry sees them (succeeded ones kept, failed ones
follow their replay policy). :func:`fork_failed` forks from the resume point.

Rewinding a ``failed`` or ``cancelled`` run to step N does the same in place
(same run id): later checkpoints and their effects are moved into
``pgdurable.run_rewinds`` (the history of the run) and the run is runnable
again from checkpoint N.

State: ``state=None`` keeps checkpoint N's state; otherwise ``state_mode``
says how ``state`` applies: ``"merge"`` (default) is an RFC 7396 JSON Merge
Patch (objects merge recursively, a ``None`` member deletes the key, any
non-object patch replaces the state), ``"replace"`` replaces the state.

Revision: ``revision=None`` keeps the source's. Another revision must have
been registered by a started worker (``pgdurable.worker_revisions``; a worker
registers its task revisions when it starts and removes them when it stops
cleanly) unless ``force=True``: else :class:`~pgdurable.RevisionNotServed`.

Each operation is one SQL function, one round trip: ``fork_run``,
``fork_failed`` (bulk), ``rewind_run``. :func:`fork_sync`, :func:`fork_failed_sync`
and :func:`rewind_sync` (for :class:`~pgdurable.DurableClient`) are generated from
:func:`fork`, :func:`fork_failed` and :func:`rewind` by ``tools/async_to_sync.py``. Errors change nothing:
:class:`~pgdurable.RunNotFound` (unknown run), :class:`~pgdurable.StepNotRecorded`
(a step never checkpointed), :class:`~pgdurable.InvalidInput` (state not JSON,
bad mode, a thread run, rewinding a run that is not failed/cancelled).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from ..foundation import run_queries as q
from ..foundation.errors import InvalidInput, PgDurableError
from ..foundation.jsonb import dumps
from ..foundation.queries import fork as fq
from ..foundation.queries.core import many, many_sync, one, one_sync
from ..foundation.queries.fork import ForkedRun

if TYPE_CHECKING:
    from ..foundation.ports import App, Database, SyncDatabase
    from ..foundation.registry import Task

log = logging.getLogger("pgdurable.fork")

__all__ = ["ForkedRun", "StateMode", "fork", "fork_failed", "fork_failed_params",
           "fork_failed_sync", "fork_params", "fork_sync", "register_worker", "rewind",
           "ServedRevisions",
           "rewind_params", "rewind_sync", "unregister_worker"]

StateMode = Literal["merge", "replace"]

#: The SQL functions take a step and a limit as ``integer``: a larger int
#: would match no function (``UndefinedFunction``), so it is refused here.
_INT4_MAX = 2**31 - 1


def _step(from_step: object, name: str = "from_step") -> int | None:
    if from_step is None:
        return None  # the resume point (fork only; rewind_run refuses it)
    if isinstance(from_step, bool) or not isinstance(from_step, int):
        raise TypeError(f"{name} must be an int, not {type(from_step).__name__}")
    if from_step < 0:
        raise InvalidInput(f"{name} must be >= 0, not {from_step}")
    if from_step > _INT4_MAX:
        raise InvalidInput(f"{name} must be at most {_INT4_MAX} (a step number), not {from_step}")
    return from_step


def _state(state: Any, state_mode: object) -> tuple[str | None, str]:
    if state_mode not in ("merge", "replace"):
        raise InvalidInput(f"state_mode must be 'merge' or 'replace', not {state_mode!r}")
    if state is None:
        return None, "keep"
    try:
        text = dumps(state, "state")
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"state is not JSON: {exc}") from None
    return text, str(state_mode)


def _revision(revision: object) -> str | None:
    if revision is None:
        return None
    return q.check_name(revision, "revision")


def _force(force: object) -> bool:
    if not isinstance(force, bool):
        raise TypeError("force must be a bool")
    return force


def fork_params(run_id: Any, from_step: Any, state: Any, state_mode: Any, revision: Any,
                force: Any) -> tuple[Any, ...]:
    """Validated parameters of :data:`~pgdurable.foundation.queries.fork.FORK` (nothing is
    sent on bad input)."""
    rid = q.check_run_id(run_id)
    text, mode = _state(state, state_mode)
    return rid, _step(from_step), text, mode, _revision(revision), _force(force)


def rewind_params(run_id: Any, to_step: Any, state: Any, state_mode: Any, revision: Any,
                  force: Any) -> tuple[Any, ...]:
    """Validated parameters of :data:`~pgdurable.foundation.queries.fork.REWIND` (a step is
    required)."""
    if to_step is None:
        raise TypeError("to_step must be an int, not None")
    _step(to_step, "to_step")
    return fork_params(run_id, to_step, state, state_mode, revision, force)


def fork_failed_params(task: Any, error: Any, since: Any, revision: Any, force: Any,
                       limit: Any) -> tuple[Any, ...]:
    """Validated parameters of :data:`~pgdurable.foundation.queries.fork.FORK_FAILED`."""
    q.check_name(task, "task")
    if error is not None and (not isinstance(error, str) or not error):
        raise InvalidInput("error must be a non-empty error type name (e.g. 'TimeoutError') or None")
    if not isinstance(since, datetime) or since.tzinfo is None:
        raise InvalidInput("since must be a timezone-aware datetime")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _INT4_MAX:
        raise InvalidInput(f"limit must be an int in 1..{_INT4_MAX}, not {limit!r}")
    return task, error, since, _revision(revision), _force(force), limit


# async-to-sync: source
async def fork(app: Database, run_id: Any, from_step: int | None = None, state: Any = None, *,
               state_mode: StateMode = "merge", revision: str | None = None,
               force: bool = False) -> str:
    """Fork ``run_id`` from its checkpoint ``from_step`` (None: its resume point); the new run's id."""
    return await one(app, fq.FORK, fork_params(run_id, from_step, state, state_mode,
                                               revision, force))


async def fork_failed(app: Database, task: str, *, error: str | None, since: datetime,
                      revision: str | None = None, force: bool = False,
                      limit: int = 1000) -> list[ForkedRun]:
    """Fork every failed run of ``task`` (error type ``error``, since ``since``) not forked
    yet, each from its resume point."""
    return await many(app, fq.FORK_FAILED, fork_failed_params(task, error, since, revision,
                                                              force, limit))


async def rewind(app: Database, run_id: Any, to_step: int, state: Any = None, *,
                 state_mode: StateMode = "merge", revision: str | None = None,
                 force: bool = False) -> str:
    """Rewind a failed or cancelled run in place to checkpoint ``to_step``; ``"runnable"``."""
    return await one(app, fq.REWIND, rewind_params(run_id, to_step, state, state_mode,
                                                   revision, force))
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def fork_sync(app: SyncDatabase, run_id: Any, from_step: int | None = None, state: Any = None, *,
              state_mode: StateMode = "merge", revision: str | None = None,
              force: bool = False) -> str:
    """Fork ``run_id`` from its checkpoint ``from_step`` (None: its resume point); the new run's id."""
    return one_sync(app, fq.FORK, fork_params(run_id, from_step, state, state_mode,
                                              revision, force))


def fork_failed_sync(app: SyncDatabase, task: str, *, error: str | None, since: datetime,
                     revision: str | None = None, force: bool = False,
                     limit: int = 1000) -> list[ForkedRun]:
    """Fork every failed run of ``task`` (error type ``error``, since ``since``) not forked
    yet, each from its resume point."""
    return many_sync(app, fq.FORK_FAILED, fork_failed_params(task, error, since, revision,
                                                             force, limit))


def rewind_sync(app: SyncDatabase, run_id: Any, to_step: int, state: Any = None, *,
                state_mode: StateMode = "merge", revision: str | None = None,
                force: bool = False) -> str:
    """Rewind a failed or cancelled run in place to checkpoint ``to_step``; ``"runnable"``."""
    return one_sync(app, fq.REWIND, rewind_params(run_id, to_step, state, state_mode,
                                                  revision, force))
# async-to-sync: end


async def register_worker(app: App, worker_id: str, tasks: dict[str, Task]) -> None:
    """Record the task revisions a starting worker serves (``worker_revisions``).

    Only checked by forks/rewinds to another revision: a failure is logged,
    never stops the worker.
    """
    names = sorted(tasks)
    try:
        await one(app, fq.REGISTER_WORKER,
                  (worker_id, names, [tasks[n].revision for n in names]))
    except (PgDurableError, psycopg.Error, OSError) as exc:
        log.warning("worker %s: task revisions not registered (%s)", worker_id, exc)


async def unregister_worker(app: App, worker_id: str) -> None:
    """Remove a stopping worker's ``worker_revisions`` rows (failure only logged)."""
    try:
        async with asyncio.timeout(5.0):
            await one(app, fq.UNREGISTER_WORKER, (worker_id,))
    except (TimeoutError, PgDurableError, psycopg.Error, OSError) as exc:
        log.warning("worker %s: task revisions not unregistered (%s)", worker_id, exc)


class ServedRevisions:
    """A worker service (:class:`pgdurable.engine.services.Service`): the task revisions
    the worker serves are registered when it starts (:func:`register_worker`) and removed
    when it stops (:func:`unregister_worker`). Plugged in by ``Durable.worker()``."""

    def __init__(self, app: App, tasks: dict[str, Task]) -> None:
        self.app, self.tasks = app, tasks

    async def start(self, worker_id: str) -> None:
        """Register (a failure is logged: only forks to another revision check it)."""
        await register_worker(self.app, worker_id, self.tasks)

    async def stop(self, worker_id: str) -> None:
        """Unregister (bounded: 5 s; a failure is logged)."""
        await unregister_worker(self.app, worker_id)

