"""Retrying a statement over a lost connection while it is still safe to.

A lost connection (a restart, a failover, a proxy or PgBouncer closing idle
server connections, ``pg_terminate_backend``) is not a failure of the work:
the next connection usually works. The callers here retry only writes that
are fenced and idempotent for their owner (``effect_finish``,
``idempotency_finish``, ``fail_run``, ...), so a write that committed before
its answer was lost is harmless to send again, and a write whose lease was
taken over meanwhile is refused by the fence, never applied late. They retry
only while their lease is still trusted: past that, another owner may already
be running the same work.

* :func:`backoff` -- 0.1 s doubling to 2 s, with jitter;
* :func:`retry_while` -- await a call again after a transient error (a lost
  connection, a deadlock, a statement timeout: :func:`is_transient`) for as
  long as a ``trusted()`` predicate holds (the worker's lease check);
  :func:`retry_while_sync` is its sync twin.

Reads and idempotent start-up writes (the schema check when a pool opens, a
worker's schedule declarations) use the same helpers with a deadline as the
predicate.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from .errors import DatabaseUnavailable, translate

__all__ = ["Deadline", "backoff", "for_seconds", "is_lost_connection",
           "is_transient", "retry_while", "retry_while_sync"]

T = TypeVar("T")

def is_lost_connection(exc: BaseException) -> bool:
    """True for a lost or unobtainable connection (SQLSTATE class 08, 57P, or none)."""
    return isinstance(translate(exc), DatabaseUnavailable)


def is_transient(exc: BaseException) -> bool:
    """A lost connection, or an error that says nothing about the statement:
    SQLSTATE class 40 (serialization failure, deadlock), 53 (insufficient
    resources) or 57014 (statement timeout, ``pg_cancel_backend``). A
    transaction failed with one of these did not commit."""
    if is_lost_connection(exc):
        return True
    code = getattr(exc, "sqlstate", None)
    if not isinstance(code, str):
        code = getattr(exc.__cause__, "sqlstate", None)
    return isinstance(code, str) and (code.startswith(("40", "53")) or code == "57014")


class Deadline:
    """A point ``seconds`` from now on the monotonic clock. Calling it is a
    ``trusted()`` predicate for :func:`retry_while` (true until then);
    :meth:`left` bounds each try's own waits (a pool checkout) by what remains."""

    __slots__ = ("_at",)

    def __init__(self, seconds: float) -> None:
        self._at = time.monotonic() + seconds

    def __call__(self) -> bool:
        return time.monotonic() < self._at

    def left(self) -> float:
        """Seconds until the deadline, never below zero."""
        return max(self._at - time.monotonic(), 0.0)


def for_seconds(seconds: float) -> Deadline:
    """A ``trusted()`` predicate for :func:`retry_while`: true for the next ``seconds``."""
    return Deadline(seconds)


def backoff(first: float = 0.1, cap: float = 2.0) -> Iterator[float]:
    """Delays between retries: ``first`` doubling up to ``cap``, each jittered ±25%."""
    delay = first
    while True:
        yield delay * random.uniform(0.75, 1.25)
        delay = min(delay * 2, cap)


async def retry_while(call: Callable[[], Awaitable[T]], trusted: Callable[[], bool]) -> T:
    """``await call()``; after a transient error (:func:`is_transient`: a lost
    connection, a deadlock, a statement timeout, ...), call again (with
    :func:`backoff`) as long as ``trusted()`` holds. Any other error, or a
    transient one once ``trusted()`` is false, is raised."""
    delays = backoff()
    while True:
        try:
            return await call()
        except Exception as exc:
            if not is_transient(exc) or not trusted():
                raise
        await asyncio.sleep(next(delays))


def retry_while_sync(call: Callable[[], T], trusted: Callable[[], bool]) -> T:
    """Sync twin of :func:`retry_while`."""
    delays = backoff()
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc) or not trusted():
                raise
        time.sleep(next(delays))
