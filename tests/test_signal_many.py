"""Many signals in one statement and transaction (issue 45): ``signal_many`` /
``pgdurable.send_signals`` behaves as the same signals sent one by one, notifies each
queue once, keeps nothing of a batch that fails, and two batches over the same refs in
opposite orders do not deadlock."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgdurable import Durable, DurableClient, InvalidInput, SignalConflict
from pgdurable.foundation.errors import translate
from pgdurable.foundation.signals import MAX_SIGNALS


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    yield a
    await a.close()


def sql(conn: psycopg.Connection[Any], query: str, *params: Any) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        raise translate(exc) from exc


def seed_leased(conn: psycopg.Connection[Any], n: int, queue: str = "default") -> list[uuid.UUID]:
    """n runs of task t/1 leased by worker 'w' with token 1 for an hour (ordered ids)."""
    rows = sql(conn, "INSERT INTO pgdurable.runs (task, revision, queue, status, lease_owner, "
               "lease_token, lease_expires_at) SELECT 't', '1', %s, 'leased', 'w', 1, "
               "pgdurable.now() + interval '1 hour' FROM generate_series(1, %s) RETURNING id",
               queue, n)
    return sorted(r[0] for r in rows)


def park(conn: psycopg.Connection[Any], rid: uuid.UUID, kind: str, ref: str) -> str:
    rows = sql(conn, "SELECT status FROM pgdurable.park_run(%s, 1, 'w', '{}', 0, %s, %s, "
               "NULL, NULL)", rid, kind, ref)
    return str(rows[0][0])


def count(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    return int(sql(conn, f"SELECT count(*) FROM pgdurable.{table} WHERE {where}")[0][0])


async def test_a_batch_wakes_as_the_same_signals_one_by_one_with_one_notify_per_queue(
        app: Durable, dsn: str, conn: psycopg.Connection[Any]) -> None:
    a1, a2 = seed_leased(conn, 2, "qa")
    (b,) = seed_leased(conn, 1, "qb")
    for rid in (a1, a2):
        park(conn, rid, "cm", "r1")
    park(conn, b, "cm", "r2")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgdurable_wake")
        woke = await app.signal_many([("cm", "r1", {"v": 1}), ("cm", "r2"),
                                      ("cm", "nobody", [1]), ("cm", "r1", {"v": 2})])
        notes = list(listener.notifies(timeout=1.0))
    # the fourth finds nobody waiting on r1 any more: kept pending, as if sent after the first
    assert woke == [sorted([str(a1), str(a2)]), [str(b)], [], []]
    assert sorted(n.payload for n in notes) == ["qa", "qb"]  # one NOTIFY per queue
    wakes = dict(sql(conn, "SELECT id, wake FROM pgdurable.runs WHERE status = 'runnable'"))
    assert wakes[a1]["payload"] == {"v": 1} and wakes[a1]["type"] == "signal"
    assert wakes[b]["payload"] is None and wakes[b]["ref"] == "r2"
    assert count(conn, "signals", "consumed_at IS NULL") == 2
    # a pending one is handed to the next run that parks on it, as send_signal's are
    (c,) = seed_leased(conn, 1)
    assert park(conn, c, "cm", "nobody") == "runnable"
    assert await app.signal_many([]) == []


async def test_dedup_and_a_conflict_keep_nothing_of_the_batch(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    a, b = seed_leased(conn, 2)
    park(conn, a, "cm", "d1")
    park(conn, b, "cm", "d2")
    first = await app.signal_many([("cm", "d1", {"v": 1}, "sig-1")])
    assert first == [[str(a)]]
    # the same id with the same content: the first answer, nothing delivered again
    assert await app.signal_many([("cm", "d1", {"v": 1}, "sig-1")]) == first
    assert await app.signal("cm", "d1", {"v": 1}, signal_id="sig-1") == [str(a)]
    # a valid signal then a conflicting id: SignalConflict and the valid one is not kept
    before = sql(conn, "SELECT id, status, wake FROM pgdurable.runs ORDER BY id")
    with pytest.raises(SignalConflict):
        await app.signal_many([("cm", "d2", {"v": 1}), ("cm", "d1", {"v": 2}, "sig-1")])
    assert sql(conn, "SELECT id, status, wake FROM pgdurable.runs ORDER BY id") == before
    assert count(conn, "signals") == 1
    # a duplicate id within one batch: the second is the first's duplicate
    assert await app.signal_many([("cm", "d2", 1, "sig-2"), ("cm", "d2", 1, "sig-2")]) == [
        [str(b)], [str(b)]]
    assert count(conn, "signals", "signal_id = 'sig-2'") == 1


async def test_bad_input_changes_nothing(app: Durable, conn: psycopg.Connection[Any]) -> None:
    (rid,) = seed_leased(conn, 1)
    park(conn, rid, "cm", "x")
    app.max_signal_payload = 100
    cases: list[tuple[type[BaseException], Callable[[], Any]]] = [
        (TypeError, lambda: app.signal_many("cm")),  # type: ignore[arg-type]
        (TypeError, lambda: app.signal_many(5)),  # type: ignore[arg-type]
        (TypeError, lambda: app.signal_many([["cm", "x"]])),  # type: ignore[list-item]
        (TypeError, lambda: app.signal_many([("cm",)])),
        (TypeError, lambda: app.signal_many([("cm", "x", 1, "id", "more")])),
        (ValueError, lambda: app.signal_many([("cm", "x"), ("", "x")])),
        (TypeError, lambda: app.signal_many([("cm", "x"), ("cm", 1)])),
        (ValueError, lambda: app.signal_many([("cm", "x"), ("cm", "x", "y" * 200)])),
        (ValueError, lambda: app.signal_many([("cm", "x"), ("cm", "x", float("nan"))])),
        (ValueError, lambda: app.signal_many([("cm", "x", None, "")])),
        (ValueError, lambda: app.signal_many([("cm", "x")], ttl=timedelta(seconds=-1))),
        (ValueError, lambda: app.signal_many([("cm", f"r{i}") for i in range(MAX_SIGNALS + 1)])),
    ]
    for exc_type, call in cases:
        with pytest.raises(exc_type):
            await call()
    # the database checks again (psql callers)
    for query in ("SELECT * FROM pgdurable.send_signals('{cm,cm}', '{x}', '{null,null}')",
                  "SELECT * FROM pgdurable.send_signals('{cm}', '{x}', '{null}', '{a,b}')",
                  "SELECT * FROM pgdurable.send_signals('{cm,\"\"}', '{x,x}', '{null,null}')",
                  "SELECT * FROM pgdurable.send_signals(array_fill('cm'::text, ARRAY[10001]), "
                  "array_fill('x'::text, ARRAY[10001]), array_fill('1'::jsonb, ARRAY[10001]))"):
        with pytest.raises(InvalidInput):
            sql(conn, query)
    assert count(conn, "signals") == 0
    assert sql(conn, "SELECT status FROM pgdurable.runs") == [("waiting",)]


def test_two_batches_in_opposite_orders_do_not_deadlock(dsn: str,
                                                        conn: psycopg.Connection[Any]) -> None:
    """Each batch takes the refs' advisory locks (held to commit) in one order by key: in
    the order given, these two would deadlock (PostgreSQL would kill one)."""
    refs = [f"r{i}" for i in range(200)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def sender(order: list[str], tag: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for round_ in range(5):
                    barrier.wait()
                    sql(c, "SELECT * FROM pgdurable.send_signals(%s, %s, %s::jsonb[])",
                        ["dl"] * len(order), order, [json.dumps(f"{tag}{round_}")] * len(order))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=sender, args=(refs, "a")),
               threading.Thread(target=sender, args=(refs[::-1], "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert count(conn, "signals", "kind = 'dl'") == 2 * 5 * len(refs)


def test_sync_client_signal_many(dsn: str, conn: psycopg.Connection[Any]) -> None:
    a, b = seed_leased(conn, 2)
    park(conn, a, "cm", "s1")
    park(conn, b, "cm", "s2")
    with DurableClient(dsn) as client:
        assert client.signal_many([("cm", "s2", True), ("cm", "s1", {"n": 1})]) == [
            [str(b)], [str(a)]]

