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

from .errors import DatabaseUnavailable, InvalidInput, first_line, translate

__all__ = ["CONNECT_TIMEOUT", "acheck_connection", "check_connection", "connect",
           "connect_timeout", "library_options", "resolve_dsn", "translated", "validate_dsn"]

CONNECT_TIMEOUT = 10  # seconds, unless the DSN (or PGCONNECT_TIMEOUT) sets one


def connect_timeout(conninfo: str | None) -> dict[str, Any]:
    """``{"connect_timeout": CONNECT_TIMEOUT}`` unless ``conninfo`` or
    ``PGCONNECT_TIMEOUT`` sets one: a connection attempt to an unreachable
    host then fails instead of hanging for the OS's TCP timeout."""
    try:
        params = _conninfo.conninfo_to_dict(conninfo or "")
    except psycopg.ProgrammingError:
        params = {}
    if params.get("connect_timeout") or os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT}

def library_options(conninfo: str | None) -> str:
    """The ``options`` of a library connection: our settings, then the user's.

    Ours: library connections never sit idle inside a transaction (pitfall
    15: a transaction left open by a bug is ended by the server instead of
    pinning xmin), and name themselves ``pgdurable`` in ``pg_stat_activity``.

    The caller's own ``options`` (from the DSN, else ``PGOPTIONS``) come last,
    so their ``-c`` settings (``statement_timeout``, ``search_path``, ...) win
    over ours instead of being dropped; ``application_name=pgdurable`` is set
    only when the DSN (or ``PGAPPNAME``) names none.
    """
    try:
        params = _conninfo.conninfo_to_dict(conninfo or "")
    except psycopg.ProgrammingError:
        params = {}
    ours = "-c idle_in_transaction_session_timeout=60000"
    if not params.get("application_name") and not os.environ.get("PGAPPNAME"):
        ours += " -c application_name=pgdurable"
    theirs = str(params.get("options") or os.environ.get("PGOPTIONS") or "").strip()
    return f"{ours} {theirs}" if theirs else ours


_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def resolve_dsn(dsn: str | None = None) -> str | None:
    """The DSN to use: explicit, else ``PGDURABLE_DSN``, else ``DATABASE_URL``."""
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
    validate_dsn(dsn)
    try:
        return psycopg.connect(
            dsn, autocommit=autocommit, options=library_options(dsn), connect_timeout=10,
            **kwargs,
        )
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None


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

