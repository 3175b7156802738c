"""Connection plumbing shared by every module: DSN resolution and validation,
connections with library settings, and error translation at one choke point."""

from __future__ import annotations

import os
import re
import select
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import conninfo as _conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from . import pooler as _pooler
from .errors import InvalidInput, first_line, translate
from .pooler import CONNECT_TIMEOUT, connect_timeout

__all__ = ["CONNECT_TIMEOUT", "acheck_connection", "check_connection", "connect",
           "connect_timeout", "resolve_dsn", "translated", "validate_dsn"]

_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def resolve_dsn(dsn: str | None = None) -> str | None:
    """The DSN to use: explicit, else ``PGDURABLE_DSN``, else ``DATABASE_URL`` (None:
    none given). Public as ``pgdurable.resolve_dsn``: what ``Durable()`` and the
    command line use, for code that needs the same DSN (a LangGraph saver, a
    ``psycopg.connect``)."""
    for candidate in (dsn, os.environ.get("PGDURABLE_DSN"), os.environ.get("DATABASE_URL")):
        if candidate:
            return candidate
    return None


def validate_dsn(dsn: str) -> str:
    """Check that ``dsn`` is a PostgreSQL conninfo or URL; return it unchanged.

    Raises :class:`InvalidInput` for a URL of another database (``mysql://``),
    an empty string or a conninfo that does not parse (libpq's reason, with the
    tokens it quotes masked: they can be pieces of the password).
    """
    if not isinstance(dsn, str):
        raise TypeError(f"DSN must be a str, not {type(dsn).__name__}")
    if not dsn.strip():
        raise InvalidInput("DSN is empty")
    if "\x00" in dsn:
        raise InvalidInput("DSN contains a NUL character")
    m = _URL_SCHEME.match(dsn)
    if m and m.group(1).lower() not in ("postgres", "postgresql"):
        raise InvalidInput(
            f"DSN is not a PostgreSQL URL (scheme {m.group(1)!r}; expected postgresql://)"
        )
    problem = None
    try:
        _conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        problem = mask_dsn_error(first_line(str(exc)))
    if problem is not None:  # raised outside the handler: no __context__ holding libpq's text
        raise InvalidInput(f"DSN does not parse: {problem}")
    return dsn


# a token libpq quotes in a parse error ("missing "=" after "<token>"", "invalid
# percent-encoded token: "<token>"", ...): it may be a piece of the password
_QUOTED = re.compile(r'"([^"]*)"')


def mask_dsn_error(message: str) -> str:
    """libpq's DSN parse error with every quoted token but ``"="`` masked as ``"***"``."""
    return _QUOTED.sub(lambda m: m.group() if m.group(1) == "=" else '"***"', message)


def connect(dsn: str, *, autocommit: bool = True, **kwargs: Any) -> psycopg.Connection[Any]:
    """Open a sync connection with library settings; failures are typed errors."""
    return _pooler.connect(validate_dsn(dsn), autocommit=autocommit, **kwargs)


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise psycopg errors as pgdurable errors (the one translation point)."""
    try:
        yield
    except psycopg.Error as exc:
        err = translate(exc)
        if err is exc:
            raise
        raise err from exc


def _quiet(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True if the idle connection's socket has nothing to read: the server
    has neither closed it nor sent anything (no round trip, one poll)."""
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


async def acheck_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """The ``check=`` of the library's async pools: hand out no dead connection.

    A connection that the server closed while it sat idle in the pool (a
    restart, a failover, ``pg_terminate_backend``, a pooler) has a readable
    socket (the termination notice, then EOF): only then is it checked with a
    round trip (psycopg's ``check_connection``), which raises for a dead one
    so the pool replaces it. A quiet socket costs one poll, not a round trip.
    """
    if conn.closed or conn.broken or not _quiet(conn):
        await AsyncConnectionPool.check_connection(conn)


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """Sync twin of :func:`acheck_connection` (the ``check=`` of sync pools)."""
    if conn.closed or conn.broken or not _quiet(conn):
        ConnectionPool.check_connection(conn)

