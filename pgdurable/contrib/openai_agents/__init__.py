"""OpenAI Agents SDK on pgdurable (``pip install 'pgdurable[openai-agents]'``).

* :class:`PgDurableSession` -- the SDK's session protocol on Postgres tables;
  concurrent ``add_items`` from many processes keep their order.
* :func:`register_agent` / :func:`run_agent` -- durable agent runs: every
  model call and tool call is a recorded pgdurable effect, so a run whose
  worker crashed resumes on another worker without paying for a model call or
  repeating a tool's side effect again; tools that need approval park the run
  (the SDK's ``RunState``, resumed by an approval signal in any process);
  ``stream=True`` sends ``Runner.run_streamed`` events to the run's output
  stream (see :mod:`.runner`).

See docs/frameworks.md.
"""

try:
    import agents  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "pgdurable.contrib.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'pgdurable[openai-agents]'"
    ) from _exc

from .runner import (
    APPROVAL_KIND,
    RecordedModel,
    apply_decision,
    event_json,
    register_agent,
    run_agent,
)
from .session import PgDurableSession

__all__ = ["APPROVAL_KIND", "PgDurableSession", "RecordedModel", "apply_decision",
           "event_json", "register_agent", "run_agent"]
