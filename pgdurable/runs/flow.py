"""Flow control across all workers: queue and per-key concurrency, fair
rotation between keys, start rates, shared token buckets and delayed starts.

Everything is enforced by the database inside ``pgdurable.claim_runs`` (see
``sql/*_flow_control.sql``), so it holds across any number of worker
processes and hosts. This module validates the Python arguments (nothing is
written on bad input), holds the SQL statements, and defines
:class:`RateLimited`, the exception that parks a run until a time (what
``ctx.acquire`` raises when a bucket is empty, and what a step raises on a
provider's 429).

See docs/flow_control.md.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from ..foundation.errors import PgDurableError
from ..foundation.queries import flow as fq
from ..foundation.queries.core import first
from ..foundation.run_queries import START, check_name

__all__ = ["Rate", "RateLimited", "bucket_params", "queue_params"]

#: A rate: ``(count, per)``, e.g. ``(600, timedelta(minutes=1))``, or a
#: number of tokens per second.
Rate = tuple[float, timedelta] | float | int

#: The SQL the run API (:mod:`pgdurable.app.run_api`, and its generated sync twin) sends
#: (its answers are not read): :mod:`pgdurable.foundation.queries.flow`.
SET_QUEUE = fq.SET_QUEUE.sql
SET_BUCKET = fq.SET_BUCKET.sql
#: The wait kind of a run parked by ``ctx.acquire`` (ref: the bucket name).
ACQUIRE_KIND = "pgdurable.acquire"
#: The longest delayed start (like the longest Sleep).
MAX_DELAY = timedelta(days=365 * 1000)


class RateLimited(PgDurableError):
    """Raised in a step: park the run (no worker held) and run the step again
    after ``retry_after`` seconds, woken by a timer.

    ``ctx.acquire`` raises it when its bucket is short; raise it yourself when
    a provider answers 429 (:meth:`from_headers` reads ``Retry-After`` and the
    common ``x-ratelimit-reset*`` headers). The state is the last checkpoint;
    the step starts over with ``ctx.wake`` = ``{"type": "timeout", ...}``.
    """

    def __init__(self, retry_after: float | timedelta | datetime, message: str | None = None,
                 *, bucket: str | None = None):
        #: Set by ``ctx.acquire``: the tokens of this bucket are reserved for
        #: the run at the wake time (the park records it in ``ctx.wake``).
        self.bucket = bucket
        if isinstance(retry_after, datetime):
            if retry_after.tzinfo is None:
                raise ValueError("RateLimited(retry_after=datetime) must be timezone-aware")
            secs = (retry_after - datetime.now(UTC)).total_seconds()
        elif isinstance(retry_after, timedelta):
            secs = retry_after.total_seconds()
        elif isinstance(retry_after, int | float) and not isinstance(retry_after, bool):
            secs = float(retry_after)
        else:
            raise TypeError("retry_after must be seconds, a timedelta or an aware datetime")
        if not math.isfinite(secs):
            raise ValueError("retry_after must be finite")
        #: Seconds to wait (>= 0).
        self.retry_after = max(0.0, secs)
        super().__init__(message or f"rate limited: retry in {self.retry_after:.3f} s")

    def parking(self) -> tuple[str | None, str | None, timedelta | None]:
        """How the worker parks the run: the wait's ``(kind, ref)`` (a plain timer, or
        the bucket's reservation) and the timer (``retry_after``)."""
        kind = None if self.bucket is None else ACQUIRE_KIND
        return kind, self.bucket, timedelta(seconds=self.retry_after)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], default: float = 1.0) -> RateLimited:
        """A :class:`RateLimited` from an HTTP 429's headers: ``Retry-After``
        (seconds or an HTTP date), else ``x-ratelimit-reset-requests`` /
        ``x-ratelimit-reset-tokens`` / ``x-ratelimit-reset`` (seconds, ``6m0s``
        style durations, or a Unix time), else ``default`` seconds."""
        low = {k.lower(): v for k, v in headers.items()}
        value = low.get("retry-after")
        if value is not None:
            try:
                return cls(float(value))
            except ValueError:
                parsed = email.utils.parsedate_to_datetime(value) if value.strip() else None
                if parsed is not None and parsed.tzinfo is not None:
                    return cls(parsed)
        waits = [
            w for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
                           "x-ratelimit-reset")
            if (w := _parse_reset(low.get(name))) is not None
        ]
        return cls(max(waits) if waits else default)


def _parse_reset(value: str | None) -> float | None:
    """``"12"``, ``"1.5s"``, ``"6m0s"``, ``"250ms"`` or a Unix time -> seconds."""
    if value is None:
        return None
    v = value.strip()
    try:
        n = float(v)
    except ValueError:
        pass
    else:
        # a Unix time (reset at) rather than a duration
        return n - datetime.now(UTC).timestamp() if n > 1e9 else n
    total, num = 0.0, ""
    i = 0
    while i < len(v):
        ch = v[i]
        if ch.isdigit() or ch == ".":
            num += ch
        elif v.startswith("ms", i) and num:
            total += float(num) / 1000
            num = ""
            i += 1
        elif ch in "hms" and num:
            total += float(num) * {"h": 3600, "m": 60, "s": 1}[ch]
            num = ""
        else:
            return None
        i += 1
    return total if not num else None


