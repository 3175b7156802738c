"""The pgdurable workflow an agent run is in (set around ``agent.run``), and its events as JSON."""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai.messages import AgentStreamEvent

from ...models.workflows import WorkflowContext

__all__ = ["SCOPE", "Scope", "event_json"]

_EVENTS: TypeAdapter[AgentStreamEvent] = TypeAdapter(AgentStreamEvent)


@dataclass
class Scope:
    """The pgdurable workflow running one agent run (set by :mod:`.runs`)."""

    ctx: WorkflowContext
    agent_name: str
    #: the agent whose run this is
    agent: Any
    #: the tool call being executed (sequential in a durable run): its name and
    #: validated arguments, for a reconcile
    call: tuple[str, dict[str, Any]] | None = None
    waits: dict[str, int] = dataclasses.field(default_factory=dict)


#: Set by the workflow body (:mod:`.runs`) around ``agent.run``.
SCOPE: ContextVar[Scope | None] = ContextVar("pgdurable_pydantic_ai_scope", default=None)


def event_json(event: AgentStreamEvent) -> Any:
    """An agent stream event as the JSON the run's output stream holds (``event_kind`` first
    among its fields; load it back with ``TypeAdapter(AgentStreamEvent)``)."""
    return _EVENTS.dump_python(event, mode="json")


