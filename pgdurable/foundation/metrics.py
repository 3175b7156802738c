"""Prometheus metrics (optional: ``pip install 'pgdurable[metrics]'``).

Every hook here is a no-op until :func:`enable` is called (``pgdurable worker
--metrics-port``, the dashboard's ``/metrics``, or your code), and
:func:`enable` raises :class:`ImportError` with an install hint when
``prometheus_client`` is absent. Metrics (all prefixed ``pgdurable_``):

* ``runs_started_total{task}``: runs started by this process (``app.start``);
* ``runs_completed_total{task}``, ``runs_failed_total{task}``: runs this
  process's workers ended;
* ``step_duration_seconds{task}`` (histogram): wall time of each step;
* ``claim_duration_seconds`` (histogram): latency of the claim statement;
* ``lease_losses_total``: runs a worker stopped because it lost the lease;
* ``queue_depth{queue,status}`` and ``queue_oldest_runnable_age_seconds{queue}``:
  read from ``pgdurable.queue_stats`` at each scrape (the read-only role may
  read it), when a DSN is given to :func:`enable`;
* ``budget_reservations_total{outcome}``: ``ctx.reserve`` calls of this process by
  outcome (reserved, replayed, unbudgeted, exhausted, too_large);
* ``budget_limit{budget,unit}``, ``budget_settled{budget,unit}`` (in the current
  window) and ``budget_held{budget,unit}`` (live reservations): read from
  ``pgdurable.budget_usage`` at each scrape, for the named budgets (not the runs'
  own), when a DSN is given to :func:`enable`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from .queries.budgets import GAUGES as BUDGET_GAUGES
from .queries.core import many_sync
from .queries.metrics import QUEUE_STATS
from .schemas import resolve_schema, use_schema

__all__ = [
    "budget_reserved", "claim_done", "enable", "enabled", "lease_lost", "registry",
    "run_finished", "run_started", "serve", "step_done",
]

_STATUSES = ("runnable", "leased", "waiting", "completed", "failed", "cancelled")


class _Metrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Histogram

        self.registry = registry
        self.started = Counter("pgdurable_runs_started", "Runs started.", ["task"],
                               registry=registry)
        self.completed = Counter("pgdurable_runs_completed", "Runs completed.", ["task"],
                                 registry=registry)
        self.failed = Counter("pgdurable_runs_failed", "Runs failed.", ["task"],
                              registry=registry)
        self.step = Histogram("pgdurable_step_duration_seconds", "Wall time of a step.",
                              ["task"], registry=registry)
        self.claim = Histogram("pgdurable_claim_duration_seconds",
                               "Latency of a claim statement.", registry=registry,
                               buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self.lost = Counter("pgdurable_lease_losses", "Runs stopped on a lost lease.",
                            registry=registry)
        self.reservations = Counter("pgdurable_budget_reservations",
                                    "Budget reservations (ctx.reserve) by outcome.", ["outcome"],
                                    registry=registry)


class _QueueCollector:
    """Queue depth and oldest runnable age, read from SQL at scrape time."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._dsn, self._schema = dsn, schema

    def collect(self) -> Iterator[Any]:
        import psycopg
        from prometheus_client.core import GaugeMetricFamily

        depth = GaugeMetricFamily("pgdurable_queue_depth", "Runs per queue and status.",
                                  labels=["queue", "status"])
        oldest = GaugeMetricFamily("pgdurable_queue_oldest_runnable_age_seconds",
                                   "Age of the oldest due runnable run.", labels=["queue"])
        with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
            use_schema(conn, self._schema)
            for q in many_sync(conn, QUEUE_STATS):
                for status in _STATUSES:
                    depth.add_metric([q.queue, status], float(getattr(q, status)))
                oldest.add_metric([q.queue], float(q.oldest_runnable_age or 0.0))
        yield depth
        yield oldest


class _BudgetCollector:
    """The named budgets' limits, settled spend and live holds, read from SQL at scrape time."""

    def __init__(self, dsn: str, schema: str) -> None:
        self._dsn, self._schema = dsn, schema

    def collect(self) -> Iterator[Any]:
        import psycopg
        from prometheus_client.core import GaugeMetricFamily

        labels = ["budget", "unit"]
        limit = GaugeMetricFamily("pgdurable_budget_limit", "A budget's limit per unit.",
                                  labels=labels)
        settled = GaugeMetricFamily("pgdurable_budget_settled",
                                    "Spend settled in the budget's current window.", labels=labels)
        held = GaugeMetricFamily("pgdurable_budget_held",
                                 "Capacity held by live reservations.", labels=labels)
        with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
            use_schema(conn, self._schema)
            for b in many_sync(conn, BUDGET_GAUGES):
                if b.limit_amount is not None:
                    limit.add_metric([b.budget_key, b.unit], float(b.limit_amount))
                settled.add_metric([b.budget_key, b.unit], float(b.settled))
                held.add_metric([b.budget_key, b.unit], float(b.held))
        yield limit
        yield settled
        yield held


_m: _Metrics | None = None
_lock = threading.Lock()


def enabled() -> bool:
    """True once :func:`enable` was called."""
    return _m is not None


def enable(dsn: str | None = None, registry: Any = None, schema: str | None = None) -> Any:
    """Turn the hooks on (idempotent) and return the registry. With ``dsn``,
    queue gauges are read from ``pgdurable.queue_stats`` at each scrape (in ``schema``,
    else ``PGDURABLE_SCHEMA``, else ``pgdurable``)."""
    global _m
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise ImportError(
            "metrics need prometheus_client: pip install 'pgdurable[metrics]'"
        ) from None
    with _lock:
        if _m is None:
            _m = _Metrics(registry if registry is not None else CollectorRegistry())
            if dsn is not None:
                in_schema = resolve_schema(schema)
                _m.registry.register(_QueueCollector(dsn, in_schema))
                _m.registry.register(_BudgetCollector(dsn, in_schema))
        return _m.registry


def registry() -> Any:
    """The registry of the enabled metrics (None before :func:`enable`)."""
    return None if _m is None else _m.registry


def serve(port: int, dsn: str | None = None, addr: str = "127.0.0.1",
          schema: str | None = None) -> None:
    """Enable the metrics and serve ``/metrics`` on ``addr:port`` (a daemon thread)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=addr, registry=enable(dsn, schema=schema))


def run_started(task: str) -> None:
    """Count a started run."""
    if _m is not None:
        _m.started.labels(task).inc()


def run_finished(task: str, status: str) -> None:
    """Count a run a worker ended: ``completed`` or ``failed`` (others ignored)."""
    if _m is None:
        return
    if status == "completed":
        _m.completed.labels(task).inc()
    elif status == "failed":
        _m.failed.labels(task).inc()


def step_done(task: str, seconds: float) -> None:
    """Observe one step's wall time."""
    if _m is not None:
        _m.step.labels(task).observe(seconds)


def claim_done(seconds: float) -> None:
    """Observe one claim statement's latency."""
    if _m is not None:
        _m.claim.observe(seconds)


def lease_lost() -> None:
    """Count a run stopped on a lost lease."""
    if _m is not None:
        _m.lost.inc()


def budget_reserved(outcome: str) -> None:
    """Count a ``ctx.reserve`` by its outcome."""
    if _m is not None:
        _m.reservations.labels(outcome).inc()
