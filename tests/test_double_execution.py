"""Double execution and poisoned batches (issue 12), against a real Postgres.

Every execution is counted in the scratch table ``public.effect_log`` by the
code under test through its own connection (tests/_effects_app.py), so a
re-execution is seen by the database, not by a process that may have died.
Connections are cut with ``pg_terminate_backend`` on the library's own
backends (``application_name = 'pgdurable'``), outages with a local TCP proxy;
the shared server is never restarted.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, finished, running, until
from psycopg.conninfo import make_conninfo

from pgdurable import (
    NOT_PERFORMED,
    AsyncPostgresLeaseProvider,
    Continue,
    DatabaseUnavailable,
    Done,
    Durable,
    DurableClient,
    EffectFailed,
    PostgresLeaseProvider,
    RunContext,
    with_idempotency,
)
from pgdurable.foundation.queries.migrations import SCHEMA_STATE
from pgdurable.foundation.queries.schedules import DECLARE_LOCK

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import _effects_app as fx  # noqa: E402
from _pgnet import Proxy, proxied  # noqa: E402
from fix_fleet import Fleet  # noqa: E402
from test_effects_crash import HANGING, spawn_hanging_worker, wait_for  # noqa: E402

# -- terminate every connection of the library to this database (not the test's own),
# -- and wait (up to 10 s) until those backends are gone: their sockets are closed
KILL_LIBRARY = ("SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'pgdurable' "
                "AND pid <> pg_backend_pid()")


def kill_library(dsn: str) -> int:
    """Terminate the library's connections to this database (from a connection of our own)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        row = c.execute(KILL_LIBRARY).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
async def app(dsn: str, conn: psycopg.Connection[Any]) -> AsyncIterator[Durable]:
    conn.execute(fx.SCRATCH)
    a = Durable(dsn)
    yield a
    await a.close()


