"""Leases with ``pipeline=True``: concurrent callers share round trips and commits.

The L-scenarios of tests/test_leases.py run again here, unchanged, against
pipelined providers (async, and sync behind a thread shell; the string-encoding
and client-clock cases, which share every line with the plain path, are left
out to save CI time); then races of real concurrent callers, a neighbour's
server error, a stuck batch, and a backend terminated while a batch of several
callers is in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from test_leases import (  # noqa: F401  (re-collected here with the pipelined `lp`)
    TTL,
    ThreadShell,
    test_expiry_boundary_pair,
    test_l1_acquire_free_key,
    test_l2_loser_learns_holder_and_nothing_changes,
    test_l3_same_owner_reacquire_refreshes_ttl_keeps_token,
    test_l4_after_expiry_free_and_next_owner_gets_higher_token,
    test_l6_expired_owner_loses_to_new_holder,
    test_l8_release_by_non_owner_is_silent_noop,
    test_l9_late_release_leaves_successor,
    test_l10_renew_while_held_sets_expiry_to_now_plus_ttl,
    test_l11_renew_after_expiry_does_not_resurrect,
    test_l12_renew_after_takeover_fails_and_leaves_successor,
    test_l13_transfer_while_held,
    test_l14_transfer_from_expired_holder_fails_key_stays_free,
    test_l15_transfer_from_non_holder_fails_holder_keeps,
    test_l16_transfer_to_self_refreshes_ttl_keeps_token,
    test_l19_operations_on_one_key_never_touch_another,
    test_release_token_fence,
    test_renew_token_fence,
    test_transfer_token_fence,
)

from pgdurable import AsyncPostgresLeaseProvider, DatabaseUnavailable, PostgresLeaseProvider


class Alternating:
    """Sends its calls alternately to a pipelined async provider and a pipelined
    sync one (behind a thread shell): each scenario exercises both paths at
    half the cost of running it twice."""

    def __init__(self, *providers: Any) -> None:
        self.providers = providers
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        return getattr(self.providers[self.calls % len(self.providers)], name)


@pytest.fixture
async def lp(dsn: str) -> AsyncIterator[Any]:
    """Pipelined lease providers (the fixture the imported L-scenarios use)."""
    async with AsyncPostgresLeaseProvider(dsn, pipeline=True) as a:
        with PostgresLeaseProvider(dsn, pipeline=True) as s:
            yield Alternating(a, ThreadShell(s))


def lock_waiters(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pgdurable' AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0]) if row else 0


def wait_for(pred: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + 30
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


async def await_for(pred: Callable[[], bool], what: str) -> None:
    await asyncio.to_thread(wait_for, pred, what)


def test_bad_pipeline_arguments(dsn: str) -> None:
    with pytest.raises(TypeError):
        AsyncPostgresLeaseProvider(dsn, pipeline=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PostgresLeaseProvider(dsn, pipeline=True, pipeline_lanes=0)
    with pytest.raises(TypeError):
        PostgresLeaseProvider(dsn, pipeline=True, pipeline_lanes=True)


async def test_concurrent_callers_share_a_batch_and_get_serial_answers(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """16 callers at once: one transaction, one winner on the shared key, every
    loser told the winner and its token; the answers match the table."""
    async with AsyncPostgresLeaseProvider(dsn, pipeline=True) as p:
        assert p._lanes is not None
        shared = [p.acquire_lease("shared", f"o{i}", TTL) for i in range(8)]
        own = [p.acquire_lease(f"own{i}", f"o{i}", TTL) for i in range(8)]
        grants = await asyncio.gather(*shared, *own)
        assert p._lanes.batches == 1
        winners = [g for g in grants[:8] if g.acquired]
        assert len(winners) == 1
        w = winners[0]
        assert all((g.owner, g.token, g.expires_at) == (w.owner, w.token, w.expires_at)
                   for g in grants[:8])
        assert all(g.acquired and g.token == 1 for g in grants[8:])
        rows = dict(conn.execute("SELECT convert_from(key, 'UTF8'), convert_from(owner, 'UTF8')"
                                 " FROM pgdurable.leases").fetchall())
        assert rows == {"shared": w.owner, **{f"own{i}": f"o{i}" for i in range(8)}}
        # mixed operations of different callers in one batch
        renewed, moved, released, owner = await asyncio.gather(
            p.renew_lease("own0", "o0", TTL), p.transfer_lease("own1", "o1", "x", TTL),
            p.release_lease("own2", "o2"), p.get_lease_owner("own3"))
        assert (renewed, moved, released, owner) == (True, True, None, "o3")
        assert await p.get_lease_owner("own1") == "x"
        assert await p.get_lease_owner("own2") is None


async def test_hammering_callers_never_hold_a_key_together(dsn: str) -> None:
    """Pipelined (async and sync) and plain callers race for 3 keys: at most one
    holder per key at any time, and each key's tokens only grow."""
    holders: dict[str, str] = {}
    tokens: dict[str, int] = {}
    guard = threading.Lock()
    errors: list[str] = []

    def granted(key: str, owner: str, token: int | None) -> None:
        with guard:
            if key in holders:
                errors.append(f"{owner} got {key} while {holders[key]} holds it")
            assert token is not None
            if token <= tokens.get(key, 0):
                errors.append(f"token {token} on {key} after {tokens[key]}")
            holders[key], tokens[key] = owner, token

    def releasing(key: str) -> None:
        with guard:
            holders.pop(key, None)

    end = time.monotonic() + 1.0

    async def caller(p: AsyncPostgresLeaseProvider, owner: str) -> int:
        wins = 0
        while time.monotonic() < end:
            for key in ("a", "b", "c"):
                g = await p.acquire_lease(key, owner, TTL)
                if g.acquired:
                    wins += 1
                    granted(key, owner, g.token)
                    await asyncio.sleep(0)
                    releasing(key)
                    await p.release_lease(key, owner, token=g.token)
        return wins

    def thread_caller(p: PostgresLeaseProvider, owner: str, out: list[int]) -> None:
        wins = 0
        while time.monotonic() < end:
            for key in ("a", "b", "c"):
                g = p.acquire_lease(key, owner, TTL)
                if g.acquired:
                    wins += 1
                    granted(key, owner, g.token)
                    releasing(key)
                    p.release_lease(key, owner, token=g.token)
        out.append(wins)

    async with AsyncPostgresLeaseProvider(dsn, pipeline=True, max_size=2,
                                          pipeline_lanes=2) as piped, \
            AsyncPostgresLeaseProvider(dsn) as plain:
        with PostgresLeaseProvider(dsn, pipeline=True) as spiped:
            out: list[int] = []
            threads = [threading.Thread(target=thread_caller, args=(spiped, f"t{i}", out))
                       for i in range(3)]
            for t in threads:
                t.start()
            wins = await asyncio.gather(*[caller(piped, f"p{i}") for i in range(6)],
                                        *[caller(plain, f"q{i}") for i in range(2)])
            for t in threads:
                t.join()
    assert not errors, errors[:5]
    assert sum(wins) + sum(out) > 10
    assert sum(wins[:6]) > 0 and sum(out) > 0


