"""Leases: scenarios L1-L19 and C1-C3 of CONTRACT.md against a real Postgres,
for both providers (async and its sync twin), plus keep_lease, bad input, a
closed provider and a database whose connections were killed."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import pgdurable
from pgdurable import (
    AsyncNoopLeaseProvider,
    AsyncPostgresLeaseProvider,
    DatabaseUnavailable,
    InvalidInput,
    LeaseGrant,
    LeaseLost,
    NoopLeaseProvider,
    PostgresLeaseProvider,
    ProviderClosed,
    SchemaVersionMismatch,
    is_lease_provider,
    keep_lease,
    resolve_async_lease_provider,
    resolve_lease_provider,
)
from pgdurable.foundation.errors import translate

TTL = 60_000


class ThreadShell:
    """Runs a sync provider's methods in a thread so one async test body drives both."""

    def __init__(self, sync: PostgresLeaseProvider) -> None:
        self.sync = sync

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        fn = getattr(self.sync, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(fn, *args, **kwargs)

        return call


@pytest.fixture(params=["async", "sync"])
async def lp(request: pytest.FixtureRequest, dsn: str) -> AsyncIterator[Any]:
    """A lease provider on the test database; the sync one behind a thread shell."""
    if request.param == "async":
        async with AsyncPostgresLeaseProvider(dsn) as p:
            yield p
    else:
        with PostgresLeaseProvider(dsn) as s:
            yield ThreadShell(s)


@pytest.fixture
async def alp(dsn: str) -> AsyncIterator[AsyncPostgresLeaseProvider]:
    async with AsyncPostgresLeaseProvider(dsn) as p:
        yield p


def expire(conn: psycopg.Connection[Any], key: str, by: str = "1 second") -> None:
    """Seed an expiry: the lease on ``key`` lapsed ``by`` ago (database clock)."""
    conn.execute(
        "UPDATE pgdurable.leases SET expires_at = pgdurable.now() - %s::interval"
        " WHERE key = %s AND owner IS NOT NULL",
        (by, key.encode()),
    )


def row(conn: psycopg.Connection[Any], key: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT owner, token, expires_at, acquired_at FROM pgdurable.leases WHERE key = %s",
        (key.encode(),),
    ).fetchone()


def db_now(conn: psycopg.Connection[Any]) -> dt.datetime:
    r = conn.execute("SELECT pgdurable.now()").fetchone()
    assert r is not None
    return r[0]  # type: ignore[no-any-return]


# ----------------------------------------------------------------- L1-L4


async def test_l1_acquire_free_key(lp: Any) -> None:
    g = await lp.acquire_lease("thread:abc", "run-1", TTL)
    assert isinstance(g, LeaseGrant)
    assert (g.acquired, g.owner, g.token) == (True, "run-1", 1)
    assert g.expires_at is not None
    assert await lp.get_lease_owner("thread:abc") == "run-1"


async def test_l2_loser_learns_holder_and_nothing_changes(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    a = await lp.acquire_lease("k", "a", TTL)
    before = row(conn, "k")
    b = await lp.acquire_lease("k", "b", TTL)
    assert (b.acquired, b.owner, b.token, b.expires_at) == (False, "a", a.token, a.expires_at)
    assert row(conn, "k") == before


async def test_l3_same_owner_reacquire_refreshes_ttl_keeps_token(lp: Any) -> None:
    first = await lp.acquire_lease("k", "a", 1_000)
    again = await lp.acquire_lease("k", "a", TTL)
    assert again.acquired and again.owner == "a"
    assert again.token == first.token
    assert again.expires_at > first.expires_at


async def test_l4_after_expiry_free_and_next_owner_gets_higher_token(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    a = await lp.acquire_lease("k", "a", TTL)
    expire(conn, "k")
    assert await lp.get_lease_owner("k") is None
    b = await lp.acquire_lease("k", "b", TTL)
    assert b.acquired and b.owner == "b" and b.token == a.token + 1


async def test_expiry_boundary_pair(lp: Any, conn: psycopg.Connection[Any]) -> None:
    await lp.acquire_lease("gone", "a", TTL)
    await lp.acquire_lease("live", "a", TTL)
    expire(conn, "gone", "1 second")
    expire(conn, "live", "-1 second")  # expires one second from now
    assert await lp.get_lease_owner("gone") is None
    assert await lp.get_lease_owner("live") == "a"
    assert (await lp.acquire_lease("gone", "b", TTL)).acquired
    assert not (await lp.acquire_lease("live", "b", TTL)).acquired


async def test_tokens_stay_monotonic_across_release(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    tokens = []
    for owner in ("a", "b", "a", "c"):
        g = await lp.acquire_lease("k", owner, TTL)
        tokens.append(g.token)
        await lp.release_lease("k", owner)
    assert tokens == [1, 2, 3, 4]
    r = row(conn, "k")
    assert r is not None and r[0] is None and r[1] == 4  # released row keeps its token


async def test_l6_expired_owner_loses_to_new_holder(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "a", TTL)
    expire(conn, "k")
    assert (await lp.acquire_lease("k", "b", TTL)).acquired
    late = await lp.acquire_lease("k", "a", TTL)
    assert (late.acquired, late.owner) == (False, "b")


async def test_l7_loser_waiting_on_a_releasing_holder_gets_the_key(
    dsn: str, alp: AsyncPostgresLeaseProvider, conn: psycopg.Connection[Any]
) -> None:
    """b's acquire blocks on a's row; a releases and commits: b must win, not see None."""
    await alp.acquire_lease("k", "a", TTL)
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM pgdurable.leases WHERE key = %s FOR UPDATE", (b"k",))
        task = asyncio.create_task(alp.acquire_lease("k", "b", TTL))
        await until(lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'pgdurable' AND wait_event_type = 'Lock'"
        ).fetchone() is not None)
        holder.execute("SELECT pgdurable.release_lease(%s, %s)", (b"k", b"a"))
        holder.commit()
        g = await task
    assert (g.acquired, g.owner, g.token) == (True, "b", 2)


def test_l7_a_losing_acquire_holds_the_holder_row_locked(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Why a loser reads a live holder: its failed ON CONFLICT DO UPDATE locks the row,
    so the holder cannot release between the upsert and the read (same transaction)."""
    conn.execute("SELECT pgdurable.acquire_lease('k'::bytea, 'a'::bytea, 60000)")
    with psycopg.connect(dsn) as loser:
        r = loser.execute(
            "SELECT acquired, owner FROM pgdurable.acquire_lease('k'::bytea, 'b'::bytea, 60000)"
        ).fetchone()
        assert r == (False, b"a")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'k'::bytea FOR UPDATE NOWAIT")
        loser.rollback()
    conn.execute("SELECT 1 FROM pgdurable.leases WHERE key = 'k'::bytea FOR UPDATE NOWAIT")


# ----------------------------------------------------------------- L8-L12 release / renew


async def test_l8_release_by_non_owner_is_silent_noop(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "a", TTL)
    before = row(conn, "k")
    assert await lp.release_lease("k", "b") is None
    assert await lp.release_lease("free-key", "b") is None
    assert row(conn, "k") == before
    await lp.release_lease("k", "a")
    assert await lp.get_lease_owner("k") is None


async def test_l9_late_release_leaves_successor(lp: Any, conn: psycopg.Connection[Any]) -> None:
    await lp.acquire_lease("k", "a", TTL)
    expire(conn, "k")
    b = await lp.acquire_lease("k", "b", TTL)
    await lp.release_lease("k", "a")
    assert await lp.get_lease_owner("k") == "b"
    assert row(conn, "k")[1] == b.token  # type: ignore[index]


async def test_release_token_fence(lp: Any) -> None:
    g = await lp.acquire_lease("k", "a", TTL)
    await lp.release_lease("k", "a", token=g.token + 1)
    assert await lp.get_lease_owner("k") == "a"
    await lp.release_lease("k", "a", token=g.token)
    assert await lp.get_lease_owner("k") is None


async def test_l10_renew_while_held_sets_expiry_to_now_plus_ttl(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "a", 1_000)
    assert await lp.renew_lease("k", "a", 120_000) is True
    r = conn.execute(
        "SELECT expires_at - renewed_at FROM pgdurable.leases WHERE key = 'k'::bytea"
    ).fetchone()
    assert r is not None and r[0] == dt.timedelta(seconds=120)


async def test_l11_renew_after_expiry_does_not_resurrect(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "a", TTL)
    expire(conn, "k")
    before = row(conn, "k")
    assert await lp.renew_lease("k", "a", TTL) is False
    assert row(conn, "k") == before
    assert await lp.get_lease_owner("k") is None
    assert await lp.renew_lease("never-held", "a", TTL) is False


async def test_l12_renew_after_takeover_fails_and_leaves_successor(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "a", TTL)
    expire(conn, "k")
    await lp.acquire_lease("k", "b", TTL)
    before = row(conn, "k")
    assert await lp.renew_lease("k", "a", TTL) is False
    assert row(conn, "k") == before


async def test_renew_token_fence(lp: Any) -> None:
    g = await lp.acquire_lease("k", "a", TTL)
    assert await lp.renew_lease("k", "a", TTL, token=g.token) is True
    assert await lp.renew_lease("k", "a", TTL, token=g.token - 1) is False


async def test_released_lease_cannot_be_renewed(lp: Any) -> None:
    await lp.acquire_lease("k", "a", TTL)
    await lp.release_lease("k", "a")
    assert await lp.renew_lease("k", "a", TTL) is False
    assert await lp.get_lease_owner("k") is None


# ----------------------------------------------------------------- L13-L16 transfer


async def test_l13_transfer_while_held(lp: Any, conn: psycopg.Connection[Any]) -> None:
    a = await lp.acquire_lease("k", "a", 1_000)
    assert await lp.transfer_lease("k", "a", "b", 90_000) is True
    owner, token, expires_at, acquired_at = row(conn, "k")  # type: ignore[misc]
    assert bytes(owner) == b"b" and token == a.token + 1
    assert expires_at - acquired_at == dt.timedelta(seconds=90)  # full fresh TTL
    c = await lp.acquire_lease("k", "c", TTL)
    assert (c.acquired, c.owner) == (False, "b")


async def test_l14_transfer_from_expired_holder_fails_key_stays_free(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "a", TTL)
    expire(conn, "k")
    assert await lp.transfer_lease("k", "a", "b", TTL) is False
    assert await lp.get_lease_owner("k") is None
    assert (await lp.acquire_lease("k", "b", TTL)).acquired


async def test_l15_transfer_from_non_holder_fails_holder_keeps(
    lp: Any, conn: psycopg.Connection[Any]
) -> None:
    await lp.acquire_lease("k", "c", TTL)
    before = row(conn, "k")
    assert await lp.transfer_lease("k", "a", "b", TTL) is False
    assert row(conn, "k") == before
    assert await lp.transfer_lease("free", "a", "b", TTL) is False


async def test_l16_transfer_to_self_refreshes_ttl_keeps_token(lp: Any) -> None:
    a = await lp.acquire_lease("k", "a", 1_000)
    assert await lp.transfer_lease("k", "a", "a", TTL) is True
    lease = await lp.get_lease("k")
    assert lease is not None and lease.owner == "a"
    assert lease.token == a.token  # documented choice: a -> a keeps the token
    assert lease.expires_at >= a.expires_at + dt.timedelta(seconds=59)  # TTL refreshed


async def test_transfer_token_fence(lp: Any) -> None:
    g = await lp.acquire_lease("k", "a", TTL)
    assert await lp.transfer_lease("k", "a", "b", TTL, token=g.token + 5) is False
    assert await lp.transfer_lease("k", "a", "b", TTL, token=g.token) is True
    assert await lp.get_lease_owner("k") == "b"


# ----------------------------------------------------------------- L17 closed provider


async def test_l17_closed_async_provider_raises_typed_error(dsn: str) -> None:
    p = AsyncPostgresLeaseProvider(dsn)
    with pytest.raises(ProviderClosed, match="not open"):
        await p.acquire_lease("k", "a", TTL)
    await p.open()
    assert (await p.acquire_lease("k", "a", TTL)).acquired
    await p.close()
    assert p.closed
    for call in (
        p.acquire_lease("k", "b", TTL), p.get_lease_owner("k"), p.release_lease("k", "a"),
        p.renew_lease("k", "a", TTL), p.transfer_lease("k", "a", "b", TTL),
    ):
        with pytest.raises(ProviderClosed):
            await call
    with pytest.raises(ProviderClosed):
        await p.open()


def test_l17_closed_sync_provider_raises_typed_error(dsn: str) -> None:
    with PostgresLeaseProvider(dsn) as p:
        assert p.acquire_lease("k", "a", TTL).acquired
    with pytest.raises(ProviderClosed):
        p.acquire_lease("k", "a", TTL)
    with pytest.raises(ProviderClosed):
        p.renew_lease("k", "a", TTL)


async def test_provider_on_a_pool_closed_by_its_owner(dsn: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, kwargs={"autocommit": True}, open=False, min_size=1, max_size=2
    )
    await pool.open(wait=True)
    p = AsyncPostgresLeaseProvider(pool)
    await p.open()
    assert (await p.acquire_lease("k", "a", TTL)).acquired
    await p.close()
    assert not pool.closed  # not owned: left open
    p2 = AsyncPostgresLeaseProvider(pool)
    await p2.open()
    await pool.close()
    with pytest.raises(ProviderClosed):
        await p2.acquire_lease("k", "a", TTL)


def test_sync_provider_on_a_non_autocommit_pool_commits(dsn: str) -> None:
    with ConnectionPool(dsn, open=False, min_size=1, max_size=1) as pool:
        pool.open(wait=True)
        with PostgresLeaseProvider(pool) as p:
            assert p.acquire_lease("k", "a", TTL).acquired
            assert p.get_lease_owner("k") == "a"
        assert not pool.closed
    with PostgresLeaseProvider(dsn) as q:
        assert q.get_lease_owner("k") == "a"  # committed, not rolled back


# ----------------------------------------------------------------- L18 clocks


async def test_l18_client_clock_skew_changes_nothing(
    lp: Any, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_time = time.time
    for skew in (+10.0, -10.0, +3600.0):
        monkeypatch.setattr(time, "time", lambda s=skew: real_time() + s)
        key = f"k{skew}"
        before = db_now(conn)
        g = await lp.acquire_lease(key, "a", 5_000)
        after = db_now(conn)
        assert before + dt.timedelta(seconds=5) <= g.expires_at <= after + dt.timedelta(seconds=5)
        assert await lp.get_lease_owner(key) == "a"
        assert not (await lp.acquire_lease(key, "b", TTL)).acquired


def test_l18_the_database_clock_decides_expiry(conn: psycopg.Connection[Any]) -> None:
    """Move only the DB clock (SET LOCAL pgdurable.now): expiry follows it."""
    g = conn.execute("SELECT * FROM pgdurable.acquire_lease('k'::bytea, 'a'::bytea, 60000)")
    acquired, _, token, expires_at = g.fetchone()  # type: ignore[misc]
    assert acquired
    for offset, held in (("59 seconds", True), ("61 seconds", False), ("-10 seconds", True)):
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT set_config('pgdurable.now', (now() + %s::interval)::text, true)",
                         (offset,))
            owner = conn.execute("SELECT pgdurable.get_lease_owner('k'::bytea)").fetchone()
            assert (owner[0] is not None) == held  # type: ignore[index]
            b = conn.execute(
                "SELECT acquired, token FROM pgdurable.acquire_lease('k'::bytea, 'b'::bytea, 1000)"
            ).fetchone()
            assert b == ((False, token) if held else (True, token + 1))
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL pgdurable.now = '2999-01-01 00:00:00+00'")
        assert conn.execute(
            "SELECT pgdurable.renew_lease('k'::bytea, 'a'::bytea, 1000)"
        ).fetchone() == (False,)
    assert conn.execute("SELECT expires_at FROM pgdurable.leases").fetchone() == (expires_at,)


# ----------------------------------------------------------------- L19 arbitrary strings

STRANGE = [
    "it's \"quoted\"; DROP TABLE x; --",
    "100% %s %(x)s %%",
    "emoji 🧵🔒 and ünïcödé",
    "resource\x00thread",
    "\x00",
    "\x00\x00lead and trail\x00",
    "back\\slash \\x00 not a nul",
    "x" * 10_240 + "🙂",
    # 10 kB that does not compress: too big for a B-tree entry, so the key is
    # unique through its sha256 (leases.key_hash) and looked up by a hash index.
    "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(3_500)),
]


@pytest.mark.parametrize("s", STRANGE, ids=range(len(STRANGE)))
async def test_l19_keys_and_owners_round_trip(lp: Any, s: str) -> None:
    g = await lp.acquire_lease(s, s, TTL)
    assert g.acquired and g.owner == s
    assert await lp.get_lease_owner(s) == s
    loser = await lp.acquire_lease(s, s + "!", TTL)
    assert loser.owner == s and not loser.acquired
    assert await lp.renew_lease(s, s, TTL)
    assert await lp.transfer_lease(s, s, s + "\x00", TTL)
    assert await lp.get_lease_owner(s) == s + "\x00"
    await lp.release_lease(s, s + "\x00")
    assert await lp.get_lease_owner(s) is None


def test_l19_any_text_round_trips(dsn: str) -> None:
    """Property: every non-empty str without lone surrogates round-trips as key and owner."""
    text = st.text(min_size=1, max_size=200)

    with PostgresLeaseProvider(dsn) as p:

        @settings(max_examples=60, deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(key=text, owner=text)
        def check(key: str, owner: str) -> None:
            g = p.acquire_lease(key, owner, TTL)
            assert g.acquired and g.owner == owner
            assert p.get_lease_owner(key) == owner
            p.release_lease(key, owner)
            assert p.get_lease_owner(key) is None

        check()


async def test_l19_operations_on_one_key_never_touch_another(lp: Any) -> None:
    keys = ["k", "k\x00", "k\x00x", "K", "k ", "k%", "k_"]
    for i, k in enumerate(keys):
        assert (await lp.acquire_lease(k, f"o{i}", TTL)).acquired
    await lp.release_lease("k\x00", "o1")
    assert await lp.transfer_lease("k", "o0", "z", TTL)
    assert [await lp.get_lease_owner(k) for k in keys] == [
        "z", None, "o2", "o3", "o4", "o5", "o6"
    ]


async def test_active_leases_view_is_readable(
    alp: AsyncPostgresLeaseProvider, conn: psycopg.Connection[Any]
) -> None:
    await alp.acquire_lease("resource\x00thread", "run 🙂", TTL)
    await alp.acquire_lease("quote's", "\x00", TTL)
    await alp.acquire_lease("gone", "a", TTL)
    await alp.release_lease("gone", "a")
    rows = conn.execute(
        "SELECT key, owner, token, ttl_remaining > interval '0', key_bytes, owner_bytes"
        " FROM pgdurable.active_leases ORDER BY key"
    ).fetchall()
    assert rows == [
        ("quote's", "␀", 1, True, b"quote's", b"\x00"),
        ("resource␀thread", "run 🙂", 1, True, b"resource\x00thread", "run 🙂".encode()),
    ]


def test_view_survives_bytes_that_are_not_utf8(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO pgdurable.leases (key, owner, token, expires_at)"
        " VALUES ('\\xff00'::bytea, 'a'::bytea, 1, now() + interval '1 minute')"
    )
    assert conn.execute("SELECT key FROM pgdurable.active_leases").fetchone() == ("\\377\\000",)


def test_sql_functions_callable_from_psql_with_text(conn: psycopg.Connection[Any]) -> None:
    c = conn.execute
    assert c("SELECT acquired, owner FROM pgdurable.acquire_lease('t:1', 'run-1', 15000)"
             ).fetchone() == (True, "run-1")
    assert c("SELECT acquired, owner FROM pgdurable.acquire_lease('t:1', 'run-2', 15000)"
             ).fetchone() == (False, "run-1")
    assert c("SELECT pgdurable.get_lease_owner('t:1')").fetchone() == ("run-1",)
    assert c("SELECT pgdurable.renew_lease('t:1', 'run-1', 15000)").fetchone() == (True,)
    assert c("SELECT pgdurable.transfer_lease('t:1', 'run-1', 'run-2', 15000)").fetchone() == (2,)
    assert c("SELECT pgdurable.release_lease('t:1', 'run-2')").fetchone() == (True,)
    # bytea originals with convert_to, e.g. for keys holding NUL
    assert c("SELECT acquired FROM pgdurable.acquire_lease("
             "convert_to('r', 'UTF8') || '\\x00'::bytea || convert_to('t', 'UTF8'),"
             " convert_to('run-1', 'UTF8'), 15000)").fetchone() == (True,)
    assert c("SELECT key FROM pgdurable.active_leases").fetchone() == ("r␀t",)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM pgdurable.acquire_lease('', 'a', 1000)",
        "SELECT * FROM pgdurable.acquire_lease('k', '', 1000)",
        "SELECT * FROM pgdurable.acquire_lease('k', 'a', 0)",
        "SELECT * FROM pgdurable.acquire_lease('k', 'a', 86400001)",
        "SELECT * FROM pgdurable.acquire_lease('k', 'a', NULL)",
        "SELECT pgdurable.renew_lease('k', 'a', -1)",
        "SELECT pgdurable.transfer_lease('k', 'a', '', 1000)",
    ],
)
def test_sql_rejects_bad_input_with_pd000(conn: psycopg.Connection[Any], sql: str) -> None:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    assert isinstance(translate(info.value), InvalidInput)
    assert conn.execute("SELECT count(*) FROM pgdurable.leases").fetchone() == (0,)


# ----------------------------------------------------------------- bad input (Python)

BAD: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception]]] = [
    ("acquire_lease", ("", "a", TTL), {}, ValueError),
    ("acquire_lease", ("k", "", TTL), {}, ValueError),
    ("acquire_lease", (None, "a", TTL), {}, TypeError),
    ("acquire_lease", ("k", None, TTL), {}, TypeError),
    ("acquire_lease", (b"k", "a", TTL), {}, TypeError),
    ("acquire_lease", ("k", 7, TTL), {}, TypeError),
    ("acquire_lease", ("k", "a", 0), {}, ValueError),
    ("acquire_lease", ("k", "a", -5), {}, ValueError),
    ("acquire_lease", ("k", "a", 86_400_001), {}, ValueError),
    ("acquire_lease", ("k", "a", 1.5), {}, TypeError),
    ("acquire_lease", ("k", "a", "1000"), {}, TypeError),
    ("acquire_lease", ("k", "a", True), {}, TypeError),
    ("acquire_lease", ("k", "a", None), {}, TypeError),
    ("acquire_lease", ("\ud800", "a", TTL), {}, ValueError),
    ("get_lease_owner", ("",), {}, ValueError),
    ("get_lease_owner", (None,), {}, TypeError),
    ("release_lease", ("k", ""), {}, ValueError),
    ("release_lease", ("k", "a"), {"token": "1"}, TypeError),
    ("release_lease", ("k", "a"), {"token": -1}, ValueError),
    ("renew_lease", ("k", "a", 0), {}, ValueError),
    ("renew_lease", ("k", "a", TTL), {"token": True}, TypeError),
    ("transfer_lease", ("k", "a", "", TTL), {}, ValueError),
    ("transfer_lease", ("k", "a", None, TTL), {}, TypeError),
    ("transfer_lease", ("k", "a", "b", 10**20), {}, ValueError),
]


@pytest.mark.parametrize("method,args,kwargs,exc", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
async def test_bad_input_is_rejected_before_any_sql(
    dsn: str, conn: psycopg.Connection[Any], method: str, args: tuple[Any, ...],
    kwargs: dict[str, Any], exc: type[Exception],
) -> None:
    # Never-opened providers: a ProviderClosed would mean validation came after I/O.
    with pytest.raises(exc):
        await getattr(AsyncPostgresLeaseProvider(dsn), method)(*args, **kwargs)
    with pytest.raises(exc):
        getattr(PostgresLeaseProvider(dsn), method)(*args, **kwargs)
    async with AsyncPostgresLeaseProvider(dsn) as p:
        await p.acquire_lease("k", "a", TTL)
        before = conn.execute("SELECT * FROM pgdurable.leases").fetchall()
        with pytest.raises(exc):
            await getattr(p, method)(*args, **kwargs)
        assert conn.execute("SELECT * FROM pgdurable.leases").fetchall() == before


def test_bad_constructor_arguments() -> None:
    with pytest.raises(TypeError):
        PostgresLeaseProvider(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        PostgresLeaseProvider("mysql://x@y/z")
    with pytest.raises(TypeError):
        AsyncPostgresLeaseProvider(ConnectionPool("", open=False))  # type: ignore[arg-type]


def test_opening_without_schema_or_server(empty_dsn: str) -> None:
    with pytest.raises(SchemaVersionMismatch):
        PostgresLeaseProvider(empty_dsn).open()
    p = PostgresLeaseProvider("postgresql://postgres@127.0.0.1:1/x", timeout=1.0)
    with pytest.raises(DatabaseUnavailable):
        p.open()


# ----------------------------------------------------------------- database went away


def _kill_library_backends(conn: psycopg.Connection[Any]) -> int:
    pids = [r[1] for r in conn.execute(
        "SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = 'pgdurable'"
        " AND pid <> pg_backend_pid()"
    ).fetchall()]
    # Wait for the killed backends only: the pool may already be reconnecting.
    while conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
    ).fetchone():
        time.sleep(0.01)
    return len(pids)


async def test_killed_connections_idempotent_calls_retry_transfer_raises(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Decision: a broken connection is retried once on a fresh one for acquire,
    owner, release and renew (same answer when repeated); transfer raises
    DatabaseUnavailable (a repeat would report False); the next call works."""
    async with AsyncPostgresLeaseProvider(dsn, min_size=2, max_size=2) as p:
        assert (await p.acquire_lease("k", "a", TTL)).acquired
        assert _kill_library_backends(conn) >= 1
        assert (await p.acquire_lease("k", "a", TTL)).acquired
        assert _kill_library_backends(conn) >= 1
        assert await p.renew_lease("k", "a", TTL)
        assert _kill_library_backends(conn) >= 1
        with pytest.raises(DatabaseUnavailable):
            await p.transfer_lease("k", "a", "b", TTL)
        assert await p.get_lease_owner("k") == "a"  # the transfer never ran
        assert await p.transfer_lease("k", "a", "b", TTL)


def test_killed_connections_sync(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with PostgresLeaseProvider(dsn, min_size=2, max_size=2) as p:
        assert p.acquire_lease("k", "a", TTL).acquired
        _kill_library_backends(conn)
        assert p.get_lease_owner("k") == "a"
        _kill_library_backends(conn)
        with pytest.raises(DatabaseUnavailable):
            p.transfer_lease("k", "a", "b", TTL)
        assert p.transfer_lease("k", "a", "b", TTL)


# ----------------------------------------------------------------- C1-C3


class Duck:
    def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant:
        return LeaseGrant(True, owner)

    def get_lease_owner(self, key: str) -> str | None:
        return None

    def release_lease(self, key: str, owner: str) -> None:
        return None

    def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        return True

    def transfer_lease(self, key: str, a: str, b: str, ttl_ms: int) -> bool:
        return True


def test_c1_detection_is_structural(dsn: str) -> None:
    assert is_lease_provider(Duck())
    assert is_lease_provider(PostgresLeaseProvider(dsn))
    assert is_lease_provider(AsyncPostgresLeaseProvider(dsn))
    assert is_lease_provider(NoopLeaseProvider())
    assert not is_lease_provider(None)
    assert not is_lease_provider(object())

    class Missing(Duck):
        transfer_lease = None  # type: ignore[assignment]

    class NotCallable(Duck):
        renew_lease = "yes"  # type: ignore[assignment]

    assert not is_lease_provider(Missing())
    assert not is_lease_provider(NotCallable())
    # a plain namespace with five callables counts too (no base class, no isinstance)
    ns = type("NS", (), {m: staticmethod(lambda *a: None) for m in pgdurable.foundation.leases.LEASE_METHODS})
    assert is_lease_provider(ns())


def test_c2_wrappers_are_unwrapped(dsn: str) -> None:
    inner = Duck()

    class Wrapper:
        def __init__(self, p: object) -> None:
            self.p = p

        def get_lease_provider(self) -> object:
            return self.p

    assert resolve_lease_provider(inner) is inner
    assert resolve_lease_provider(Wrapper(inner)) is inner
    assert isinstance(resolve_lease_provider(Wrapper(None)), NoopLeaseProvider)
    assert isinstance(resolve_lease_provider(Wrapper(object())), NoopLeaseProvider)
    assert isinstance(resolve_lease_provider(None), NoopLeaseProvider)
    assert isinstance(resolve_lease_provider(object()), NoopLeaseProvider)
    assert isinstance(resolve_async_lease_provider(Wrapper(None)), AsyncNoopLeaseProvider)
    ap = AsyncPostgresLeaseProvider(dsn)
    assert resolve_async_lease_provider(Wrapper(ap)) is ap


async def test_c3_noop_provider_semantics() -> None:
    s = NoopLeaseProvider()
    assert s.acquire_lease("k", "a", TTL) == LeaseGrant(True, "a")
    assert s.acquire_lease("k", "b", TTL) == LeaseGrant(True, "b")  # every caller wins
    assert s.get_lease_owner("k") is None
    assert s.release_lease("k", "a") is None
    assert s.renew_lease("k", "zz", TTL) is True
    assert s.transfer_lease("k", "x", "y", TTL) is True
    a = AsyncNoopLeaseProvider()
    assert await a.acquire_lease("k", "a", TTL) == LeaseGrant(True, "a")
    assert await a.acquire_lease("k", "b", TTL) == LeaseGrant(True, "b")
    assert await a.get_lease_owner("k") is None
    assert await a.release_lease("k", "a") is None
    assert await a.renew_lease("k", "a", TTL) is True
    assert await a.transfer_lease("k", "a", "b", TTL) is True


# ----------------------------------------------------------------- keep_lease


class Flaky:
    """Wraps a real provider; its renew raises the queued errors first."""

    def __init__(self, inner: AsyncPostgresLeaseProvider, errors: list[BaseException]) -> None:
        self.inner = inner
        self.errors = errors
        self.renew_calls = 0

    async def acquire_lease(self, key: str, owner: str, ttl_ms: int) -> LeaseGrant:
        return await self.inner.acquire_lease(key, owner, ttl_ms)

    async def get_lease_owner(self, key: str) -> str | None:
        return await self.inner.get_lease_owner(key)

    async def release_lease(self, key: str, owner: str) -> None:
        await self.inner.release_lease(key, owner)

    async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        self.renew_calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return await self.inner.renew_lease(key, owner, ttl_ms)

    async def transfer_lease(self, key: str, a: str, b: str, ttl_ms: int) -> bool:
        return await self.inner.transfer_lease(key, a, b, ttl_ms)


async def until(pred: Callable[[], bool]) -> None:
    """Poll a condition (generous 30 s deadline: a hang guard, not a timing assertion)."""
    async with asyncio.timeout(30):
        while not pred():  # noqa: ASYNC110 - polls state owned by another task
            await asyncio.sleep(0.01)


async def test_keep_lease_renews_while_the_body_works(alp: AsyncPostgresLeaseProvider) -> None:
    g = await alp.acquire_lease("k", "a", 3_000)
    async with keep_lease(alp, "k", "a", 3_000) as k:
        await until(lambda: k.renewals >= 2)
    lease = await alp.get_lease("k")
    assert lease is not None and lease.expires_at > g.expires_at and lease.token == g.token
    assert not k.lost


async def test_keep_lease_renews_independently_of_a_busy_body(
    alp: AsyncPostgresLeaseProvider,
) -> None:
    """The body awaits one long operation; renewals happen meanwhile."""
    await alp.acquire_lease("k", "a", 1_500)
    async with keep_lease(alp, "k", "a", 1_500) as k:
        done = asyncio.Event()

        async def watch() -> None:
            await until(lambda: k.renewals >= 3)
            done.set()

        w = asyncio.create_task(watch())
        await done.wait()  # a single long await in the body
        await w
    assert await alp.get_lease_owner("k") == "a"


async def test_keep_lease_survives_two_transient_errors(alp: AsyncPostgresLeaseProvider) -> None:
    await alp.acquire_lease("k", "a", 3_000)
    flaky = Flaky(alp, [DatabaseUnavailable("blip"), ConnectionResetError("blip")])
    async with keep_lease(flaky, "k", "a", 3_000) as k:
        await until(lambda: k.renewals >= 1)
    assert flaky.renew_calls == 3 and not k.lost


async def test_keep_lease_third_transient_error_loses_and_cancels(
    alp: AsyncPostgresLeaseProvider,
) -> None:
    await alp.acquire_lease("k", "a", 3_000)
    flaky = Flaky(alp, [DatabaseUnavailable(f"blip {i}") for i in range(3)])
    reached_end = False
    k = keep_lease(flaky, "k", "a", 3_000)
    with pytest.raises(LeaseLost) as info:
        async with k:
            await asyncio.sleep(60)
            reached_end = True
    assert k.lost and not reached_end and flaky.renew_calls == 3
    assert isinstance(info.value.__cause__, DatabaseUnavailable)
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)  # the task is usable afterwards


async def test_keep_lease_counts_a_hanging_renewal_as_transient(
    alp: AsyncPostgresLeaseProvider,
) -> None:
    """A renewal that never answers times out (ttl/3) and counts as a transient error."""
    await alp.acquire_lease("k", "a", 600)

    class Hangs(Flaky):
        async def renew_lease(self, key: str, owner: str, ttl_ms: int) -> bool:
            self.renew_calls += 1
            await asyncio.Event().wait()
            return True

    hangs = Hangs(alp, [])
    with pytest.raises(LeaseLost):
        async with keep_lease(hangs, "k", "a", 600) as k:
            await asyncio.sleep(60)
    assert k.lost and isinstance(k.error, TimeoutError) and 2 <= hangs.renew_calls <= 3


async def test_keep_lease_loss_by_takeover_cancels_body(
    alp: AsyncPostgresLeaseProvider, conn: psycopg.Connection[Any]
) -> None:
    await alp.acquire_lease("k", "a", 3_000)
    with pytest.raises(LeaseLost):
        async with keep_lease(alp, "k", "a", 3_000) as k:
            expire(conn, "k")
            await alp.acquire_lease("k", "b", TTL)
            await asyncio.sleep(60)
    assert k.lost and k.error is None
    assert await alp.get_lease_owner("k") == "b"


async def test_keep_lease_without_cancel_only_flags(
    alp: AsyncPostgresLeaseProvider, conn: psycopg.Connection[Any]
) -> None:
    await alp.acquire_lease("k", "a", 1_500)
    async with keep_lease(alp, "k", "a", 1_500, cancel_on_loss=False) as k:
        await alp.release_lease("k", "a")
        await until(lambda: k.lost)
    assert k.lost


async def test_keep_lease_with_stale_token_is_lost(alp: AsyncPostgresLeaseProvider) -> None:
    g = await alp.acquire_lease("k", "a", 1_500)
    await alp.release_lease("k", "a")
    await alp.acquire_lease("k", "a", 1_500)  # a new grant, token + 1
    with pytest.raises(LeaseLost):
        async with keep_lease(alp, "k", "a", 1_500, token=g.token):
            await asyncio.sleep(60)


async def test_keep_lease_lets_outside_cancellation_through(
    alp: AsyncPostgresLeaseProvider,
) -> None:
    await alp.acquire_lease("k", "a", 3_000)

    async def body() -> None:
        async with keep_lease(alp, "k", "a", 3_000):
            await asyncio.sleep(60)

    t = asyncio.create_task(body())
    await asyncio.sleep(0.05)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t


async def test_keep_lease_short_circuits_on_noop() -> None:
    class CountingNoop(AsyncNoopLeaseProvider):
        calls = 0

        async def renew_lease(self, key: str, owner: str, ttl_ms: int, *,
                              token: int | None = None) -> bool:
            CountingNoop.calls += 1
            return True

    async with keep_lease(CountingNoop(), "k", "a", 30) as k:
        await asyncio.sleep(0.1)  # would be ~10 renewals
    assert CountingNoop.calls == 0 and not k.lost
    async with keep_lease(resolve_async_lease_provider(None), "k", "a", 30) as k2:
        pass
    assert not k2.lost


async def test_keep_lease_with_a_plain_function_returning_an_awaitable(
    alp: AsyncPostgresLeaseProvider,
) -> None:
    await alp.acquire_lease("k", "a", 1_500)

    class Wrapped(Flaky):
        def renew_lease(self, key: str, owner: str, ttl_ms: int) -> Any:  # type: ignore[override]
            self.renew_calls += 1
            return self.inner.renew_lease(key, owner, ttl_ms)

    w = Wrapped(alp, [])
    async with keep_lease(w, "k", "a", 1_500) as k:
        await until(lambda: k.renewals >= 2)
    assert not k.lost and w.renew_calls >= 2


def test_keep_lease_with_a_sync_provider(dsn: str) -> None:
    with PostgresLeaseProvider(dsn) as p:
        p.acquire_lease("k", "a", 1_500)

        async def main() -> int:
            async with keep_lease(p, "k", "a", 1_500) as k:
                await until(lambda: k.renewals >= 2)
            return k.renewals

        assert asyncio.run(main()) >= 2
        assert p.get_lease_owner("k") == "a"


def test_keep_lease_bad_input() -> None:
    for args, exc in [
        ((NoopLeaseProvider(), "", "a", 1000), ValueError),
        ((NoopLeaseProvider(), "k", None, 1000), TypeError),
        ((NoopLeaseProvider(), "k", "a", 0), ValueError),
        ((object(), "k", "a", 1000), TypeError),
    ]:
        with pytest.raises(exc):
            keep_lease(*args)


# ----------------------------------------------------------------- sync provider threads


def test_sync_provider_is_thread_safe(dsn: str) -> None:
    results: list[LeaseGrant] = []
    with PostgresLeaseProvider(dsn, max_size=4) as p:
        barrier = threading.Barrier(8)

        def worker(i: int) -> None:
            barrier.wait()
            results.append(p.acquire_lease("shared", f"t{i}", TTL))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    winners = [r for r in results if r.acquired]
    assert len(winners) == 1
    assert {r.owner for r in results} == {winners[0].owner}


def test_public_names_are_exported() -> None:
    for name in ("AsyncPostgresLeaseProvider", "PostgresLeaseProvider", "LeaseGrant",
                 "LeaseProvider", "AsyncLeaseProvider", "is_lease_provider",
                 "resolve_lease_provider", "NoopLeaseProvider", "keep_lease"):
        assert name in pgdurable.__all__ and hasattr(pgdurable, name)

