"""Review of the waiting boundary: signal argument checks that used to let
errors other than TypeError/ValueError escape (deeply nested payloads, a TTL
past what PostgreSQL can store), through the API, the sync client, the CLI
and the webhook app (ASGI, called directly)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgdurable import Durable, DurableClient
from pgdurable.foundation.signals import MAX_SIGNAL_TTL, parse_payload
from pgdurable.ops.webhooks import app, sign_request
from tests.test_webhooks import call

SECRET = "review-secret-" + "r" * 32


def count(conn: psycopg.Connection[Any], table: str) -> int:
    return int(conn.execute(f"SELECT count(*) FROM pgdurable.{table}").fetchone()[0])  # type: ignore[index]


def parked_run(conn: psycopg.Connection[Any], kind: str, ref: str) -> uuid.UUID:
    rid: uuid.UUID = conn.execute(
        "INSERT INTO pgdurable.runs (task, revision, status, lease_owner, lease_token, "
        "lease_expires_at) VALUES ('t', '1', 'leased', 'w', 1, pgdurable.now() + "
        "interval '1 hour') RETURNING id").fetchone()[0]  # type: ignore[index]
    conn.execute("SELECT * FROM pgdurable.park_run(%s, 1, 'w', '{}', 0, %s, %s, NULL, NULL)",
                 (rid, kind, ref))
    return rid


def status(conn: psycopg.Connection[Any], rid: uuid.UUID) -> str:
    return str(conn.execute("SELECT status FROM pgdurable.runs WHERE id = %s",
                            (rid,)).fetchone()[0])  # type: ignore[index]


def nested(depth: int) -> list[Any]:
    """[[[...]]] ``depth`` levels deep (built without recursion)."""
    root: list[Any] = []
    cur = root
    for _ in range(depth - 1):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return root


@pytest.fixture
async def durable(dsn: str) -> AsyncIterator[Durable]:
    d = Durable(dsn)
    yield d
    await d.close()


# -- deeply nested payloads: ValueError (400 / exit 2), never RecursionError ----------


def test_parse_payload_refuses_deep_nesting_with_value_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # 200 kB: well under the size limit
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_payload(deep)
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_payload(deep.encode())
    assert parse_payload("[[[1]]]") == [[[1]]]


async def test_signal_refuses_deeply_nested_payload(durable: Durable, dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    rid = parked_run(conn, "ci", "deep")
    payload = nested(5000)  # _json.validate is iterative; json.dumps recursed and blew up
    with pytest.raises(ValueError, match="nested too deeply"):
        await durable.signal("ci", "deep", payload)
    with pytest.raises(ValueError, match="nested too deeply"):
        await durable.signal_run(rid, "ci", payload)
    with DurableClient(dsn) as client:
        with pytest.raises(ValueError, match="nested too deeply"):
            client.signal("ci", "deep", payload)
        with pytest.raises(ValueError, match="nested too deeply"):
            client.signal_run(rid, "ci", payload)
    assert count(conn, "signals") == 0 and status(conn, rid) == "waiting"
    assert await durable.signal("ci", "deep", nested(50)) == [str(rid)]


def test_cli_signal_refuses_deeply_nested_payload(dsn: str, conn: psycopg.Connection[Any]) -> None:
    from typer.testing import CliRunner

    from pgdurable.ops.cli import app as cli_app

    rid = parked_run(conn, "ci", "deep")
    r = CliRunner().invoke(cli_app, ["signal", "ci", "deep", "--payload", "[" * 50_000 + "]" * 50_000,
                                     "--dsn", dsn], catch_exceptions=False)
    assert r.exit_code == 2 and "nested too deeply" in r.stderr and r.stderr.count("\n") == 1
    assert count(conn, "signals") == 0 and status(conn, rid) == "waiting"


async def asgi_call(hooks: Any, path: str, body: bytes) -> tuple[int, Any]:
    """POST a signed ``body`` to ``path`` through the ASGI interface."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in
                         sign_request(SECRET, *path.split("/")[2:4], body).items()]}
    return await call(hooks, scope, body)


async def test_webhook_deeply_nested_body_is_a_400(dsn: str, conn: psycopg.Connection[Any]) -> None:
    rid = parked_run(conn, "ci", "deep")
    hooks = app(Durable(dsn), secret=SECRET, kinds=["ci"])
    try:
        # a signed, well-formed JSON body of 10 kB: the app raised RecursionError
        # (the server's plain-text 500) instead of answering 400 in JSON
        status_code, answer = await asgi_call(hooks, "/signals/ci/deep",
                                              b"[" * 5000 + b"]" * 5000)
        assert status_code == 400 and "nested too deeply" in answer["error"]
        assert count(conn, "signals") == 0 and status(conn, rid) == "waiting"
        status_code, answer = await asgi_call(hooks, "/signals/ci/deep", b"[[[]]]")
        assert (status_code, answer) == (200, {"woken": [str(rid)], "pending": False})
    finally:
        await hooks.durable.close()


