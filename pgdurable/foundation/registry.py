"""The task registry: :class:`Task` (a registered step function and its
policies), :class:`TaskRegistry` and :func:`start_params` (a start validated
against the registry before any SQL).

Shared by the app, its client, its workers and integrations; it imports only
the SQL helpers and the errors (the lowest layer, see ``docs/architecture.md``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import run_queries as q
from .errors import UnknownTask

__all__ = ["Task", "TaskRegistry", "start_params"]


@dataclass(frozen=True)
class Task:
    """A registered task: its step function and policies.

    ``retry_base``/``retry_cap`` (seconds) shape the exponential backoff with
    jitter between failed attempts: ``min(cap, base * 2**(attempt-1))`` times a
    random factor in [0.5, 1.5).

    ``max_reclaims`` bounds crashes apart from step errors: a run whose lease
    expired (its worker crashed or stalled) more than ``max_reclaims`` times
    in a row without a checkpoint fails with error type ``PoisonRun``.

    ``step_timeout`` / ``heartbeat_timeout`` (seconds) cancel a step that runs
    too long or stops calling ``ctx.heartbeat`` (a failed attempt, retried;
    see :mod:`pgdurable.runs.liveness`).

    ``deadline`` is the default deadline of a start (from now, database
    clock); ``prepare_state`` checks (and defaults) the start state before any
    SQL. Both are set for registered durable task definitions
    (:meth:`Durable.register`).
    """

    name: str
    revision: str
    fn: Callable[..., Any]
    max_attempts: int = 3
    retry_base: float = 1.0
    retry_cap: float = 300.0
    max_reclaims: int = 5
    deadline: timedelta | None = None
    prepare_state: Callable[[Any], Any] | None = None
    step_timeout: float | None = None  # seconds; see pgdurable.liveness
    heartbeat_timeout: float | None = None  # seconds; see pgdurable.liveness

    @functools.cached_property
    def is_async(self) -> bool:
        """True for ``async def`` step functions (sync ones run in a thread)."""
        return inspect.iscoroutinefunction(self.fn)


class TaskRegistry:
    """Task registry shared by the app, its client, its workers and integrations.

    Maps task names to :class:`Task`; :func:`start_params` reads revisions,
    ``max_attempts``, deadlines and state defaults from it.
    """

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def register(self, task: Task) -> None:
        """Add ``task``; ValueError if its name is taken."""
        if task.name in self.tasks:
            raise ValueError(f"task {task.name!r} is already registered")
        self.tasks[task.name] = task

    def revision_for(self, name: object, revision: str | None) -> str:
        """``revision`` if given, else the registered task's (UnknownTask if none)."""
        q.check_name(name, "task")
        assert isinstance(name, str)
        if revision is not None:
            q.check_name(revision, "revision")
            return revision
        task = self.tasks.get(name)
        if task is None:
            raise UnknownTask(
                f"no task {name!r} is registered (known: {sorted(self.tasks)}); "
                "register it with @app.task or pass revision="
            )
        return task.revision

    def max_attempts_for(self, name: str) -> int:
        """The registered task's ``max_attempts`` (3 for an unknown task)."""
        task = self.tasks.get(name)
        return task.max_attempts if task is not None else 3


def start_params(
    registry: TaskRegistry,
    task: object,
    state: object = None,
    queue: object = "default",
    priority: object = 0,
    idempotency_key: object = None,
    deadline: object = None,
    budget: object = None,
    revision: str | None = None,
    max_attempts: int | None = None,
) -> tuple[Any, ...]:
    """Validate a start (before any SQL) and return the parameters of ``START``.

    Shared by :meth:`Durable.start`, :meth:`DurableClient.start` and
    integrations (``pgdurable.contrib.sqlalchemy``). The task's revision and
    ``max_attempts`` come from ``registry`` unless given; a registered
    durable task definition also checks/defaults ``state`` and its deadline.
    TypeError/ValueError/UnknownTask for bad input.
    """
    rev = registry.revision_for(task, revision)
    assert isinstance(task, str)
    attempts = registry.max_attempts_for(task) if max_attempts is None else max_attempts
    q.check_max_attempts(attempts)
    spec = registry.tasks.get(task)
    if spec is not None and spec.revision == rev:
        if spec.prepare_state is not None:
            state = spec.prepare_state(state)
        if deadline is None:
            deadline = spec.deadline
    return q.start_params(
        task, rev, state, queue, priority, attempts, idempotency_key, deadline, budget
    )
