"""Pydantic AI on pgdurable (``pip install 'pgdurable[pydantic-ai]'``).

* :class:`PgDurability` -- a Pydantic AI durability capability: attach it to an
  ``Agent`` and its runs (:func:`start_agent`) are pgdurable workflows run by
  leased workers. Every model request and tool call (function, MCP, dynamic) is a
  recorded step; a run whose worker died resumes on another worker without calling
  the model again for a recorded turn or repeating a recorded tool call; deferred
  tool calls and approvals park the run (no worker held) until an approval signal;
  the agent's events go to the run's output stream.

See docs/frameworks.md.
"""

try:
    import pydantic_ai  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "pgdurable.contrib.pydantic_ai needs Pydantic AI: pip install 'pgdurable[pydantic-ai]'"
    ) from _exc

from .durability import APPROVAL_KIND, PgDurability, decision
from .runs import start_agent, task_name
from .scope import event_json

__all__ = ["APPROVAL_KIND", "PgDurability", "decision", "event_json", "start_agent", "task_name"]
