"""Names and keys too long for a B-tree index get a clear ValueError before any SQL.

Task and queue names, signal kinds, refs and ids, idempotency keys, message
ids, effect keys and durable task ids are all index keys;
Postgres refuses an index entry over ~2,700 bytes with a raw
``ProgramLimitExceeded``. Every entry point checks the UTF-8 length
(``MAX_NAME_BYTES``) first, names the argument, and writes nothing.
(Lease keys may be any length, see test_leases.py; thread keys have no limit
of their own, and one the database cannot index is refused by it, typed.)
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from _waiting import finished, running, until

from pgdurable import (
    MAX_NAME_BYTES,
    Done,
    Durable,
    DurableClient,
    InvalidInput,
    PostgresDurableStore,
    RunContext,
    Wait,
)

HUGE = secrets.token_hex(3000)  # 6,000 bytes, incompressible
AT_LIMIT = "é" * (MAX_NAME_BYTES // 2)  # exactly MAX_NAME_BYTES bytes (2 bytes per char)
OVER_BY_ONE = AT_LIMIT + "x"

TABLES = ("runs", "signals", "threads", "thread_messages", "idempotency_keys",
          "task_checkpoints", "effects")


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM pgdurable.{t}").fetchone()[0]  # type: ignore[index]
            for t in TABLES}


def app_for(dsn: str) -> Durable:
    app = Durable(dsn, pool_size=2)

    @app.task("t")
    async def t(ctx: RunContext, state: Any) -> Any:
        return Done(result=None)

    app.thread_task("", "t")
    return app


CALLS: dict[str, Callable[[Durable, str], Awaitable[Any]]] = {
    "task": lambda app, v: app.start(v, {}),
    "queue": lambda app, v: app.start("t", {}, queue=v),
    "idempotency_key": lambda app, v: app.start("t", {}, idempotency_key=v),
    "signal kind": lambda app, v: app.signal(v, "ref"),
    "signal ref": lambda app, v: app.signal("kind", v),
    "signal_id": lambda app, v: app.signal("kind", "ref", signal_id=v),
    "message_id": lambda app, v: app.send("thread", {"text": "hi"}, message_id=v),
    "idempotency key": lambda app, v: app.with_idempotency(v, lambda: 1),
}


@pytest.mark.parametrize("what", list(CALLS))
@pytest.mark.parametrize("value", [HUGE, OVER_BY_ONE], ids=["6000-bytes", "limit+1"])
async def test_async_app_rejects_oversized_names(dsn: str, conn: psycopg.Connection[Any],
                                                 what: str, value: str) -> None:
    before = counts(conn)
    async with app_for(dsn) as app:
        with pytest.raises(ValueError, match=f"{what} is \\d+ bytes long; the limit is 1000"):
            await CALLS[what](app, value)
    assert counts(conn) == before


def test_sync_client_rejects_oversized_names(dsn: str, conn: psycopg.Connection[Any]) -> None:
    before = counts(conn)
    with DurableClient(dsn, app=app_for(dsn)) as client:
        for call in (lambda: client.start("t", {}, queue=HUGE),
                     lambda: client.signal("kind", HUGE),
                     lambda: client.send("thread", {"text": "hi"}, message_id=HUGE)):
            with pytest.raises(ValueError, match="bytes long; the limit is 1000"):
                call()
    assert counts(conn) == before


async def test_thread_keys_have_no_limit_of_their_own(dsn: str,
                                                      conn: psycopg.Connection[Any]) -> None:
    """A long compressible thread key works (test_thread_keys.py sends a 10 kB one);
    one the database cannot index even compressed is refused by it, typed, and the
    transaction leaves nothing behind (no thread, no run, no message)."""
    before = counts(conn)
    async with app_for(dsn) as app:
        with pytest.raises(InvalidInput, match="too large for the database to index"):
            await app.send(HUGE, {"text": "hi"})
        assert (await app.send("x" * 20_000, {"text": "hi"})).action == "wake"
    with DurableClient(dsn, app=app_for(dsn)) as client:
        with pytest.raises(InvalidInput, match="too large for the database to index"):
            client.send(HUGE + "sync", {"text": "hi"})
    after = counts(conn)
    assert after["threads"] == before["threads"] + 1 and after["runs"] == before["runs"] + 1
    assert after["thread_messages"] == before["thread_messages"] + 1


async def test_effect_key_and_durable_task_id_limits(dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    async with PostgresDurableStore(dsn) as store:
        with pytest.raises(ValueError, match="task_id is 6000 bytes long"):
            await store.load(HUGE)

    app = Durable(dsn, pool_size=2)
    seen: list[str] = []

    @app.task("effects")
    async def effects(ctx: RunContext, state: Any) -> Any:
        try:
            await ctx.effect(HUGE, lambda: 1)
        except ValueError as e:
            seen.append(str(e))
        return Done(result=await ctx.effect("short", lambda: 2))

    async with app, running(app.worker(poll_interval=0.2)):
        info = await finished(app, await app.start("effects", {}))
    assert info.status == "completed" and info.result == 2
    assert seen == ["effect key is 6000 bytes long; the limit is 1000 bytes (UTF-8)"]
    assert conn.execute("SELECT key FROM pgdurable.effects").fetchall() == [("short",)]


async def test_names_at_the_limit_are_accepted(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Exactly MAX_NAME_BYTES bytes (multi-byte characters) round-trip through the indexes."""
    async with app_for(dsn) as app:
        rid = await app.start("t", {}, queue=AT_LIMIT, idempotency_key=AT_LIMIT)
        assert await app.start("t", {}, queue=AT_LIMIT, idempotency_key=AT_LIMIT) == rid
        assert await app.signal(AT_LIMIT, AT_LIMIT, signal_id=AT_LIMIT) == []
        delivery = await app.send(AT_LIMIT, {"text": "hi"}, message_id=AT_LIMIT)
    assert delivery.action == "wake"
    row = conn.execute("SELECT queue, idempotency_key FROM pgdurable.runs WHERE id = %s",
                       (rid,)).fetchone()
    assert row == (AT_LIMIT, AT_LIMIT)
    assert conn.execute("SELECT count(*) FROM pgdurable.thread_messages "
                        "WHERE message_id = %s", (AT_LIMIT,)).fetchone() == (1,)


