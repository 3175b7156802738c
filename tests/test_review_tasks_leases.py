"""Review findings: durable task store, idempotent effects, leases.

Each test failed before its fix. Races are made deterministic by blocking the
event loop (synchronous psycopg calls) while the server finishes a statement,
then cancelling the task before it can read the answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from _waiting import until_sync as wait_until
from psycopg_pool import AsyncConnectionPool

from pgdurable import DurableStep, PostgresDurableStore, define_durable_task, with_idempotency
from tests.test_tasks import is_count


def advisory_locks(c: psycopg.Connection[Any], *, granted: bool) -> int:
    row = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted = %s "
                    "AND pid <> pg_backend_pid()", (granted,)).fetchone()
    return int(row[0]) if row else 0


# ------------------------------------------------------------------ durable task lock
async def test_cancel_landing_after_the_task_lock_was_granted_leaks_no_lock(dsn: str) -> None:
    """The task lock is granted by the server, then the caller is cancelled before it
    reads the answer: psycopg waits for the statement and raises CancelledError, so the
    pooled session would keep the advisory lock and every later run of that task id
    (from any other session) would block forever."""
    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               initial_state={"count": 0},
                               steps=[DurableStep(id="s", run=lambda s, _c: {"count": 1})])
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pg_advisory_lock(pgdurable.task_lock_key('t'))")
        async with PostgresDurableStore(dsn) as store:
            waiter = asyncio.create_task(task.run(task_id="t", store=store))
            await asyncio.to_thread(wait_until, lambda: advisory_locks(c, granted=False) == 1,
                                    "the waiter blocked at the task lock")
            # Without yielding to the event loop: hand the lock over, wait until the
            # server granted it to the waiter, then cancel the waiter.
            c.execute("SELECT pg_advisory_unlock(pgdurable.task_lock_key('t'))")
            wait_until(lambda: advisory_locks(c, granted=True) == 1, "the lock granted")
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            # nobody may hold the task lock now (the closing session lets go of it)
            for _ in range(500):
                if advisory_locks(c, granted=True) == 0:
                    break
                await asyncio.sleep(0.02)
            assert advisory_locks(c, granted=True) == 0
        # a store with its own pool (other sessions) can run the task
        async with PostgresDurableStore(dsn) as other:
            assert await task.run(task_id="t", store=other) == {"count": 1}


# ------------------------------------------------------------------ with_idempotency
def key_status(c: psycopg.Connection[Any], key: str) -> str | None:
    row = c.execute("SELECT status FROM pgdurable.idempotency_keys WHERE key = %s",
                    (key,)).fetchone()
    return None if row is None else str(row[0])


@pytest.mark.parametrize("target", ["conninfo", "pool"])
async def test_cancel_landing_after_the_claim_committed_releases_it(dsn: str, target: str
                                                                    ) -> None:
    """The claim statement commits, then the caller is cancelled before it reads the
    answer: it is the owner of a running claim it never learned about. Like an owner
    cancelled in ``fn`` it must release it at once, or every other caller of the key
    waits a whole lease (30 s by default) for nothing."""
    from psycopg_pool import AsyncConnectionPool

    from pgdurable import with_idempotency

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
                row = c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type "
                                "= 'Lock' AND query LIKE '%%idempotency_claim%%'").fetchone()
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


async def test_store_on_a_callers_pool_leaves_its_connections_transactional(dsn: str
                                                                            ) -> None:
    """PostgresDurableStore switches the lock connection to autocommit; on a pool the
    application shares, it must hand the connection back as it found it, or the
    application's later `async with pool.connection()` blocks silently autocommit
    (an exception no longer rolls its writes back)."""
    from psycopg_pool import AsyncConnectionPool

    task = define_durable_task(id="count", revision="1", is_state=is_count,
                               initial_state={"count": 0},
                               steps=[DurableStep(id="s", run=lambda s, _c: {"count": 1})])
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
        async with pool.connection() as c:
            await c.execute("CREATE TABLE app_rows (n int)")
        async with PostgresDurableStore(pool) as store:
            assert await task.run(task_id="t", store=store) == {"count": 1}
        with pytest.raises(ZeroDivisionError):
            async with pool.connection() as c:
                await c.execute("INSERT INTO app_rows VALUES (1)")
                1 / 0  # noqa: B018 - the application's failure: its insert must roll back
        async with pool.connection() as c:
            cur = await c.execute("SELECT count(*) FROM app_rows")
            assert await cur.fetchone() == (0,)
            assert not c.autocommit


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
