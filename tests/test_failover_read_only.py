"""An old primary that comes back read-only after a failover is detected, not retried forever.

A pair of local instances (tests/_failover_cluster.py, asynchronous): worker
``old`` runs on the primary's own single-host DSN, worker ``new`` on the
multi-host DSN (``target_session_attrs=read-write``, the old primary listed
first). The primary is stopped with ``-m immediate``, the standby promoted,
and the old primary started again as a standby (``standby.signal``: read-only,
what a careless restart of an old primary gives). Then:

* worker ``old`` reconnects to the read-only server, its claim is refused with
  SQLSTATE 25006, and it stops with :class:`pgdurable.ReadOnlyDatabase`
  (exit 1, one line naming the cause and the DSN form), instead of logging
  "claim failed" every second forever;
* a client on the old primary's DSN gets :class:`pgdurable.ReadOnlyDatabase`
  from ``start`` and nothing is written there;
* worker ``new`` and a client on the multi-host DSN never use the read-only
  server (libpq skips it): a run started after the failover completes.

The pool side (a pooled connection whose server turns read-only is dropped when
its DSN asks for read-write) is tests/test_failover_pool.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from _failover_cluster import Pair, binaries, start_pair
from _waiting import WAIT_LIMIT
from fix_fleet import Fleet

import pgdurable

BINDIR = binaries()
pytestmark = [
    pytest.mark.skipif(isinstance(BINDIR, str), reason=f"no PostgreSQL server binaries: {BINDIR}"),
    pytest.mark.fleet("_failover_app:app", ttl=4.0, concurrency=2, poll=1.0),
    pytest.mark.crash,  # a server is stopped -m immediate
]


@pytest.fixture
def cluster() -> Iterator[Pair]:
    assert isinstance(BINDIR, Path)
    p = start_pair(synchronous=False, bindir=BINDIR)
    try:
        with psycopg.connect(p.primary.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE app")
        pgdurable.migrate(p.dsn_for("app"))
        yield p
    finally:
        p.close()


@pytest.fixture
def dsn(cluster: Pair) -> str:
    """The fleet's DSN: the pair's multi-host DSN (overrides tests/conftest.py's)."""
    return cluster.dsn_for("app")


def _count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM pgdurable.runs").fetchone()
        assert row is not None
        return int(row[0])


def test_old_primary_back_read_only(cluster: Pair, fleet: Fleet) -> None:
    old_dsn = cluster.primary.dsn.replace("dbname=postgres", "dbname=app")
    old = fleet.start("old", env={"PGDURABLE_DSN": old_dsn})
    new = fleet.start("new")
    fleet.ready(old, new)

    cluster.crash_primary()
    cluster.standby.promote()
    (cluster.primary.data / "standby.signal").touch()  # back, but as a standby
    cluster.primary.start()
    with psycopg.connect(old_dsn, autocommit=True) as c:
        row = c.execute("SELECT pg_is_in_recovery()").fetchone()
        assert row is not None and row[0] is True

    # the worker on the old primary's own DSN stops, saying why
    assert old.wait(WAIT_LIMIT) == 1, old.log()
    log = old.log()
    assert "the worker stopped" in log and "read-only" in log, log
    assert "target_session_attrs=read-write" in log, log

    # a client there gets the typed error; nothing is written
    before = _count(old_dsn)

    async def on_old() -> None:
        async with pgdurable.Durable(old_dsn) as app:
            with pytest.raises(pgdurable.ReadOnlyDatabase, match="read-only"):
                await app.start("chain", {"n": 2, "wait_at": -1}, revision="1")

    asyncio.run(on_old())
    assert _count(old_dsn) == before

    # the multi-host DSN (the old primary listed first) reaches the new primary
    async def on_pair() -> None:
        async with pgdurable.Durable(cluster.dsn_for("app")) as app:
            rid = await app.start("chain", {"n": 3, "wait_at": -1}, revision="1")
            assert await app.result(rid, timeout=WAIT_LIMIT) == {"path": [0, 1, 2]}

    asyncio.run(on_pair())
    assert new.poll() is None, new.log()
