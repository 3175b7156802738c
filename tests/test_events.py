"""Events (issue 43): send_event with dedup and typed errors, in the caller's
transaction; wait_event (tasks and workflows) woken by an indexed lookup and
which events a wait sees; cancel_on while parked and racing completion;
triggers: one run per event, per debounce window (timing from the database
clock), per batch (size bound), leading debounce."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from _dashboard_server import serving
from _waiting import app_running, finished, until
from test_security_boundary import _as, _grant, roles
from typer.testing import CliRunner

from pgdurable import (
    Continue,
    Done,
    Durable,
    DurableClient,
    Event,
    EventConflict,
    InvalidInput,
    RunContext,
    Wait,
    WorkflowContext,
)
from pgdurable.foundation.errors import translate
from pgdurable.ops import webhooks
from pgdurable.ops.cli import app as cli_app
from pgdurable.ops.dashboard import create_app
from pgdurable.ops.retention import prune


def sql(conn: psycopg.Connection[Any], query: str, *params: Any) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        raise translate(exc) from exc


def count(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    return int(sql(conn, f"SELECT count(*) FROM pgdurable.{table} WHERE {where}")[0][0])


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    yield a
    await a.close()


# -- events as rows: dedup, bad input, the caller's transaction ------------------------


async def test_send_event_dedup_and_conflict(app: Durable, conn: psycopg.Connection[Any]) -> None:
    first = await app.send_event("order.paid", {"order_id": "o-1"}, id="evt-1")
    again = await app.send_event("order.paid", {"order_id": "o-1"}, id="evt-1")
    assert first.created and not again.created and again.id == first.id
    with pytest.raises(EventConflict):
        await app.send_event("order.paid", {"order_id": "o-2"}, id="evt-1")
    # the id is scoped by name; no id: never deduplicated
    other = await app.send_event("order.shipped", {"order_id": "o-1"}, id="evt-1")
    assert other.created and other.id != first.id
    await app.send_event("order.paid", {"order_id": "o-1"})
    await app.send_event("order.paid", {"order_id": "o-1"})
    rows = sql(conn, "SELECT name, data, event_key, created_at <= pgdurable.now() "
               "FROM pgdurable.events ORDER BY id")
    assert rows == [("order.paid", {"order_id": "o-1"}, "evt-1", True),
                    ("order.shipped", {"order_id": "o-1"}, "evt-1", True),
                    ("order.paid", {"order_id": "o-1"}, None, True),
                    ("order.paid", {"order_id": "o-1"}, None, True)]
    # from SQL, one round trip, the same contract
    assert sql(conn, "SELECT event_id, created FROM pgdurable.send_event("
               "'order.paid', '{\"order_id\": \"o-1\"}', 'evt-1')") == [(first.id, False)]


def test_concurrent_senders_of_one_id_store_one_event(dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    answers: list[tuple[Any, ...]] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            row = c.execute("SELECT event_id, created FROM pgdurable.send_event("
                            "'order.paid', '{\"order_id\": \"o-1\"}', 'same')").fetchone()
            assert row is not None
            answers.append(tuple(row))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 8 and len({a[0] for a in answers}) == 1
    assert sorted(a[1] for a in answers) == [False] * 7 + [True]
    assert count(conn, "events") == 1


async def test_bad_input_writes_nothing(app: Durable, conn: psycopg.Connection[Any]) -> None:
    app.max_event_data = 100
    cases: list[tuple[type[BaseException], Callable[[], Any]]] = [
        (ValueError, lambda: app.send_event("", {})),
        (ValueError, lambda: app.send_event("a\x00b", {})),
        (TypeError, lambda: app.send_event(1, {})),  # type: ignore[arg-type]
        (TypeError, lambda: app.send_event("e", [1, 2])),  # type: ignore[arg-type]
        (TypeError, lambda: app.send_event("e", "text")),  # type: ignore[arg-type]
        (ValueError, lambda: app.send_event("e", {"x": float("nan")})),
        (TypeError, lambda: app.send_event("e", {"x": {1, 2}})),
        (ValueError, lambda: app.send_event("e", {"x": "y" * 200})),
        (ValueError, lambda: app.send_event("e", {}, id="")),
        (TypeError, lambda: app.start("t", revision="1", cancel_on=[("e", "data.x")])),
        (ValueError, lambda: app.start("t", revision="1", cancel_on=[("e", "x", 1)])),
        (ValueError, lambda: app.start("t", revision="1", cancel_on=[("e", "data.", 1)])),
        (TypeError, lambda: app.start("t", revision="1", cancel_on=[("e", "data.x", [1])])),
        (TypeError, lambda: app.start("t", revision="1", cancel_on="e")),
    ]
    for exc_type, call in cases:
        with pytest.raises(exc_type):
            await call()
    for bad in ({}, {"x": 1}, {"data.x": [1]}, {"data.x": None}, {"data..y": 1}):
        with pytest.raises((TypeError, ValueError)):
            Wait.for_event("e", bad)
    with pytest.raises(ValueError):
        Wait.for_event("", {"data.x": 1})
    # the database checks again (psql callers): typed, nothing written
    for query in ("SELECT * FROM pgdurable.send_event('', '{}', NULL)",
                  "SELECT * FROM pgdurable.send_event('e', '[1]', NULL)",
                  "SELECT * FROM pgdurable.send_event('e', '{}', '')",
                  "SELECT pgdurable.cancel_on_events(gen_random_uuid(), '{e}', '{x}', '[1]')",
                  "SELECT pgdurable.cancel_on_events(gen_random_uuid(), '{e}', '{data.x}', "
                  "'[[1]]')",
                  "SELECT pgdurable.upsert_event_trigger('t', 'e', 't', '1', 'default', 3, NULL, "
                  "NULL, NULL, true, NULL, NULL)",
                  "SELECT pgdurable.upsert_event_trigger('t', 'e', 't', '1', 'default', 3, NULL, "
                  "NULL, NULL, false, 5, NULL)"):
        with pytest.raises(InvalidInput):
            sql(conn, query)
    for table in ("events", "runs", "event_cancels", "event_triggers", "event_paths"):
        assert count(conn, table) == 0, table


async def test_send_event_in_the_callers_transaction(app: Durable, dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        async with c.transaction(force_rollback=True):
            await app.send_event("e", {"n": 1}, conn=c)
            assert count(conn, "events") == 0  # not committed: nobody sees it
    assert count(conn, "events") == 0
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        async with c.transaction():
            await app.send_event("e", {"n": 2}, conn=c)
    with DurableClient(dsn) as client:
        rid = client.start("t", revision="1", cancel_on=[("e", "data.n", 3)])
        sent = client.send_event("e", {"n": 3}, id="s-1")
        assert client.get_run(rid).status == "cancelled"  # runnable: cancelled at once
        assert client.send_event("e", {"n": 3}, id="s-1") == sent.__class__(sent.id, False)
        with pytest.raises(EventConflict):
            client.send_event("e", {"n": 4}, id="s-1")
        with psycopg.connect(dsn) as sc:
            with sc.transaction(force_rollback=True):
                client.send_event("e", {"n": 5}, conn=sc)
    assert [r[0] for r in sql(conn, "SELECT data->>'n' FROM pgdurable.events ORDER BY id")] == \
        ["2", "3"]


# -- wait_event -------------------------------------------------------------------------


def _waiter(app: Durable, name: str = "waiter", *, before: Any = None) -> None:
    @app.task(name)
    async def waiter(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0 and before is not None:
            await before(ctx, state)
            return Continue(state)
        if ctx.wake is None:
            return ctx.wait_event("payment.succeeded", {"data.order_id": state["order"]},
                                  timeout=state.get("timeout", 60))
        return Done({"event": ctx.event, "wake": ctx.wake["type"]})


async def test_wait_event_parks_and_a_matching_event_wakes_it(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    _waiter(app)
    async with app_running(app):
        rid = await app.start("waiter", {"order": "o-1"})

        async def parked() -> bool:
            return (await app.get_run(rid)).status == "waiting"

        await until(parked, "park")
        assert sql(conn, "SELECT wait_kind, wait_ref = pgdurable.event_ref('payment.succeeded', "
                   "'data.order_id', '\"o-1\"') FROM pgdurable.runs") == [("event", True)]
        # other orders, other names, a non-matching type: nothing wakes it
        await app.send_event("payment.succeeded", {"order_id": "o-2"})
        await app.send_event("payment.failed", {"order_id": "o-1"})
        await app.send_event("payment.succeeded", {"order_id": 1})
        await app.send_event("payment.succeeded", {"other": "o-1"})
        assert (await app.get_run(rid)).status == "waiting"
        sent = await app.send_event("payment.succeeded", {"order_id": "o-1", "amount": 42},
                                    id="pay-1")
        info = await finished(app, rid)
    assert info.status == "completed"
    assert info.result["wake"] == "event"
    event = info.result["event"]
    assert (event["id"], event["name"], event["data"], event["event_id"]) == \
        (sent.id, "payment.succeeded", {"order_id": "o-1", "amount": 42}, "pay-1")


async def test_an_event_sent_before_the_park_is_not_lost(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    """The previous step causes the event (say, it charges a card and the webhook
    is quick): the event is stored before the run parks, and the park finds it.
    An event sent before the run started is not one the wait sees."""

    async def charge(ctx: RunContext, state: Any) -> None:
        if state.get("charge", True):
            await app.send_event("payment.succeeded", {"order_id": state["order"], "n": 2})

    _waiter(app, before=charge)
    await app.send_event("payment.succeeded", {"order_id": "o-9", "n": 1})  # before the start
    async with app_running(app):
        rid = await app.start("waiter", {"order": "o-9"})
        info = await finished(app, rid)
        assert info.status == "completed" and info.result["event"]["data"]["n"] == 2
        # the events sent before its start are not seen: this one times out
        rid2 = await app.start("waiter", {"order": "o-9", "timeout": 0.3, "charge": False})
        info2 = await finished(app, rid2)
    assert info2.status == "completed"
    assert info2.result == {"event": None, "wake": "timeout"}


async def test_consecutive_waits_each_get_the_next_event(app: Durable) -> None:
    """A run waiting again sees the events sent since the one that ended its previous
    wait (none is returned twice, none skipped), oldest first."""

    @app.task("reader")
    async def reader(ctx: RunContext, state: Any) -> Any:
        got = state.get("got", [])
        if ctx.event is not None:
            got = [*got, ctx.event["data"]["n"]]
        if len(got) == 3:
            return Done(got)
        return ctx.wait_event("tick", {"data.k": "a"}, timeout=30, state={"got": got})

    rid = await app.start("reader", {})
    for n in range(3):  # all three sent before the run ever parks
        await app.send_event("tick", {"k": "a", "n": n})
    async with app_running(app):
        info = await finished(app, rid)
    assert info.status == "completed" and info.result == [0, 1, 2]


async def test_workflow_wait_event(app: Durable) -> None:
    @app.workflow("checkout")
    async def checkout(ctx: WorkflowContext, order: str) -> Any:
        paid = await ctx.wait_event("payment.succeeded", {"data.order_id": order},
                                    timeout=timedelta(seconds=30))
        late = await ctx.wait_event("refund", {"data.order_id": order}, timeout=0.2)
        assert paid is not None
        return {"paid": paid["data"], "late": late}

    async with app_running(app):
        rid = await app.start("checkout", "o-5")

        async def parked() -> bool:
            return (await app.get_run(rid)).status == "waiting"

        await until(parked, "park")
        await app.send_event("payment.succeeded", {"order_id": "o-5", "ok": True})
        info = await finished(app, rid)
    assert info.status == "completed", info.error
    assert info.result == {"paid": {"order_id": "o-5", "ok": True}, "late": None}


def _seed_leased(conn: psycopg.Connection[Any], n: int) -> list[uuid.UUID]:
    rows = sql(conn, "INSERT INTO pgdurable.runs (task, revision, status, lease_owner, "
               "lease_token, lease_expires_at) SELECT 't', '1', 'leased', 'w', 1, "
               "pgdurable.now() + interval '1 hour' FROM generate_series(1, %s) RETURNING id", n)
    return [r[0] for r in rows]


def test_a_matching_wait_among_1000_is_woken_by_an_index_lookup(
        conn: psycopg.Connection[Any]) -> None:
    ids = _seed_leased(conn, 1000)
    for i, rid in enumerate(ids):
        status = sql(conn, "SELECT status FROM pgdurable.park_event(%s, 1, 'w', '{}', 0, "
                     "'payment.succeeded', %s::jsonb, NULL)", rid,
                     json.dumps({"data.order_id": f"o-{i}"}))
        assert status == [("waiting",)]
    conn.execute("ANALYZE pgdurable.runs")
    # the plans of the statements send_event runs (auto_explain logs nested statements;
    # at level NOTICE they come back to this session)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.errors.UndefinedFile:  # a server without contrib: the same statement
        wake = "\n".join(r[0] for r in sql(conn, """
            EXPLAIN SELECT r.id FROM pgdurable.runs r
              JOIN pgdurable.event_waits ew ON ew.run_id = r.id
             WHERE r.status = 'waiting' AND r.wait_kind = 'event' AND r.wait_ref =
                   pgdurable.event_ref('payment.succeeded', 'data.order_id', '"o-500"')
               AND ew.ref = r.wait_ref"""))
    for setting in ("SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_nested_statements = on",
                    "SET auto_explain.log_level = 'notice'", "SET client_min_messages = notice"):
        conn.execute(setting)
    sent = sql(conn, "SELECT event_id FROM pgdurable.send_event('payment.succeeded', "
               "'{\"order_id\": \"o-500\"}', NULL)")
    conn.execute("RESET client_min_messages")
    plans = [n for n in notices if "UPDATE pgdurable.runs r SET status = 'runnable'" in n]
    if plans:
        (wake,) = plans
    print(wake)
    assert "Index Scan using runs_waiting_signal_idx on runs r" in wake, wake
    assert "Seq Scan" not in wake, wake
    woken = sql(conn, "SELECT id, wake->'event'->>'id' FROM pgdurable.runs "
                "WHERE status = 'runnable'")
    assert woken == [(ids[500], str(sent[0][0]))]
    assert count(conn, "runs", "status = 'waiting'") == 999
    if not plans:
        return  # no auto_explain: the park's own lookup is not shown
    # the other way round: a park finds its stored event among 5,000 by the GIN index
    (late,) = _seed_leased(conn, 1)
    conn.execute("INSERT INTO pgdurable.events (name, data) SELECT 'payment.succeeded', "
                 "jsonb_build_object('order_id', 'x-' || g) FROM generate_series(1, 5000) g")
    conn.execute("ANALYZE pgdurable.events")
    conn.execute("SET client_min_messages = notice")
    status = sql(conn, "SELECT status FROM pgdurable.park_event(%s, 1, 'w', '{}', 0, "
                 "'payment.succeeded', '{\"data.order_id\": \"x-4321\"}', NULL)", late)
    conn.execute("RESET client_min_messages")
    assert status == [("runnable",)]
    (lookup,) = [n for n in notices if "FROM pgdurable.events e" in n and "LIMIT 1" in n]
    print(lookup)
    # events is partitioned by day (0039): the partition holding the 5,000 is read by its
    # GIN index; a Seq Scan only of the empty partitions (the days ahead, the default)
    day = sql(conn, "SELECT tableoid::regclass::text FROM pgdurable.events LIMIT 1")[0][0]
    assert f"Bitmap Index Scan on {day.removeprefix('pgdurable.')}_data_idx" in lookup, lookup
    for scanned in re.findall(r"Seq Scan on (\w+)", lookup):
        assert count(conn, scanned, "true") == 0, (scanned, lookup)


def test_which_events_a_wait_sees_boundary_pairs(conn: psycopg.Connection[Any]) -> None:
    """since = the run's creation, then the time of the event that ended the previous
    event wait; an event at exactly since is seen, 1 ms before it is not; an event a
    wait returned is never returned again, another one of the same time is."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    ms = timedelta(milliseconds=1)
    (rid,) = [r[0] for r in sql(conn, "INSERT INTO pgdurable.runs (task, revision, status, "
              "lease_owner, lease_token, lease_expires_at, created_at) VALUES ('t', '1', "
              "'leased', 'w', 1, '2030-01-01 01:00+00', %s) RETURNING id", t0)]
    ins = ("INSERT INTO pgdurable.events (name, data, created_at) VALUES ('paid', "
           "'{\"o\": 1}', %s) RETURNING id")
    (before,) = sql(conn, ins, t0 - ms)
    (at_start,) = sql(conn, ins, t0)
    park = ("SELECT status FROM pgdurable.park_event(%s, %s, 'w', '{}', 0, 'paid', "
            "'{\"data.o\": 1}', NULL)")
    woke = "SELECT (wake->'event'->>'id')::bigint FROM pgdurable.runs WHERE id = %s"

    def relay(token: int) -> None:  # a worker claims the run again
        conn.execute("UPDATE pgdurable.runs SET status = 'leased', lease_owner = 'w', "
                     "lease_token = %s, lease_expires_at = '2030-01-01 01:00+00' "
                     "WHERE id = %s", (token, rid))

    assert _at(conn, t0 + ms, park, rid, 1) == [("runnable",)]
    assert sql(conn, woke, rid) == [(at_start[0],)]  # not the one 1 ms before the start
    relay(2)
    assert _at(conn, t0 + 2 * ms, park, rid, 2) == [("waiting",)]  # at_start is used up
    # another event of the very same time as the one that ended the last wait: seen
    (same_time,) = _at(conn, t0, "SELECT event_id FROM pgdurable.send_event('paid', "
                       "'{\"o\": 1}', NULL)")
    assert sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", rid) == [("runnable",)]
    assert sql(conn, woke, rid) == [(same_time[0],)]
    assert before[0] not in (at_start[0], same_time[0])


