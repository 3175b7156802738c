"""Thread keys are any non-empty str (CONTRACT L19 for threads): NUL, backslashes, quotes, ...

The thread_key columns store the escaped form (``\\`` -> ``\\\\``, NUL -> ``\\0``)
made by ``pgdurable.threads.encode_thread_key``; every API returns the original key.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, until

from pgdurable import Done, Durable, DurableClient, RunContext
from pgdurable.runs.threads import decode_thread_key, encode_thread_key, thread_lease_key
from tests.test_stream import collect, running
from tests.test_threads import q1

STRANGE = [
    "resource\x00thread",  # Mastra's resource + NUL + thread
    "\x00",
    "\x00\x00lead and trail\x00",
    "back\\slash \\x00 not a nul",
    "ends with a backslash\\",
    "\\0",  # backslash, zero: the text of an escaped NUL, but a different key
    "\\",
    "it's \"quoted\"; DROP TABLE x; --",
    "100% %s %(x)s %% _",
    "emoji 🧵🔒 and ünïcödé",
    "line\nbreak\ttab",
    "x" * 10_240 + "🙂",
]


# -- the helper pair ---------------------------------------------------------------


def test_encode_decode_round_trip_and_readable_form() -> None:
    for key in STRANGE:
        stored = encode_thread_key(key)
        assert "\x00" not in stored
        assert decode_thread_key(stored) == key
    assert encode_thread_key("chat:42") == "chat:42"  # ordinary keys read as themselves
    assert encode_thread_key("user-1\x00thread-9") == "user-1\\0thread-9"
    assert encode_thread_key("C:\\tmp") == "C:\\\\tmp"
    assert encode_thread_key("\\0") == "\\\\0" != encode_thread_key("\x00")


def test_escaping_is_injective_and_keeps_prefixes() -> None:
    """Every key of length <= 4 over {a, 0, backslash, NUL}: distinct keys stay distinct, and
    key.startswith(prefix) exactly when the escaped key starts with the escaped prefix
    (what starts_with(thread_key, ...) in SQL relies on; a prefix ending with a backslash is
    escaped to a whole escape, so it never matches half of an escaped NUL)."""
    keys = ["".join(p) for n in range(1, 5) for p in itertools.product("a0\\\x00", repeat=n)]
    stored = {k: encode_thread_key(k) for k in keys}
    assert len(set(stored.values())) == len(keys)
    for key, prefix in itertools.product(keys, keys):
        assert key.startswith(prefix) == stored[key].startswith(stored[prefix]), (key, prefix)


def test_bad_keys_and_malformed_stored_keys_are_rejected() -> None:
    with pytest.raises(TypeError):
        encode_thread_key(b"bytes")
    with pytest.raises(ValueError):
        encode_thread_key("")
    with pytest.raises(ValueError):
        encode_thread_key("lone \ud800 surrogate")
    for bad in ["a\\b", "a\\", "\\", "\\\\\\"]:
        with pytest.raises(ValueError):
            decode_thread_key(bad)


def test_sql_accepts_exactly_the_escaped_keys(conn: psycopg.Connection[Any]) -> None:
    texts = ["chat:42", "a\\0b", "a\\\\b", "\\\\\\0", "a\\b", "a\\", "\\", "", "x\ny"]
    texts += [encode_thread_key(k) for k in STRANGE]
    for text in texts:
        try:
            ok = bool(text) and isinstance(decode_thread_key(text), str)
        except ValueError:
            ok = False
        assert q1(conn, "SELECT pgdurable.is_thread_key(%s)", (text,)) is ok, text
    for key in STRANGE:  # the lease key is computed the same way on both sides
        assert q1(conn, "SELECT pgdurable.thread_lease_key(%s) = convert_to(%s, 'UTF8')",
                  (encode_thread_key(key), thread_lease_key(key))) is True
    # send_message (psql callers) refuses a text that is not an escaped key; nothing stored
    for bad in ["a\\b", "trailing\\"]:
        with pytest.raises(psycopg.Error) as ei:
            conn.execute("SELECT * FROM pgdurable.send_message(%s, 'm', '1', NULL, 'chat', '1', "
                         "'default', 0, 3)", (bad,))
        assert ei.value.sqlstate == "PD000"
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO pgdurable.threads (thread_key) VALUES ('a\\b')")
    assert q1(conn, "SELECT count(*) FROM pgdurable.threads") == 0


# -- round trips through the app --------------------------------------------------------


async def test_strange_keys_round_trip_through_send_inbox_wait_and_stream(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """send -> run's ctx.thread_key / Message.thread_key == the key; a second send (while the
    run is parked on wait_inbox, whose signal ref is the escaped key) reaches the same run;
    stream_thread(key) replays (and follows) it; thread_owners shows the escaped form."""
    app = Durable(dsn)
    app.thread_task("", "echo")
    seen: list[tuple[str | None, str, Any]] = []

    @app.task("echo")
    async def echo(ctx: RunContext, state: Any) -> Any:
        got = list((state or {}).get("got", []))
        for m in await ctx.inbox():
            seen.append((ctx.thread_key, m.thread_key, m.payload))
            got.append(m.payload)
            await ctx.emit({"got": m.payload})
        if "bye" in got:
            return Done(got)
        return ctx.wait_inbox(state={"got": got})

    def status(rid: str) -> Any:
        return q1(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", (rid,))

    nul_key = STRANGE[0]
    async with app:
        first = {k: await app.send(k, "hi") for k in STRANGE}
        assert {d.action for d in first.values()} == {"wake"}
        assert len({d.run_id for d in first.values()}) == len(STRANGE)
        live = asyncio.create_task(_until_final(app, nul_key))
        async with running(app):
            await until(lambda: asyncio.sleep(0, all(status(d.run_id) == "waiting"
                                                     for d in first.values())), "all parked")
            second = {k: await app.send(k, "bye") for k in STRANGE}
            await until(lambda: asyncio.sleep(0, all(status(d.run_id) == "completed"
                                                     for d in first.values())), "all done")
            live_events = await asyncio.wait_for(live, WAIT_LIMIT)
        for key in STRANGE:
            assert (second[key].action, second[key].run_id) == ("deliver", first[key].run_id)
            events = await collect(app.stream_thread(key, follow=False))
            assert [e.event for e in events[:2]] == [{"got": "hi"}, {"got": "bye"}]
            assert events[2].final and events[2].event["result"] == ["hi", "bye"]
            assert {e.run_id for e in events} == {first[key].run_id}
        assert [e.event for e in live_events[:2]] == [{"got": "hi"}, {"got": "bye"}]
    assert sorted(seen, key=repr) == sorted(
        [(k, k, p) for k in STRANGE for p in ("hi", "bye")], key=repr)
    rows = dict(conn.execute("SELECT thread_key, id::text FROM pgdurable.runs").fetchall())
    assert rows == {encode_thread_key(k): first[k].run_id for k in STRANGE}
    shown = q1(conn, "SELECT thread_key FROM pgdurable.thread_owners "
                     "WHERE thread_key = 'resource\\0thread'")  # what a psql user types
    assert shown == "resource\\0thread"
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages WHERE consumed_at IS NULL") == 0


async def _until_final(app: Durable, key: str) -> list[Any]:
    out = []
    async for ev in app.stream_thread(key, poll=0.2):
        out.append(ev)
        if ev.final:
            return out
    return out


async def test_nul_and_backslash_zero_are_different_threads(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    app.task("chat")(lambda ctx, s: Done(None))
    nul, text = "u\x00t", "u\\0t"
    async with app:
        d1 = await app.send(nul, "a")
        d2 = await app.send(text, "b")
        d3 = await app.send(nul, "c")
    with DurableClient(app=app) as client:  # the sync twin addresses the same thread
        d4 = client.send(nul, "d")
        d5 = client.send(text, "e")
    assert (d1.action, d2.action) == ("wake", "wake") and d1.run_id != d2.run_id
    assert (d3.action, d3.run_id, d3.seq) == ("deliver", d1.run_id, 2)
    assert (d4.action, d4.run_id, d4.seq) == ("deliver", d1.run_id, 3)
    assert (d5.action, d5.run_id, d5.seq) == ("deliver", d2.run_id, 2)
    owners = conn.execute("SELECT thread_key, run_id::text, inbox_depth "
                          "FROM pgdurable.thread_owners ORDER BY thread_key").fetchall()
    assert owners == [("u\\0t", d1.run_id, 3), ("u\\\\0t", d2.run_id, 2)]


async def test_prefix_routing_uses_the_original_keys(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "other")
    app.thread_task("u\x00", "by_resource")  # Mastra: every thread of resource "u"
    app.thread_task("u\\", "backslash")  # a prefix ending with a backslash
    for name in ("other", "by_resource", "backslash"):
        app.task(name)(lambda ctx, s: Done(None))
    expect = {
        "u\x00t": "by_resource",
        "u\x00": "by_resource",
        "u\\0t": "backslash",  # the text of an escaped NUL is not a NUL
        "u\\": "backslash",
        "u\\\x00": "backslash",
        "u0": "other",
        "u": "other",
    }
    async with app:
        runs = {k: (await app.send(k, "x")).run_id for k in expect}
    for key, task in expect.items():
        assert q1(conn, "SELECT task FROM pgdurable.runs WHERE id = %s", (runs[key],)) == task, key
    # the same prefixes escaped select the same threads in SQL (starts_with on the stored text)
    for prefix, tasks in [("u\x00", {"by_resource"}), ("u\\", {"backslash"})]:
        got = {decode_thread_key(r[0]) for r in conn.execute(
            "SELECT thread_key FROM pgdurable.threads WHERE starts_with(thread_key, %s)",
            (encode_thread_key(prefix),))}
        assert got == {k for k, t in expect.items() if t in tasks}, prefix
    with pytest.raises(TypeError):
        app.thread_task(b"u", "other")  # type: ignore[arg-type]


async def test_bad_thread_keys_are_rejected_before_sql(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    app.task("chat")(lambda ctx, s: Done(None))
    async with app:
        for bad, exc in [("", ValueError), ("a\ud800", ValueError), (7, TypeError)]:
            with pytest.raises(exc):
                await app.send(bad, "x")  # type: ignore[arg-type]
            with pytest.raises(exc):
                await collect(app.stream_thread(bad, follow=False))  # type: ignore[arg-type]
    assert q1(conn, "SELECT count(*) FROM pgdurable.threads") == 0
