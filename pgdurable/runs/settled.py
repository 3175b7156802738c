"""``RunSettled``: a step stopped because its run was settled by the step's own write
(re-exported by :mod:`pgdurable.runs.steps`; here so that :mod:`pgdurable.runs.text`
raises it without importing the step context)."""

from __future__ import annotations

__all__ = ["RunSettled"]


class RunSettled(BaseException):
    """Raised inside a step when the run was settled by the step's own write.

    A workflow (:mod:`pgdurable.models.workflows`) checkpoints from inside one call of
    its step function; when that write ends the run (a cancel, a budget or
    deadline verdict), or the run was given back at a step boundary, the
    worker stops the call without further writes. A ``BaseException`` so that
    user code catching ``Exception`` cannot swallow it.
    """