async def test_webhook_lock_timeout_is_a_503_json(dsn: str, conn: psycopg.Connection[Any]) -> None:
    from _waiting import WAIT_LIMIT
    from psycopg import sql

    # a server-side timeout the operator configured (lock_timeout here; also
    # statement_timeout, a deadlock or serialization failure) is not translated
    # by pgdurable: the app let the raw psycopg error escape (the server's
    # plain-text 500) instead of its documented JSON 503 "retry later"
    rid = parked_run(conn, "ci", "busy")
    db = conn.info.dbname
    conn.execute(sql.SQL("ALTER DATABASE {} SET lock_timeout = 50").format(sql.Identifier(db)))
    hooks = app(Durable(dsn), secret=SECRET, kinds=["ci"])
    try:
        with psycopg.connect(dsn) as holder:  # another sender of (ci, busy), mid-transaction
            holder.execute("SELECT pg_advisory_xact_lock(pgdurable.wait_lock_key('ci', 'busy'))")
            async with asyncio.timeout(WAIT_LIMIT):  # a bound against a hang, not a measure
                status_code, answer = await asgi_call(hooks, "/signals/ci/busy", b'{"n": 1}')
            holder.rollback()
        # a generic body that tells the sender what to do (the details are logged)
        assert status_code == 503 and "retry with the same Idempotency-Key" in answer["error"]
        assert count(conn, "signals") == 0 and status(conn, rid) == "waiting"
        status_code, answer = await asgi_call(hooks, "/signals/ci/busy", b'{"n": 1}')
        assert (status_code, answer) == (200, {"woken": [str(rid)], "pending": False})
    finally:
        await hooks.durable.close()


# -- TTL of kept signals: bounded, checked before any SQL ---------------------------


async def test_far_future_ttl_is_a_value_error(durable: Durable, dsn: str,
                                              conn: psycopg.Connection[Any]) -> None:
    rid = parked_run(conn, "other", "x")  # waiting on another kind: signal_run keeps it
    for ttl in (timedelta.max, timedelta(days=999_999_999), MAX_SIGNAL_TTL + timedelta(days=1)):
        # was psycopg.errors.DatetimeFieldOverflow from the INSERT (now() + ttl)
        with pytest.raises(ValueError, match="ttl"):
            await durable.signal("ci", "far", {"x": 1}, ttl=ttl)
        with pytest.raises(ValueError, match="ttl"):
            await durable.signal_run(rid, "ci", {"x": 1}, ttl=ttl)
        with DurableClient(dsn) as client:
            with pytest.raises(ValueError, match="ttl"):
                client.signal("ci", "far", {"x": 1}, ttl=ttl)
            with pytest.raises(ValueError, match="ttl"):
                client.signal_run(rid, "ci", {"x": 1}, ttl=ttl)
    assert count(conn, "signals") == 0
    # the largest TTL and None (no expiry) are kept as asked
    assert await durable.signal("ci", "far", {"x": 1}, ttl=MAX_SIGNAL_TTL) == []
    assert await durable.signal_run(rid, "ci", {"x": 2}, ttl=None) == []
    rows = conn.execute("SELECT run_id IS NULL, expires_at - created_at >= %s, expires_at IS NULL "
                        "FROM pgdurable.signals ORDER BY id", (MAX_SIGNAL_TTL,)).fetchall()
    assert rows == [(True, True, False), (False, None, True)]


# -- Wait/Sleep arguments ------------------------------------------------------------


def test_wait_refuses_a_signal_no_sender_can_address() -> None:
    from pgdurable import Wait

    # app.signal / signal_run / the webhook refuse these kinds and refs (check_name):
    # a run parked on one can never be woken by a signal
    for sig in (("ci", "x" * 1001), ("ci", "é" * 501), ("k" * 1001, "r"), ("ci", "\ud800")):
        with pytest.raises(ValueError):
            Wait(signal=sig)
    with pytest.raises(ValueError):
        Wait.approval("x" * 1001)
    Wait(signal=("ci", "x" * 1000))
    Wait(signal=("inbox", "x" * 10_240))  # a thread's own wait: thread keys have no limit


def test_wait_and_sleep_refuse_timeouts_past_what_the_database_stores() -> None:
    from pgdurable import Sleep, Wait

    # the worker turned these into timedelta(seconds=1e300) (OverflowError: the run
    # stayed leased until its lease lapsed, again and again) or stored a wake_at
    # after year 9999 that psycopg cannot load (get_run raised DataError)
    for value in (1e300, 1e12, timedelta.max, timedelta(days=999_999_999)):
        with pytest.raises(ValueError):
            Wait(signal=("ci", "x"), timeout=value)
        with pytest.raises(ValueError):
            Sleep(seconds=value)
    Wait(signal=("ci", "x"), timeout=timedelta(days=365_000))
    Sleep(seconds=timedelta(days=365_000))


async def test_far_future_sleep_fails_the_step_instead_of_breaking_get_run(
        durable: Durable) -> None:
    from _waiting import finished, running

    from pgdurable import Done, RunContext, Sleep

    @durable.task("sleeps_forever", revision="1", max_attempts=1)
    async def sleeps(ctx: RunContext, state: Any) -> Any:
        if ctx.wake is None:
            return Sleep(seconds=1e12)  # ~31,700 years
        return Done(None)

    rid = await durable.start("sleeps_forever")
    async with running(durable.worker(poll_interval=0.1)):
        info = await finished(durable, rid)  # was: psycopg.DataError once it parked
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "ValueError"