# -- cancel_on --------------------------------------------------------------------------


async def test_cancel_on_cancels_a_parked_run(app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("checkout")
    async def checkout(ctx: RunContext, state: Any) -> Any:
        if ctx.wake is None:
            return Wait(signal=("payment", state["order"]), timeout=60)
        return Done("paid")

    async with app_running(app):
        rid = await app.start("checkout", {"order": "o-7"},
                              cancel_on=[("order.cancelled", "data.order_id", "o-7")])
        keep = await app.start("checkout", {"order": "o-8"},
                               cancel_on=[("order.cancelled", "data.order_id", "o-8")])

        async def parked() -> bool:
            return all([(await app.get_run(r)).status == "waiting" for r in (rid, keep)])

        await until(parked, "park")
        await app.send_event("order.cancelled", {"order_id": "o-6"})
        await app.send_event("order.updated", {"order_id": "o-7"})
        assert (await app.get_run(rid)).status == "waiting"
        await app.send_event("order.cancelled", {"order_id": "o-7", "why": "customer"})
        info = await app.get_run(rid)  # parked: cancelled in the event's transaction
        assert info.status == "cancelled" and info.error["type"] == "RunCancelled"
        assert (await app.get_run(keep)).status == "waiting"
        await app.signal("payment", "o-8")
        assert (await finished(app, keep)).status == "completed"


async def test_cancel_on_racing_completion_ends_in_one_state(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("quick")
    async def quick(ctx: RunContext, state: Any) -> Any:
        await asyncio.sleep(state["sleep"])
        return Done("done")

    async with app_running(app, concurrency=64):
        ids = await asyncio.gather(*[
            app.start("quick", {"sleep": (i % 10) * 0.06}, cancel_on=[("stop", "data.n", i)])
            for i in range(60)])

        async def busy() -> bool:  # many in a step (the cancels race the steps' ends), and
            # the quickest already done, whatever the load on the machine
            return (count(conn, "runs", "status = 'leased'") >= 10
                    and count(conn, "runs", "status = 'completed'") >= 1)

        await until(busy, "runs in their step")
        await asyncio.gather(*[app.send_event("stop", {"n": i}) for i in range(60)])
        infos = [await finished(app, r) for r in ids]
    outcomes = {i.status for i in infos}
    assert outcomes == {"completed", "cancelled"}, outcomes
    for i in infos:
        if i.status == "completed":
            assert i.result == "done" and i.error is None
        else:
            assert i.result is None and i.error["type"] == "RunCancelled"
    print({s: sum(1 for i in infos if i.status == s) for s in outcomes})
    # one end per run: the completion and the cancel never both applied
    assert sql(conn, "SELECT count(*) FROM pgdurable.runs WHERE result IS NOT NULL "
               "AND error IS NOT NULL") == [(0,)]


# -- triggers ---------------------------------------------------------------------------


async def test_one_run_per_event_without_debounce_or_batch(app: Durable) -> None:
    got: list[list[Any]] = []

    @app.on_event("signup")
    def welcome(ctx: RunContext, events: list[Event]) -> int:  # a sync handler: in a thread
        got.append([e.data["user"] for e in events])
        return len(events)

    await app.declare_triggers()
    async with app_running(app):
        for u in ("a", "b", "c"):
            await app.send_event("signup", {"user": u})

        async def three() -> bool:
            return len(got) == 3

        await until(three, "three runs")
    assert sorted(got) == [["a"], ["b"], ["c"]]


async def test_debounce_one_run_per_burst_and_timing_on_the_db_clock(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    got: dict[str, list[int]] = {}

    @app.on_event("message.received", key="data.thread_id", debounce=timedelta(seconds=0.4),
                  max_wait=timedelta(seconds=3))
    async def reply(ctx: RunContext, events: list[Event]) -> int:
        key = events[0].data["thread_id"]
        assert key not in got, "two runs for one window"
        got[key] = [e.data["n"] for e in events]
        return len(events)

    await app.declare_triggers()  # (a worker declares them as it starts, maybe later)
    async with app_running(app):
        for n in range(6):  # a burst on t-1, interleaved with t-2
            await app.send_event("message.received", {"thread_id": "t-1", "n": n})
            if n % 2:
                await app.send_event("message.received", {"thread_id": "t-2", "n": n})
            await asyncio.sleep(0.05)

        async def both() -> bool:
            return len(got) == 2

        await until(both, "two runs")
        await asyncio.sleep(0.6)
    assert got == {"t-1": [0, 1, 2, 3, 4, 5], "t-2": [1, 3, 5]}
    assert sql(conn, "SELECT concurrency_key FROM pgdurable.runs WHERE task = 'reply' "
               "ORDER BY 1") == [("t-1",), ("t-2",)]  # the flow-control key
    # bounds from the database clock: the window was due debounce after its last event
    # (max_wait after its first at the latest), and its run read it after that
    rows = sql(conn, """
        SELECT w.key, w.due_at = least(max(e.created_at) + interval '0.4 s',
                                       w.opened_at + interval '3 s'),
               w.opened_at = min(e.created_at), w.taken_at >= w.due_at,
               extract(epoch FROM w.taken_at - w.due_at), count(*) = w.events
          FROM pgdurable.event_windows w
          JOIN pgdurable.event_window_events we ON we.window_id = w.id
          JOIN pgdurable.events e ON e.id = we.event_id
         GROUP BY w.id ORDER BY w.key""")
    assert [r[:4] for r in rows] == [("t-1", True, True, True), ("t-2", True, True, True)]
    assert all(r[4] < 5 and r[5] for r in rows), rows


async def test_one_turn_per_thread_at_a_time_gathers_what_came_meanwhile(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    """per_key_concurrency=1: while a thread's turn runs, its next window is due but not
    claimed, so it keeps taking the thread's new events: the next turn sees them all."""
    release = asyncio.Event()
    got: list[list[int]] = []

    @app.on_event("msg", key="data.t", debounce=timedelta(seconds=0.1))
    async def turn(ctx: RunContext, events: list[Event]) -> None:
        got.append([e.data["n"] for e in events])
        if len(got) == 1:
            await release.wait()

    await app.declare_triggers()
    await app.set_queue("default", per_key_concurrency=1)
    async with app_running(app):
        await app.send_event("msg", {"t": "a", "n": 0})

        async def first() -> bool:
            return len(got) == 1

        await until(first, "the first turn")
        for n in (1, 2, 3):  # each one after the debounce: the window is due, the key busy
            await app.send_event("msg", {"t": "a", "n": n})
            await asyncio.sleep(0.15)
        assert len(got) == 1 and count(conn, "event_windows") == 2
        release.set()

        async def second() -> bool:
            return len(got) == 2

        await until(second, "the second turn")
    assert got == [[0], [1, 2, 3]]


def _at(conn: psycopg.Connection[Any], when: datetime, query: str, *params: Any) -> Any:
    """Run ``query`` in one transaction whose pgdurable.now() is ``when``."""
    with conn.transaction():
        conn.execute("SELECT set_config('pgdurable.now', %s, true)", (when.isoformat(),))
        return sql(conn, query, *params)


def test_debounce_due_times_on_the_database_clock_boundary_pairs(
        conn: psycopg.Connection[Any]) -> None:
    """debounce 3 s, max_wait 4 s: each event moves the window's due time to 3 s after
    it, never past 4 s after the first. The run starts at the first due time (a claim
    1 ms before takes nothing) and reads nothing before the window is due (it is told
    the due time, 1 ms before it too); events keep joining until it reads; after the
    read, an event opens a new window."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    sql(conn, "SELECT pgdurable.upsert_event_trigger('reply', 'msg', 'reply', '1', 'default', "
        "3, 'data.t', '3 s', '4 s', false, NULL, NULL)")
    send = "SELECT event_id FROM pgdurable.send_event('msg', %s::jsonb, NULL)"
    claim = ("SELECT id FROM pgdurable.claim_runs('w', ARRAY['default'], ARRAY['reply'], "
             "ARRAY['1'], 10, '1 minute'::interval)")
    take = "SELECT due_at, data->>'n' FROM pgdurable.take_due_event_window(%s)"
    due = "SELECT due_at, events FROM pgdurable.event_windows ORDER BY id"
    ms = timedelta(milliseconds=1)
    _at(conn, t0, send, '{"t": "a", "n": 1}')
    assert sql(conn, due) == [(t0 + timedelta(seconds=3), 1)]
    _at(conn, t0 + timedelta(seconds=2), send, '{"t": "a", "n": 2}')
    assert sql(conn, due) == [(t0 + timedelta(seconds=4), 2)]  # 5 s, but max_wait 4 s
    _at(conn, t0 + timedelta(seconds=3.5), send, '{"t": "a", "n": 3}')
    assert sql(conn, due) == [(t0 + timedelta(seconds=4), 3)]
    # no send moved the run: it starts at the window's first due time
    assert _at(conn, t0 + timedelta(seconds=3) - ms, claim) == []
    (run,) = _at(conn, t0 + timedelta(seconds=3), claim)
    assert _at(conn, t0 + timedelta(seconds=3), take, run[0]) == \
        [(t0 + timedelta(seconds=4), None)]                     # not due: sleep until 4 s
    _at(conn, t0 + timedelta(seconds=3.8), send, '{"t": "a", "n": 4}')  # still joins
    assert sql(conn, due) == [(t0 + timedelta(seconds=4), 4)]
    assert _at(conn, t0 + timedelta(seconds=4) - ms, take, run[0]) == \
        [(t0 + timedelta(seconds=4), None)]
    four = [(t0 + timedelta(seconds=4), n) for n in "1234"]
    assert _at(conn, t0 + timedelta(seconds=4), take, run[0]) == four
    _at(conn, t0 + timedelta(seconds=4.5), send, '{"t": "a", "n": 5}')  # it was read
    assert sql(conn, due) == [(t0 + timedelta(seconds=4), 4),
                              (t0 + timedelta(seconds=7.5), 1)]
    assert _at(conn, t0 + timedelta(seconds=9), take, run[0]) == four  # a retry: the same


def test_a_full_batch_wakes_its_sleeping_run(conn: psycopg.Connection[Any]) -> None:
    """debounce 3 s and batch 3: the run found its window not due and sleeps until it is;
    the event that fills the batch makes it due at once, and the run is claimable then."""
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    sql(conn, "SELECT pgdurable.upsert_event_trigger('b', 'msg', 'b', '1', 'default', "
        "3, NULL, '3 s', '10 s', false, 3, NULL)")
    send = "SELECT event_id FROM pgdurable.send_event('msg', %s::jsonb, NULL)"
    claim = ("SELECT id, lease_token FROM pgdurable.claim_runs('w', ARRAY['default'], "
             "ARRAY['b'], ARRAY['1'], 10, '1 minute'::interval)")
    take = "SELECT due_at, data->>'n' FROM pgdurable.take_due_event_window(%s)"
    _at(conn, t0, send, '{"n": 1}')
    _at(conn, t0 + timedelta(seconds=2), send, '{"n": 2}')     # due 5 s
    ((run, token),) = _at(conn, t0 + timedelta(seconds=3), claim)
    assert _at(conn, t0 + timedelta(seconds=3), take, run) == [(t0 + timedelta(seconds=5), None)]
    _at(conn, t0 + timedelta(seconds=3), "SELECT status FROM pgdurable.park_run(%s, %s, 'w', "
        "'{}', 0, NULL, NULL, %s, NULL)", run, token, t0 + timedelta(seconds=5))
    assert _at(conn, t0 + timedelta(seconds=4), claim) == []    # asleep
    _at(conn, t0 + timedelta(seconds=4), send, '{"n": 3}')     # full: due now, woken
    assert _at(conn, t0 + timedelta(seconds=4) - timedelta(milliseconds=1), claim) == []
    assert [r[0] for r in _at(conn, t0 + timedelta(seconds=4), claim)] == [run]
    assert [r[1] for r in _at(conn, t0 + timedelta(seconds=4), take, run)] == ["1", "2", "3"]


async def test_debounce_max_wait_runs_a_steady_stream(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    got: list[list[int]] = []

    @app.on_event("tick", debounce=timedelta(seconds=0.5), max_wait=timedelta(seconds=0.8))
    async def ticks(ctx: RunContext, events: list[Event]) -> None:
        got.append([e.data["n"] for e in events])

    await app.declare_triggers()
    async with app_running(app):
        for n in range(20):  # every 0.1 s for 2 s: never quiet for 0.5 s
            await app.send_event("tick", {"n": n})
            await asyncio.sleep(0.1)

        async def all_seen() -> bool:
            return sum(len(g) for g in got) == 20

        await until(all_seen, "every event")
    assert len(got) >= 2  # max_wait cut the stream into windows
    assert sorted(n for g in got for n in g) == list(range(20))
    spans = sql(conn, "SELECT extract(epoch FROM w.due_at - w.opened_at) "
                "FROM pgdurable.event_windows w")
    assert all(s[0] <= 0.8 + 1e-6 for s in spans), spans


async def test_batches_never_exceed_their_size(app: Durable, conn: psycopg.Connection[Any]) -> None:
    got: list[list[int]] = []

    @app.on_event("webhook.delivery", key="data.tenant", batch=10,
                  batch_timeout=timedelta(seconds=0.5))
    async def ingest(ctx: RunContext, events: list[Event]) -> int:
        got.append([e.data["n"] for e in events])
        return len(events)

    await app.declare_triggers()
    # 25 events before any worker runs: two full batches, one left for the timeout
    for n in range(25):
        await app.send_event("webhook.delivery", {"tenant": "x", "n": n})
    assert sql(conn, "SELECT events, closed_at IS NOT NULL, due_at <= pgdurable.now() "
               "FROM pgdurable.event_windows ORDER BY id") == \
        [(10, True, True), (10, True, True), (5, False, False)]
    async with app_running(app):
        async def all_seen() -> bool:
            return sum(len(g) for g in got) == 25

        await until(all_seen, "every event")
    assert sorted(len(g) for g in got) == [5, 10, 10]
    assert sorted(n for g in got for n in g) == list(range(25))


async def test_cli_lists_events_and_what_they_triggered(app: Durable, dsn: str) -> None:
    @app.on_event("signup", batch=2, batch_timeout=timedelta(hours=1))
    async def onboard(ctx: RunContext, events: list[Event]) -> None:
        return None

    await app.declare_triggers()
    await app.send_event("signup", {"user": "a"}, id="u-a")
    await app.send_event("login", {"user": "a"})
    runner = CliRunner()
    res = runner.invoke(cli_app, ["events", "--dsn", dsn, "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert [(r["name"], r["event_key"], r["data"]) for r in rows] == \
        [("login", None, {"user": "a"}), ("signup", "u-a", {"user": "a"})]
    assert rows[0]["triggered"] == []
    (t,) = rows[1]["triggered"]
    assert (t["trigger"], t["status"]) == ("onboard", "runnable")
    res = runner.invoke(cli_app, ["events", "--dsn", dsn, "--name", "signup"],
                        catch_exceptions=False)
    assert res.exit_code == 0 and "onboard" in res.output and "login" not in res.output
    # send-event: its number; a repeated id acts once; other data or a non-object: exit 2
    res = runner.invoke(cli_app, ["send-event", "signup", "--data", '{"user": "b"}', "--id",
                                  "u-b", "--dsn", dsn], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    again = runner.invoke(cli_app, ["send-event", "signup", "--data", '{"user": "b"}', "--id",
                                    "u-b", "--dsn", dsn], catch_exceptions=False)
    assert again.exit_code == 0 and again.stdout.split()[0] == res.stdout.split()[0]
    for data in ('{"user": "c"}', "[1]", "{"):
        bad = runner.invoke(cli_app, ["send-event", "signup", "--data", data, "--id", "u-b",
                                      "--dsn", dsn], catch_exceptions=False)
        assert bad.exit_code == 2, (data, bad.output)
    with psycopg.connect(dsn) as c:
        assert c.execute("SELECT count(*) FROM pgdurable.events").fetchone() == (3,)


async def test_leading_debounce_runs_the_first_event_at_once(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    got: list[list[int]] = []

    @app.on_event("ping", debounce=timedelta(seconds=0.5), leading=True)
    async def pong(ctx: RunContext, events: list[Event]) -> None:
        got.append([e.data["n"] for e in events])

    await app.declare_triggers()
    for n in range(4):
        await app.send_event("ping", {"n": n})
    assert sql(conn, "SELECT events, due_at = opened_at FROM pgdurable.event_windows "
               "ORDER BY id") == [(1, True), (3, False)]
    async with app_running(app):
        async def all_seen() -> bool:
            return sum(len(g) for g in got) == 4

        await until(all_seen, "every event")
    assert sorted(got) == [[0], [1, 2, 3]]


async def test_trigger_options_are_checked(app: Durable) -> None:
    async def h(ctx: RunContext, events: list[Event]) -> None:
        return None

    for kwargs, exc in (({"max_wait": timedelta(seconds=1)}, ValueError),
                        ({"leading": True}, ValueError),
                        ({"batch": 5}, ValueError),
                        ({"batch": 0, "batch_timeout": timedelta(seconds=1)}, ValueError),
                        ({"batch_timeout": timedelta(seconds=1)}, ValueError),
                        ({"debounce": 3}, TypeError),
                        ({"debounce": timedelta(0)}, ValueError),
                        ({"key": "thread_id"}, ValueError)):
        with pytest.raises(exc):
            app.on_event("e", **kwargs)(h)
    assert "h" not in app.tasks
    app.on_event("e")(h)
    with pytest.raises(ValueError, match="declared differently"):
        app.on_event("other")(h)
    assert app.tasks["h"] is not None


# -- retention --------------------------------------------------------------------------


async def test_prune_events_keeps_what_unfinished_runs_need(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    got: list[int] = []

    @app.on_event("job", batch=3, batch_timeout=timedelta(hours=1))
    async def jobs(ctx: RunContext, events: list[Event]) -> None:
        got.extend(e.data["n"] for e in events)

    await app.declare_triggers()
    for n in range(4):  # a full batch (runs now), and one event whose batch waits an hour
        await app.send_event("job", {"n": n}, id=f"j-{n}")
    await app.send_event("other", {"n": 9}, id="o-9")  # no trigger: nobody needs it
    async with app_running(app):
        async def three() -> bool:
            return len(got) == 3

        await until(three, "the full batch")
    with pytest.raises(ValueError):
        await app.prune_events(timedelta(seconds=-1))
    with pytest.raises(InvalidInput):
        sql(conn, "SELECT pgdurable.prune_events('1 day', 0)")
    assert await app.prune_events(timedelta(hours=1)) == 0  # nothing that old
    # everything older than now: the finished batch's events and window; the waiting
    # batch keeps its event and window, and "other" is kept too: it came after the
    # waiting batch's run started, which may still wait_event for it (its horizon)
    assert await app.prune_events(timedelta(0), batch=2) == 3 + 1
    assert sql(conn, "SELECT event_key FROM pgdurable.events ORDER BY id") == [("j-3",),
                                                                              ("o-9",)]
    assert sql(conn, "SELECT events FROM pgdurable.event_windows") == [(1,)]
    assert sql(conn, "SELECT count(*) FROM pgdurable.event_ids") == [(2,)]
    # once that run is over, nothing needs them
    (waiting,) = sql(conn, "SELECT run_id FROM pgdurable.event_windows")
    await app.cancel(str(waiting[0]))
    assert await app.prune_events(timedelta(0)) == 2 + 1
    assert count(conn, "events") == count(conn, "event_ids") == 0
    # a pruned id deduplicates no more
    assert (await app.send_event("job", {"n": 0}, id="j-0")).created


async def test_pgdurable_prune_prunes_sent_events_after_their_runs(
        app: Durable, conn: psycopg.Connection[Any]) -> None:
    got: list[int] = []

    @app.on_event("job")
    async def job(ctx: RunContext, events: list[Event]) -> None:
        got.extend(e.data["n"] for e in events)

    await app.declare_triggers()
    for n in range(3):
        await app.send_event("job", {"n": n})
    async with app_running(app):
        async def three() -> bool:
            return len(got) == 3

        await until(three, "three runs")
    preview = await prune(app, timedelta(0), dry_run=True)
    assert (preview.runs, preview.sent_events) == (3, 3)  # their runs are finished
    done = await prune(app, timedelta(0), batch=2)
    assert (done.runs, done.sent_events) == (3, 3 + 3)  # 3 events, then their 3 windows
    assert done.as_dict()["sent_events"] == 6
    for table in ("events", "event_windows", "event_window_events", "runs"):
        assert count(conn, table) == 0, table


# -- the dashboard's events page ----------------------------------------------------------


def test_dashboard_lists_events_for_the_readonly_role(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT pgdurable.upsert_event_trigger('onboard', 'signup', 'onboard', '1', "
                  "'default', 3, NULL, NULL, NULL, false, NULL, NULL)")
        c.execute("SELECT * FROM pgdurable.send_event('signup', '{\"user\": \"<b>a</b>\"}', "
                  "'u-1')")
        c.execute("SELECT * FROM pgdurable.send_event('login', '{}', NULL)")
        (rid,) = c.execute("SELECT run_id FROM pgdurable.event_windows").fetchone() or ()
    with roles(dsn, "NOLOGIN", "LOGIN", "LOGIN") as (owner, app_role, ro):
        _grant(dsn, owner, app_role, ro)
        with serving(create_app(_as(dsn, ro))) as base:
            page = httpx.get(base + "/event-log")
            assert page.status_code == 200, page.text
            assert "signup" in page.text and "login" in page.text and "u-1" in page.text
            assert f"/runs/{rid}" in page.text and "<b>a</b>" not in page.text  # escaped
            only = httpx.get(base + "/event-log", params={"name": "login"}).text
            assert "login" in only and "u-1" not in only


# -- the signed webhook endpoint ------------------------------------------------------------


async def _post(asgi: Any, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    await asgi(scope, receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


async def test_signed_webhook_sends_events(app: Durable, conn: psycopg.Connection[Any]) -> None:
    event_secret, signal_secret = "e" * 40, "s" * 40
    hooks = webhooks.app(app, secrets={"ci": signal_secret},
                         events={"order.paid": event_secret})
    path = webhooks.event_path("order.paid")
    body = b'{"order_id": "o-1"}'
    status, answer = await _post(hooks, path, webhooks.sign_event_request(
        event_secret, "order.paid", body, event_id="stripe-1"), body)
    assert (status, answer["created"]) == (200, True)
    # the same delivery again: the same event, nothing done again
    status, again = await _post(hooks, path, webhooks.sign_event_request(
        event_secret, "order.paid", body, event_id="stripe-1"), body)
    assert (status, again) == (200, {"event": answer["event"], "created": False})
    # the same id with other data; a signal secret; no secret for the name; not an object
    other = b'{"order_id": "o-2"}'
    assert (await _post(hooks, path, webhooks.sign_event_request(
        event_secret, "order.paid", other, event_id="stripe-1"), other))[0] == 409
    assert (await _post(hooks, path, webhooks.sign_event_request(
        signal_secret, "order.paid", body), body))[0] == 401
    assert (await _post(hooks, webhooks.event_path("order.refunded"),
                        webhooks.sign_event_request(event_secret, "order.refunded", body),
                        body))[0] == 403
    assert (await _post(hooks, path, webhooks.sign_event_request(
        event_secret, "order.paid", b"[1]"), b"[1]"))[0] == 400
    # a signature of one path does not verify another
    headers = webhooks.sign_event_request(event_secret, "order.paid", body)
    assert (await _post(hooks, webhooks.request_path("ci", "x"), headers, body))[0] == 401
    # without an id, a replay of the same signed request is deduplicated
    headers = webhooks.sign_event_request(event_secret, "order.paid", b'{"n": 1}')
    first = await _post(hooks, path, headers, b'{"n": 1}')
    assert first[0] == 200 and first[1]["created"]
    assert (await _post(hooks, path, headers, b'{"n": 1}'))[1] == {**first[1], "created": False}
    assert sql(conn, "SELECT name, data FROM pgdurable.events ORDER BY id") == \
        [("order.paid", {"order_id": "o-1"}), ("order.paid", {"n": 1})]
    # signals go on as before on the same app; an events-only app takes no signals
    assert webhooks.app(app, events={"order.paid": event_secret}).kinds == frozenset()
