"""Google ADK on pgdurable (``pip install 'pgdurable[adk]'``).

* :class:`PgDurablePlugin` -- an ADK ``Runner`` plugin (``BasePlugin``) that makes
  every model call and tool call of a run a recorded pgdurable effect;
* :func:`register_agent` / :func:`run_agent` -- an agent's invocation as a durable
  pgdurable run: a crashed worker's run resumes on another worker without calling
  the model again for a recorded turn or repeating a recorded tool call; tools that
  ask for a confirmation and long-running tools park the run until an approval
  signal; ADK's events go to the run's output stream (see :mod:`.runs`).

See docs/frameworks.md.
"""

try:
    import google.adk  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "pgdurable.contrib.adk needs Google ADK: pip install 'pgdurable[adk]'"
    ) from _exc

from .plugin import PgDurablePlugin
from .runs import APPROVAL_KIND, answer, register_agent, run_agent

__all__ = ["APPROVAL_KIND", "PgDurablePlugin", "answer", "register_agent", "run_agent"]
