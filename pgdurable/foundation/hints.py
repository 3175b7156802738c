"""Private: notifications are hints, never orders.

Anyone who can connect may ``NOTIFY pgdurable_wake`` or ``NOTIFY
pgdurable_cancel`` (no privilege is needed, and run ids are broadcast on
``pgdurable_events``). So a worker:

* stops a step on a ``pgdurable_cancel`` notification only after the database
  says the run's ``cancel_requested_at`` is set under the worker's lease token
  (:func:`cancels_requested`); ``ack_cancel`` refuses a run nobody asked to
  cancel as well (0009). Those checks are coalesced and rate-limited like
  claims (a :class:`WakeLimiter` of their own): one check asks about every
  run named since the last one, so a flood of forged cancels costs at most
  ``burst`` checks plus ``rate`` a second, whichever runs it names, and a real
  cancel caught in it waits at most ``1 / rate`` seconds for its check;
* claims on ``pgdurable_wake`` notifications at a bounded rate
  (:class:`WakeLimiter`): a flood of forged wake-ups costs at most ``burst``
  claims plus ``rate`` claims a second, and a wake-up over the limit is not
  lost but deferred until a claim is allowed again. A claim gives back one
  token per run it found, so real wake-ups are never slowed (not even when
  one claim takes the runs of several NOTIFYs).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from .queries.hints import CANCELS_REQUESTED

__all__ = ["WakeLimiter", "cancels_requested"]


class _Fetch(Protocol):
    async def fetchall(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...


async def cancels_requested(app: _Fetch,
                            attempts: Sequence[tuple[uuid.UUID, int]]) -> set[uuid.UUID]:
    """Of these ``(run id, lease token)`` attempts, the runs the database holds a
    cancel request for (one statement, however many)."""
    q = CANCELS_REQUESTED
    rows = await app.fetchall(q.sql, ([r for r, _ in attempts], [t for _, t in attempts]))
    return set(q.all(rows))


class WakeLimiter:
    """Token bucket for what notifications trigger: claims on wake-ups (and,
    a bucket of its own, database checks on cancels).

    ``take()`` spends a token and returns 0.0 when a claim may run now, else
    reserves the next token and returns the seconds until it is there (the
    caller defers its claim that long, and asks again only after it ran).
    """

    def __init__(self, rate: float = 20.0, burst: int = 20) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> float:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        delay = 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate
        self._tokens -= 1.0
        return delay

    def refund(self, runs: int = 1) -> None:
        """A claim found ``runs`` runs: their wake-ups were real, give back a
        token per run. A run's NOTIFY whose run an earlier claim already took
        finds nothing and spends a token; the run that claim took gives it
        back, so a trickle of real starts never runs the bucket dry (only
        wake-ups that find no run at all, e.g. forged ones, are limited)."""
        self._tokens = min(self.burst, self._tokens + float(runs))
