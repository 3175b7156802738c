"""What a run can do: one module per capability (children, threads, streams, fork, flow control, results, search, schedules, ...), as SQL calls on a :class:`pgdurable.foundation.ports.App`.

``pgdurable.runs`` was the app's module before the house change (issue 39), and
users import from it: ``Durable``, ``DurableClient``, ``RunInfo``, ``Task``,
``TaskRegistry``, ``start_params`` and ``RETRY`` still resolve here, to the same
objects as their homes (:mod:`pgdurable.app.durable`,
:mod:`pgdurable.foundation.registry`, :mod:`pgdurable.foundation.queries.runs`).
The app's two come through a module ``__getattr__``, imported on first use: this
layer does not import the app when it is imported (the import-graph test allows
exactly that one late import).
"""

from __future__ import annotations

from typing import Any

from ..foundation.queries.retry import RETRY as _RETRY
from ..foundation.queries.runs import RunInfo
from ..foundation.registry import Task, TaskRegistry, start_params

__all__ = ["RETRY", "Durable", "DurableClient", "RunInfo", "Task", "TaskRegistry",
           "start_params"]

#: The retry statement's SQL, as ``pgdurable.app.durable.RETRY``.
RETRY = _RETRY.sql

#: The old paths that live above this layer, resolved on first use.
_APP_NAMES = frozenset({"Durable", "DurableClient"})


def __getattr__(name: str) -> Any:
    if name in _APP_NAMES:
        from ..app import durable  # the old pgdurable.runs path (see the docstring)

        return getattr(durable, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
