"""An agent run as a pgdurable workflow: registration, the workflow, :func:`start_agent`.

Binding :class:`~.durability.PgDurability` to an agent (Pydantic AI does it when
the ``Agent`` is built) registers the workflow ``pydantic_ai.<agent name>`` on
the app. Its input is ``{"prompt", "message_history", "deps", "model"}`` (JSON);
its body sets the scope the capability reads and awaits ``agent.run(...)``:

* the model requests and tool calls inside are recorded steps (see
  :mod:`.durability`); a later claim (after a crash, a park, a lapsed lease)
  runs ``agent.run`` again from the top and every recorded step returns its
  recorded result, so the model is not called again for a recorded turn and a
  recorded tool call never runs twice;
* a wait parks the run (the workflow's ``Wait = exit``): the coroutine is
  abandoned and no worker holds the run until its signal;
* the run's result is ``{"output", "usage", "messages"}``: the output as JSON,
  the run's :class:`~pydantic_ai.usage.RunUsage`, and every message of the
  conversation (``ModelMessagesTypeAdapter`` JSON: pass it as
  ``message_history=`` to continue).

``deps`` cross as JSON and are validated into the agent's ``deps_type`` on the
worker; the model crosses by name (``model="openai:gpt-5-mini"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import TypeAdapter
from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from ...models.workflows import WorkflowContext, _Park
from ...runs.steps import RunSettled
from .scope import SCOPE, Scope

_LIMITS: TypeAdapter[UsageLimits] = TypeAdapter(UsageLimits)

if TYPE_CHECKING:
    from pydantic_ai.agent.abstract import AbstractAgent


class Bound(Protocol):
    """What the workflow needs of the bound capability (:class:`~.durability.PgDurability`)."""

    app: Any
    name: str
    revision: str
    max_attempts: int

    @property
    def task_name(self) -> str: ...


@dataclass
class _Entry:
    """The agent a registered workflow runs (rebinding the same agent replaces the capability)."""

    agent: Any
    capability: Bound


def _entry_of(task: Any) -> _Entry | None:
    """The entry of a registered agent workflow (``Task.fn`` is its ``Workflow.drive``)."""
    workflow = getattr(task.fn, "__self__", None)
    entry = getattr(getattr(workflow, "fn", None), "pgdurable_agent", None)
    return entry if isinstance(entry, _Entry) else None


def register(capability: Bound, agent: AbstractAgent[Any, Any]) -> None:
    """Register the workflow of ``agent`` on ``capability.app`` (once per name).

    The app's registry holds the agent from then on (a worker process keeps it).
    A second, different agent of the same name on the same app: ValueError.
    """
    app = capability.app
    name = capability.task_name
    task = app.tasks.get(name)
    if task is not None:
        entry = _entry_of(task)
        if entry is None:
            raise ValueError(f"task {name!r} is already registered on this app")
        if entry.agent is not agent:
            raise ValueError(f"another agent named {capability.name!r} is already durable on "
                             "this app: give each agent its own name")
        entry.capability = capability
        return
    entry = _Entry(agent, capability)

    async def run_agent(ctx: WorkflowContext, input: dict[str, Any]) -> dict[str, Any]:
        return await _run(ctx, entry.agent, entry.capability, input)

    run_agent.__qualname__ = run_agent.__name__ = f"run_{capability.name}"
    run_agent.pgdurable_agent = entry  # type: ignore[attr-defined]
    app.workflow(name, revision=capability.revision,
                 max_attempts=capability.max_attempts)(run_agent)


async def _run(ctx: WorkflowContext, agent: AbstractAgent[Any, Any], capability: Bound,
               input: dict[str, Any]) -> dict[str, Any]:
    history = input.get("message_history")
    deps = input.get("deps")
    limits = input.get("usage_limits")
    if deps is not None or agent.deps_type is not type(None):
        deps = TypeAdapter(agent.deps_type).validate_python(deps)
    token = SCOPE.set(Scope(ctx, capability.name, agent))
    try:
        result = await agent.run(
            input.get("prompt"),
            message_history=ModelMessagesTypeAdapter.validate_python(history)
            if history else None,
            deps=deps, model=input.get("model"),
            usage_limits=_LIMITS.validate_python(limits) if limits else None)
    except BaseExceptionGroup as group:
        raise _single(group) from None
    finally:
        SCOPE.reset(token)
    return {"output": to_jsonable_python(result.output),
            "usage": to_jsonable_python(result.usage),
            "messages": ModelMessagesTypeAdapter.dump_python(result.all_messages(), mode="json")}


def _single(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """A park or a settled run raised inside a task group, unwrapped (else the group)."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for e in exc.exceptions:
                walk(e)
        else:
            leaves.append(exc)

    walk(group)
    for exc in leaves:
        if isinstance(exc, RunSettled | _Park):
            return exc
    return group
