"""Run metadata: labels set at start, searched by containment, and the trace context.

``await app.start("agent", state, metadata={"tenant": "acme"})`` stores the
labels in ``pgdurable.runs.metadata`` (JSONB, GIN-indexed for ``@>``) in the
same statement as the start: :data:`START_TAGGED` composes
``pgdurable.start_run`` with ``pgdurable.tag_started_run``, which only labels a
row inserted by the same transaction (no one can relabel an existing run). The
W3C trace context of the caller (only when OpenTelemetry is already in use,
see :mod:`pgdurable.tracing`) is stored the same way, in ``trace_context``.
An idempotent repeat (same ``idempotency_key``) keeps the first labels.
"""

from __future__ import annotations

from typing import Any

from . import _json
from . import _runs_sql as q

__all__ = ["MAX_METADATA_BYTES", "START_TAGGED", "check_metadata", "start_statement"]

#: Largest metadata object (bytes of JSON) accepted at start.
MAX_METADATA_BYTES = 8192

# -- start a run and label it in one statement; returns (run_id, created)
START_TAGGED = (
    "SELECT t.id, s.created FROM pgdurable.start_run(%s::text, %s::text, %s::jsonb, %s::text, "
    "%s::integer, %s::integer, %s::text, %s::interval, %s::timestamptz, %s::numeric) s, "
    "LATERAL (SELECT pgdurable.tag_started_run(s.run_id, s.created, %s::jsonb, %s::jsonb)"
    " AS id) t"
)


def check_metadata(metadata: object, what: str = "metadata") -> str | None:
    """JSON text of a metadata object (a dict with str keys), or None; else TypeError/ValueError."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"{what} must be a dict, not {type(metadata).__name__}")
    for key in metadata:
        if not isinstance(key, str):
            raise TypeError(f"{what} keys must be str, not {type(key).__name__}")
    text = _json.dumps(metadata, what)
    if len(text.encode()) > MAX_METADATA_BYTES:
        raise ValueError(f"{what} is larger than {MAX_METADATA_BYTES} bytes of JSON")
    return text


def start_statement(params: tuple[Any, ...], metadata: object) -> tuple[str, tuple[Any, ...]]:
    """The start statement and its parameters: plain ``START`` when there is
    nothing to store, else :data:`START_TAGGED` with metadata and trace context."""
    from .tracing import current_trace_context

    meta = check_metadata(metadata)
    trace = current_trace_context()
    if meta is None and trace is None:
        return q.START, params
    return START_TAGGED, (*params, meta, None if trace is None else _json.dumps(trace, "trace"))
