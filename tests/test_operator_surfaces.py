"""Operator surfaces (issue 12): what the CLI prints, what errors show, and the
inputs that gave a traceback or a raw psycopg error instead of a one-line
error or a ValueError. CLI cases run the real ``pgdurable`` entry point in a
subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgdurable import Durable, DurableClient, PermissionDenied, PgDurableError
from pgdurable.foundation.db import validate_dsn
from pgdurable.foundation.errors import InvalidInput
from pgdurable.ops.retention import parse_age
from pgdurable.ops.testing import TestServer

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "pgdurable"]


def pgdurable_cli(*args: str | bytes, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """``pgdurable ARGS`` in a subprocess (wide, not a terminal); text with escapes kept."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGDURABLE_DSN")}
    env["COLUMNS"] = "400"
    if dsn is not None:
        env["PGDURABLE_DSN"] = dsn
    return subprocess.run([*CLI, *args], cwd=ROOT, env=env, capture_output=True, timeout=120,
                          text=True, encoding="utf-8", errors="backslashreplace")


def one_line_error(p: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert p.returncode == code, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


# -- database text is data, not Rich markup, and never terminal control ----------------

HOSTILE = ("boom [/] [link=https://evil.example]click[/link] [bold]x "
           "\x1b]8;;https://evil.example\x1b\\ \x1b[2J \x9b31m \x07")


def test_cli_prints_database_text_as_plain_escaped_text(dsn: str,
                                                       conn: psycopg.Connection[Any]) -> None:
    failed = conn.execute(
        "INSERT INTO pgdurable.runs (task, revision, queue, status, error, finished_at) "
        "VALUES ('t[/]', '1', 'q[/]', 'failed', jsonb_build_object('type', 'E[/]', "
        "'message', %s::text), now()) RETURNING id", (HOSTILE,)).fetchone()[0]  # type: ignore[index]
    leased = conn.execute(
        "INSERT INTO pgdurable.runs (task, revision, queue, status, lease_owner, lease_token, "
        "lease_expires_at) VALUES ('t', '1', 'q[/]', 'leased', %s, 1, "
        "pgdurable.now() + interval '1 hour') RETURNING id",
        ("w[/]\x1b[2J[link=https://evil.example]",)).fetchone()[0]  # type: ignore[index]
    conn.execute("INSERT INTO pgdurable.effects (run_id, key, status, token, result) "
                 "VALUES (%s, %s, 'succeeded', 1, '{}')", (failed, "k[/]\x1b[2J"))
    conn.execute("INSERT INTO pgdurable.leases (key, owner, token, expires_at) "
                 "VALUES (%s, %s, 1, now() + interval '1 hour')", ("key[/]", "o\x1b[2J[/]"))
    outputs = []
    for args in (["runs"], ["run", str(failed)], ["run", str(leased)], ["leases"], ["stats"],
                 ["runs", "--status", "failed"]):
        p = pgdurable_cli(*args, dsn=dsn)
        # Rich raised MarkupError on "[/]" (a traceback), or turned [link=...] into a link
        assert p.returncode == 0, (args, p.stderr)
        outputs.append(p.stdout)
        assert "\x1b" not in p.stdout and "\x9b" not in p.stdout and "\x07" not in p.stdout
    everything = "\n".join(outputs)
    assert "[/]" in outputs[0] and "[link=https://evil.example]" in outputs[1]
    assert "\\x1b[2J" in outputs[1] + outputs[2] and "\\x9b31m" in outputs[1]
    assert "w[/]\\x1b[2J[link=https://evil.example]" in outputs[2]
    assert "k[/]\\x1b[2J" in outputs[1] and "o\\x1b[2J[/]" in outputs[3]
    assert "q[/]" in outputs[4] and "E[/]" in everything


def test_cli_errors_print_the_argument_as_text(dsn: str) -> None:
    # these messages quote what the operator typed; Rich parsed it as markup and crashed
    for args in (["runs", "--bogus[/]"], ["bogus[/]"], ["runs", "--status", "[/]x"]):
        line = one_line_error(pgdurable_cli(*args, dsn=dsn))
        assert "[/]" in line
    line = one_line_error(pgdurable_cli("runs", "--status", "\x1b[2J", dsn=dsn))
    assert "\x1b" not in line and "\\x1b[2J" in line


def test_cli_json_output_escapes_c1_and_bidi_controls(dsn: str,
                                                      conn: psycopg.Connection[Any]) -> None:
    conn.execute("INSERT INTO pgdurable.runs (task, revision, status) VALUES (%s, '1', 'runnable')",
                 ("t\x9b2J\u202eevil\x1b",))
    p = pgdurable_cli("runs", "--json", dsn=dsn)
    assert p.returncode == 0, p.stderr
    assert "\x9b" not in p.stdout and "\u202e" not in p.stdout and "\x1b" not in p.stdout
    import json

    assert json.loads(p.stdout)["runs"][0]["task"] == "t\x9b2J\u202eevil\x1b"  # still the same data


# -- a DSN that does not parse: no piece of the password is echoed ----------------------

BAD_DSNS = [
    "host=db password=Sup3r S3cretTail",        # missing "=" after "S3cretTail"
    "host=db password='Sup3rS3cretTail",        # unterminated quoted string
    "postgresql://app:Sup3r%zzS3cretTail@db/x",  # invalid percent-encoded token
    "postgresql://app:Sup3r S3cretTail@db/x",    # unexpected spaces
    "postgresql://app:Sup3rS3cretTail@db/x?S3cretTail",  # invalid URI query parameter
]


@pytest.mark.parametrize("bad", BAD_DSNS)
def test_a_bad_dsn_never_echoes_the_password(bad: str) -> None:
    for make in (validate_dsn, Durable, DurableClient):
        with pytest.raises(InvalidInput) as caught:
            make(bad)
        text = f"{caught.value} {caught.value!r} {caught.value.__context__!r}"
        assert "S3cret" not in text and "Sup3r" not in text, text
        assert "does not parse" in str(caught.value)
    line = one_line_error(pgdurable_cli("runs", "--dsn", bad))
    assert "S3cret" not in line and "Sup3r" not in line, line
    p = pgdurable_cli("migrate", dsn=bad)
    assert "S3cret" not in p.stderr + p.stdout and p.returncode == 2


def test_test_server_repr_hides_the_password() -> None:
    server = TestServer(host="db", port=5432, user="app", password="Sup3rS3cret",
                        dsn="postgresql://app:Sup3rS3cret@db:5432/postgres")
    assert "Sup3rS3cret" not in repr(server) and "Sup3rS3cret" not in str(server)
    assert "host='db'" in repr(server) and server.password == "Sup3rS3cret"
    assert "Sup3rS3cret" in server.dsn_for("x")  # still usable


# -- one-line errors and ValueErrors instead of tracebacks ----------------------------


def test_prune_with_an_absurd_age_is_a_one_line_error(dsn: str) -> None:
    for age in ("99999999999999d", "999999999d", "99999999999w", "1" + "0" * 400):
        line = one_line_error(pgdurable_cli("prune", "--older-than", age, dsn=dsn))
        assert "too large" in line, line
        with pytest.raises(InvalidInput, match="too large"):
            parse_age(age)
    assert parse_age("365000d") == timedelta(days=365_000)


def test_cli_signal_payload_with_a_lone_surrogate(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # a JSON escape of a lone surrogate; undecodable argv bytes arrive as lone surrogates too
    for payload in ('"\\ud800"', '{"k": ["ok", "\\udfff"]}', '{"\\ud800": 1}'):
        line = one_line_error(pgdurable_cli("signal", "ci", "x", "--payload", payload, dsn=dsn))
        assert "surrogate" in line, line
    p = subprocess.run([*CLI.copy(), "signal", "ci", "x", "--payload", b'"\xed\xa0\x80 \xff"'],
                       env={**os.environ, "PGDURABLE_DSN": dsn}, capture_output=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 2 and b"Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and b"surrogate" in p.stderr
    assert conn.execute("SELECT count(*) FROM pgdurable.signals").fetchone() == (0,)


def test_worker_for_a_missing_module_is_a_one_line_error(dsn: str) -> None:
    line = one_line_error(pgdurable_cli("worker", "missing.module:app", dsn=dsn))
    assert "missing.module" in line and "No module named" in line
    p = subprocess.run([sys.executable, "-m", "pgdurable.worker", "missing.module:app"],
                       env={**os.environ, "PGDURABLE_DSN": dsn}, capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "missing.module" in p.stderr


@pytest.fixture
async def durable(dsn: str) -> AsyncIterator[Durable]:
    async with Durable(dsn) as app:
        yield app


def count_runs(conn: psycopg.Connection[Any]) -> int:
    return int(conn.execute("SELECT count(*) FROM pgdurable.runs").fetchone()[0])  # type: ignore[index]


async def test_max_attempts_beyond_32_bits_is_a_value_error(
    durable: Durable, dsn: str, conn: psycopg.Connection[Any],
) -> None:
    for bad in (2**31, 2**63, 10**30):
        with pytest.raises(ValueError, match="max_attempts"):
            await durable.start("t", {}, revision="1", max_attempts=bad)
        with DurableClient(dsn) as client:
            with pytest.raises(ValueError, match="max_attempts"):
                client.start("t", {}, revision="1", max_attempts=bad)
        with pytest.raises(ValueError, match="max_attempts"):
            durable.task("big", revision="1", max_attempts=bad)
    assert count_runs(conn) == 0
    await durable.start("t", {}, revision="1", max_attempts=2**31 - 1)
    assert count_runs(conn) == 1


async def test_a_deadline_past_what_postgres_stores_is_a_value_error(
    durable: Durable, dsn: str, conn: psycopg.Connection[Any],
) -> None:
    for bad in (timedelta(days=999_999_999), timedelta.max, timedelta(days=365_001)):
        with pytest.raises(ValueError, match="deadline"):
            await durable.start("t", {}, revision="1", deadline=bad)
        with DurableClient(dsn) as client:
            with pytest.raises(ValueError, match="deadline"):
                client.start("t", {}, revision="1", deadline=bad)
    assert count_runs(conn) == 0
    await durable.start("t", {}, revision="1", deadline=timedelta(days=365_000))
    assert count_runs(conn) == 1


async def test_fork_step_and_limit_beyond_32_bits_are_value_errors(
    durable: Durable, dsn: str, conn: psycopg.Connection[Any],
) -> None:
    """fork_run/rewind_run take an integer step and fork_failed an integer limit:
    a bigger int found no function (raw UndefinedFunction); now an InvalidInput
    (a ValueError) naming the parameter, before any SQL, and nothing is written."""
    rid = await durable.start("t", {}, revision="1")
    before = count_runs(conn)
    since = datetime.now(UTC) - timedelta(days=1)
    for bad in (2**31, 2**40, 2**63, 10**30):
        with pytest.raises(InvalidInput, match="from_step"):
            await durable.fork(rid, from_step=bad)
        with pytest.raises(InvalidInput, match="to_step"):
            await durable.rewind(rid, to_step=bad)
        with pytest.raises(InvalidInput, match="limit"):
            await durable.fork_failed("t", error=None, since=since, limit=bad)
        with DurableClient(dsn) as client:
            with pytest.raises(InvalidInput, match="from_step"):
                client.fork(rid, bad)
            with pytest.raises(InvalidInput, match="limit"):
                client.fork_failed("t", error=None, since=since, limit=bad)
        line = one_line_error(pgdurable_cli("fork", rid, "--step", str(bad), dsn=dsn))
        assert "from_step" in line, line
        line = one_line_error(pgdurable_cli("fork-failed", "t", "--limit", str(bad), dsn=dsn))
        assert "limit" in line, line
    assert count_runs(conn) == before
    # the largest value that fits still reaches the database (and its own answer)
    assert await durable.fork_failed("t", error=None, since=since, limit=2**31 - 1) == []


@pytest.fixture
def unprivileged(dsn: str, conn: psycopg.Connection[Any]) -> Iterator[str]:
    """The DSN of a real role that may read the schema version but no run table."""
    role = f"pgd_noperm_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA pgdurable TO {}").format(ident))
    conn.execute(sql.SQL("GRANT SELECT ON pgdurable.schema_migrations TO {}").format(ident))
    conn.execute(sql.SQL("GRANT SELECT ON pgdurable.schema_definitions TO {}").format(ident))
    try:
        yield make_conninfo(dsn, user=role)
    finally:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                      (role,))
            c.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            c.execute(sql.SQL("DROP ROLE {}").format(ident))


async def test_a_missing_privilege_is_permission_denied(unprivileged: str) -> None:
    async with Durable(unprivileged) as app:
        with pytest.raises(PermissionDenied, match="permission denied") as caught:
            await app.get_run(uuid.uuid4())
    assert isinstance(caught.value, PgDurableError) and caught.value.sqlstate == "42501"
    with DurableClient(unprivileged) as client:
        with pytest.raises(PermissionDenied):
            client.get_run(uuid.uuid4())
    line = one_line_error(pgdurable_cli("runs", dsn=unprivileged))
    assert "permission denied" in line and "database error" not in line
