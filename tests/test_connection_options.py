"""Library connections keep the user's own session settings from the DSN.

pgdurable adds ``idle_in_transaction_session_timeout`` (and names its
connections ``pgdurable``), but a DSN's ``options`` (e.g. ``-c
statement_timeout=...``) and ``application_name`` must still apply: before,
the library's ``options`` silently replaced them. Ours are no longer a
startup parameter (PgBouncer refuses ``options``, tests/test_pgbouncer.py):
``application_name`` is libpq's fallback, the timeout is set after connecting
unless something set one already.
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

from pgdurable import AsyncPostgresLeaseProvider, Durable, DurableClient, PostgresLeaseProvider
from pgdurable.foundation.db import connect
from pgdurable.foundation.pooler import connect_kwargs

SHOW = ("SELECT current_setting('statement_timeout'), current_setting('application_name'), "
        "current_setting('idle_in_transaction_session_timeout')")


def with_options(dsn: str) -> str:
    return make_conninfo(dsn, options="-c statement_timeout=4321", application_name="myapp")


def test_library_connections_send_no_options_of_their_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGOPTIONS", raising=False)
    for pooler in (None, "session", "transaction"):
        kwargs = connect_kwargs(pooler)  # type: ignore[arg-type]
        assert "options" not in kwargs and "application_name" not in kwargs
        assert kwargs["fallback_application_name"] == "pgdurable"
    assert connect_kwargs("transaction")["prepare_threshold"] is None
    assert "prepare_threshold" not in connect_kwargs(None)


ALTER_DB = ("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET "
            "idle_in_transaction_session_timeout = %L', current_database(), '9s'); END $$")


def test_a_timeout_set_elsewhere_wins(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGOPTIONS", raising=False)
    with connect(make_conninfo(dsn, options="-c idle_in_transaction_session_timeout=5s")) as c:
        assert c.execute(SHOW).fetchone()[2] == "5s"  # type: ignore[index]
    with connect(dsn) as c:
        c.execute(ALTER_DB)
    with connect(dsn) as c:
        assert c.execute(SHOW).fetchone()[2] == "9s"  # type: ignore[index]


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
