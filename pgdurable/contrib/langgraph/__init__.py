"""LangGraph on pgdurable (``pip install 'pgdurable[langgraph]'``).

* :class:`PgDurableSaver` / :class:`AsyncPgDurableSaver` -- LangGraph
  checkpointers on pgdurable's tables, one writer per thread
  (``hold_thread``, :func:`invoke_exclusive`), retention by ``set_retention``
  applied by ``pgdurable prune``.
* :func:`register_graph` / :func:`run_graph` / :func:`resume_graph` -- a
  compiled graph run as a durable pgdurable run (see :mod:`.runs`);
  ``register_graph(..., reserve=...)`` charges each chat model call to the
  run's budgets (:class:`BudgetCallback`, see :mod:`.budget`).

See docs/frameworks.md.
"""

try:
    import langgraph.checkpoint.base
    import langgraph.graph  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "pgdurable.contrib.langgraph needs LangGraph: pip install 'pgdurable[langgraph]'"
    ) from _exc

from .budget import BudgetCallback
from .runs import RESUME_KIND, register_graph, resume_graph, run_graph
from .saver import (
    AsyncPgDurableSaver,
    PgDurableSaver,
    ThreadBusy,
    ainvoke_exclusive,
    invoke_exclusive,
    thread_lease_key,
)

__all__ = [
    "RESUME_KIND",
    "AsyncPgDurableSaver",
    "BudgetCallback",
    "PgDurableSaver",
    "ThreadBusy",
    "ainvoke_exclusive",
    "invoke_exclusive",
    "register_graph",
    "resume_graph",
    "run_graph",
    "thread_lease_key",
]

