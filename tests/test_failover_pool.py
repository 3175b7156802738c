"""A server that turns read-only under a pool (issue 46, failover): what the library does.

On the suite's own server, no second instance needed:

* a pooled connection whose server now says it is read-only (it reports
  ``default_transaction_read_only``, and ``in_hot_standby`` from PostgreSQL 14,
  as they change) is dropped by the pools' ``check=`` when its DSN asks for a
  writable server (``target_session_attrs=read-write``): the next connection
  is resolved again among the DSN's hosts (tests/test_failover.py does it
  with two); with a DSN that asks for nothing it is kept, and a write fails;
* a write refused with SQLSTATE 25006 is :class:`pgdurable.ReadOnlyDatabase`
  (a :class:`pgdurable.PgDurableError`, naming the cause and the DSN form),
  and nothing is written;
* :func:`~pgdurable.foundation.db.asks_writable` reads the DSN (and
  ``PGTARGETSESSIONATTRS``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

import pgdurable
from pgdurable.foundation.db import acheck_connection, asks_writable, translated


async def _pid_after_read_only(dsn: str) -> tuple[int, int, bool]:
    """(backend pid made read-only, backend pid handed out next, is the next read-only)."""
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, check=acheck_connection,
                                   kwargs={"autocommit": True}) as pool:
        async with pool.connection() as conn:
            await conn.execute("SET default_transaction_read_only = on")
            first = conn.info.backend_pid
        async with pool.connection() as conn:
            cur = await conn.execute("SHOW transaction_read_only")
            row = await cur.fetchone()
            assert row is not None
            return first, conn.info.backend_pid, row[0] == "on"


def test_pool_drops_a_read_only_connection_when_the_dsn_asks_for_read_write(dsn: str) -> None:
    rw = make_conninfo(dsn, target_session_attrs="read-write")
    first, second, read_only = asyncio.run(_pid_after_read_only(rw))
    assert first != second and not read_only


def test_pool_keeps_it_when_the_dsn_asks_for_nothing(dsn: str) -> None:
    first, second, read_only = asyncio.run(_pid_after_read_only(dsn))
    assert first == second and read_only


def test_a_write_refused_as_read_only_is_typed_and_writes_nothing(dsn: str) -> None:
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as c:
        before = _count(c)
        c.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')

    async def start() -> None:
        async with pgdurable.Durable(dsn) as app:
            with pytest.raises(pgdurable.ReadOnlyDatabase) as err:
                await app.start("anything", {"x": 1}, revision="1")
            assert isinstance(err.value, pgdurable.PgDurableError)
            assert "read-only" in str(err.value)
            assert "target_session_attrs=read-write" in str(err.value)

    asyncio.run(start())
    with psycopg.connect(dsn, autocommit=True) as c:
        with pytest.raises(pgdurable.ReadOnlyDatabase), translated():
            c.execute("CREATE TABLE not_written ()")
        c.execute("SET default_transaction_read_only = off")  # this session only
        c.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
    with psycopg.connect(dsn, autocommit=True) as c:
        assert _count(c) == before
        row = c.execute("SELECT to_regclass('not_written') IS NULL").fetchone()
        assert row is not None and row[0] is True


def _count(c: psycopg.Connection[Any]) -> int:
    row = c.execute("SELECT count(*) FROM pgdurable.runs").fetchone()
    assert row is not None
    return int(row[0])


def test_asks_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    assert asks_writable("host=a,b target_session_attrs=read-write")
    assert asks_writable("postgresql://u@a,b/db?target_session_attrs=primary")
    assert not asks_writable("host=a")
    assert not asks_writable("host=a target_session_attrs=any")
    assert not asks_writable(None)
    assert not asks_writable("not a dsn ===")
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "read-write")
    assert asks_writable("host=a")