async def test_a_neighbours_server_error_fails_only_its_own_call(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A call that hits lock_timeout aborts its batch: nothing of the batch
    committed, the other callers get their own answers (each sent again), and
    the failing caller its own error."""
    timed = make_conninfo(dsn, options="-c lock_timeout=200")
    async with AsyncPostgresLeaseProvider(timed, pipeline=True) as p:
        assert p._lanes is not None
        await p.acquire_lease("x", "z", TTL)
        with psycopg.connect(dsn) as blocker:
            blocker.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'x'::bytea FOR UPDATE")
            before = p._lanes.batches
            got = await asyncio.gather(
                p.acquire_lease("k1", "a", TTL), p.acquire_lease("x", "y", TTL),
                p.acquire_lease("k2", "a", TTL), return_exceptions=True)
            blocker.rollback()
    assert isinstance(got[1], psycopg.errors.LockNotAvailable)
    for g in (got[0], got[2]):
        assert not isinstance(g, BaseException)
        assert (g.acquired, g.token) == (True, 1)  # the failed batch's grants never committed
    assert p._lanes.batches == before + 4  # the batch, then each call alone


async def test_a_stuck_batch_does_not_stall_the_other_lane(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A batch waits on a row lock an outside transaction holds: with two lanes (the
    default), later calls go out on the second lane and are answered meanwhile."""
    async with AsyncPostgresLeaseProvider(dsn, pipeline=True) as p:
        await p.acquire_lease("x", "z", TTL)
        with psycopg.connect(dsn) as blocker:
            blocker.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'x'::bytea FOR UPDATE")
            stuck = asyncio.create_task(p.acquire_lease("x", "y", TTL))
            await await_for(lambda: lock_waiters(conn) == 1, "the first batch to block")
            free = await asyncio.wait_for(p.acquire_lease("k", "a", TTL), timeout=20)
            assert free.acquired and not stuck.done()
            blocker.rollback()
        assert (await stuck).owner == "z"


def _check_after_kill(conn: psycopg.Connection[Any], got: list[Any]) -> None:
    """Answers of [acquire x, acquire k1, renew t, transfer t, owner t] after the kill."""
    acq_x, acq_k1, renewed, moved, owner = got
    assert (acq_x.acquired, acq_x.owner, acq_x.token) == (False, "z", 1)
    assert (acq_k1.acquired, acq_k1.owner, acq_k1.token) == (True, "a", 1)  # applied once
    assert renewed is True
    assert isinstance(moved, DatabaseUnavailable)  # transfer is not retried
    assert owner == "a"  # the transfer never committed
    row = conn.execute("SELECT convert_from(owner, 'UTF8'), token FROM pgdurable.leases"
                       " WHERE key = 't'::bytea").fetchone()
    assert row == ("a", 1)


def _kill_waiting_backend(conn: psycopg.Connection[Any]) -> None:
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'pgdurable'"
        " AND wait_event_type = 'Lock'").fetchone()
    assert killed == (1,)


