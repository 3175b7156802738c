"""pytest plugin and helpers for testing code that uses pgdurable.

Installed with pgdurable and enabled automatically (entry point ``pytest11``,
name ``pgdurable``; disable with ``-p no:pgdurable``). It only adds fixtures;
nothing runs unless a test asks for them.

Fixtures:

* ``pgdurable_server`` (session): the PostgreSQL server to test against --
  ``PGDURABLE_TEST_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``,
  a maintenance database of a role that may create databases), or, if nothing
  answers there, an embedded server (``pip install 'pgdurable[embedded]'``)
  started for the session in a temporary directory and deleted after it.
* ``pgdurable_template`` (session): a database migrated once per session, used
  as the template of every ``pgdurable_dsn``; its test clock is enabled, so
  ``SET LOCAL pgdurable.now = '...'`` moves ``pgdurable.now()`` there.
* ``pgdurable_dsn``: a fresh, migrated database for this test (cloned from the
  template with ``CREATE DATABASE ... TEMPLATE``, dropped afterwards); its conninfo.

Helpers (plain functions; they run real workers and real SQL, no mocks):

* :func:`run_until_idle` -- drive a worker in-process until no run of the
  app's tasks is runnable now, leased, or parked with a due timer.
* :func:`fire_due_timers` / :func:`afire_due_timers` -- **test-only**: make
  parked timers and retry backoffs due now (or ``advance`` them) without waiting.
* :func:`enable_test_clock` -- let ``SET pgdurable.now`` move the clock of a
  database you migrated yourself (production databases ignore the setting).

See ``examples/test_with_pgdurable.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..app.durable import Durable, DurableClient
from ..foundation import run_queries as q
from ..foundation.db import connect, translated, validate_dsn
from ..foundation.migrations import migrate
from ..foundation.queries import testing as tq
from ..foundation.queries.core import one_sync

__all__ = [
    "DEFAULT_TEST_DSN",
    "TestServer",
    "afire_due_timers",
    "enable_test_clock",
    "fire_due_timers",
    "pgdurable_dsn",
    "pgdurable_server",
    "pgdurable_template",
    "run_until_idle",
    "test_server",
]

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
_counter = itertools.count()

# The statements of the plugin and its helpers (busy queues, firing timers, the test
# clock, test databases): pgdurable.foundation.queries.testing (imported as ``tq``).


# -- the server, the template, the per-test database -----------------------------


@dataclass(frozen=True)
class TestServer:
    """A PostgreSQL server for tests: ``dsn`` names its maintenance database.

    Its repr shows host, port and user only: never the password or the DSN.
    """

    __test__ = False  # not a test class, whatever pytest thinks of the name

    host: str
    port: int
    user: str
    password: str | None = field(repr=False)  # never in a repr (test logs, tracebacks)
    dsn: str = field(repr=False)  # it may hold the password too

    def dsn_for(self, dbname: str) -> str:
        """The conninfo of database ``dbname`` on this server."""
        return make_conninfo(self.dsn, dbname=dbname)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create database ``name`` (optionally from ``template``); return its conninfo."""
        stmt = tq.CREATE_DATABASE.format(sql.Identifier(name))
        if template is not None:
            stmt = tq.TEMPLATE.format(stmt, sql.Identifier(template))
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as c:
            c.execute(stmt)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` (closing its connections) if it exists."""
        stmt = tq.DROP_DATABASE.format(sql.Identifier(name))
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as c:
            c.execute(stmt)


def _reachable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as c:
            one_sync(c, tq.PING)
        return True
    except psycopg.OperationalError:
        return False


@contextmanager
def test_server(dsn: str | None = None) -> Iterator[TestServer]:
    """The server at ``dsn`` (default ``PGDURABLE_TEST_DSN``), else an embedded one.

    The embedded server (pgserver) lives in a temporary directory that is
    deleted when the context exits.
    """
    dsn = validate_dsn(dsn or os.environ.get("PGDURABLE_TEST_DSN") or DEFAULT_TEST_DSN)
    server = None
    if not _reachable(dsn):
        from .embedded import start_embedded

        server, dsn = start_embedded(tempfile.mkdtemp(prefix="pgdurable-test-"), cleanup="delete")
    info = conninfo_to_dict(dsn)
    try:
        yield TestServer(
            host=str(info.get("host") or "127.0.0.1"),
            port=int(info.get("port") or 5432),
            user=str(info.get("user") or "postgres"),
            password=None if info.get("password") is None else str(info.get("password")),
            dsn=dsn,
        )
    finally:
        if server is not None:
            server.cleanup()


test_server.__test__ = False  # type: ignore[attr-defined]


def _db_name(kind: str) -> str:
    return f"pgdurable_{kind}_{os.getpid()}_{uuid.uuid4().hex[:8]}_{next(_counter)}"


@pytest.fixture(scope="session")
def pgdurable_server() -> Iterator[TestServer]:
    """The PostgreSQL server of this test session (see the module docstring)."""
    with test_server() as server:
        yield server


@pytest.fixture(scope="session")
def pgdurable_template(pgdurable_server: TestServer) -> Iterator[str]:
    """Name of a database migrated once for the session (the clones' template)."""
    name = _db_name("tmpl")
    dsn = pgdurable_server.create_database(name)
    try:
        migrate(dsn)
        enable_test_clock(dsn)
        yield name
    finally:
        pgdurable_server.drop_database(name)


def enable_test_clock(target: str | psycopg.Connection[Any], enabled: bool = True) -> None:
    """Let ``SET LOCAL pgdurable.now = '...'`` move this database's clock (tests only).

    Production databases ignore the ``pgdurable.now`` setting: only the schema
    owner or a superuser can enable the test clock (it redefines
    ``pgdurable.now()``), so an app role cannot take a live lease by moving the
    clock. The plugin's template database has it enabled.
    """
    conn = connect(target) if isinstance(target, str) else target
    try:
        with translated():
            one_sync(conn, tq.TEST_CLOCK, (enabled,))
    finally:
        if isinstance(target, str):
            conn.close()


@pytest.fixture
def pgdurable_dsn(pgdurable_server: TestServer, pgdurable_template: str) -> Iterator[str]:
    """Conninfo of a fresh, migrated database for this test, dropped afterwards."""
    name = _db_name("test")
    dsn = pgdurable_server.create_database(name, template=pgdurable_template)
    try:
        yield dsn
    finally:
        pgdurable_server.drop_database(name)


# -- driving workers and timers ----------------------------------------------------


def _task_arrays(app: Durable) -> tuple[list[str], list[str]]:
    tasks = list(app.tasks.values())
    if not tasks:
        raise ValueError("the app has no registered tasks: nothing could run")
    return [t.name for t in tasks], [t.revision for t in tasks]


async def _busy_queues(
    app: Durable, names: list[str], revs: list[str], queues: list[str] | None
) -> set[str]:
    rows = await app.fetchall(
        tq.BUSY.sql, {"tasks": names, "revs": revs, "queues": queues},  # type: ignore[arg-type]
        prepare=False,
    )
    return set(tq.BUSY.all(rows))


async def run_until_idle(
    app: Durable,
    *,
    queues: Sequence[str] | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109 - the helper owns the worker it stops
    poll_interval: float = 0.05,
    **worker_options: Any,
) -> None:
    """Run the app's tasks in-process until nothing is left to do now, then return.

    A real :class:`~pgdurable.Worker` (``app.worker(...)``, NOTIFY and claims
    as in production) serves ``queues`` (default: every queue with work for
    the app's tasks, widened if a step starts runs in another queue) until no
    run of the app's registered task revisions is runnable now, leased, or
    parked with a due timer, and the worker holds none. Runs parked on a
    future timer, waiting for a signal, or in a retry backoff do not count:
    use :func:`afire_due_timers` and call this again. Raises
    :class:`TimeoutError` if work remains after ``timeout`` seconds (e.g. a
    task that never finishes). ``worker_options`` go to the worker.
    """
    names, revs = _task_arrays(app)
    wanted = None if queues is None else [q.check_name(x, "queue") for x in queues]
    deadline = time.monotonic() + timeout
    while True:
        busy = await _busy_queues(app, names, revs, wanted)
        if not busy:
            return
        served = sorted(busy) if wanted is None else wanted
        options = {"poll_interval": 0.5, **worker_options}
        worker = app.worker(queues=served, **options)
        running = asyncio.create_task(worker.run(), name="pgdurable-run-until-idle")
        try:
            while True:
                if running.done():
                    running.result()  # a worker that crashed raises here
                    raise RuntimeError("the worker stopped on its own")
                await asyncio.sleep(poll_interval)
                busy = await _busy_queues(app, names, revs, wanted)
                if not busy and not worker.active_runs:
                    return
                if wanted is None and not busy <= set(served):
                    break  # a run appeared in another queue: serve it too
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"run_until_idle: work left after {timeout} s in queues {sorted(busy)} "
                        f"(worker holds {worker.active_runs})"
                    )
        finally:
            await worker.stop(grace=timeout)
            await running


def _fire_params(advance: timedelta | None) -> dict[str, Any]:
    if advance is not None and (not isinstance(advance, timedelta) or advance.total_seconds() < 0):
        raise TypeError("advance must be a non-negative timedelta or None")
    return {"advance": advance}


def _conninfo(target: str | Durable | DurableClient) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, Durable) and target.conninfo:
        return target.conninfo
    if isinstance(target, DurableClient):
        conninfo = target._pool.conninfo
        if isinstance(conninfo, str):
            return conninfo
    if isinstance(target, Durable) and isinstance(target.pool.conninfo, str):
        return target.pool.conninfo
    raise TypeError("fire_due_timers takes a conninfo string, a Durable or a DurableClient")


def fire_due_timers(
    target: str | Durable | DurableClient, *, advance: timedelta | None = None
) -> int:
    """**Test-only**: make future timers due without waiting; return how many are due.

    Every parked run's ``wake_at`` (a ``Sleep`` or a ``Wait`` timeout) and
    every runnable run's future ``available_at`` (a retry backoff) is moved
    to now, or, with ``advance``, back by that amount (only those then due
    count). Workers are NOTIFYed for the queues with runs now due. This edits
    rows behind the engine's back: never call it on a production database.
    """
    params = _fire_params(advance)
    conninfo = _conninfo(target)  # (a target of another type: TypeError)
    schema = None if isinstance(target, str) else target.schema  # a DSN: PGDURABLE_SCHEMA's
    with connect(conninfo, schema=schema) as conn, translated():
        fired = tq.FIRE.first(conn.execute(tq.FIRE.sql, params).fetchone())
    return fired.due if fired else 0


async def afire_due_timers(app: Durable, *, advance: timedelta | None = None) -> int:
    """Async twin of :func:`fire_due_timers` on the app's pool (test-only)."""
    rows = await app.fetchall(tq.FIRE.sql, _fire_params(advance),  # type: ignore[arg-type]
                              prepare=False)
    fired = tq.FIRE.all(rows)
    return fired[0].due if fired else 0
