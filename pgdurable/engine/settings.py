"""A worker's settings: its options, checked once, and the knobs its parts read.

:class:`Settings` is built by :meth:`Settings.of` from the options of
:class:`~pgdurable.engine.worker.Worker` and shared, read-only in practice, by every
part (the claimer, the heartbeat, the listener, the executor, parking). The few knobs
tests and operators tune (``claim_delay``, ``recheck_interval``, ``settle_limit``,
``grace``) are plain attributes.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from ..foundation import run_queries as q
from ..foundation.affinity import new_instance

__all__ = ["Settings", "as_timedelta"]


def _seconds(value: timedelta | float | int, what: str) -> float:
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not secs > 0:
        raise ValueError(f"{what} must be > 0")
    return secs


def as_timedelta(value: timedelta | float | None) -> timedelta | None:
    """``value`` as a timedelta (seconds if a number; None stays None)."""
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


@dataclass(slots=True)
class Settings:
    """What a worker was asked to do (see :class:`~pgdurable.engine.worker.Worker`)."""

    queues: list[str]
    concurrency: int
    ttl: float  # lease TTL, seconds
    heartbeat_interval: float
    poll_interval: float
    lease_window: float
    safety_margin: float
    worker_id: str
    #: this process's instance (pgdurable/foundation/affinity.py): runs pinned here name
    #: it, and a restart under the same worker_id is another instance
    instance: str
    listen: bool
    #: when fewer than claim_batch slots are free, a claim waits claim_delay seconds for
    #: more to free up (under load: fewer, larger claims); a wake-up within claim_delay
    #: of a claim that found runs (fewer than its free slots) waits for the rest of it
    #: (a trickle: engine/claim.py)
    claim_batch: int
    claim_delay: float = 0.005
    #: how long a trickle of claims may skip next_wakeup (see engine/claim.py)
    recheck_interval: float = 0.5
    #: after the grace period, how long stopped runs get to settle (release, acknowledge
    #: a cancel) before stop() gives up on them
    settle_limit: float = 10.0
    #: how long running steps get to finish on a stop (set by stop(grace=...))
    grace: float = 30.0

    @classmethod
    def of(
        cls,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 16,
        lease_ttl: timedelta | float = timedelta(seconds=60),
        heartbeat: timedelta | float | None = None,
        poll_interval: timedelta | float = 5.0,
        lease_window: timedelta | float | None = None,
        safety_margin: timedelta | float | None = None,
        worker_id: str | None = None,
        listen: bool = True,
    ) -> Settings:
        """Check the worker's options (TypeError/ValueError) and derive the rest."""
        if isinstance(queues, str) or not isinstance(queues, Sequence) or not queues:
            raise TypeError("queues must be a non-empty list of queue names")
        for name in queues:
            q.check_name(name, "queue")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError("concurrency must be an int >= 1")
        ttl = _seconds(lease_ttl, "lease_ttl")
        hb = ttl / 3 if heartbeat is None else _seconds(heartbeat, "heartbeat")
        margin = ttl / 6 if safety_margin is None else _seconds(safety_margin, "safety_margin")
        return cls(
            queues=list(dict.fromkeys(queues)),
            concurrency=concurrency,
            ttl=ttl,
            heartbeat_interval=min(hb, ttl / 3),
            poll_interval=_seconds(poll_interval, "poll_interval"),
            lease_window=ttl if lease_window is None else _seconds(lease_window, "lease_window"),
            safety_margin=min(margin, ttl / 2),
            worker_id=worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            instance=new_instance(),
            listen=listen,
            claim_batch=max(1, concurrency // 8),
        )
