"""Tracing (:mod:`pgdurable.runs.tracing`): the W3C trace context a run was started with."""

from __future__ import annotations

from typing import Any

from .core import Query, column

__all__ = ["TRACE_CONTEXT"]

# -- the stored trace context of a run (a JSON object, or NULL; no row: no such run)
TRACE_CONTEXT: Query[Any] = column("SELECT trace_context FROM pgdurable.runs WHERE id = %s::uuid")
