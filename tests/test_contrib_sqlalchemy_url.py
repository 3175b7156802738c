"""url_from_dsn: every DSN form libpq accepts becomes a SQLAlchemy URL that connects the same way."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from pgdurable import InvalidInput
from pgdurable.contrib.sqlalchemy import url_from_dsn

# (DSN, the URL it renders as). None: no fixed rendering to pin, the round trip is checked.
DSNS: list[tuple[str, str | None]] = [
    ("host=db port=5433 user=u password=p dbname=d sslmode=require",
     "postgresql+psycopg://u:p@db:5433/d?sslmode=require"),
    ("postgresql://u@h/d", "postgresql+psycopg://u@h/d"),
    ("postgres://u@10.0.0.7:6432/d", "postgresql+psycopg://u@10.0.0.7:6432/d"),
    ("postgresql://[::1]:5433/app", "postgresql+psycopg://[::1]:5433/app"),
    # unix-socket directories: the URL's query, never the path
    ("postgresql:///app?host=/var/run/postgresql",
     "postgresql+psycopg:///app?host=%2Fvar%2Frun%2Fpostgresql"),
    ("host=/var/run/postgresql dbname=app", None),
    ("postgresql://%2Fvar%2Frun%2Fpostgresql/app", None),
    ("host=/tmp/pgdurable-test-k2x8/ port=5432 user=postgres dbname=pgd_1_2",
     "postgresql+psycopg://postgres@/pgd_1_2?host=%2Ftmp%2Fpgdurable-test-k2x8%2F&port=5432"),
    ("postgresql:///app?host=@abstract-ns", None),
    ("port=5433 dbname=app", None),  # the default socket, another port
    ("dbname=app", "postgresql+psycopg:///app"),
    # several hosts: one port each, one port for all, a socket among them, empty ports
    ("postgresql://u:p@h1:5432,h2:5433/app?target_session_attrs=read-write", None),
    ("host=h1,h2 port=5432 dbname=app", None),
    ("host=h1,/var/run/postgresql,h3 port=5432,,5434 dbname=app", None),
    ("host=h1,h2 dbname=app", None),
    # service files, options and other query parameters
    ("service=mydb", "postgresql+psycopg://?service=mydb"),
    ("postgresql:///?service=mydb&dbname=other", None),
    ("postgresql://u@h/app?options=-c%20statement_timeout%3D5000&application_name=x"
     "&connect_timeout=3&sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem", None),
    ("postgresql://h/app?hostaddr=10.0.0.1&port=6543", None),
    ("host=db.example hostaddr=10.0.0.1,10.0.0.2 dbname=app", None),
    # percent-encoded and quoted values
    ("postgresql://u%40corp:p%40ss%3Aw%2F%25%20x@h/my%20db",
     "postgresql+psycopg://u%40corp:p%40ss%3Aw%2F%25 x@h/my db"),
    ("user='o\\'brien' password='a b\\' c' host=h dbname='my db?x/y'", None),
    ("host=h port=5432 dbname=app options='-c search_path=app,public'", None),
]


def connect_params(url: Any) -> dict[str, str]:
    """What SQLAlchemy's psycopg dialect hands libpq for ``url``, as libpq parses it."""
    engine = create_engine(url)
    try:
        args, kwargs = engine.dialect.create_connect_args(url)
    finally:
        engine.dispose()
    kwargs.pop("context", None)  # psycopg's adapters map, not a libpq parameter
    return effective(
        {k: str(v) for k, v in conninfo_to_dict(make_conninfo(*args, **kwargs)).items()}
    )


def libpq_params(dsn: str) -> dict[str, str]:
    return effective({k: str(v) for k, v in conninfo_to_dict(dsn).items()})


def effective(params: dict[str, str]) -> dict[str, str]:
    """``params`` with libpq's port rule spelled out: one port per host.

    For libpq ``host=a,b port=5432`` means 5432 for both, and ``host=a,b`` (no
    port) the default port for both, which SQLAlchemy's dialect writes as
    ``port=5432,5432`` and ``port=,``.
    """
    hosts = params.get("host", "").split(",")
    ports = params.get("port", "").split(",")
    if len(hosts) > 1 and len(ports) == 1:
        params = {**params, "port": ",".join(ports * len(hosts))}
    return params