def run_row(conn: psycopg.Connection[Any], rid: str) -> tuple[Any, ...]:
    row = conn.execute("SELECT status, attempts, error->>'type', claims FROM pgdurable.runs "
                       "WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return row


def effect_row(conn: psycopg.Connection[Any], rid: str, key: str) -> tuple[Any, ...] | None:
    return conn.execute("SELECT status, result, error->>'type' FROM pgdurable.effects "
                        "WHERE run_id = %s AND key = %s", (rid, key)).fetchone()


async def _is(value: bool) -> bool:
    return value


# ----------------------------------------------------------- poisoned batch


async def test_one_unstorable_run_does_not_fail_its_batch(
    app: Durable, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """16 steps finish in one event-loop turn and go in ONE write_steps batch;
    the database refuses one run's state. The batch is retried run by run: the
    15 others complete, each executed once, none PoisonRun; the bad run alone
    fails terminally (not left to lapse and re-run)."""
    conn.execute("ALTER TABLE pgdurable.runs ADD CONSTRAINT test_no_poison "
                 "CHECK (NOT coalesce(state ? 'poison', false)) NOT VALID")
    gate = asyncio.Event()
    arrived: list[str] = []

    @app.task("wide", revision="1", max_attempts=3, retry_base=0.01, retry_cap=0.05)
    async def wide(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            await asyncio.to_thread(fx.log, dsn, "step0", ctx.run_id)
            arrived.append(ctx.run_id)
            await gate.wait()
            return Continue({"poison": True} if state["i"] == 7 else {"i": state["i"]})
        return Done(state["i"])

    ids = [await app.start("wide", {"i": i}) for i in range(16)]
    worker = app.worker(concurrency=16, poll_interval=60, lease_ttl=timedelta(seconds=3))
    async with running(worker):
        await until(lambda: _is(len(arrived) == 16), "all 16 steps to start")
        gate.set()
        infos = [await finished(app, rid) for rid in ids]
        # one batch of 16, then each alone, then the 15 Done steps
        assert worker.write_count >= 1 + 16
    for i, (rid, info) in enumerate(zip(ids, infos, strict=True)):
        assert fx.count(dsn, "step0", rid) == 1, f"run {i} executed again"
        if i == 7:
            status, _, error_type, _ = run_row(conn, rid)
            assert (status, error_type) == ("failed", "CheckViolation")
        else:
            assert info.status == "completed" and info.result == i
            assert run_row(conn, rid)[:2] == ("completed", 0)


# ----------------------------------------------------------- effects


async def test_effect_result_that_cannot_be_stored_runs_once_and_fails(
    app: Durable, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A lone surrogate in an effect's result (truncated LLM output): the
    effect ran, so it is recorded failed, the run fails clearly, and the
    e-mail is sent once, not once per attempt."""

    @app.task("mailer", revision="1", max_attempts=3, retry_base=0.01, retry_cap=0.05)
    async def mailer(ctx: RunContext, state: Any) -> Any:
        def send() -> Any:
            fx.log(dsn, "mail", ctx.run_id)
            return {"summary": "truncated \ud83d"}

        return Done(await ctx.effect("mail", send))

    rid = await app.start("mailer", {})
    async with running(app.worker(poll_interval=0.2)):
        info = await finished(app, rid)
    assert info.status == "failed"
    assert fx.count(dsn, "mail", rid) == 1
    assert run_row(conn, rid)[2] == "EffectFailed"
    assert "lone surrogate" in (info.error or {}).get("message", "")
    row = effect_row(conn, rid, "mail")
    assert row is not None and row[0] == "failed" and row[2] == "ValueError"


@pytest.mark.parametrize("cut", ["while fn runs", "during effect_finish"])
async def test_effect_survives_lost_connections(
    app: Durable, dsn: str, conn: psycopg.Connection[Any], cut: str
) -> None:
    """The library's connections die while fn runs (all of them) or under the
    effect_finish statement itself: the outcome is recorded on a fresh
    connection, the effect runs once and the step's attempts are untouched."""
    in_fn = asyncio.Event()
    go_on = asyncio.Event()
    killed: list[int] = []

    @app.task("mailer", revision="1", max_attempts=3, retry_base=0.01, retry_cap=0.05)
    async def mailer(ctx: RunContext, state: Any) -> Any:
        async def send() -> Any:
            await asyncio.to_thread(fx.log, dsn, "mail", ctx.run_id)
            if cut == "while fn runs":
                killed.append(await asyncio.to_thread(kill_library, dsn))
            in_fn.set()
            await go_on.wait()
            return {"sent": True}

        return Done(await ctx.effect("mail", send))

    rid = await app.start("mailer", {})
    async with running(app.worker(poll_interval=0.2)):
        await asyncio.wait_for(in_fn.wait(), WAIT_LIMIT)
        if cut == "while fn runs":
            assert killed[0] > 0  # fn killed every library connection, then returns
            go_on.set()
        else:
            with psycopg.connect(dsn, autocommit=True) as locker:
                with locker.transaction():
                    # hold the effect row: effect_finish blocks on it
                    locker.execute("SELECT 1 FROM pgdurable.effects WHERE run_id = %s "
                                   "FOR UPDATE", (rid,))
                    go_on.set()

                    async def finish_blocked() -> bool:
                        return conn.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock' "
                            "AND query LIKE '%%effect_finish%%'").fetchone() == (1,)

                    await until(finish_blocked, "effect_finish to wait for the row lock")
                    assert conn.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                        "AND query LIKE '%%effect_finish%%'").fetchone() == (1,)
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"sent": True}
    assert fx.count(dsn, "mail", rid) == 1
    assert run_row(conn, rid)[:2] == ("completed", 0)
    assert effect_row(conn, rid, "mail") == ("succeeded", {"sent": True}, None)


@HANGING
async def test_reconcile_not_performed_runs_fn_once(dsn: str, conn: psycopg.Connection[Any],
                                                    fleet: Fleet) -> None:
    """The effect is recorded started, the worker is SIGKILLed before fn
    performed it; on resume reconcile finds no trace and returns
    NOT_PERFORMED: fn runs exactly once, under the new lease token."""
    conn.execute(fx.SCRATCH)
    starter = fx.make_app(dsn)
    try:
        rid = await starter.start("crash_before_send")
    finally:
        await starter.close()
    proc = spawn_hanging_worker(fleet, dsn)
    try:
        await wait_for(lambda: fx.count(dsn, "entered", rid) == 1, "fn entered", proc)
        assert effect_row(conn, rid, "send") == ("started", None, None)
    finally:
        proc.kill()  # SIGKILL, reaped
    app = fx.make_app(dsn)
    try:
        async with running(app.worker(poll_interval=0.2)):
            info = await finished(app, rid)
    finally:
        await app.close()
    assert info.status == "completed" and info.result == {"sent": True}
    assert fx.count(dsn, "reconcile", rid) == 1 and fx.count(dsn, "send", rid) == 1
    token = conn.execute("SELECT lease_token FROM pgdurable.runs WHERE id = %s",
                         (rid,)).fetchone()
    assert conn.execute("SELECT status, token FROM pgdurable.effects WHERE run_id = %s",
                        (rid,)).fetchone() == ("succeeded", token[0])  # type: ignore[index]
    assert repr(NOT_PERFORMED) == "pgdurable.NOT_PERFORMED"


# ----------------------------------------------------------- lost connections


async def test_lost_connections_between_steps_are_not_step_failures(
    app: Durable, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Every connection of the worker is terminated while its runs are
    between two statements (the server closing idle pooled connections, as
    a restart, failover or pooler does). The runs complete, each step once,
    with their attempts unchanged; none fails with DatabaseUnavailable."""
    gate = asyncio.Event()
    arrived: set[str] = set()

    @app.task("chain", revision="1", max_attempts=2, retry_base=0.01, retry_cap=0.05)
    async def chain(ctx: RunContext, state: dict[str, Any]) -> Any:
        await asyncio.to_thread(fx.log, dsn, f"step{ctx.step}", ctx.run_id)
        if ctx.step == 1:
            arrived.add(ctx.run_id)
            await gate.wait()
            # the step's own statement, like a durable task's step bookkeeping
            await app.fetchone("SELECT 1", ())
        if ctx.step < 2:
            return Continue(state)
        return Done(ctx.step)

    ids = [await app.start("chain", {"i": i}) for i in range(8)]
    async with running(app.worker(concurrency=8, poll_interval=0.5)):
        await until(lambda: _is(len(arrived) == 8), "all runs in step 1")
        assert kill_library(dsn) > 0
        gate.set()
        infos = [await finished(app, rid) for rid in ids]
    for rid, info in zip(ids, infos, strict=True):
        assert info.status == "completed", info.error
        assert run_row(conn, rid)[:2] == ("completed", 0)
        assert [fx.count(dsn, f"step{s}", rid) for s in range(3)] == [1, 1, 1]


async def test_step_write_killed_mid_statement_is_sent_again_once(
    app: Durable, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """write_steps dies under its statement (backend terminated while it waits
    for the run's row lock): the worker reads the run, sees the write did not
    apply and sends it again; no step is executed twice or skipped."""
    gate = asyncio.Event()
    arrived = asyncio.Event()

    @app.task("two", revision="1", max_attempts=1)
    async def two(ctx: RunContext, state: Any) -> Any:
        await asyncio.to_thread(fx.log, dsn, f"step{ctx.step}", ctx.run_id)
        if ctx.step == 0:
            arrived.set()
            await gate.wait()
            return Continue({"n": 1})
        return Done(state)

    rid = await app.start("two", {"n": 0})
    async with running(app.worker(poll_interval=0.2)):
        await asyncio.wait_for(arrived.wait(), WAIT_LIMIT)
        with psycopg.connect(dsn, autocommit=True) as locker:
            with locker.transaction():
                locker.execute("SELECT 1 FROM pgdurable.runs WHERE id = %s FOR UPDATE", (rid,))
                gate.set()
                killed = ("SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                          "AND query LIKE '%%write_steps%%'")
                await until(lambda: _is(conn.execute(killed).fetchone() == (1,)),
                            "write_steps to wait for the row lock, then be terminated")
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == {"n": 1}
    assert run_row(conn, rid)[:2] == ("completed", 0)
    assert [fx.count(dsn, f"step{s}", rid) for s in range(2)] == [1, 1]
    assert conn.execute("SELECT array_agg(step ORDER BY step) FROM pgdurable.checkpoints "
                        "WHERE run_id = %s", (rid,)).fetchone() == ([1, 2],)


async def test_step_whose_statement_loses_its_connection_uses_no_attempt(
    app: Durable, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A step's own statement dies under it (its backend is terminated while it
    waits for a lock): the step runs again from its checkpoint on a fresh
    connection; with max_attempts=1 the run still completes, attempts 0."""

    @app.task("locker", revision="1", max_attempts=1)
    async def locker(ctx: RunContext, state: Any) -> Any:
        await asyncio.to_thread(fx.log, dsn, "step", ctx.run_id)
        await app.fetchone("SELECT pg_advisory_xact_lock(4242)", ())
        return Done("locked")

    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        rid = await app.start("locker", {})
        async with running(app.worker(poll_interval=0.2)):
            blocked = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                       "AND query LIKE '%%pg_advisory_xact_lock%%'")
            await until(lambda: _is(fx.count(dsn, "step", rid) == 1), "the step to start")
            await until(lambda: _is(conn.execute(blocked).fetchone() == (1,)),
                        "the step's statement to be terminated")
            await until(lambda: _is(fx.count(dsn, "step", rid) == 2), "the step to run again")
            holder.execute("SELECT pg_advisory_unlock(4242)")
            info = await finished(app, rid)
    assert info.status == "completed" and info.result == "locked"
    assert run_row(conn, rid)[:2] == ("completed", 0)


# ----------------------------------------------------------- with_idempotency


async def test_heartbeat_cancelling_a_stalled_owner_keeps_its_claim(
    app: Durable, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A step's with_idempotency fn has acted (the e-mail went out) and then
    stalls; the worker's heartbeat finds the lease lost and cancels the step.
    The claim is not released (fn had started): it is settled failed with an
    unknown outcome, and the next caller of the key does not send again."""
    acted = asyncio.Event()
    stopped = asyncio.Event()

    @app.task("mailer", revision="1")
    async def mailer(ctx: RunContext, state: Any) -> Any:
        async def send() -> Any:
            await asyncio.to_thread(fx.log, dsn, "mail", ctx.run_id)
            acted.set()
            await asyncio.Event().wait()  # stalled after acting

        try:
            await app.with_idempotency("mail-1", send)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return Done()

    rid = await app.start("mailer", {})
    async with running(app.worker(lease_ttl=timedelta(seconds=1.5), poll_interval=5)):
        await asyncio.wait_for(acted.wait(), WAIT_LIMIT)
        conn.execute("UPDATE pgdurable.runs SET lease_token = lease_token + 1, "
                     "lease_owner = 'thief', lease_expires_at = pgdurable.now() + interval '1 h'")
        await asyncio.wait_for(stopped.wait(), WAIT_LIMIT)
    row = conn.execute("SELECT status, error->>'type' FROM pgdurable.idempotency_keys "
                       "WHERE key = 'mail-1'").fetchone()
    assert row == ("failed", "Interrupted")

    def again() -> Any:
        fx.log(dsn, "mail", rid)

    with pytest.raises(EffectFailed, match="outcome is unknown"):
        await with_idempotency(dsn, "mail-1", again, wait_timeout=5)
    assert fx.count(dsn, "mail", rid) == 1


async def test_owner_interrupted_before_fn_started_releases_its_claim(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Cancelled inside its claim statement (held up by a row lock), the
    caller gives its claim up: fn never started, the next caller runs it."""
    conn.execute(fx.SCRATCH)
    calls: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as locker, locker.transaction():
        locker.execute("LOCK TABLE pgdurable.idempotency_keys IN EXCLUSIVE MODE")
        task = asyncio.create_task(with_idempotency(dsn, "k", lambda: calls.append(1)))

        async def claim_blocked() -> bool:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%%idempotency_claim%%'"
            ).fetchone() == (1,)

        await until(claim_blocked, "the claim to wait for the lock")
        task.cancel()
        await asyncio.sleep(0)  # deliver the cancellation before the lock goes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == []
    await until(lambda: _is(conn.execute(
        "SELECT count(*) FROM pgdurable.idempotency_keys WHERE status = 'running'"
    ).fetchone() == (0,)), "the claim to be released")
    assert await with_idempotency(dsn, "k", lambda: 7, wait_timeout=5) == 7


# ----------------------------------------------------------- open after an outage


@pytest.fixture
def proxy(dsn: str) -> Iterator[tuple[Proxy, str]]:
    with proxied(dsn) as pair:
        yield pair


async def test_durable_open_recovers_after_an_outage(proxy: tuple[Proxy, str]) -> None:
    p, via_proxy = proxy
    app = Durable(via_proxy)
    app.open_timeout = 0.5
    try:
        with pytest.raises(DatabaseUnavailable):
            await app.open()
        with pytest.raises(DatabaseUnavailable):
            await app.open()  # still down: the same clear error, again
        p.forwarding = True
        await app.open()
        assert await app.fetchone("SELECT 1", ()) == (1,)
    finally:
        await app.close()


def test_client_open_recovers_after_an_outage(proxy: tuple[Proxy, str]) -> None:
    p, via_proxy = proxy
    client = DurableClient(via_proxy)
    client.open_timeout = 0.5
    try:
        with pytest.raises(DatabaseUnavailable):
            client.open()
        p.forwarding = True
        rid = client.start("t", {}, revision="1")
        assert client.get_run(rid).status == "runnable"
    finally:
        client.close()


# The schema check's first statement: a proxy cut there is a server (or PgBouncer)
# that restarts just after the pool opened, under the check.
SCHEMA_CHECK = SCHEMA_STATE.sql.strip().splitlines()[0].encode()


@pytest.fixture
def cut_once(proxy: tuple[Proxy, str]) -> tuple[Proxy, str]:
    p, via_proxy = proxy
    p.forwarding = True
    p.cut_on, p.cuts_left = SCHEMA_CHECK, 1
    return p, via_proxy


async def test_durable_open_asks_again_when_its_schema_check_loses_the_connection(
        cut_once: tuple[Proxy, str]) -> None:
    """The CI failure of 2026-12-02: a worker opening while PgBouncer restarted died."""
    p, via_proxy = cut_once
    async with Durable(via_proxy) as app:
        assert p.cut == 1  # the check lost its connection once, then went through
        assert await app.fetchone("SELECT 1", ()) == (1,)


def test_client_open_asks_again_when_its_schema_check_loses_the_connection(
        cut_once: tuple[Proxy, str]) -> None:
    p, via_proxy = cut_once
    with DurableClient(via_proxy) as client:
        assert p.cut == 1
        rid = client.start("t", {}, revision="1")
        assert client.get_run(rid).status == "runnable"


async def test_lease_providers_open_asks_again_when_the_schema_check_loses_the_connection(
        cut_once: tuple[Proxy, str]) -> None:
    p, via_proxy = cut_once
    with PostgresLeaseProvider(via_proxy) as leases:
        assert p.cut == 1
        assert leases.acquire_lease("k", "me", 60_000).acquired
    p.cuts_left = 1
    async with AsyncPostgresLeaseProvider(via_proxy) as aleases:
        assert p.cut == 2
        assert (await aleases.acquire_lease("k2", "me", 60_000)).acquired


async def test_open_gives_up_when_every_schema_check_loses_its_connection(
        cut_once: tuple[Proxy, str]) -> None:
    """Asked again only until the open timeout: then the same clear error as an outage."""
    p, via_proxy = cut_once
    p.cuts_left = 1_000_000
    app = Durable(via_proxy)
    app.open_timeout = 0.5
    with pytest.raises(DatabaseUnavailable):
        await app.open()
    assert p.cut > 1
    await app.close()
    client = DurableClient(via_proxy)
    client.open_timeout = 0.5
    with pytest.raises(DatabaseUnavailable):
        client.open()
    client.close()
    p.cuts_left = 0  # back: the next open works
    async with Durable(via_proxy) as again:
        assert await again.fetchone("SELECT 1", ()) == (1,)


async def test_a_worker_starts_when_its_schedule_declaration_loses_the_connection(
        cut_once: tuple[Proxy, str]) -> None:
    """A worker's other start-up write (its schedules, idempotent) is asked again too."""
    p, via_proxy = cut_once
    p.cut_on = DECLARE_LOCK.sql.replace("%s", "$1").encode()  # as psycopg sends it
    app = Durable(via_proxy)

    @app.task("t")
    async def t(ctx: RunContext, state: dict[str, Any]) -> Any:
        return Done({"ok": True})

    async with app:
        p.cut = 0
        async with running(app.worker(poll_interval=0.2)):
            rid = await app.start("t", {})
            assert (await finished(app, rid)).result == {"ok": True}
        assert p.cut == 1


def test_pool_connections_have_a_connect_timeout(dsn: str) -> None:
    client = DurableClient(dsn)
    app = Durable(dsn)
    assert client._pool.kwargs["connect_timeout"] == 10
    assert app.pool.kwargs["connect_timeout"] == 10
    own = DurableClient(make_conninfo(dsn, connect_timeout="3"))
    assert "connect_timeout" not in own._pool.kwargs  # the DSN's own wins


def test_transient_errors_are_told_from_the_statement_s_own(conn: psycopg.Connection[Any]) -> None:
    """What the worker retries (while its lease is trusted) instead of failing
    the run: lost connections, deadlocks and serialization failures, lack of
    resources, statement timeouts; not an error of the statement's values."""
    from pgdurable.foundation.retry import is_transient

    def error_of(code: str) -> BaseException:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '{code}'; END $$")
        return info.value

    for code in ("40P01", "40001", "53100", "57014", "57P01", "08006"):
        assert is_transient(error_of(code)), code
    for code in ("23514", "22P02", "42501", "PD001"):
        assert not is_transient(error_of(code)), code
