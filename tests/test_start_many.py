"""start_many: N runs in one statement (sql/0021_start_many.sql, pgdurable/runs/batch_start.py):
the same arguments and validation as start(), all or nothing, one NOTIFY per
queue, idempotency keys (repeated in the call and already existing), the
caller's transaction (psycopg and SQLAlchemy)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from pgdurable import Durable, DurableClient, InvalidInput, Start, UnknownTask


def _count(dsn: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT count(*) FROM pgdurable.runs").fetchone()
    assert row is not None
    return int(row[0])


async def test_every_start_argument_is_stored_and_ids_come_back_in_order(dsn: str) -> None:
    at = datetime(2100, 1, 1, tzinfo=UTC)
    async with Durable(dsn) as app:

        @app.task("agent", revision="7", max_attempts=4)
        async def agent(ctx: Any, state: Any) -> Any:  # never run here
            raise AssertionError

        ids = await app.start_many([
            Start("agent", {"n": 1}),
            {"task": "agent", "state": {"n": 2}, "queue": "q2", "priority": 5,
             "deadline": timedelta(hours=1), "budget": Decimal("2.5"),
             "metadata": {"tenant": "acme"}, "key": "tenant:acme", "delay": timedelta(hours=1)},
            Start("other", None, revision="3", max_attempts=9, at=at, budget=1,
                  deadline=at),
        ])
        one = await app.start("agent", {"n": 4})  # the single start on the same table
        assert await app.start_many([]) == []
    assert len(set(ids)) == 3
    with psycopg.connect(dsn) as c:
        rows = {str(r[0]): r[1:] for r in c.execute(
            "SELECT id, task, revision, state, queue, priority, max_attempts, status, "
            "deadline_at IS NOT NULL, budget, metadata, concurrency_key, "
            "available_at > now() + interval '50 minutes', available_at = %s, deadline_at = %s "
            "FROM pgdurable.runs", (at, at)).fetchall()}
    assert rows[ids[0]] == ("agent", "7", {"n": 1}, "default", 0, 4, "runnable", False, None,
                            None, "", False, False, None)
    assert rows[ids[1]] == ("agent", "7", {"n": 2}, "q2", 5, 4, "runnable", True,
                            Decimal("2.5"), {"tenant": "acme"}, "tenant:acme", True, False, False)
    assert rows[ids[2]] == ("other", "3", {}, "default", 0, 9, "runnable", True, Decimal(1),
                            None, "", True, True, True)
    assert rows[one][:2] == ("agent", "7")


async def test_idempotency_keys_repeated_in_the_call_and_already_existing(dsn: str) -> None:
    async with Durable(dsn) as app:
        old = await app.start("t", {"v": "old"}, revision="1", idempotency_key="k-old")
        ids = await app.start_many([
            Start("t", {"v": "a"}, revision="1", idempotency_key="k-new"),
            Start("t", {"v": "b"}, revision="1", idempotency_key="k-old"),
            Start("t", {"v": "c"}, revision="1", idempotency_key="k-new"),
            Start("t", {"v": "d"}, revision="1"),
        ])
        again = await app.start_many([Start("t", {"v": "e"}, revision="1",
                                            idempotency_key="k-new")])
    assert ids[1] == old and ids[0] == ids[2] == again[0] and ids[3] not in (old, ids[0])
    with psycopg.connect(dsn) as c:
        states = dict(c.execute("SELECT idempotency_key, state->>'v' FROM pgdurable.runs "
                                "WHERE idempotency_key IS NOT NULL").fetchall())
    assert states == {"k-old": "old", "k-new": "a"}  # the first start of a key wins
    assert _count(dsn) == 3


async def test_one_notify_per_queue_at_commit(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN pgdurable_wake")
        async with Durable(dsn) as app:
            await app.start_many([Start("t", {"i": i}, revision="1", queue=f"q{i % 2}")
                                  for i in range(50)])
            await app.fetchall("SELECT pg_notify('pgdurable_wake', 'end')", ())
        got: list[str] = []
        async for n in listener.notifies(timeout=10.0):
            if n.payload == "end":
                break
            got.append(n.payload)
    assert sorted(got) == ["q0", "q1"]


def test_all_or_nothing_when_the_database_refuses_one_start(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("ALTER TABLE pgdurable.runs ADD CONSTRAINT test_refused "
                  "CHECK (task <> 'refused')")
    with DurableClient(dsn) as client, pytest.raises(psycopg.errors.CheckViolation):
        client.start_many([Start("t", revision="1"), Start("t", revision="1", queue="b"),
                           Start("refused", revision="1")])
    assert _count(dsn) == 0


BAD: list[tuple[Any, type[Exception]]] = [
    (Start(1, revision="1"), TypeError),  # type: ignore[arg-type]
    (Start("unregistered"), UnknownTask),
    (Start("t", revision="1", queue=""), ValueError),
    (Start("t", revision="1", priority=True), TypeError),
    (Start("t", revision="1", priority=2**31), ValueError),
    (Start("t", revision="1", max_attempts=0), ValueError),
    (Start("t", revision="1", idempotency_key="a\x00b"), ValueError),
    (Start("t", revision="1", deadline=datetime(2100, 1, 1)), ValueError),
    (Start("t", revision="1", deadline=timedelta(0)), ValueError),
    (Start("t", revision="1", deadline="soon"), TypeError),
    (Start("t", revision="1", budget=-1), ValueError),
    (Start("t", revision="1", budget=float("nan")), ValueError),
    (Start("t", {"x": {1, 2}}, revision="1"), TypeError),
    (Start("t", revision="1", metadata=["x"]), TypeError),  # type: ignore[arg-type]
    (Start("t", revision="1", key=""), ValueError),
    (Start("t", revision="1", at=datetime(2100, 1, 1)), ValueError),
    (Start("t", revision="1", delay=timedelta(seconds=-1)), ValueError),
    (Start("t", revision="1", at=datetime.now(UTC), delay=timedelta(1)), ValueError),
    ({"task": "t", "revision": "1", "tenant": "x"}, TypeError),
    ({"revision": "1"}, TypeError),
    (("t", {}), TypeError),
]


def test_each_bad_input_is_a_typed_error_naming_the_start_and_writes_nothing(dsn: str) -> None:
    with DurableClient(dsn) as client:
        for bad, err in BAD:
            with pytest.raises(err) as info:
                client.start_many([Start("t", revision="1"), bad])
            assert "start_many: start #1" in getattr(info.value, "__notes__", []), bad
        with pytest.raises(TypeError):
            client.start_many("t")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput):  # the SQL function's own checks (PD000)
            client.fetchall("SELECT * FROM pgdurable.start_runs(ARRAY['t'], ARRAY['1'], "
                             "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                             "NULL, NULL, NULL)", ())
    assert _count(dsn) == 0


async def test_in_the_callers_transaction(dsn: str) -> None:
    async with Durable(dsn) as app:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await app.start_many([Start("t", revision="1")] * 3, conn=conn)
            await conn.rollback()
            assert _count(dsn) == 0
            ids = await app.start_many([Start("t", revision="1")] * 2, conn=conn)
            await conn.commit()
    with DurableClient(dsn) as client, psycopg.connect(dsn) as sconn:
        more = client.start_many([Start("t", revision="1")], conn=sconn)
        assert _count(dsn) == 2
        sconn.commit()
    assert _count(dsn) == 3 and len(set(ids + more)) == 3


def test_sqlalchemy_session_start_many(dsn: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from pgdurable.contrib.sqlalchemy import start_many, url_from_dsn

    engine = create_engine(url_from_dsn(dsn))
    try:
        with Session(engine) as session:
            start_many(session, [Start("t", revision="1"), Start("t", revision="1")])
            session.rollback()
        assert _count(dsn) == 0
        with Session(engine) as session, session.begin():
            ids = start_many(session, [Start("t", revision="1", idempotency_key="s")] * 2)
        assert _count(dsn) == 1 and isinstance(ids, list) and ids[0] == ids[1]
    finally:
        engine.dispose()


def test_claim_runs_plans_generically(conn: psycopg.Connection[Any]) -> None:
    """0021 sets plan_cache_mode on claim_runs (no planning per claim: enqueue -> start);
    a migration that re-creates claim_runs must keep it."""
    row = conn.execute("SELECT proconfig FROM pg_proc WHERE oid = 'pgdurable.claim_runs(text, "
                       "text[], text[], text[], integer, interval, integer[])'::regprocedure"
                       ).fetchone()
    assert row is not None and "plan_cache_mode=force_generic_plan" in row[0]


def test_wake_limiter_gives_a_token_back_per_run_claimed() -> None:
    """A claim that takes the runs of several NOTIFYs refunds each one: a trickle
    of real starts never defers a wake-up; wake-ups that find nothing stay limited."""
    from pgdurable.foundation.hints import WakeLimiter

    lim = WakeLimiter(rate=0.001, burst=3)
    assert [lim.take() for _ in range(3)] == [0.0, 0.0, 0.0]  # three NOTIFYs
    lim.refund(3)  # one claim found their three runs
    assert [lim.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.take() > 0  # three empty wake-ups later: the fourth is deferred
