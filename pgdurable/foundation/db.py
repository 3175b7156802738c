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

__all__ = ["CONNECT_TIMEOUT", "acheck_connection", "asks_writable", "check_connection",
           "connect", "connect_timeout", "read_only_now", "resolve_dsn", "translated",
           "validate_dsn"]

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


#: What a connection's DSN says when it must reach a server that takes writes.
_WRITABLE = ("read-write", "primary")


def read_only_now(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True if the server has told this connection that it no longer takes
    writes (it reports ``default_transaction_read_only`` and, from PostgreSQL
    14, ``in_hot_standby`` as they change: no round trip) while its DSN asks
    for a writable server (``target_session_attrs=read-write`` or ``primary``).

    A connection made to a primary that was then made read-only (an old
    primary fenced by an operator, ``default_transaction_read_only = on``)
    is such a one: the pools drop it, and the next connection is resolved
    again among the DSN's hosts. A DSN that asks for nothing (one host) keeps
    it: its writes fail with :class:`~pgdurable.ReadOnlyDatabase`, said at once.
    """
    info = conn.info
    if "on" not in (info.parameter_status("default_transaction_read_only"),
                    info.parameter_status("in_hot_standby")):
        return False  # the hot path: two lookups in what the server reported
    return info.get_parameters().get("target_session_attrs") in _WRITABLE


def asks_writable(conninfo: str | None) -> bool:
    """True if ``conninfo`` asks libpq for a server that takes writes
    (``target_session_attrs=read-write`` or ``primary``, in the DSN or
    ``PGTARGETSESSIONATTRS``): a new connection skips a read-only host."""
    try:
        params = _conninfo.conninfo_to_dict(conninfo or "")
    except psycopg.ProgrammingError:
        return False
    attrs = params.get("target_session_attrs") or os.environ.get("PGTARGETSESSIONATTRS")
    return attrs in _WRITABLE


# async-to-sync: source (aname -> name)
async def acheck_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """The ``check=`` of the library's pools: hand out no dead connection.

    A connection that the server closed while it sat idle in the pool (a
    restart, a failover, ``pg_terminate_backend``, a pooler) has a readable
    socket (the termination notice, then EOF): only then is it checked with a
    round trip (psycopg's ``check_connection``), which raises for a dead one
    so the pool replaces it. A quiet socket costs one poll, not a round trip.
    A connection whose server became read-only while its DSN asks for a
    writable one (:func:`read_only_now`) is replaced too: a failover.
    """
    if conn.closed or conn.broken or not _quiet(conn):
        await AsyncConnectionPool.check_connection(conn)
    if read_only_now(conn):
        await conn.close()  # a closed connection is discarded, not put back
        raise psycopg.OperationalError("the server became read-only; the DSN asks for "
                                       "target_session_attrs=read-write: a new connection")
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def check_connection(conn: psycopg.Connection[Any]) -> None:
    """The ``check=`` of the library's pools: hand out no dead connection.

    A connection that the server closed while it sat idle in the pool (a
    restart, a failover, ``pg_terminate_backend``, a pooler) has a readable
    socket (the termination notice, then EOF): only then is it checked with a
    round trip (psycopg's ``check_connection``), which raises for a dead one
    so the pool replaces it. A quiet socket costs one poll, not a round trip.
    A connection whose server became read-only while its DSN asks for a
    writable one (:func:`read_only_now`) is replaced too: a failover.
    """
    if conn.closed or conn.broken or not _quiet(conn):
        ConnectionPool.check_connection(conn)
    if read_only_now(conn):
        conn.close()  # a closed connection is discarded, not put back
        raise psycopg.OperationalError("the server became read-only; the DSN asks for "
                                       "target_session_attrs=read-write: a new connection")
# async-to-sync: end

