"""Start runs and send signals inside a SQLAlchemy transaction (the outbox pattern).

Install with ``pip install 'pgdurable[sqlalchemy]'``. ::

    from pgdurable.contrib.sqlalchemy import signal, start_run

    with Session(engine) as session, session.begin():
        session.add(Order(id=42))
        start_run(session, "fulfil", {"order": 42}, revision="1")
    # the order row and the run commit together, or neither exists

Contract:

* ``target`` is a :class:`~sqlalchemy.orm.Session`, a
  :class:`~sqlalchemy.engine.Connection`, an ``AsyncSession`` or an
  ``AsyncConnection`` (or a ``scoped_session`` / ``async_scoped_session``,
  e.g. Flask-SQLAlchemy's ``db.session``: its current session is used) on
  the ``postgresql+psycopg`` dialect (psycopg 3). With
  the async ones the functions return a coroutine: ``await start_run(...)``.
* The SQL functions are the ones :class:`pgdurable.Durable` calls (the
  statements of ``pgdurable.foundation.run_queries``: ``START``, ``SIGNAL``,
  ``SIGNAL_RUN``), with the same argument validation (the shared helpers of
  :mod:`pgdurable.app.durable` and :mod:`pgdurable.foundation.signals`), executed on the
  caller's connection inside the caller's transaction (begun if needed). Nothing
  here commits or rolls back: a rollback leaves no run and no signal; the
  ``pgdurable_wake`` NOTIFY is transactional, so workers wake on commit only.
  (On a connection with ``isolation_level="AUTOCOMMIT"`` there is no
  transaction of yours: each call commits at once.)
* Bad input raises before anything is executed: :class:`TypeError` for an
  object that is not a session/connection (an ``Engine`` has no transaction of
  yours), :class:`~pgdurable.InvalidInput` for another database engine or
  driver (sqlite, ``postgresql+psycopg2``, asyncpg) or a session without a
  bind, ``TypeError``/``ValueError`` for bad arguments, as with the app.
* The schema version is checked once per engine (two read-only queries in
  the caller's transaction): a database without the pgdurable schema raises
  :class:`~pgdurable.SchemaVersionMismatch` before anything is written.
* Errors raised by the SQL functions are translated to pgdurable errors; as
  after any failed statement, the caller's transaction must be rolled back.
* There is no task registry here, so ``task`` is a task name with
  ``revision=`` given, or a :class:`pgdurable.Task` (``app.tasks["name"]``),
  or a name registered on ``app=`` (a :class:`~pgdurable.Durable` or
  :class:`~pgdurable.DurableClient`), whose revision and ``max_attempts`` are used.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Coroutine, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

try:
    from sqlalchemy import URL
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import Connection, Dialect, Engine
    from sqlalchemy.orm import Session, scoped_session
except ImportError as _exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "pgdurable.contrib.sqlalchemy needs SQLAlchemy 2: pip install 'pgdurable[sqlalchemy]'"
    ) from _exc

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ...app.durable import Durable, DurableClient, Task, TaskRegistry, start_params
from ...foundation import run_queries as q
from ...foundation.db import validate_dsn
from ...foundation.errors import InvalidInput, UnknownTask, translate
from ...foundation.migrations import acheck_schema, check_schema
from ...foundation.queries.core import Query
from ...foundation.queries.signals import SIGNAL, SIGNAL_RUN
from ...foundation.queries.start import Started, started
from ...foundation.schemas import caller_schema, in_schema, resolve_schema
from ...foundation.signals import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_SIGNAL_TTL,
    signal_params,
    signal_run_params,
)
from ...runs.batch_start import Start, start_many_params, start_many_query
from ...runs.metadata import start_statement

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

__all__ = ["signal", "signal_run", "start_many", "start_run", "url_from_dsn"]

R = TypeVar("R")

# Engines whose pgdurable schema version was checked (never a failed check).
_checked: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()  # schemas


def url_from_dsn(dsn: str, *, async_: bool = False) -> URL:
    """A SQLAlchemy URL (``postgresql+psycopg``) for a psycopg conninfo or URL.

    Handy to point SQLAlchemy at the database a pgdurable fixture or
    ``PGDURABLE_DSN`` names; ``async_=True`` selects ``postgresql+psycopg_async``.

    Every form libpq accepts converts, because the DSN is parsed by libpq
    (``conninfo_to_dict``) and the URL is built from its parameters, never by
    editing the string: a single TCP host (names, IPv4, IPv6) becomes the URL's
    host and port; a unix-socket directory (``host=/var/run/postgresql``,
    ``postgresql:///app?host=/tmp/x``), an abstract socket (``@name``) or
    several hosts (``host=a,b port=5432,5433``) go to the query as ``host=``
    and ``port=``, which SQLAlchemy's psycopg dialect hands back to libpq
    unchanged. Every other parameter (``service``, ``sslmode``, ``options``,
    ``hostaddr``, ...) is a query option; the password is stored decoded and
    escaped again when the URL is rendered. The URL connects with exactly the
    parameters of ``dsn`` (``render_as_string(hide_password=False)`` gives a
    string that parses back to the same URL).

    A DSN that is not PostgreSQL's (``mysql://...``) or does not parse raises
    :class:`~pgdurable.InvalidInput`.
    """
    info = {k: str(v) for k, v in conninfo_to_dict(validate_dsn(dsn)).items() if v is not None}
    user, password, dbname = info.pop("user", None), info.pop("password", None), info.pop("dbname", None)
    host, port = info.pop("host", None), info.pop("port", None)
    url_host: str | None = None
    url_port: int | None = None
    if host is not None and _tcp_host(host) and (port is None or port.isdigit()):
        url_host, url_port = host, int(port) if port else None
    else:
        # libpq's own host/port lists, in the query: SQLAlchemy's psycopg dialect
        # joins them back into host=a,b port=p,q. It wants one port per host,
        # where libpq also takes one port for all hosts.
        hosts = host.split(",") if host is not None else []
        ports = port.split(",") if port is not None else []
        if len(hosts) > 1 and len(ports) == 1:
            ports *= len(hosts)
        if host is not None:
            info["host"] = host
        if ports:
            info["port"] = ",".join(ports)
    return URL.create(
        "postgresql+psycopg_async" if async_ else "postgresql+psycopg",
        username=user,
        password=password,
        host=url_host,
        port=url_port,
        database=dbname,
        query=info,
    )


def _tcp_host(host: str) -> bool:
    """One network host (a name or an IP address), not a socket path or a list.

    libpq takes a host starting with ``/`` (a directory) or ``@`` (an abstract
    namespace) as a unix socket.
    """
    return bool(host) and "," not in host and not host.startswith(("/", "@"))


# -- resolving the caller's session or connection -----------------------------


def _async_types() -> tuple[type[Any], ...]:
    # An AsyncSession/AsyncConnection can only exist once sqlalchemy.ext.asyncio
    # is imported; not importing it here keeps sync users free of greenlet.
    mod = sys.modules.get("sqlalchemy.ext.asyncio")
    return () if mod is None else (mod.AsyncSession, mod.AsyncConnection)


def _unwrap(target: object) -> object:
    """The current session of a ``scoped_session`` / ``async_scoped_session``."""
    if isinstance(target, scoped_session):
        return target()
    mod = sys.modules.get("sqlalchemy.ext.asyncio")
    if mod is not None and isinstance(target, mod.async_scoped_session):
        return target()
    return target


def _check_dialect(dialect: Dialect, what: str) -> None:
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise InvalidInput(
            f"pgdurable.contrib.sqlalchemy needs the postgresql+psycopg dialect (psycopg 3); "
            f"this {what} is bound to {dialect.name}+{dialect.driver}. Nothing was written."
        )


def _session_bind(session: Session, what: str) -> Engine | Connection:
    try:
        return session.get_bind()
    except sa_exc.UnboundExecutionError:
        raise InvalidInput(
            f"this {what} has no bind (no engine or connection): create it with "
            f"{what}(engine) or pass a Connection. Nothing was written."
        ) from None


def _classify(target: object) -> bool:
    """Validate ``target`` (before any SQL); True if it is an async one."""
    if isinstance(target, Session):
        _check_dialect(_session_bind(target, "Session").dialect, "Session")
        return False
    if isinstance(target, Connection):
        _check_dialect(target.dialect, "Connection")
        return False
    async_types = _async_types()
    if async_types and isinstance(target, async_types[0]):
        _check_dialect(_session_bind(target.sync_session, "AsyncSession").dialect, "AsyncSession")
        return True
    if async_types and isinstance(target, async_types[1]):
        _check_dialect(target.sync_engine.dialect, "AsyncConnection")
        return True
    if isinstance(target, Engine) or type(target).__name__ == "AsyncEngine":
        raise TypeError(
            "pass a Session or Connection (your transaction), not an Engine: "
            "the run must commit with your own writes"
        )
    raise TypeError(
        "expected a SQLAlchemy Session, Connection, AsyncSession or AsyncConnection, "
        f"not {type(target).__name__}"
    )


@contextmanager
def _translated() -> Iterator[None]:
    """Re-raise driver errors (wrapped by SQLAlchemy or not) as pgdurable errors."""
    try:
        yield
    except sa_exc.DBAPIError as exc:
        orig = exc.orig
        err = translate(orig) if isinstance(orig, BaseException) else exc
        if err is orig or err is exc:
            raise
        raise err from exc
    except psycopg.Error as exc:
        err2 = translate(exc)
        if err2 is exc:
            raise
        raise err2 from exc


def _run_sync(target: Session | Connection, query: Query[R], params: tuple[Any, ...],
              schema: str) -> list[R]:
    conn = target.connection() if isinstance(target, Session) else target
    with _translated():
        if not conn.in_transaction():
            conn.begin()  # the caller's transaction (as autobegin would start it)
        engine = conn.engine
        if schema not in _checked.get(engine, ()):
            raw = conn.connection.driver_connection
            assert isinstance(raw, psycopg.Connection)
            with caller_schema(raw, schema):
                check_schema(raw)
            _checked.setdefault(engine, set()).add(schema)
        return query.all(conn.exec_driver_sql(in_schema(query.sql, schema), params).fetchall())


async def _run_async(
    target: AsyncSession | AsyncConnection, query: Query[R], params: tuple[Any, ...],
    schema: str,
) -> list[R]:
    async_session = _async_types()[0]
    conn: AsyncConnection = (
        await target.connection() if isinstance(target, async_session) else target  # type: ignore[assignment]
    )
    with _translated():
        if not conn.in_transaction():
            await conn.begin()
        engine = conn.sync_engine
        if schema not in _checked.get(engine, ()):
            raw = (await conn.get_raw_connection()).driver_connection
            assert isinstance(raw, psycopg.AsyncConnection)
            with caller_schema(raw, schema):
                await acheck_schema(raw)
            _checked.setdefault(engine, set()).add(schema)
        result = await conn.exec_driver_sql(in_schema(query.sql, schema), params)
        return query.all(result.fetchall())


# -- public API ---------------------------------------------------------------


def _registry_for(task: object, app: Durable | DurableClient | None) -> tuple[TaskRegistry, object]:
    if isinstance(task, Task):
        registry = TaskRegistry()
        registry.register(task)
        return registry, task.name
    if app is not None:
        if not isinstance(app, Durable | DurableClient):
            raise TypeError(f"app must be a Durable or DurableClient, not {type(app).__name__}")
        return app._registry, task
    return TaskRegistry(), task


@overload
def start_run(
    target: Session | Connection | scoped_session[Any],
    task: str | Task,
    state: Any = None,
    *,
    revision: str | None = None,
    app: Durable | DurableClient | None = None,
    queue: str = "default",
    priority: int = 0,
    idempotency_key: str | None = None,
    deadline: Any = None,
    budget: float | None = None,
    max_attempts: int | None = None,
    metadata: dict[str, Any] | None = None,
    schema: str | None = None,
) -> str: ...


@overload
def start_run(
    target: AsyncSession | AsyncConnection | async_scoped_session[Any],
    task: str | Task,
    state: Any = None,
    *,
    revision: str | None = None,
    app: Durable | DurableClient | None = None,
    queue: str = "default",
    priority: int = 0,
    idempotency_key: str | None = None,
    deadline: Any = None,
    budget: float | None = None,
    max_attempts: int | None = None,
    metadata: dict[str, Any] | None = None,
    schema: str | None = None,
) -> Coroutine[Any, Any, str]: ...


def start_run(
    target: Any,
    task: str | Task,
    state: Any = None,
    *,
    revision: str | None = None,
    app: Durable | DurableClient | None = None,
    queue: str = "default",
    priority: int = 0,
    idempotency_key: str | None = None,
    deadline: Any = None,
    budget: float | None = None,
    max_attempts: int | None = None,
    metadata: dict[str, Any] | None = None,
    schema: str | None = None,
) -> str | Coroutine[Any, Any, str]:
    """Start a run inside the caller's transaction; return its id (await it if async).

    Arguments are those of :meth:`pgdurable.Durable.start`; ``task`` is a
    name with ``revision=``, a :class:`~pgdurable.Task`, or a name registered
    on ``app=``. The same ``idempotency_key`` returns the existing run's id.
    ``schema`` (else ``app``'s, else ``PGDURABLE_SCHEMA``, else ``pgdurable``): the
    schema the run lives in (docs/schemas.md), as for every helper here.
    """
    registry, name = _registry_for(task, app)
    if revision is None and isinstance(name, str) and name not in registry.tasks:
        raise UnknownTask(
            f"task {name!r}: pass revision=, a Task object, or app= (an app that "
            "registered it); there is no task registry in a SQLAlchemy session"
        )
    params = start_params(
        registry, name, state, queue, priority, idempotency_key, deadline, budget,
        revision, max_attempts,
    )
    sql, params = start_statement(q.START, params, metadata)  # metadata + trace context
    target = _unwrap(target)
    in_schema_of = _schema(schema, app)
    if _classify(target):
        return _astart(target, started(sql), params, in_schema_of)
    return _run_sync(target, started(sql), params, in_schema_of)[0].run_id


async def _astart(target: Any, query: Query[Started], params: tuple[Any, ...],
                  schema: str) -> str:
    return (await _run_async(target, query, params, schema))[0].run_id


def _schema(schema: str | None, app: Durable | DurableClient | None = None) -> str:
    """``schema``, else ``app``'s, else ``PGDURABLE_SCHEMA``, else ``pgdurable`` (checked)."""
    return resolve_schema(schema if schema is not None or app is None else app.schema)


def start_many(
    target: Any, starts: Iterable[Start | dict[str, Any]], *,
    app: Durable | DurableClient | None = None, schema: str | None = None,
) -> list[str] | Coroutine[Any, Any, list[str]]:
    """Start many runs with ONE statement inside the caller's transaction; return
    their ids in input order (await it if async). ``starts`` as for
    :meth:`pgdurable.Durable.start_many`; a task not registered on ``app=``
    needs ``revision=`` in its :class:`~pgdurable.Start`."""
    if app is not None and not isinstance(app, Durable | DurableClient):
        raise TypeError(f"app must be a Durable or DurableClient, not {type(app).__name__}")
    params = start_many_params(app._registry if app is not None else TaskRegistry(), starts)
    if params is None:
        return _no_ids(target)
    return _ids(target, start_many_query(params), params, _schema(schema, app))


def _no_ids(target: Any) -> list[str] | Coroutine[Any, Any, list[str]]:
    async def none() -> list[str]:
        return []

    return none() if _classify(_unwrap(target)) else []


@overload
def signal(
    target: Session | Connection | scoped_session[Any],
    kind: str,
    ref: str,
    payload: Any = None,
    *,
    signal_id: str | None = None,
    ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    schema: str | None = None,
) -> list[str]: ...


@overload
def signal(
    target: AsyncSession | AsyncConnection | async_scoped_session[Any],
    kind: str,
    ref: str,
    payload: Any = None,
    *,
    signal_id: str | None = None,
    ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    schema: str | None = None,
) -> Coroutine[Any, Any, list[str]]: ...


def signal(
    target: Any,
    kind: str,
    ref: str,
    payload: Any = None,
    *,
    signal_id: str | None = None,
    ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    schema: str | None = None,
) -> list[str] | Coroutine[Any, Any, list[str]]:
    """Send a signal inside the caller's transaction; return the woken run ids.

    Same SQL function, validation and semantics as
    :meth:`pgdurable.Durable.signal` (:mod:`pgdurable.foundation.signals`): runs waiting
    on ``(kind, ref)`` become runnable on commit; with none waiting the signal
    is kept (until ``ttl``) for the next run that parks on it; the same
    ``signal_id`` with the same content changes nothing (with other content:
    :class:`~pgdurable.SignalConflict`; roll back). ``max_payload`` bounds the
    JSON payload (bytes). Await the result for an async session/connection.
    """
    params = signal_params(kind, ref, payload, signal_id, ttl, max_payload)
    return _ids(target, SIGNAL, params, _schema(schema))


@overload
def signal_run(
    target: Session | Connection | scoped_session[Any],
    run_id: Any,
    kind: str,
    payload: Any = None,
    *,
    signal_id: str | None = None,
    ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    schema: str | None = None,
) -> list[str]: ...


@overload
def signal_run(
    target: AsyncSession | AsyncConnection | async_scoped_session[Any],
    run_id: Any,
    kind: str,
    payload: Any = None,
    *,
    signal_id: str | None = None,
    ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    schema: str | None = None,
) -> Coroutine[Any, Any, list[str]]: ...


def signal_run(
    target: Any,
    run_id: Any,
    kind: str,
    payload: Any = None,
    *,
    signal_id: str | None = None,
    ttl: timedelta | None = DEFAULT_SIGNAL_TTL,
    max_payload: int | None = DEFAULT_MAX_PAYLOAD,
    schema: str | None = None,
) -> list[str] | Coroutine[Any, Any, list[str]]:
    """Signal ONE run inside the caller's transaction; ``[run_id]`` if it woke, else ``[]``.

    As :meth:`pgdurable.Durable.signal_run`: the run wakes on commit if it is
    parked on a ``Wait`` of this ``kind``; otherwise the signal is kept for
    that run alone. Unknown run: :class:`~pgdurable.RunNotFound` (roll back).
    """
    params = signal_run_params(run_id, kind, payload, signal_id, ttl, max_payload)
    return _ids(target, SIGNAL_RUN, params, _schema(schema))


def _ids(
    target: Any, query: Query[str], params: tuple[Any, ...], schema: str
) -> list[str] | Coroutine[Any, Any, list[str]]:
    target = _unwrap(target)
    if _classify(target):
        return _run_async(target, query, params, schema)
    return _run_sync(target, query, params, schema)
