"""Real-Postgres test harness.

* The server is ``PGDURABLE_TEST_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``);
  if nothing answers there, an embedded server (pgserver) is started for the session
  (``pgdurable.testing.test_server``, shared with the users' pytest plugin).
* A template database is migrated once per session; every test that asks for
  ``dsn`` gets a fresh database cloned from it (pytest-postgresql's janitor).
* ``empty_dsn`` is a fresh database with nothing in it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from _watchdog import watchdog  # noqa: F401 (autouse: a hung test prints its stacks)
from psycopg.conninfo import make_conninfo
from pytest_postgresql.janitor import DatabaseJanitor

import pgdurable
from pgdurable.testing import enable_test_clock, test_server

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


def _fresh(pg_server: PgServer, template: str | None) -> Iterator[str]:
    name = f"pgd_{os.getpid()}_{next(_counter)}"
    janitor = pg_server.janitor(name, template_dbname=template)
    janitor.init()
    try:
        yield pg_server.dsn_for(name)
    finally:
        janitor.drop()


@pytest.fixture
def dsn(pg_server: PgServer, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    yield from _fresh(pg_server, template_db)


@pytest.fixture
def empty_dsn(pg_server: PgServer) -> Iterator[str]:
    """A fresh database with no pgdurable schema."""
    yield from _fresh(pg_server, None)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's migrated database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
