"""The ``@app.task`` programming model: a step function registered as a task.

A step function ``fn(ctx, state)`` (sync or async) returns ``Continue``,
``Done``, ``Wait`` or ``Sleep`` (:mod:`pgdurable.runs.steps`); the engine runs it as
is. :func:`task_decorator` validates the task's policies and registers it in
the :class:`~pgdurable.foundation.registry.TaskRegistry` (used by :meth:`Durable.task`).
The other programming models turn user code into such a step function:
durable task definitions (:mod:`pgdurable.models.durable_runs`) and workflows
(:mod:`pgdurable.models.workflows`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..foundation import run_queries as q
from ..foundation.registry import Task, TaskRegistry
from ..runs.liveness import check_timeout

__all__ = ["task_decorator"]

F = TypeVar("F", bound=Callable[..., Any])


def task_decorator(
    registry: TaskRegistry,
    name: str,
    revision: str,
    max_attempts: int,
    retry_base: float,
    retry_cap: float,
    max_reclaims: int = 5,
    step_timeout: timedelta | float | None = None,
    heartbeat_timeout: timedelta | float | None = None,
) -> Callable[[F], F]:
    """``@app.task(name, revision=...)``: register a step function ``fn(ctx, state)``."""
    q.check_name(name, "task name")
    step_secs = check_timeout(step_timeout, "step_timeout")
    hb_secs = check_timeout(heartbeat_timeout, "heartbeat_timeout")
    q.check_name(revision, "revision")
    q.check_max_attempts(max_attempts)
    if retry_base < 0 or retry_cap < 0:
        raise ValueError("retry_base and retry_cap must be >= 0")
    if isinstance(max_reclaims, bool) or not isinstance(max_reclaims, int) or max_reclaims < 0:
        raise ValueError("max_reclaims must be an int >= 0")

    def deco(fn: F) -> F:
        if not callable(fn):
            raise TypeError("@task decorates a callable (ctx, state) -> step result")
        registry.register(
            Task(name, revision, fn, max_attempts, float(retry_base), float(retry_cap),
                 max_reclaims, step_timeout=step_secs, heartbeat_timeout=hb_secs)
        )
        return fn

    return deco
