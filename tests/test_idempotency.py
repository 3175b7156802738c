"""with_idempotency / with_idempotency_sync against a real database.

Executions are counted durably (rows in a scratch table), races use real
processes released together by an advisory-lock gate.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import until_sync as wait_until
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgdurable import (
    DeadlineExceeded,
    EffectFailed,
    InvalidInput,
    LeaseLost,
    with_idempotency,
    with_idempotency_sync,
)
from pgdurable.foundation.db import translated

ROOT = Path(__file__).resolve().parent.parent
HELPER = str(ROOT / "tests" / "_effect_procs.py")


@pytest.fixture
def scratch(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE executions (seq bigserial PRIMARY KEY, key text, pid int)")
        yield c


def executions(c: psycopg.Connection[Any], key: str) -> int:
    row = c.execute("SELECT count(*) FROM executions WHERE key = %s", (key,)).fetchone()
    return int(row[0]) if row else 0


def key_row(c: psycopg.Connection[Any], key: str) -> tuple[Any, ...] | None:
    return c.execute("SELECT status, owner, result, error FROM pgdurable.idempotency_keys "
                     "WHERE key = %s", (key,)).fetchone()




def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, HELPER, *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# ------------------------------------------------------------------ basics
async def test_executes_once_and_returns_the_stored_result(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    calls: list[int] = []

    async def effect() -> Any:
        calls.append(1)
        return {"charge": "ch_1", "amount": 12.5, "items": [1, "two", None, True]}

    first = await with_idempotency(dsn, "charge:42", effect)
    second = await with_idempotency(dsn, "charge:42", effect)
    third = with_idempotency_sync(dsn, "charge:42", lambda: calls.append(1))
    assert first == second == third == {"charge": "ch_1", "amount": 12.5,
                                        "items": [1, "two", None, True]}
    assert calls == [1]
    row = key_row(scratch, "charge:42")
    assert row is not None and row[0] == "succeeded"


async def test_with_pools(dsn: str, scratch: psycopg.Connection[Any]) -> None:
    async with AsyncConnectionPool(dsn, open=False, kwargs={"autocommit": True}) as apool:
        await apool.open()
        assert await with_idempotency(apool, "k", lambda: 1) == 1
        assert await with_idempotency(apool, "k", lambda: 2) == 1
    with ConnectionPool(dsn, open=False, kwargs={"autocommit": True}) as pool:
        pool.open()
        assert with_idempotency_sync(pool, "k", lambda: 3) == 1
        assert with_idempotency_sync(pool, "k2", lambda: None) is None
        assert with_idempotency_sync(pool, "k2", lambda: 4) is None


async def test_concurrent_callers_in_one_process(dsn: str, scratch: psycopg.Connection[Any]
                                                 ) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    calls: list[int] = []

    async def effect() -> Any:
        calls.append(1)
        started.set()
        await release.wait()
        return "done"

    first = asyncio.create_task(with_idempotency(dsn, "k", effect))
    await started.wait()
    others = [asyncio.create_task(with_idempotency(dsn, "k", effect)) for _ in range(5)]
    await asyncio.sleep(0.1)  # let them poll at least once (not needed for correctness)
    release.set()
    assert await asyncio.gather(first, *others) == ["done"] * 6
    assert calls == [1]


# ------------------------------------------------------------------ failures
async def test_failure_is_stored_and_propagated_as_effect_failed(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    async def effect() -> Any:
        raise ConnectionRefusedError("payment gateway said no")

    with pytest.raises(ConnectionRefusedError):  # the executing caller gets its own error
        await with_idempotency(dsn, "pay", effect)
    for _ in range(2):
        with pytest.raises(EffectFailed, match="ConnectionRefusedError: payment gateway") as info:
            await with_idempotency(dsn, "pay", lambda: "never")
        assert info.value.error == {
            "type": "ConnectionRefusedError", "message": "payment gateway said no"}
    with pytest.raises(EffectFailed):
        with_idempotency_sync(dsn, "pay", lambda: "never")
    row = key_row(scratch, "pay")
    assert row is not None and row[0] == "failed"


@pytest.mark.parametrize("bad, exc", [
    ({1, 2}, TypeError), (float("nan"), ValueError), (object(), TypeError),
    ({"a": (1, 2)}, TypeError), ("a\x00b", ValueError),
])
async def test_non_json_result_is_refused_and_leaves_no_stuck_key(
    dsn: str, scratch: psycopg.Connection[Any], bad: Any, exc: type[Exception]
) -> None:
    with pytest.raises(exc):
        await with_idempotency(dsn, "k", lambda: bad)
    row = key_row(scratch, "k")
    assert row is not None and row[0] == "failed"  # recorded: the effect did happen
    assert row[3]["type"] == exc.__name__
    with pytest.raises(EffectFailed):  # a later caller is answered at once, not blocked
        await with_idempotency(dsn, "k", lambda: "x", wait_timeout=5)
    with pytest.raises(exc):
        with_idempotency_sync(dsn, "k-sync", lambda: bad)
    row = key_row(scratch, "k-sync")
    assert row is not None and row[0] == "failed"


async def test_owner_cancelled_while_fn_runs_keeps_the_key(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    """fn had started (it may have acted): the key is settled failed with an
    unknown outcome, never released for a second execution."""
    started = asyncio.Event()

    async def slow() -> Any:
        started.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(with_idempotency(dsn, "k", slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = key_row(scratch, "k")
    assert row is not None and row[0] == "failed" and row[3]["type"] == "Interrupted"
    with pytest.raises(EffectFailed, match="outcome is unknown"):
        await with_idempotency(dsn, "k", lambda: 7, wait_timeout=5)


async def test_wait_timeout_raises_deadline_exceeded(dsn: str, scratch: psycopg.Connection[Any]
                                                     ) -> None:
    with translated():
        scratch.execute("SELECT * FROM pgdurable.idempotency_claim('k', 'someone', '1 hour')")
    with pytest.raises(DeadlineExceeded, match="held by another caller"):
        await with_idempotency(dsn, "k", lambda: 1, wait_timeout=0.2)
    with pytest.raises(DeadlineExceeded):
        with_idempotency_sync(dsn, "k", lambda: 1, wait_timeout=timedelta(milliseconds=200))


# ------------------------------------------------------------------ leases
async def test_heartbeat_keeps_a_long_effect_claimed(dsn: str, scratch: psycopg.Connection[Any]
                                                      ) -> None:
    """An effect longer than its lease stays claimed: renewals move expires_at."""
    seen: list[Any] = []
    release = threading.Event()

    def expires() -> Any:
        row = scratch.execute("SELECT expires_at FROM pgdurable.idempotency_keys "
                              "WHERE key = 'long'").fetchone()
        return row[0] if row else None

    async def effect() -> Any:
        def watch() -> None:
            wait_until(lambda: expires() is not None, "the claim")
            seen.append(expires())
            for _ in range(3):  # three renewals observed
                wait_until(lambda: expires() > seen[-1], "a renewal")
                seen.append(expires())
            release.set()

        await asyncio.to_thread(watch)
        return "long done"

    result = await with_idempotency(dsn, "long", effect, lease=0.6)
    assert result == "long done" and release.is_set()
    assert seen == sorted(seen) and len(set(seen)) == 4


def test_expired_claim_boundary_in_sql(conn: psycopg.Connection[Any]) -> None:
    """expires_at = now - 1 s is taken over; now + 1 s is not (database clock)."""
    claim = "SELECT claimed, owner FROM pgdurable.idempotency_claim(%s, %s, '30 s')"
    for key, offset, taken in (("past", "-1 second", True), ("future", "1 second", False)):
        conn.execute("INSERT INTO pgdurable.idempotency_keys (key, status, owner, expires_at) "
                     "VALUES (%s, 'running', 'dead', pgdurable.now() + %s::interval)",
                     (key, offset))
        assert conn.execute(claim, (key, "waiter")).fetchone() == (
            (True, "waiter") if taken else (False, "dead"))
    with conn.transaction():  # a fake clock sees an expired result as free again
        conn.execute("SELECT pgdurable.idempotency_finish('future', 'dead', '1', '1 hour')")
        conn.execute("SET LOCAL pgdurable.now = '2999-01-01'")
        assert conn.execute(claim, ("future", "later")).fetchone() == (True, "later")


def test_sql_owner_fencing(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT * FROM pgdurable.idempotency_claim('k', 'a', '30 s')")
    for fn in ("finish", "fail"):
        assert conn.execute(f"SELECT pgdurable.idempotency_{fn}('k', 'b', '1', '1 day')"
                            ).fetchone() == (False,)
    assert conn.execute("SELECT pgdurable.idempotency_renew('k', 'b', '30 s')").fetchone() == (
        False,)
    assert conn.execute("SELECT pgdurable.idempotency_release('k', 'b')").fetchone() == (False,)
    assert conn.execute("SELECT status, owner FROM pgdurable.idempotency_keys").fetchone() == (
        "running", "a")
    for bad in (("", "a", "1 s"), ("k", "", "1 s"), ("k", "a", "0 s")):
        with pytest.raises(InvalidInput), translated():
            conn.execute("SELECT * FROM pgdurable.idempotency_claim(%s, %s, %s::interval)", bad)


async def test_owner_that_lost_its_claim_gets_lease_lost(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    async def effect() -> Any:
        # another caller takes the key over (as after a lapsed lease)
        scratch.execute("UPDATE pgdurable.idempotency_keys SET owner = 'thief' WHERE key = 'k'")
        return 1

    with pytest.raises(LeaseLost, match="taken over"):
        await with_idempotency(dsn, "k", effect)
    assert key_row(scratch, "k") == ("running", "thief", None, None)


@pytest.mark.crash
async def test_sigkilled_owner_is_taken_over_after_its_lease(
    dsn: str, scratch: psycopg.Connection[Any]
) -> None:
    proc = spawn("idem-hang", dsn, "k")
    try:
        wait_until(lambda: executions(scratch, "k") == 1 or proc.poll() is not None,
                   "the owner's execution")
        assert proc.poll() is None, proc.communicate()
        row = key_row(scratch, "k")
        assert row is not None and row[0] == "running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
    calls: list[int] = []

    def effect() -> Any:
        calls.append(1)
        scratch.execute("INSERT INTO executions (key, pid) VALUES ('k', %s)", (os.getpid(),))
        return {"taken_over": True}

    # the waiter polls until the dead owner's 1 s lease lapses, then executes
    assert await with_idempotency(dsn, "k", effect, lease=1.0, wait_timeout=120) == {
        "taken_over": True}
    assert calls == [1] and executions(scratch, "k") == 2
    row = key_row(scratch, "k")
    assert row is not None and row[0] == "succeeded"


# ------------------------------------------------------------------ the race
@pytest.mark.crash
def test_twenty_processes_race_on_one_key(dsn: str, scratch: psycopg.Connection[Any]) -> None:
    n = 20
    scratch.execute("SELECT pg_advisory_lock(4242)")  # the gate
    procs = [spawn("idem", dsn, "race", "sync" if i % 2 else "async") for i in range(n)]
    try:
        def at_gate() -> int:
            row = scratch.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                  "AND objid = 4242 AND NOT granted").fetchone()
            return int(row[0]) if row else 0

        wait_until(lambda: at_gate() == n or any(p.poll() is not None for p in procs),
                   "all processes at the gate", timeout=180)
        scratch.execute("SELECT pg_advisory_unlock(4242)")
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    results = [json.loads(out) for out, _err in outs]
    assert executions(scratch, "race") == 1
    (pid,) = scratch.execute("SELECT pid FROM executions").fetchone() or (None,)
    assert results == [{"executed_by": pid}] * n


# ------------------------------------------------------------------ lost answers
# The server acted (a claim committed, an outcome written) but the caller never read
# its answer: cancelled in between, or its connection died.
def key_status(c: psycopg.Connection[Any], key: str) -> str | None:
    row = key_row(c, key)
    return None if row is None else str(row[0])


@pytest.mark.parametrize("target", ["conninfo", "pool"])
async def test_cancel_landing_after_the_claim_committed_releases_it(dsn: str, target: str
                                                                    ) -> None:
    """The claim statement commits, then the caller is cancelled before it reads the
    answer: it is the owner of a running claim it never learned about. Like an owner
    cancelled in ``fn`` it must release it at once, or every other caller of the key
    waits a whole lease (30 s by default) for nothing."""
    ran: list[int] = []
    with psycopg.connect(dsn, autocommit=True) as c, psycopg.connect(dsn) as blocker:
        # an expired result: the next claim takes the row over
        c.execute("INSERT INTO pgdurable.idempotency_keys (key, status, owner, result, "
                  "created_at, expires_at) VALUES ('k', 'succeeded', 'old', '1', "
                  "now() - interval '2 hours', now() - interval '1 hour')")
        blocker.execute("SELECT 1 FROM pgdurable.idempotency_keys WHERE key = 'k' FOR UPDATE")

        async def call(pool: AsyncConnectionPool[Any] | None) -> Any:
            return await with_idempotency(dsn if pool is None else pool, "k",
                                          lambda: ran.append(1))

        pool: AsyncConnectionPool[Any] | None = None
        if target == "pool":
            pool = AsyncConnectionPool(dsn, kwargs={"autocommit": True}, open=False)
            await pool.open()
        try:
            caller = asyncio.create_task(call(pool))

            def claim_blocked() -> bool:
                row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                "current_database() AND wait_event_type = 'Lock' "
                                "AND query LIKE '%%idempotency_claim%%'").fetchone()
                return row == (1,)

            await asyncio.to_thread(wait_until, claim_blocked, "the claim blocked on the row")
            # Without yielding to the event loop: let the claim through, wait until it
            # is committed, then cancel the caller before it reads the answer.
            blocker.commit()
            wait_until(lambda: key_status(c, "k") == "running", "the claim committed")
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            assert ran == []
            assert key_status(c, "k") is None  # released: the next caller executes at once
        finally:
            if pool is not None:
                await pool.close()


KILL_LIBRARY_CONNECTIONS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = 'pgdurable' "
    "AND pid <> pg_backend_pid()")


@pytest.mark.parametrize("target", ["conninfo", "pool"])
async def test_a_connection_lost_before_the_outcome_is_written_is_retried(
        dsn: str, conn: psycopg.Connection[Any], target: str) -> None:
    """The effect ran; the connection that would record its result dies (a
    server restart, a failover, a proxy). The owner reconnects and records it
    (a few retries), instead of leaving the claim 'running' until its lease
    lapses and a later caller executes the effect a second time."""
    calls: list[int] = []

    async def effect() -> Any:
        calls.append(1)
        with psycopg.connect(dsn, autocommit=True, application_name="killer") as k:
            row = k.execute(KILL_LIBRARY_CONNECTIONS).fetchone()
            assert row is not None and row[0] >= 1
        return {"charged": 42}

    pool: AsyncConnectionPool[Any] | None = None
    if target == "pool":
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False,
                                   kwargs={"autocommit": True, "application_name": "pgdurable"})
        await pool.open(wait=True)
    where: Any = pool if pool is not None else dsn
    try:
        assert await with_idempotency(where, "charge-1", effect) == {"charged": 42}
        assert await with_idempotency(where, "charge-1", effect) == {"charged": 42}
    finally:
        if pool is not None:
            await pool.close()
    assert calls == [1]
    assert conn.execute("SELECT status, result FROM pgdurable.idempotency_keys "
                        "WHERE key = 'charge-1'").fetchone() == ("succeeded", {"charged": 42})


def test_a_settle_retried_after_a_lost_answer_is_still_true(conn: psycopg.Connection[Any]) -> None:
    """The first finish committed but its answer was lost: the retry by the
    same owner reports success (not a false "taken over"); another owner's or
    another outcome's settle stays false."""
    row = conn.execute("SELECT claimed FROM pgdurable.idempotency_claim('k', 'me', "
                       "interval '30 s')").fetchone()
    assert row == (True,)
    finish = "SELECT pgdurable.idempotency_finish('k', %s, '1'::jsonb, interval '1 day')"
    assert conn.execute(finish, ("me",)).fetchone() == (True,)
    assert conn.execute(finish, ("me",)).fetchone() == (True,)
    assert conn.execute(finish, ("someone else",)).fetchone() == (False,)
    assert conn.execute("SELECT pgdurable.idempotency_fail('k', 'me', '{}'::jsonb, "
                        "interval '1 day')").fetchone() == (False,)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs, exc", [
    ({"key": ""}, ValueError),
    ({"key": 5}, TypeError),
    ({"key": None}, TypeError),
    ({"key": "a\x00b"}, ValueError),
    ({"key": "x" * 2001}, ValueError),
    ({"fn": "not callable"}, TypeError),
    ({"ttl": timedelta(0)}, ValueError),
    ({"ttl": -1}, ValueError),
    ({"ttl": "1 day"}, TypeError),
    ({"lease": 0}, ValueError),
    ({"wait_timeout": timedelta(seconds=-1)}, ValueError),
    ({"wait_timeout": True}, TypeError),
])
async def test_bad_input_is_rejected_before_sql(
    dsn: str, scratch: psycopg.Connection[Any], kwargs: dict[str, Any], exc: type[Exception]
) -> None:
    args: dict[str, Any] = {"key": "k", "fn": lambda: 1}
    args.update(kwargs)
    key, fn = args.pop("key"), args.pop("fn")
    with pytest.raises(exc):
        await with_idempotency(dsn, key, fn, **args)
    with pytest.raises(exc):
        with_idempotency_sync(dsn, key, fn, **args)
    assert scratch.execute("SELECT count(*) FROM pgdurable.idempotency_keys").fetchone() == (0,)


