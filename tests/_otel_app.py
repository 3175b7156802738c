"""Worker app for the tracing/metrics tests: ``python -m pgdurable.worker _otel_app:app``.

OpenTelemetry's SDK with an in-memory exporter that also appends each ended
span to $OTEL_SPAN_FILE as a JSON line (the test reads spans of processes
that are killed later). Task ``traced``: step 0 records an effect and parks on
a signal; step 1 SIGKILLs its worker the first time (marker file), then
completes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import pgdurable
from pgdurable import Done, RunContext, Wait

SPANS = os.environ.get("OTEL_SPAN_FILE", os.devnull)


class FileBackedExporter(InMemorySpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(SPANS, "a") as f:
            for s in spans:
                ctx = s.get_span_context()
                assert ctx is not None
                f.write(json.dumps({
                    "name": s.name, "trace_id": format(ctx.trace_id, "032x"),
                    "span_id": format(ctx.span_id, "016x"),
                    "parent": format(s.parent.span_id, "016x") if s.parent else None,
                    "attrs": dict(s.attributes or {}), "pid": os.getpid(),
                }) + "\n")
        return super().export(spans)


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileBackedExporter()))
trace.set_tracer_provider(provider)

app = pgdurable.Durable()


@app.task("traced", revision="1")
async def traced(ctx: RunContext, state: dict[str, Any]) -> Any:
    if ctx.step == 0:
        await ctx.effect("fetch", lambda: {"ok": 1})
        return Wait(signal=("approval", state["ref"]))
    if await asyncio.to_thread(_first_time, state["marker"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return Done("ok")


def _first_time(marker: str) -> bool:
    """True (and leaves the marker) the first time only."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


@app.task("quick", revision="1")
async def quick(ctx: RunContext, state: Any) -> Any:
    if state == "fail":
        raise ValueError("boom")
    return Done(state)
