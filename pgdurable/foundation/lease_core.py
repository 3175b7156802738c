"""Private core shared by the sync and async lease providers.

Everything that is not I/O lives here once: argument validation, and which
named query (``pgdurable.foundation.queries.leases``: the SQL text and its typed
answer) each operation sends. A provider method builds a :class:`Call`
(validated before any SQL) and hands it to its shell, which executes
``call.sql`` with ``call.params`` and returns ``call.parse(row)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.types.numeric import Int8
from psycopg_pool import PoolClosed, PoolTimeout

from .errors import DatabaseUnavailable, PgDurableError, ProviderClosed, translate
from .queries import leases as lq
from .queries.leases import LeaseGrant, decode_name

__all__ = ["MAX_TTL_MS", "Call", "LeaseGrant", "acquire", "check_token", "check_ttl",
           "connection_broke", "decode_name", "encode_name", "failure", "get_lease",
           "get_owner", "release", "renew", "transfer"]

T = TypeVar("T")

MAX_TTL_MS = 24 * 60 * 60 * 1000
"""Longest TTL accepted (24 h); the SQL functions enforce the same bound."""


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One validated SQL function call: text, binary parameters, row parser."""

    sql: str
    params: tuple[Any, ...]
    parse: Callable[[tuple[Any, ...] | None], T]
    retry_safe: bool = True  # repeating it after a lost connection gives the same answer


def encode_name(value: object, what: str) -> bytes:
    """A key or owner as UTF-8 bytes; ``TypeError``/``ValueError`` on bad input."""
    if not isinstance(value, str):
        raise TypeError(f"lease {what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"lease {what} must be a non-empty string")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"lease {what} is not valid Unicode (it contains a lone surrogate)"
        ) from None


def check_ttl(ttl_ms: object) -> Int8:
    """A TTL in milliseconds: an ``int`` (not bool) in 1 .. 24 h."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int):
        raise TypeError(f"ttl_ms must be an int (milliseconds), not {type(ttl_ms).__name__}")
    if ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
    if ttl_ms > MAX_TTL_MS:
        raise ValueError(f"ttl_ms must be at most {MAX_TTL_MS} (24 h), got {ttl_ms}")
    return Int8(ttl_ms)


def check_token(token: object) -> Int8 | None:
    """An optional fencing token: ``None`` or a non-negative ``int`` (not bool)."""
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"token must be an int or None, not {type(token).__name__}")
    if token < 0 or token >= 2**63:
        raise ValueError(f"token out of range: {token}")
    return Int8(token)


def _grant(row: tuple[Any, ...] | None) -> LeaseGrant:
    if row is None:  # pragma: no cover - the function always returns one row
        raise PgDurableError("acquire_lease returned no row")
    return lq.ACQUIRE.one(row)


def _none(row: tuple[Any, ...] | None) -> None:
    return None


def _renewed(row: tuple[Any, ...] | None) -> bool:
    return bool(lq.RENEW.first(row))


def _transferred(row: tuple[Any, ...] | None) -> bool:
    return lq.TRANSFER.first(row) is not None  # a new token; NULL: not held


def acquire(key: str, owner: str, ttl_ms: int) -> Call[LeaseGrant]:
    """The validated ``acquire_lease`` call."""
    k, o, t = encode_name(key, "key"), encode_name(owner, "owner"), check_ttl(ttl_ms)
    return Call(lq.ACQUIRE.sql, (k, o, t), _grant)


def get_owner(key: str) -> Call[str | None]:
    """The validated ``get_lease_owner`` call."""
    return Call(lq.GET_OWNER.sql, (encode_name(key, "key"),), lq.GET_OWNER.first)


def get_lease(key: str) -> Call[LeaseGrant | None]:
    """The validated ``get_lease`` call."""
    return Call(lq.GET_LEASE.sql, (encode_name(key, "key"),), lq.GET_LEASE.first)


def release(key: str, owner: str, token: int | None) -> Call[None]:
    """The validated ``release_lease`` call."""
    params = (encode_name(key, "key"), encode_name(owner, "owner"), check_token(token))
    return Call(lq.RELEASE.sql, params, _none)


def renew(key: str, owner: str, ttl_ms: int, token: int | None) -> Call[bool]:
    """The validated ``renew_lease`` call."""
    params = (encode_name(key, "key"), encode_name(owner, "owner"), check_ttl(ttl_ms),
              check_token(token))
    return Call(lq.RENEW.sql, params, _renewed)


def transfer(key: str, from_owner: str, to_owner: str, ttl_ms: int,
             token: int | None) -> Call[bool]:
    """The validated ``transfer_lease`` call (not retried: a repeat would report False)."""
    params = (encode_name(key, "key"), encode_name(from_owner, "from_owner"),
              encode_name(to_owner, "to_owner"), check_ttl(ttl_ms), check_token(token))
    return Call(lq.TRANSFER.sql, params, _transferred, retry_safe=False)


def connection_broke(exc: BaseException) -> bool:
    """True when ``exc`` means the connection itself failed (server gone, killed backend)."""
    return isinstance(exc, psycopg.Error) and isinstance(translate(exc), DatabaseUnavailable)


def failure(exc: BaseException, call: Call[Any], attempt: int, closed: bool) -> BaseException | None:
    """What to raise for ``exc`` raised while running ``call``; ``None`` means retry once.

    A closed provider or pool is :class:`ProviderClosed`; a connection that broke
    (e.g. its backend was terminated) is retried once on another connection for
    retry-safe calls, else :class:`DatabaseUnavailable`; a pool that cannot hand
    out a connection is :class:`DatabaseUnavailable`; the rest is translated.
    """
    if closed or isinstance(exc, PoolClosed):
        return ProviderClosed("the lease provider is closed")
    if isinstance(exc, PoolTimeout):
        return DatabaseUnavailable(f"no database connection available: {exc}")
    if connection_broke(exc):
        if attempt == 0 and call.retry_safe:
            return None
        return DatabaseUnavailable(f"database connection lost: {exc}".splitlines()[0])
    return translate(exc)
