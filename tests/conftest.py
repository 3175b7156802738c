"""Real-Postgres test harness.

* The server is ``PGDURABLE_TEST_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``);
  if nothing answers there, an embedded server (pgserver) is started for the session
  (``pgdurable.testing.test_server``, shared with the users' pytest plugin).
* A template database is migrated once per session; every test that asks for
  ``dsn`` gets a fresh database cloned from it (pytest-postgresql's janitor).
* ``empty_dsn`` is a fresh database with nothing in it.
* Those databases are cloned ahead of the tests that take them, and dropped
  after them, by a background thread (:class:`_Supply`). A clone and a drop
  cost 0.3-0.6 s a test, most of it the server's (WAL, the drop's checkpoint),
  and PostgreSQL 15 serialises clones, so a test still mostly waits for its
  clone: measured, this saved 3-4 % of two modules' time, about the size of
  the run-to-run noise (benchmarks/RESULTS.md, "Cloning the test databases").
  What it does reliably is drop every database, through a server restart
  (tests/test_crash.py R9), and fail the session if one could not be dropped.
* ``fleet`` (tests/fix_fleet.py, a plugin registered below) is a test's worker
  processes: started, made ready, signalled by pid, logged, always killed.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import psycopg.sql
import pytest
from _watchdog import watchdog  # noqa: F401 (autouse: a hung test prints its stacks)
from psycopg.conninfo import make_conninfo
from pytest_postgresql.janitor import DatabaseJanitor

import pgdurable
from pgdurable.foundation.retry import for_seconds, retry_while_sync
from pgdurable.ops.testing import enable_test_clock, test_server

#: Fixture plugins of this suite (psycopg's tests/fix_*.py): ``fleet``, worker processes.
pytest_plugins = ["fix_fleet"]

DEFAULT_TEST_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
_counter = itertools.count()


@dataclass(frozen=True)
class PgServer:
    host: str
    port: int
    user: str
    password: str | None
    dsn: str  # maintenance database

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.dsn, dbname=dbname)

    def janitor(self, dbname: str, **kw: Any) -> DatabaseJanitor:
        return DatabaseJanitor(
            user=self.user, host=self.host, port=self.port, password=self.password,
            dbname=dbname, **kw,
        )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    # Same discovery as the users' plugin (pgdurable.testing): PGDURABLE_TEST_DSN, else
    # an embedded server for the session.
    with test_server(os.environ.get("PGDURABLE_TEST_DSN", DEFAULT_TEST_DSN)) as s:
        yield PgServer(host=s.host, port=s.port, user=s.user, password=s.password, dsn=s.dsn)


@pytest.fixture(scope="session")
def template_db(pg_server: PgServer) -> Iterator[str]:
    name = f"pgd_tmpl_{os.getpid()}"
    janitor = pg_server.janitor(name, as_template=True)
    janitor.init()
    try:
        pgdurable.migrate(pg_server.dsn_for(name))
        enable_test_clock(pg_server.dsn_for(name))  # SET LOCAL pgdurable.now works in tests
        yield name
    finally:
        janitor.drop()


T = TypeVar("T")


def _through_restarts(op: Callable[[], T]) -> T:
    """``op()``, again while the server restarts under it: a test may restart the
    suite's own server (tests/test_crash.py R9) while the next clone runs."""
    return retry_while_sync(op, for_seconds(120.0))


class _Supply:
    """Fresh databases (clones of ``template``, or empty) made ``depth`` ahead.

    One background thread does every clone and drop in order (FIFO), so a
    test's drop never races the clone that follows it, and at most ``depth``
    unused databases exist. :meth:`take` returns the oldest clone (raising its
    error if the clone failed); :meth:`give_back` queues the drop, and
    :meth:`close` raises if any drop failed.
    """

    def __init__(self, server: PgServer, template: str | None, depth: int) -> None:
        self._server = server
        self._template = template
        self._depth = depth
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgd-test-dbs")
        self._ahead: deque[Future[str]] = deque()
        self._drops: list[Future[None]] = []

    def _clone(self) -> str:
        return _through_restarts(self._clone_once)

    def _clone_once(self) -> str:
        name = f"pgd_{os.getpid()}_{next(_counter)}"  # a new name each try
        self._server.janitor(name, template_dbname=self._template).init()
        return name

    def _drop(self, name: str) -> None:
        # WITH (FORCE): ends the test's leftover connections; also drops a database
        # that a restart left invalid mid-DROP (the janitor's ALTER DATABASE cannot)
        def drop() -> None:
            with psycopg.connect(self._server.dsn, autocommit=True) as c:
                c.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    psycopg.sql.Identifier(name)))

        _through_restarts(drop)

    def take(self) -> str:
        while len(self._ahead) <= self._depth:
            self._ahead.append(self._thread.submit(self._clone))
        return self._ahead.popleft().result()

    def give_back(self, name: str) -> None:
        self._drops.append(self._thread.submit(self._drop, name))

    def close(self) -> None:
        """Wait for every queued clone and drop, drop the clones no test took,
        then raise if any database could not be dropped (it is left behind)."""
        self._thread.shutdown(wait=True)
        failed = [e for e in (d.exception() for d in self._drops) if e is not None]
        for ahead in self._ahead:
            if ahead.exception() is None:
                try:
                    self._drop(ahead.result())
                except Exception as e:
                    failed.append(e)
        if failed:
            raise RuntimeError(f"{len(failed)} test database(s) left behind: {failed!r}")


@pytest.fixture(scope="session")
def _supplies(pg_server: PgServer, template_db: str) -> Iterator[dict[str | None, _Supply]]:
    supplies = {template_db: _Supply(pg_server, template_db, depth=2),
                None: _Supply(pg_server, None, depth=1)}
    try:
        yield supplies
    finally:
        for s in supplies.values():
            s.close()


def _fresh(pg_server: PgServer, supply: _Supply) -> Iterator[str]:
    name = supply.take()
    try:
        yield pg_server.dsn_for(name)
    finally:
        supply.give_back(name)


@pytest.fixture
def dsn(pg_server: PgServer, template_db: str,
        _supplies: dict[str | None, _Supply]) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    yield from _fresh(pg_server, _supplies[template_db])


@pytest.fixture
def empty_dsn(pg_server: PgServer, _supplies: dict[str | None, _Supply]) -> Iterator[str]:
    """A fresh database with no pgdurable schema."""
    yield from _fresh(pg_server, _supplies[None])


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's migrated database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