def test_lone_surrogates_are_rejected_by_name(dsn: str, conn: psycopg.Connection[Any]) -> None:
    before = counts(conn)
    with DurableClient(dsn) as client:
        with pytest.raises(ValueError, match="signal ref is not valid Unicode"):
            client.signal("kind", "ref-\ud800")
        with pytest.raises(ValueError, match="queue is not valid Unicode"):
            client.start("t", {}, queue="q-\udfff", revision="1")
    assert counts(conn) == before


async def test_a_signal_kind_and_ref_both_at_the_limit_wake_a_parked_run(
        dsn: str, conn: psycopg.Connection[Any]) -> None:
    """Kind and ref are indexed together (waits and pending signals): both at
    MAX_NAME_BYTES of incompressible text still fit, on both sides of the race
    (a run parked first and woken; a signal kept first and consumed at park)."""
    kind, ref = secrets.token_hex(MAX_NAME_BYTES // 2), secrets.token_hex(MAX_NAME_BYTES // 2)
    app = Durable(dsn, pool_size=2)

    @app.task("waiter")
    async def waiter(ctx: RunContext, state: Any) -> Any:
        if ctx.wake is None:
            return Wait(signal=(kind, state["ref"]))
        return Done(result=ctx.wake["payload"])

    async with app:
        early = await app.signal(kind, ref[:-6] + "-early", {"n": 1})  # kept: no run waits yet
        assert early == []
        async with running(app.worker(poll_interval=0.2)):
            first = await app.start("waiter", {"ref": ref})
            kept = await app.start("waiter", {"ref": ref[:-6] + "-early"})
            assert (await finished(app, kept)).result == {"n": 1}

            async def parked() -> bool:
                return (await app.get_run(first)).status == "waiting"

            await until(parked, "the run to park on the long kind and ref")
            assert await app.signal(kind, ref, {"n": 2}) == [first]
            assert (await finished(app, first)).result == {"n": 2}