async def test_bad_targets(dsn: str) -> None:
    with pytest.raises(TypeError):
        await with_idempotency(42, "k", lambda: 1)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        with_idempotency_sync(42, "k", lambda: 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        await with_idempotency("mysql://x/y", "k", lambda: 1)

    async def coro() -> int:
        return 1

    with pytest.raises(TypeError, match="sync fn"):
        with_idempotency_sync(dsn, "k", coro)  # type: ignore[unused-coroutine]


def test_prune_deletes_expired_keys_in_batches(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO pgdurable.idempotency_keys (key, status, expires_at) "
        "SELECT 'old' || i, 'succeeded', pgdurable.now() - interval '1 second' "
        "FROM generate_series(1, 5) i")
    conn.execute("INSERT INTO pgdurable.idempotency_keys (key, status, expires_at) "
                 "VALUES ('fresh', 'succeeded', pgdurable.now() + interval '1 second')")
    assert conn.execute("SELECT pgdurable.idempotency_prune(3)").fetchone() == (3,)
    assert conn.execute("SELECT pgdurable.idempotency_prune(3)").fetchone() == (2,)
    assert conn.execute("SELECT pgdurable.idempotency_prune()").fetchone() == (0,)
    assert conn.execute("SELECT key FROM pgdurable.idempotency_keys").fetchall() == [("fresh",)]
    with pytest.raises(InvalidInput), translated():
        conn.execute("SELECT pgdurable.idempotency_prune(0)")
