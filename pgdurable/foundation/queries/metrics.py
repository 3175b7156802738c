"""Prometheus gauges read at scrape time (:mod:`pgdurable.foundation.metrics`)."""

from __future__ import annotations

from dataclasses import dataclass

from .core import record

__all__ = ["QUEUE_STATS", "QueueStats"]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's run counts by status, and the age of its oldest due runnable run."""

    queue: str
    runnable: int
    leased: int
    waiting: int
    completed: int
    failed: int
    cancelled: int
    oldest_runnable_age: float | None  # seconds


# -- per-queue counts for the queue gauges (read-only view); one QueueStats per queue
QUEUE_STATS = record(
    "SELECT queue, runnable, leased, waiting, completed, failed, cancelled, "
    "extract(epoch FROM oldest_runnable_age)::float8 FROM pgdurable.queue_stats", QueueStats)
