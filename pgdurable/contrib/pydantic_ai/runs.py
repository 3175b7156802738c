"""Starting a durable agent run: :func:`start_agent` (see :mod:`.workflow` for the run)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from .durability import PgDurability

if TYPE_CHECKING:
    from pydantic_ai.agent.abstract import AbstractAgent

    from ...app.durable import Durable

__all__ = ["start_agent", "task_name"]


def task_name(agent: AbstractAgent[Any, Any]) -> str:
    """The pgdurable workflow of ``agent`` (``pydantic_ai.<name>``); TypeError without
    a :class:`PgDurability` capability."""
    return _capability(agent).task_name


def _capability(agent: AbstractAgent[Any, Any]) -> PgDurability[Any]:
    cap = PgDurability.from_agent(agent)
    if cap is None:
        raise TypeError("the agent has no PgDurability capability: "
                        "Agent(..., capabilities=[PgDurability(app)])")
    return cap


async def start_agent(
    app: Durable,
    agent: AbstractAgent[Any, Any],
    prompt: str | None,
    *,
    message_history: list[Any] | None = None,
    deps: Any = None,
    model: str | None = None,
    metadata: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
    queue: str = "default",
    priority: int = 0,
    deadline: timedelta | datetime | None = None,
    budget: float | Mapping[str, float] | None = None,
    usage_limits: UsageLimits | None = None,
    budgets: Iterable[str] | None = None,
) -> str:
    """Start a durable run of ``agent`` on ``prompt``; return the run id.

    Any worker of ``app`` (a process that built the agent) runs it; follow it with
    ``app.stream(run_id)`` and ``await app.result(run_id)`` from any process.
    ``message_history``: earlier messages (``ModelMessage`` objects or their
    JSON, e.g. a previous run's ``result["messages"]``); ``deps``: JSON for the
    agent's ``deps_type``; ``model``: a model name (or a ``models=`` key) for this
    run; ``usage_limits``: the run's :class:`~pydantic_ai.usage.UsageLimits` (Pydantic
    AI's default allows 50 requests); ``budgets`` and ``budget`` as for
    :meth:`Durable.start` (docs/budgets.md: with ``PgDurability(reserve=...)`` each
    model request reserves from them and settles its usage). The other options are
    :meth:`Durable.start`'s. Bad input (no capability,
    a ``model`` that is not a str, values that are not JSON) raises here and
    starts nothing.
    """
    cap = _capability(agent)
    if prompt is not None and not isinstance(prompt, str):
        raise TypeError("prompt must be a str (or None with message_history)")
    if model is not None and not isinstance(model, str):
        raise TypeError("model must be a model name: models cross the durable boundary by name")
    history = None
    if message_history:
        history = ModelMessagesTypeAdapter.dump_python(
            ModelMessagesTypeAdapter.validate_python(message_history), mode="json")
    state = {"prompt": prompt, "message_history": history,
             "deps": to_jsonable_python(deps), "model": model,
             "usage_limits": None if usage_limits is None else to_jsonable_python(usage_limits)}
    return await app.start(cap.task_name, state, revision=cap.revision, metadata=metadata,
                           idempotency_key=idempotency_key, queue=queue, priority=priority,
                           deadline=deadline, budget=budget, budgets=budgets)