@pytest.mark.parametrize(("dsn", "rendered"), DSNS, ids=[d for d, _ in DSNS])
def test_url_from_dsn_keeps_every_libpq_parameter(dsn: str, rendered: str | None) -> None:
    url = url_from_dsn(dsn)
    as_string = url.render_as_string(hide_password=False)
    if rendered is not None:
        assert as_string == rendered
    # The rendered string (what goes into alembic.ini or an env var) parses back
    # to the same URL, and libpq gets exactly the DSN's parameters.
    assert make_url(as_string) == url
    assert connect_params(url) == libpq_params(dsn)
    assert connect_params(make_url(as_string)) == libpq_params(dsn)


@pytest.mark.parametrize("dsn", ["postgresql:///app?host=/tmp/x", "host=h1,h2 port=1,2 dbname=d"])
def test_url_from_dsn_async_uses_the_same_parameters(dsn: str) -> None:
    url = url_from_dsn(dsn, async_=True)
    assert url.drivername == "postgresql+psycopg_async"
    assert url.set(drivername="postgresql+psycopg") == url_from_dsn(dsn)


@pytest.mark.parametrize("bad", ["mysql://u@h/d", "", "   ", "host=h port", "dbname='unterminated"])
def test_url_from_dsn_bad_input(bad: str) -> None:
    with pytest.raises(InvalidInput):
        url_from_dsn(bad)


@pytest.mark.parametrize("bad", [None, 5, b"dbname=x"])
def test_url_from_dsn_wrong_type(bad: Any) -> None:
    with pytest.raises(TypeError):
        url_from_dsn(bad)


def _socket_dir(dsn: str) -> tuple[str, str, str]:
    """The suite's server's unix-socket directory on this machine, its port, its identity."""
    with psycopg.connect(dsn) as c:
        row = c.execute(
            "SELECT current_setting('unix_socket_directories'), current_setting('port'),"
            " (SELECT system_identifier::text FROM pg_control_system())"
        ).fetchone()
    assert row is not None
    dirs, port, ident = row
    for d in (d.strip() for d in str(dirs).split(",")):
        if d.startswith("/") and (Path(d) / f".s.PGSQL.{port}").exists():
            return d, str(port), str(ident)
    pytest.skip(f"the test server's unix sockets ({dirs}) are not on this machine")


def _socket_dsns(dsn: str, socket_dir: str, port: str) -> list[str]:
    info = conninfo_to_dict(dsn)
    user, db = str(info.get("user") or "postgres"), str(info["dbname"])
    return [
        f"postgresql:///{quote(db)}?host={quote(socket_dir, safe='')}&port={port}&user={user}",
        f"postgresql://{user}@{quote(socket_dir, safe='')}:{port}/{quote(db)}",
        make_conninfo(dsn, host=socket_dir, port=port, hostaddr=None),
    ]


def test_url_from_a_unix_socket_dsn_connects_through_the_socket(dsn: str) -> None:
    """Against the real server this is /var/run/postgresql; against pgserver, its temp dir."""
    socket_dir, port, ident = _socket_dir(dsn)
    db = str(conninfo_to_dict(dsn)["dbname"])
    for socket_dsn in _socket_dsns(dsn, socket_dir, port):
        url = url_from_dsn(socket_dsn)
        for target in (url, url.render_as_string(hide_password=False)):
            engine = create_engine(target)
            try:
                with engine.connect() as c:
                    row = c.execute(text(
                        "SELECT inet_server_addr() IS NULL, current_database(),"
                        " (SELECT system_identifier::text FROM pg_control_system())"
                    )).one()
            finally:
                engine.dispose()
            # no server address: a unix socket; the same database on the same server
            assert tuple(row) == (True, db, ident), socket_dsn


def test_url_from_a_unix_socket_dsn_connects_async(dsn: str) -> None:
    socket_dir, port, ident = _socket_dir(dsn)
    url = url_from_dsn(_socket_dsns(dsn, socket_dir, port)[0], async_=True)

    async def go() -> tuple[Any, ...]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as c:
                row = (await c.execute(text(
                    "SELECT inet_server_addr() IS NULL,"
                    " (SELECT system_identifier::text FROM pg_control_system())"
                ))).one()
        finally:
            await engine.dispose()
        return tuple(row)

    assert asyncio.run(go()) == (True, ident)


def test_the_suite_server_dsn_converts(pg_server: Any) -> None:
    """The suite's own DSN (a socket directory when the embedded server runs) round-trips."""
    assert connect_params(url_from_dsn(pg_server.dsn)) == libpq_params(pg_server.dsn)
