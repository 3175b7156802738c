"""Library connections keep the user's own session settings from the DSN.

pgdurable adds ``idle_in_transaction_session_timeout`` (and names its
connections ``pgdurable``), but a DSN's ``options`` (e.g. ``-c
statement_timeout=...``) and ``application_name`` must still apply: before,
the library's ``options`` silently replaced them.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

from pgdurable import AsyncPostgresLeaseProvider, Durable, DurableClient, PostgresLeaseProvider
from pgdurable._db import connect, library_options

SHOW = ("SELECT current_setting('statement_timeout'), current_setting('application_name'), "
        "current_setting('idle_in_transaction_session_timeout')")


def with_options(dsn: str) -> str:
    return make_conninfo(dsn, options="-c statement_timeout=4321", application_name="myapp")


def test_library_options_put_the_users_last(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGOPTIONS", raising=False)
    monkeypatch.delenv("PGAPPNAME", raising=False)
    assert library_options("dbname=x") == ("-c idle_in_transaction_session_timeout=60000 "
                                           "-c application_name=pgdurable")
    assert library_options("dbname=x options='-c search_path=app'") == (
        "-c idle_in_transaction_session_timeout=60000 -c application_name=pgdurable "
        "-c search_path=app")
    assert library_options("dbname=x application_name=me") == (
        "-c idle_in_transaction_session_timeout=60000")
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=8MB")
    assert library_options("postgresql:///x").endswith("-c work_mem=8MB")


async def test_every_kind_of_library_connection_keeps_dsn_settings(dsn: str) -> None:
    user_dsn = with_options(dsn)
    want = ("4321ms", "myapp", "1min")
    with connect(user_dsn) as c:
        assert c.execute(SHOW).fetchone() == want
    async with Durable(user_dsn, pool_size=2) as app:
        async with app.pool.connection() as ac:
            assert await (await ac.execute(SHOW)).fetchone() == want
    with DurableClient(user_dsn) as client, client._pool.connection() as sc:
        assert sc.execute(SHOW).fetchone() == want
    async with AsyncPostgresLeaseProvider(user_dsn) as ap, ap._pool.connection() as lc:
        assert await (await lc.execute(SHOW)).fetchone() == want
    with PostgresLeaseProvider(user_dsn) as sp, sp._pool.connection() as slc:
        assert slc.execute(SHOW).fetchone() == want


def test_without_dsn_settings_the_library_defaults_apply(dsn: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGOPTIONS", raising=False)
    monkeypatch.delenv("PGAPPNAME", raising=False)
    with connect(dsn) as c:
        row: Any = c.execute(SHOW).fetchone()
    assert row[1:] == ("pgdurable", "1min")