async def test_backend_killed_mid_pipeline_async(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Five callers' calls in one batch, blocked on a row lock, backend terminated:
    the idempotent calls are retried once on a fresh connection and answer as if
    the lost batch never ran (it never committed); the transfer raises."""
    async with AsyncPostgresLeaseProvider(dsn, pipeline=True) as p:
        await p.acquire_lease("x", "z", TTL)
        await p.acquire_lease("t", "a", TTL)
        with psycopg.connect(dsn) as blocker:
            blocker.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'x'::bytea FOR UPDATE")
            calls = asyncio.gather(
                p.acquire_lease("x", "y", TTL), p.acquire_lease("k1", "a", TTL),
                p.renew_lease("t", "a", TTL), p.transfer_lease("t", "a", "b", TTL),
                p.get_lease_owner("t"), return_exceptions=True)
            await await_for(lambda: lock_waiters(conn) == 1, "the batch to block")
            _kill_waiting_backend(conn)
            blocker.rollback()
            got = await calls
        _check_after_kill(conn, got)
        assert await p.transfer_lease("t", "a", "b", TTL)  # the next call works


def test_backend_killed_mid_pipeline_sync(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """The same with threads (one lane): the five calls queue behind a blocked batch,
    go together in the next one, which blocks and whose backend is terminated."""
    with PostgresLeaseProvider(dsn, pipeline=True, pipeline_lanes=1) as p:
        assert p._lanes is not None
        p.acquire_lease("w", "z", TTL)
        p.acquire_lease("x", "z", TTL)
        p.acquire_lease("t", "a", TTL)
        first, second = psycopg.connect(dsn), psycopg.connect(dsn)
        try:
            first.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'w'::bytea FOR UPDATE")
            second.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'x'::bytea FOR UPDATE")
            leader = threading.Thread(target=p.acquire_lease, args=("w", "v", TTL))
            leader.start()
            wait_for(lambda: lock_waiters(conn) == 1, "the first batch to block")
            calls: list[Callable[[], Any]] = [
                lambda: p.acquire_lease("x", "y", TTL), lambda: p.acquire_lease("k1", "a", TTL),
                lambda: p.renew_lease("t", "a", TTL), lambda: p.transfer_lease("t", "a", "b", TTL),
                lambda: p.get_lease_owner("t")]
            got: list[Any] = [None] * len(calls)

            def run(i: int) -> None:
                try:
                    got[i] = calls[i]()
                except Exception as exc:
                    got[i] = exc

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
            for t in threads:
                t.start()
            wait_for(lambda: len(p._lanes._queue) == len(calls), "the calls to queue")
            first.rollback()
            leader.join()
            wait_for(lambda: lock_waiters(conn) == 1, "the shared batch to block")
            _kill_waiting_backend(conn)
            second.rollback()
            for t in threads:
                t.join()
        finally:
            first.close()
            second.close()
        _check_after_kill(conn, got)
        assert p.transfer_lease("t", "a", "b", TTL)
