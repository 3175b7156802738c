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
  and nothing answering at all (connection refused, an unknown host, no
  socket, the connect timeout: :func:`describe_unreachable` names the host
  and port, the password masked) are raised at once, instead of a pool
  timeout 30 s later that names no cause. A server that accepts and drops
  the connection (a pooler restarting) lets the pool wait for it as before.

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
from .schemas import resolve_schema, use_schema

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
    "describe_unreachable",
    "listen_conninfo",
    "masked_conninfo",
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


# async-to-sync: source (aname -> name)
def aconfigure(
    pooler: Pooler | None = None, schema: str | None = None,
) -> Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]:
    """A ``ConnectionPool(configure=...)`` callback: the session settings (none for a
    transaction pooler), and the cursors of ``schema`` (else ``PGDURABLE_SCHEMA``, else
    ``pgdurable``: :mod:`pgdurable.foundation.schemas`)."""
    in_schema = resolve_schema(schema)

    async def setup(conn: psycopg.AsyncConnection[Any]) -> None:
        use_schema(conn, in_schema)
        if pooler != "transaction":
            await conn.execute(SESSION_SETUP)
            if not conn.autocommit:
                await conn.commit()

    return setup
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def configure(
    pooler: Pooler | None = None, schema: str | None = None,
) -> Callable[[psycopg.Connection[Any]], None]:
    """A ``ConnectionPool(configure=...)`` callback: the session settings (none for a
    transaction pooler), and the cursors of ``schema`` (else ``PGDURABLE_SCHEMA``, else
    ``pgdurable``: :mod:`pgdurable.foundation.schemas`)."""
    in_schema = resolve_schema(schema)

    def setup(conn: psycopg.Connection[Any]) -> None:
        use_schema(conn, in_schema)
        if pooler != "transaction":
            conn.execute(SESSION_SETUP)
            if not conn.autocommit:
                conn.commit()

    return setup
# async-to-sync: end


# libpq's words for "nothing answered there": no server listens, no such host, no
# socket file, no route, or the connect timeout passed
_UNREACHABLE = re.compile(
    r"Connection refused|could not translate host name|Name or service not known|"
    r"nodename nor servname|No such file or directory|Network is unreachable|"
    r"No route to host|timeout expired|Connection timed out", re.IGNORECASE)


def masked_conninfo(conninfo: str) -> str:
    """``conninfo`` as ``key=value`` pairs with the password shown as ``***``
    (for messages: never the secret)."""
    try:
        params = _conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "(a DSN that does not parse)"
    return _conninfo.make_conninfo(
        "", **{k: ("***" if k == "password" else v) for k, v in params.items()})


def describe_unreachable(conninfo: str, libpq_message: str) -> str | None:
    """What to say when nothing answered at ``conninfo`` (None: something did).

    Names the host and port tried (the DSN's, else libpq's defaults:
    ``PGHOST``/``PGPORT``, the local socket, 5432) and libpq's reason, with
    the DSN's password masked."""
    found = _UNREACHABLE.search(libpq_message)
    if found is None:
        return None
    try:
        params = _conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        params = {}
    host = params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or (
        "the local socket")
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    return (f"nothing answers at {host}:{port} ({found.group(0).lower()}): is PostgreSQL "
            f"running there, and is the DSN right? (DSN: {masked_conninfo(conninfo)})")


def _connect_error(conninfo: str, exc: psycopg.OperationalError) -> DatabaseUnavailable:
    text = str(exc)
    return DatabaseUnavailable(describe_unreachable(conninfo, text)
                               or f"cannot connect: {first_line(text)}")


# async-to-sync: source (aname -> name)
async def aconnect(
    conninfo: str, pooler: Pooler | None = None, *, schema: str | None = None, **kwargs: Any
) -> psycopg.AsyncConnection[Any]:
    """A library connection to ``schema`` (else ``PGDURABLE_SCHEMA``, else ``pgdurable``),
    set up; a refusal is :class:`DatabaseUnavailable` with its cause."""
    params = {**connect_kwargs(pooler), **connect_timeout(conninfo), **kwargs}
    try:
        conn = await psycopg.AsyncConnection.connect(conninfo, **params)
    except psycopg.OperationalError as exc:
        raise _connect_error(conninfo, exc) from None
    try:
        await aconfigure(pooler, schema)(conn)
    except psycopg.OperationalError as exc:  # lost during setup (a pooler restarting)
        await conn.close()
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None
    except BaseException:
        await conn.close()
        raise
    return conn
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def connect(
    conninfo: str, pooler: Pooler | None = None, *, schema: str | None = None, **kwargs: Any
) -> psycopg.Connection[Any]:
    """A library connection to ``schema`` (else ``PGDURABLE_SCHEMA``, else ``pgdurable``),
    set up; a refusal is :class:`DatabaseUnavailable` with its cause."""
    params = {**connect_kwargs(pooler), **connect_timeout(conninfo), **kwargs}
    try:
        conn = psycopg.Connection.connect(conninfo, **params)
    except psycopg.OperationalError as exc:
        raise _connect_error(conninfo, exc) from None
    try:
        configure(pooler, schema)(conn)
    except psycopg.OperationalError as exc:  # lost during setup (a pooler restarting)
        conn.close()
        raise DatabaseUnavailable(f"cannot connect: {first_line(str(exc))}") from None
    except BaseException:
        conn.close()
        raise
    return conn
# async-to-sync: end


# libpq's "... failed: FATAL:  <message>": the server (or pooler) answered and said no
_REFUSAL = re.compile(r"\b(?:FATAL|ERROR|PANIC):")


def _at_once(exc: DatabaseUnavailable) -> bool:
    """Whether a failed first connection is said at once: a refusal, or nothing
    answering (not a connection the other end accepted and dropped)."""
    text = str(exc)
    return bool(_REFUSAL.search(text)) or text.startswith("nothing answers at ")


# async-to-sync: source (aname -> name)
async def aprobe(conninfo: str, pooler: Pooler | None = None) -> None:
    """Connect once and close: raise a refusal or an address where nothing answers
    at once; return if it worked or if the connection was dropped after it was
    accepted (a pooler restarting: a pool may then wait for the server)."""
    try:
        await (await aconnect(conninfo, pooler)).close()
    except DatabaseUnavailable as exc:
        if _at_once(exc):
            raise
# async-to-sync: generated by tools/async_to_sync.py from the source above; do not edit
def probe(conninfo: str, pooler: Pooler | None = None) -> None:
    """Connect once and close: raise a refusal or an address where nothing answers
    at once; return if it worked or if the connection was dropped after it was
    accepted (a pooler restarting: a pool may then wait for the server)."""
    try:
        connect(conninfo, pooler).close()
    except DatabaseUnavailable as exc:
        if _at_once(exc):
            raise
# async-to-sync: end


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
