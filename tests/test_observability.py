"""OpenTelemetry spans across a park and a crash (real worker processes, the
SDK's in-memory exporter), and the worker's Prometheus /metrics scraped over
HTTP and parsed."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import free_port
from _waiting import until_sync
from fix_fleet import Fleet, WorkerProc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from pgdurable import DurableClient

#: The workers' options as they were before the fleet fixture (the worker's own default
#: concurrency, 16).
pytestmark = pytest.mark.fleet("_otel_app:app", ttl=2.0, poll=0.2, concurrency=16)


def _worker(fleet: Fleet, tmp: Path, name: str, *extra: str) -> WorkerProc:
    return fleet.start(name, env={"OTEL_SPAN_FILE": str(tmp / "spans.jsonl")}, args=extra)


def _status(dsn: str, rid: str) -> str:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    return "" if row is None else str(row[0])


def _spans(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "spans.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.crash
def test_steps_join_the_starters_trace_across_a_park_and_a_crash(
        dsn: str, tmp_path: Path, fleet: Fleet) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("request") as root, DurableClient(dsn) as client:
        rid = client.start("traced", {"ref": "r1", "marker": str(tmp_path / "killed")},
                           revision="1")
    trace_id = format(root.get_span_context().trace_id, "032x")
    root_id = format(root.get_span_context().span_id, "016x")
    with psycopg.connect(dsn) as c:
        stored = c.execute("SELECT trace_context FROM pgdurable.runs WHERE id = %s",
                           (rid,)).fetchone()
    assert stored is not None and stored[0]["traceparent"].startswith(
        f"00-{trace_id}-{root_id}-")

    w1 = _worker(fleet, tmp_path, "w1")
    until_sync(lambda: _status(dsn, rid) == "waiting", "the run to park")
    with DurableClient(dsn) as client:
        assert client.signal("approval", "r1", {"ok": True})
    until_sync(lambda: w1.poll() is not None, "worker 1 to crash in step 1")
    assert w1.returncode == -signal.SIGKILL
    w2 = _worker(fleet, tmp_path, "w2")
    until_sync(lambda: _status(dsn, rid) == "completed", "worker 2 to finish the run")
    assert w2.terminate() == 0  # a clean stop (what it traced is written)
    spans = _spans(tmp_path)
    steps = [s for s in spans if s["name"] == "pgdurable.step traced"]
    effects = [s for s in spans if s["name"] == "pgdurable.effect fetch"]
    assert all(s["trace_id"] == trace_id for s in spans), spans
    assert {s["attrs"]["pgdurable.step"] for s in steps} == {0, 1}
    assert all(s["parent"] == root_id for s in steps), "steps are children of the starter"
    assert {s["pid"] for s in steps} == {w1.pid, w2.pid}, "two processes, one trace"
    step0 = next(s for s in steps if s["attrs"]["pgdurable.step"] == 0)
    assert [e["parent"] for e in effects] == [step0["span_id"]]
    step1 = next(s for s in steps if s["attrs"]["pgdurable.step"] == 1)
    assert step1["attrs"]["pgdurable.run_id"] == rid
    assert step1["attrs"]["pgdurable.token"] > step0["attrs"]["pgdurable.token"]
    assert set(step1["attrs"]) >= {"pgdurable.task", "pgdurable.attempt"}
    assert effects[0]["attrs"]["pgdurable.effect.key"] == "fetch"


def test_worker_metrics_are_scraped_and_parsed(dsn: str, tmp_path: Path,
                                               fleet: Fleet) -> None:
    port = free_port()
    w = _worker(fleet, tmp_path, "wm", "--metrics-port", str(port))
    try:
        with DurableClient(dsn) as client:
            ids = [client.start("quick", "x", revision="1"),
                   client.start("quick", "fail", revision="1", max_attempts=1),
                   client.start("traced", {"ref": "never", "marker": "/nonexistent"},
                                revision="1", queue="other")]
        until_sync(lambda: _status(dsn, ids[0]) == "completed"
                   and _status(dsn, ids[1]) == "failed", "the runs to end")

        def scrape() -> dict[str, Any]:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            return {f.name: f for f in text_string_to_metric_families(text)}

        fams: dict[str, Any] = {}

        def ready() -> bool:
            nonlocal fams
            try:
                fams = scrape()
            except httpx.HTTPError:
                return False
            return any(s.name.endswith("_total") and s.value == 1
                       for s in fams.get("pgdurable_runs_completed", type("x", (), {
                           "samples": []})).samples)
        until_sync(ready, "metrics to show the completed run")
    finally:
        w.terminate()

    def value(name: str, suffix: str = "", **labels: str) -> float:
        return sum(s.value for s in fams[name].samples
                   if s.name == name + suffix and all(s.labels.get(k) == v
                                                      for k, v in labels.items()))

    assert value("pgdurable_runs_completed", "_total", task="quick") == 1
    assert value("pgdurable_runs_failed", "_total", task="quick") == 1
    assert value("pgdurable_step_duration_seconds", "_count", task="quick") == 2
    assert value("pgdurable_claim_duration_seconds", "_count") >= 1
    assert "pgdurable_lease_losses" in fams
    assert value("pgdurable_queue_depth", queue="other", status="runnable") == 1
    assert "pgdurable_queue_oldest_runnable_age_seconds" in fams


def test_a_step_error_whose_str_raises_does_not_break_tracing() -> None:
    from opentelemetry.trace import StatusCode

    from pgdurable.runs.tracing import StepSpan

    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("step") as span:
        StepSpan(span).outcome(Weird())
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code == StatusCode.ERROR
