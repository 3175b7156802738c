"""OpenAI Agents SDK on pgdurable (``pip install 'pgdurable[openai-agents]'``).

* :class:`PgDurableSession` -- the SDK's session protocol on Postgres tables;
  concurrent ``add_items`` from many processes keep their order.
* :func:`register_agent` / :func:`run_agent` -- durable agent runs: every
  model call and tool call is a recorded pgdurable effect, so a run whose
  worker crashed resumes on another worker without paying for a model call or
  repeating a tool's side effect again (see :mod:`.runner`).

See docs/frameworks.md.
"""

from .runner import RecordedModel, register_agent, run_agent
from .session import PgDurableSession

__all__ = ["PgDurableSession", "RecordedModel", "register_agent", "run_agent"]
