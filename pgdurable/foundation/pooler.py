"""Connection poolers (PgBouncer and the like): what a library connection sends and sets.

Every library connection works through a pooler, and a refusal is an error at once:

* The startup packet carries the DSN's own parameters and an application
  name (``fallback_application_name=pgdurable``: one in the DSN or
  ``PGAPPNAME`` wins), nothing else. (Earlier versions sent the ``options``
  startup parameter, which PgBouncer refuses: "unsupported startup parameter:
  options".)
* Session settings are made after connecting, in one statement
  (:data:`SESSION_SETUP`): ``idle_in_transaction_session_timeout`` becomes
  60 s unless the server, database, role or the DSN's own ``options`` /
  ``PGOPTIONS`` already set one (pitfall 15: a transaction left open by a bug
  is ended by the server instead of pinning xmin).
* :func:`connect` / :func:`aconnect` raise
  :class:`~pgdurable.DatabaseUnavailable` with the server's or pooler's own
  message. :class:`~pgdurable.Durable` and :class:`~pgdurable.DurableClient`
  try one connection (:func:`aprobe` / :func:`probe`) before they open their
  pool: a refusal (the server or pooler answered ``FATAL``: a startup
  parameter it does not support, a failed authentication, no such database)
  is raised at once, instead of a pool timeout 30 s later that names no
  cause. When nothing answers (a restart in progress), the pool still waits
  for the server as before.

``pooler`` says what the DSN goes through:

* ``None`` (a direct connection) or ``"session"`` (PgBouncer
  ``pool_mode = session``): everything works as directly.
* ``"transaction"`` (PgBouncer ``pool_mode = transaction``: a server
  connection serves another client after every transaction):

  - no prepared statements: every connection gets ``prepare_threshold=None``
    (PgBouncer 1.18 has no prepared-statement support; a statement prepared
    on one server connection is missing, or already there, on the next);
  - no session settings: a ``SET`` would stay on a server connection that
    other clients get (set PgBouncer's ``idle_transaction_timeout`` instead);
  - LISTEN needs a direct connection: ``listen_dsn=`` (or
    ``PGDURABLE_LISTEN_DSN``). Without one, workers poll (with a warning at
    start) and streams follow runs by polling;
  - session advisory locks (:class:`~pgdurable.PostgresDurableStore`)
    cannot work: it refuses ``pooler="transaction"`` at construction; give
    it a direct DSN.

See ``docs/pgbouncer.md`` for the tested PgBouncer configurations.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import psycopg
from psycopg import conninfo as _conninfo

from .errors import DatabaseUnavailable, InvalidInput, first_line
from .queries.connections import SESSION_SETUP

__all__ = [
    "APPLICATION_NAME",
    "CONNECT_TIMEOUT",
    "POOLERS",
    "SESSION_SETUP",
    "Pooler",
    "aconfigure",
    "aconnect",
    "aprobe",
    "check_pooler",
    "configure",
    "connect",
    "connect_kwargs",
    "connect_timeout",
    "listen_conninfo",
    "probe",
    "resolve_pooler",
]

Pooler = Literal["session", "transaction"]
POOLERS: tuple[Pooler, ...] = ("session", "transaction")

#: ``application_name`` of library connections unless the DSN or ``PGAPPNAME`` names one.
APPLICATION_NAME = "pgdurable"



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


def check_pooler(pooler: object) -> Pooler | None:
    """``pooler`` if it is ``None``, ``"session"`` or ``"transaction"``; else a typed error."""
    if pooler is None:
        return None
    if not isinstance(pooler, str):
        raise TypeError(f"pooler must be None, 'session' or 'transaction', not {type(pooler).__name__}")
    for known in POOLERS:
        if pooler == known:
            return known
    raise InvalidInput(f"pooler must be None, 'session' or 'transaction', not {pooler!r}")


def resolve_pooler(pooler: object = None) -> Pooler | None:
    """``pooler``, else ``PGDURABLE_POOLER`` (``session`` / ``transaction``), else None."""
    if pooler is None:
        pooler = os.environ.get("PGDURABLE_POOLER") or None
    return check_pooler(pooler)


def connect_kwargs(pooler: Pooler | None = None) -> dict[str, Any]:
    """Keyword arguments of a library connection (``psycopg.connect`` or a pool's ``kwargs``).

    Autocommit, the fallback application name and, behind a transaction
    pooler, ``prepare_threshold=None`` (no prepared statements at all, even
    where a call asks for one).
    """
    kwargs: dict[str, Any] = {"autocommit": True, "fallback_application_name": APPLICATION_NAME}
    if pooler == "transaction":
        kwargs["prepare_threshold"] = None
    return kwargs


def configure(pooler: Pooler | None = None) -> Callable[[psycopg.Connection[Any]], None]:
    """A ``ConnectionPool(configure=...)`` callback: the session settings (none for a
    transaction pooler)."""

    def setup(conn: psycopg.Connection[Any]) -> None:
        if pooler != "transaction":
            conn.execute(SESSION_SETUP)
            if not conn.autocommit:
                conn.commit()

    return setup


def aconfigure(
    pooler: Pooler | None = None,
) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """Async twin of :func:`configure` (``AsyncConnectionPool(configure=...)``)."""

    async def setup(conn: psycopg.AsyncConnection[Any]) -> None:
        if pooler != "transaction":
            await conn.execute(SESSION_SETUP)
            if not conn.autocommit:
                await conn.commit()

    return setup


def connect(conninfo: str, pooler: Pooler | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
    """A library connection, set up; a refusal is :class:`DatabaseUnavailable` with its cause."""
    params = {**connect_kwargs(pooler), **connect_timeout(conninfo), **kwargs}
    try:
        conn = psycopg.connect(conninfo, **params)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None
    try:
        configure(pooler)(conn)
    except psycopg.OperationalError as exc:  # lost during setup (a pooler restarting)
        conn.close()
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None
    except BaseException:
        conn.close()
        raise
    return conn


async def aconnect(
    conninfo: str, pooler: Pooler | None = None, **kwargs: Any
) -> psycopg.AsyncConnection[Any]:
    """Async twin of :func:`connect`."""
    params = {**connect_kwargs(pooler), **connect_timeout(conninfo), **kwargs}
    try:
        conn = await psycopg.AsyncConnection.connect(conninfo, **params)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None
    try:
        await aconfigure(pooler)(conn)
    except psycopg.OperationalError as exc:  # lost during setup (a pooler restarting)
        await conn.close()
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None
    except BaseException:
        await conn.close()
        raise
    return conn


# libpq's "... failed: FATAL:  <message>": the server (or pooler) answered and said no
_REFUSAL = re.compile(r"\b(?:FATAL|ERROR|PANIC):")


def probe(conninfo: str, pooler: Pooler | None = None) -> None:
    """Connect once and close: raise a refusal at once; return if it worked or if
    nothing answered (a pool may then wait for the server)."""
    try:
        connect(conninfo, pooler).close()
    except DatabaseUnavailable as exc:
        if _REFUSAL.search(str(exc)):
            raise


async def aprobe(conninfo: str, pooler: Pooler | None = None) -> None:
    """Async twin of :func:`probe`."""
    try:
        await (await aconnect(conninfo, pooler)).close()
    except DatabaseUnavailable as exc:
        if _REFUSAL.search(str(exc)):
            raise


def listen_conninfo(
    conninfo: str | None, pooler: Pooler | None, listen_dsn: str | None
) -> str | None:
    """Where to LISTEN: ``listen_dsn``; else the app's DSN unless it goes through a
    transaction pooler (then None: poll)."""
    if listen_dsn:
        return listen_dsn
    if pooler == "transaction":
        return None
    return conninfo or None
