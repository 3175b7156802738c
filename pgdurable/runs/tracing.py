"""OpenTelemetry spans for steps and effects, joined to the starter's trace.

Optional (``pip install 'pgdurable[otel]'``). pgdurable never imports
OpenTelemetry itself: everything here is a no-op unless the application has
already imported ``opentelemetry.trace`` (checked in ``sys.modules``), so
without the extra, or without tracing configured, there is no import and no
cost.

* At ``start()`` the caller's W3C trace context (``traceparent``/``tracestate``,
  from the globally configured propagator) is stored on the run
  (``runs.trace_context``, see :mod:`pgdurable.runs.metadata`).
* A worker opens one span per step (``pgdurable.step <task>``) whose parent is
  that stored context, so every step of a run joins the starter's trace,
  whichever worker runs it, after a park or a crash. Attributes:
  ``pgdurable.run_id``, ``pgdurable.task``, ``pgdurable.step``,
  ``pgdurable.attempt``, ``pgdurable.token``.
* Each ``ctx.effect(key, fn)`` gets a child span ``pgdurable.effect <key>``
  with the same attributes plus ``pgdurable.effect.key``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from ..foundation.queries.core import first
from ..foundation.queries.tracing import TRACE_CONTEXT

if TYPE_CHECKING:
    from ..foundation.ports import Database

__all__ = ["StepSpan", "current_trace_context", "effect_span", "enabled", "step_span"]

log = logging.getLogger("pgdurable.tracing")



def enabled() -> bool:
    """True when the application uses OpenTelemetry (``opentelemetry.trace`` imported)."""
    return "opentelemetry.trace" in sys.modules


def _tracing_configured() -> bool:
    """True when a real tracer provider is installed globally (spans would be recorded)."""
    if not enabled():
        return False
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


# run id -> its stored trace context: it never changes after start, so a
# worker reads it once per run (bounded; the oldest entries go first)
_contexts: dict[str, dict[str, str]] = {}
_MAX_CONTEXTS = 10_000


async def _run_context(app: Database, run_id: str) -> dict[str, str]:
    got = _contexts.get(run_id)
    if got is None:
        # read once per run, only while tracing
        stored = await first(app, TRACE_CONTEXT, (run_id,))
        got = stored if isinstance(stored, dict) else {}
        if len(_contexts) >= _MAX_CONTEXTS:
            del _contexts[next(iter(_contexts))]
        _contexts[run_id] = got
    return got


def current_trace_context() -> dict[str, str] | None:
    """The caller's W3C trace context as a carrier dict, or None (no tracing, no span)."""
    if not enabled():
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier if "traceparent" in carrier else None


class StepSpan:
    """Handle of a step span: :meth:`outcome` records an error outcome."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def outcome(self, value: object) -> None:
        """Mark the span as failed when the step's outcome is an exception."""
        if self._span is None or not isinstance(value, BaseException):
            return
        if not self._span.is_recording():
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.set_status(Status(StatusCode.ERROR, type(value).__name__))
        try:  # tracing never breaks a run: an exception whose str() raises, say
            self._span.record_exception(value)
        except Exception:
            log.debug("could not record the step's error on its span", exc_info=True)


def _attributes(run_id: object, task: str, step: int, attempt: int, token: int) -> dict[str, Any]:
    return {
        "pgdurable.run_id": str(run_id), "pgdurable.task": task, "pgdurable.step": step,
        "pgdurable.attempt": attempt, "pgdurable.token": token,
    }


class _NoSpan(contextlib.AbstractAsyncContextManager[StepSpan]):
    """What :func:`step_span` gives without tracing: one shared object, no
    async generator per step (the worker's hot path)."""

    _handle = StepSpan()

    async def __aenter__(self) -> StepSpan:
        return self._handle

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_SPAN = _NoSpan()


def step_span(
    app: Database, run_id: object, task: str, step: int, attempt: int, token: int
) -> contextlib.AbstractAsyncContextManager[StepSpan]:
    """A span around one step, child of the run's stored trace context (no-op without tracing)."""
    if not _tracing_configured():
        return _NO_SPAN
    return _step_span(app, run_id, task, step, attempt, token)


@contextlib.asynccontextmanager
async def _step_span(
    app: Database, run_id: object, task: str, step: int, attempt: int, token: int
) -> AsyncIterator[StepSpan]:
    from opentelemetry import propagate, trace

    parent = propagate.extract(await _run_context(app, str(run_id)))
    tracer = trace.get_tracer("pgdurable")
    with tracer.start_as_current_span(
        f"pgdurable.step {task}", context=parent,
        attributes=_attributes(run_id, task, step, attempt, token),
        record_exception=False, set_status_on_exception=False,
    ) as span:
        handle = StepSpan(span)
        try:
            yield handle
        except BaseException as exc:
            handle.outcome(exc)
            raise


@contextlib.contextmanager
def effect_span(
    run_id: object, task: str, step: int, attempt: int, token: int, key: str
) -> Iterator[None]:
    """A span around one effect, child of the current step span (no-op without tracing)."""
    if not _tracing_configured():
        yield
        return
    from opentelemetry import trace

    attrs = _attributes(run_id, task, step, attempt, token)
    attrs["pgdurable.effect.key"] = key
    with trace.get_tracer("pgdurable").start_as_current_span(
        f"pgdurable.effect {key}", attributes=attrs,
        record_exception=False, set_status_on_exception=False,
    ) as span:
        try:
            yield
        except BaseException as exc:
            StepSpan(span).outcome(exc)
            raise
