"""Run metadata: labels set at start, searched by containment, and the trace context.

``await app.start("agent", state, metadata={"tenant": "acme"})`` stores the
labels in ``pgdurable.runs.metadata`` (JSONB, GIN-indexed for ``@>``) in the
same statement as the start: :data:`START_TAGGED` composes
``pgdurable.start_run`` with ``pgdurable.tag_started_run``, which only labels a
row inserted by the same transaction (no one can relabel an existing run). The
W3C trace context of the caller (only when OpenTelemetry is already in use,
see :mod:`pgdurable.runs.tracing`) is stored the same way, in ``trace_context``.
An idempotent repeat (same ``idempotency_key``) keeps the first labels.
"""

from __future__ import annotations

from typing import Any

from ..foundation import jsonb as _json
from ..foundation import run_queries as q
from ..foundation.queries.affinity import AFFINE_STARTED
from ..foundation.queries.metadata import TAG_STARTED
from .tracing import current_trace_context

__all__ = ["MAX_METADATA_BYTES", "START_TAGGED", "check_metadata", "start_statement"]

#: Largest metadata object (bytes of JSON) accepted at start.
MAX_METADATA_BYTES = 8192

#: The plain start, labelled (``START`` wrapped by
#: :data:`~pgdurable.foundation.queries.metadata.TAG_STARTED`).
START_TAGGED = TAG_STARTED.format(start=q.START)


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


def start_statement(
    sql: str, params: tuple[Any, ...], metadata: object, affinity_of: object = None
) -> tuple[str, tuple[Any, ...]]:
    """A start statement (``sql``, ``params``) as is when there is nothing to
    store, else wrapped by :data:`~pgdurable.foundation.queries.metadata.TAG_STARTED` with
    metadata and trace context, and by
    :data:`~pgdurable.foundation.queries.affinity.AFFINE_STARTED` for ``affinity_of`` (the
    run starts with the affinity that run has now; :mod:`pgdurable.foundation.affinity`).
    Bad input: TypeError/ValueError before any SQL."""
    meta = check_metadata(metadata)
    source = None if affinity_of is None else q.check_run_id(affinity_of)
    trace = current_trace_context()
    if meta is not None or trace is not None:
        sql = TAG_STARTED.format(start=sql)
        params = (*params, meta, None if trace is None else _json.dumps(trace, "trace"))
    if source is not None:
        sql, params = AFFINE_STARTED.format(start=sql), (*params, source)
    return sql, params