def _positive_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or None")
    if not 1 <= value < 2**31:
        raise ValueError(f"{what} must be >= 1 (and fit in 32 bits), not {value!r}")
    return value


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise TypeError(f"{what} must be a number")
    f = float(value)
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"{what} must be a finite number > 0, not {value!r}")
    return f


def per_second(rate: object, what: str = "rate") -> float:
    """``(count, per)`` or tokens per second -> tokens per second (> 0)."""
    if isinstance(rate, tuple):
        if len(rate) != 2 or not isinstance(rate[1], timedelta):
            raise TypeError(f"{what} must be (count, timedelta) or a number per second")
        count = _number(rate[0], f"{what} count")
        secs = rate[1].total_seconds()
        if secs <= 0:
            raise ValueError(f"{what} period must be a positive timedelta, not {rate[1]!r}")
        return count / secs
    return _number(rate, what)


def queue_params(
    name: object, concurrency: object, per_key_concurrency: object, rate: object, burst: object
) -> tuple[Any, ...]:
    """Validate :meth:`Durable.set_queue` arguments -> ``SET_QUEUE`` parameters."""
    check_name(name, "queue")
    c = _positive_int(concurrency, "concurrency")
    k = _positive_int(per_key_concurrency, "per_key_concurrency")
    r = None if rate is None else per_second(rate)
    b = None
    if burst is not None:
        if r is None:
            raise ValueError("burst needs a rate")
        b = _number(burst, "burst")
        if b < 1:
            raise ValueError(f"burst must be >= 1 (one run), not {burst!r}")
    return (name, c, k, r, b)


def bucket_params(name: object, rate: object, burst: object) -> tuple[Any, ...]:
    """Validate :meth:`Durable.set_bucket` arguments -> ``SET_BUCKET`` parameters."""
    check_name(name, "bucket name")
    r = per_second(rate)
    b = None if burst is None else _number(burst, "burst")
    return (name, r, b)


def acquire_params(name: object, cost: object) -> tuple[Any, ...]:
    """Validate ``ctx.acquire`` arguments -> ``ACQUIRE`` parameters (the
    database checks the bucket exists and that cost <= its burst)."""
    check_name(name, "bucket name")
    return (name, _number(cost, "cost"))


def start_flow_params(
    params: tuple[Any, ...], key: object, at: object, delay: object
) -> tuple[Any, ...] | None:
    """``START`` parameters plus key / at / delay -> ``START_FLOW`` parameters
    (:mod:`pgdurable.foundation.queries.flow`), or ``None`` when none of them is given
    (the plain ``START``)."""
    if key is None and at is None and delay is None:
        return None
    if key is not None:
        check_name(key, "key")
    if at is not None and delay is not None:
        raise ValueError("give at= or delay=, not both")
    if at is not None:
        if not isinstance(at, datetime):
            raise TypeError("at must be an aware datetime")
        if at.tzinfo is None:
            raise ValueError("at must be timezone-aware")
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise TypeError("delay must be a timedelta")
        if delay < timedelta(0) or delay > MAX_DELAY:
            raise ValueError(f"delay must be between 0 and {MAX_DELAY.days} days, not {delay!r}")
    return (*params, key, at, delay)


def start_sql(
    params: tuple[Any, ...], key: object, at: object, delay: object
) -> tuple[str, tuple[Any, ...]]:
    """The start statement and its parameters: ``START_FLOW`` with a key or a
    delayed start, else the plain ``START``."""
    flow_params = start_flow_params(params, key, at, delay)
    return (START, params) if flow_params is None else (fq.START_FLOW.sql, flow_params)


def reserved(wake: Mapping[str, Any] | None, name: str) -> bool:
    """Did the run wake from an ``acquire`` park on bucket ``name`` (tokens
    already reserved for it)?"""
    return (wake is not None and wake.get("type") == "timeout"
            and wake.get("kind") == ACQUIRE_KIND and wake.get("ref") == name)


async def acquire(app: Any, name: str, cost: float) -> None:
    """Take ``cost`` tokens from bucket ``name``, or reserve them and raise
    :class:`RateLimited` (the worker parks the run until they are due)."""
    params = acquire_params(name, cost)
    wait = await first(app, fq.ACQUIRE, params) or 0.0
    if wait > 0:
        raise RateLimited(wait, f"bucket {name!r} is short of {float(cost):g} tokens: "
                                f"reserved, resuming in {wait:.3f} s", bucket=name)
