"""Schedules (issue 16): definitions, firing, overlap, catch-up, DST, pause/resume/trigger.

Time is the database clock, moved with the ``pgdurable.now`` override
(tests/_sched_app.py: every pooled connection follows ``test_clock``); ticks
are fired by a worker's :class:`~pgdurable.runs.schedules.Ticker` in this process
(the same code path as in a worker), never by sleeping. Worker processes are
in tests/test_schedules_procs.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _sched_app import CLOCK_TABLE, ClockedApp, make_app, set_clock
from _waiting import app_running, until

from pgdurable import Done, Durable, InvalidInput, ScheduleNotFound
from pgdurable.runs.schedules import (
    Cadence,
    Ticker,
    declare_all,
    declared,
    list_schedules,
    pause_schedule,
    resume_schedule,
    trigger_schedule,
)

T0 = datetime(2030, 1, 7, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute(CLOCK_TABLE)
    set_clock(conn, T0)
    return conn


@pytest.fixture
async def app(dsn: str, clock: psycopg.Connection[Any]) -> AsyncIterator[ClockedApp]:
    a = make_app(dsn)
    await a.open()
    try:
        yield a
    finally:
        await a.close()


def ticks(conn: psycopg.Connection[Any], name: str) -> list[datetime]:
    return [r[0] for r in conn.execute(
        "SELECT tick FROM pgdurable.schedule_runs WHERE schedule = %s AND NOT triggered "
        "ORDER BY tick", (name,)).fetchall()]


def row(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgdurable.schedules WHERE name = %s", (name,))
    names = [d.name for d in cur.description or ()]
    r = cur.fetchone()
    assert r is not None
    return dict(zip(names, r, strict=True))


async def fire_at(ticker: Ticker, conn: psycopg.Connection[Any], when: datetime) -> None:
    set_clock(conn, when)
    await ticker.fire_due()


# -- bad input ---------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "named"), [
    ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
    ({"cron": "every day"}, "invalid cron expression"),
    ({"cron": "0 7 * * *", "timezone": "Europe/Atlantis"}, "unknown time zone 'Europe/Atlantis'"),
    ({"cron": "0 7 * * *", "every": timedelta(minutes=5)}, "exactly one of cron= and every="),
    ({}, "exactly one of cron= and every="),
    ({"every": timedelta(seconds=0)}, "every must be at least 1 second"),
    ({"every": timedelta(minutes=1), "task": "nope"}, "unknown task 'nope'"),
    ({"every": timedelta(minutes=1), "overlap": "queue"}, "overlap must be one of"),
    ({"every": timedelta(minutes=1), "catchup": "some"}, "catchup must be one of"),
    ({"every": timedelta(minutes=1), "catchup": "all", "catchup_limit": 0}, "catchup_limit"),
])
async def test_bad_input_is_a_value_error_and_writes_nothing(
        app: ClockedApp, clock: psycopg.Connection[Any], kwargs: dict[str, Any],
        named: str) -> None:
    kwargs = {"task": "tick", **kwargs}
    with pytest.raises(ValueError, match=named.replace("*", r"\*").replace("(", r"\(")):
        app.schedule("bad", **kwargs)
    assert "bad" not in declared(app)
    await declare_all(app)
    assert clock.execute("SELECT count(*) FROM pgdurable.schedules").fetchone() == (0,)


def test_bad_input_through_sql_is_refused(clock: psycopg.Connection[Any]) -> None:
    call = ("SELECT pgdurable.upsert_schedule('s', %s, %s::interval, %s, 'tick', '1', '{}', "
            "'default', 3, %s, %s, 100, pgdurable.now(), NULL)")
    for args, msg in [(("0 * * * *", None, "UTC", "queue", "latest"), "overlap"),
                      (("0 * * * *", None, "UTC", "skip", "sometimes"), "catchup"),
                      (("0 * * * *", "1 minute", "UTC", "skip", "latest"), "exactly one"),
                      (("0 * * * *", None, "Mars/Base", "skip", "latest"), "time zone")]:
        with pytest.raises(psycopg.Error, match=msg) as info:
            clock.execute(call, args)
        assert info.value.sqlstate == "PD000"
    assert clock.execute("SELECT count(*) FROM pgdurable.schedules").fetchone() == (0,)


# -- declaring ---------------------------------------------------------------------------
async def test_declared_schedules_upsert_idempotently_and_undeclared_ones_are_marked(
        dsn: str, app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    app.schedule("digest", cron="0 7 * * 1-5", timezone="Europe/Berlin", task="tick",
                 state={"to": "team"}, overlap="skip", catchup="latest")
    app.schedule("monitor", every=timedelta(minutes=10), task="tick")
    await declare_all(app)
    first = row(clock, "digest")
    # 2030-01-07 is a Monday: 07:00 Berlin (CET) is 06:00 UTC; T0 is 12:00 UTC -> next day
    assert first["next_fire_at"] == datetime(2030, 1, 8, 6, 0, tzinfo=UTC)
    assert row(clock, "monitor")["next_fire_at"] == T0 + timedelta(minutes=10)
    assert first["declared_by"] == "code" and first["state"] == {"to": "team"}
    # a later worker start declares the same: nothing changes, the cadence is kept
    set_clock(clock, T0 + timedelta(minutes=3))
    await declare_all(app)
    assert row(clock, "monitor")["next_fire_at"] == T0 + timedelta(minutes=10)
    assert row(clock, "digest")["updated_at"] == first["updated_at"]
    # a new deploy no longer declares "monitor": kept (still firing), marked undeclared
    app2 = make_app(dsn)
    app2.schedule("digest", cron="0 7 * * 1-5", timezone="Europe/Berlin", task="tick",
                  state={"to": "team"})
    try:
        await declare_all(app2)
        infos = {i.name: i for i in await list_schedules(app2)}
    finally:
        await app2.close()
    assert infos["monitor"].undeclared and not infos["monitor"].paused
    assert not infos["digest"].undeclared


async def test_changing_the_cadence_replans(app: ClockedApp, clock: psycopg.Connection[Any],
                                            dsn: str) -> None:
    app.schedule("m", every=timedelta(minutes=10), task="tick")
    await declare_all(app)
    app2 = make_app(dsn)
    app2.schedule("m", every=timedelta(minutes=30), task="tick")
    set_clock(clock, T0 + timedelta(minutes=1))
    try:
        await declare_all(app2)
    finally:
        await app2.close()
    assert row(clock, "m")["next_fire_at"] == T0 + timedelta(minutes=31)


# -- firing ------------------------------------------------------------------------------
async def test_a_tick_fires_once_and_the_run_carries_schedule_and_tick(
        app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    app.schedule("m", every=timedelta(minutes=1), task="tick", state={"k": 1})
    await declare_all(app)
    a, b = Ticker(app, ["default"]), Ticker(app, ["default"])
    await fire_at(a, clock, T0 + timedelta(seconds=30))
    assert ticks(clock, "m") == []  # not due yet
    await fire_at(a, clock, T0 + timedelta(minutes=1))
    await b.fire_due()  # a second worker at the same time: nothing left to fire
    assert ticks(clock, "m") == [T0 + timedelta(minutes=1)]
    run = clock.execute(
        "SELECT r.task, r.state, r.idempotency_key, sr.schedule, sr.tick FROM pgdurable.runs r "
        "JOIN pgdurable.schedule_runs sr ON sr.run_id = r.id").fetchall()
    assert run == [("tick", {"k": 1}, "pgdurable:schedule:m@2030-01-07T12:01:00.000000Z", "m",
                    T0 + timedelta(minutes=1))]
    info = row(clock, "m")
    assert info["next_fire_at"] == T0 + timedelta(minutes=2) and info["fired"] == 1
    assert info["last_tick"] == T0 + timedelta(minutes=1)


async def test_a_stale_plan_is_fenced_off(app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    """Two workers plan the same tick; the second call finds next_fire_at moved: no run."""
    app.schedule("m", every=timedelta(minutes=1), task="tick", overlap="allow")
    await declare_all(app)
    set_clock(clock, T0 + timedelta(minutes=1))
    fire = ("SELECT count(*) FROM pgdurable.fire_schedule('m', %s, ARRAY[%s]::timestamptz[], %s)")
    t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    assert clock.execute(fire, (t1, t1, t2)).fetchone() == (1,)
    assert clock.execute(fire, (t1, t1, t2)).fetchone() == (0,)
    # even a forged call past the fence cannot start a second run for the tick
    clock.execute("UPDATE pgdurable.schedules SET next_fire_at = %s", (t1,))
    out = clock.execute("SELECT outcome FROM pgdurable.fire_schedule('m', %s, ARRAY[%s]::timestamptz[], %s)",
                        (t1, t1, t2)).fetchall()
    assert out == [("existing",)]
    assert clock.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (1,)


@pytest.mark.parametrize("overlap", ["skip", "allow", "cancel_previous"])
async def test_overlap_policies(app: ClockedApp, clock: psycopg.Connection[Any],
                                overlap: str) -> None:
    app.schedule("h", every=timedelta(minutes=1), task="hold", overlap=overlap)
    await declare_all(app)
    t = Ticker(app, ["default"])
    await fire_at(t, clock, T0 + timedelta(minutes=1))
    await fire_at(t, clock, T0 + timedelta(minutes=2))  # the first run is still runnable
    runs = clock.execute(
        "SELECT sr.tick, r.status FROM pgdurable.schedule_runs sr JOIN pgdurable.runs r "
        "ON r.id = sr.run_id ORDER BY sr.tick").fetchall()
    t1, t2 = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    if overlap == "skip":
        assert runs == [(t1, "runnable")]
        assert row(clock, "h")["skipped"] == 1
    elif overlap == "allow":
        assert runs == [(t1, "runnable"), (t2, "runnable")]
    else:
        assert runs == [(t1, "cancelled"), (t2, "runnable")]
    assert row(clock, "h")["next_fire_at"] == T0 + timedelta(minutes=3)
    # once the previous run is over, the next tick starts a run under every policy
    clock.execute("SELECT pgdurable.cancel_run(id) FROM pgdurable.runs")
    await fire_at(t, clock, T0 + timedelta(minutes=3))
    assert T0 + timedelta(minutes=3) in ticks(clock, "h")


@pytest.mark.parametrize(("catchup", "limit", "expected"), [
    ("none", 100, []),
    ("latest", 100, [20]),
    ("all", 100, list(range(2, 21, 2))),
    ("all", 4, [14, 16, 18, 20]),
])
async def test_catchup_after_all_workers_were_down(
        app: ClockedApp, clock: psycopg.Connection[Any], catchup: str, limit: int,
        expected: list[int]) -> None:
    app.schedule("c", every=timedelta(minutes=2), task="tick", catchup=catchup,
                 catchup_limit=limit, overlap="allow")
    await declare_all(app)
    # no worker for 21.5 minutes: ticks +2 .. +20 missed (the newest 90 s late)
    await fire_at(Ticker(app, ["default"]), clock, T0 + timedelta(minutes=21, seconds=30))
    assert ticks(clock, "c") == [T0 + timedelta(minutes=m) for m in expected]
    assert row(clock, "c")["next_fire_at"] == T0 + timedelta(minutes=22)


async def test_catchup_none_still_fires_a_tick_that_is_only_a_little_late(
        app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    app.schedule("c", every=timedelta(minutes=5), task="tick", catchup="none")
    await declare_all(app)
    await fire_at(Ticker(app, ["default"]), clock, T0 + timedelta(minutes=5, seconds=20))
    assert ticks(clock, "c") == [T0 + timedelta(minutes=5)]


async def test_pause_resume_trigger(app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    app.schedule("p", every=timedelta(minutes=1), task="tick", overlap="allow")
    await declare_all(app)
    t = Ticker(app, ["default"])
    assert await pause_schedule(app, "p") is True
    assert await pause_schedule(app, "p") is False
    await fire_at(t, clock, T0 + timedelta(minutes=5, seconds=10))
    assert ticks(clock, "p") == []  # paused: nothing fires
    rid = await trigger_schedule(app, "p")  # trigger works while paused
    assert clock.execute("SELECT schedule, tick, triggered FROM pgdurable.schedule_runs "
                         "WHERE run_id = %s", (rid,)).fetchone() == (
        "p", T0 + timedelta(minutes=5, seconds=10), True)
    assert row(clock, "p")["last_run_id"] is not None
    assert await resume_schedule(app, "p") is True
    # resumed from now: the ticks that fell in the pause are not caught up
    assert row(clock, "p")["next_fire_at"] == T0 + timedelta(minutes=6, seconds=10)
    await fire_at(t, clock, T0 + timedelta(minutes=6, seconds=10))
    assert ticks(clock, "p") == [T0 + timedelta(minutes=6, seconds=10)]
    for op in (pause_schedule, resume_schedule, trigger_schedule):
        with pytest.raises(ScheduleNotFound, match="no schedule nope"):
            await op(app, "nope")


async def test_an_unplannable_schedule_is_paused_with_its_error(
        app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    clock.execute("SELECT pgdurable.upsert_schedule('bad', '0 25 * * *', NULL, 'UTC', 'tick', "
                  "'1', '{}', 'default', 3, 'skip', 'latest', 100, %s, NULL)", (T0,))
    await fire_at(Ticker(app, ["default"]), clock, T0)
    r = row(clock, "bad")
    assert r["paused"] and "invalid cron expression" in r["last_error"]


def test_sql_bad_argument_to_fire_changes_nothing(clock: psycopg.Connection[Any]) -> None:
    clock.execute("SELECT pgdurable.upsert_schedule('m', NULL, '1 minute', 'UTC', 'tick', '1', "
                  "'{}', 'default', 3, 'skip', 'latest', 100, %s, NULL)", (T0,))
    with pytest.raises(psycopg.Error, match="is not a due tick") as info:  # a future tick
        clock.execute("SELECT * FROM pgdurable.fire_schedule('m', %s, ARRAY[%s]::timestamptz[], %s)",
                      (T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)))
    assert info.value.sqlstate == InvalidInput.sqlstate
    assert clock.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)


# -- daylight saving time ------------------------------------------------------------------
def _utc(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


# (zone, cron, start UTC, minutes per worker wake-up, wake-ups, expected ticks UTC)
DST_CASES = {
    # Berlin springs forward 2030-03-31 01:00 UTC: 02:00 CET -> 03:00 CEST (no 02:xx).
    # 02:00 and 02:30 map to 03:00 and 03:30 CEST, which are ticks anyway: once each
    "berlin-spring": ("Europe/Berlin", "*/30 * * * *", "2030-03-30 23:50", 10, 14,
                      ["2030-03-31 00:00", "2030-03-31 00:30", "2030-03-31 01:00",
                       "2030-03-31 01:30", "2030-03-31 02:00"]),
    # Berlin falls back 2030-10-27 01:00 UTC: 03:00 CEST -> 02:00 CET (02:xx twice):
    # 02:00 and 02:30 fire in CEST only (00:00, 00:30 UTC), not again in CET
    "berlin-fall": ("Europe/Berlin", "*/30 * * * *", "2030-10-26 23:50", 10, 20,
                    ["2030-10-27 00:00", "2030-10-27 00:30", "2030-10-27 02:00",
                     "2030-10-27 02:30", "2030-10-27 03:00"]),
    # New York springs forward 2030-03-10 07:00 UTC: 02:00 EST -> 03:00 EDT
    "newyork-spring": ("America/New_York", "*/30 * * * *", "2030-03-10 06:50", 10, 14,
                       ["2030-03-10 07:00", "2030-03-10 07:30", "2030-03-10 08:00",
                        "2030-03-10 08:30", "2030-03-10 09:00"]),
    # New York falls back 2030-11-03 06:00 UTC: 02:00 EDT -> 01:00 EST (01:xx twice)
    "newyork-fall": ("America/New_York", "*/30 * * * *", "2030-11-03 04:50", 10, 20,
                     ["2030-11-03 05:00", "2030-11-03 05:30", "2030-11-03 07:00",
                      "2030-11-03 07:30", "2030-11-03 08:00"]),
    # a daily 02:30 job on the day 02:xx is skipped fires once, at 03:30 CEST
    "berlin-daily-in-gap": ("Europe/Berlin", "30 2 * * *", "2030-03-30 00:00", 30, 144,
                            ["2030-03-30 01:30", "2030-03-31 01:30", "2030-04-01 00:30"]),
    # a daily 01:30 job on the day 01:xx repeats fires once, in EDT
    "newyork-daily-in-repeat": ("America/New_York", "30 1 * * *", "2030-11-02 00:00", 30,
                                144, ["2030-11-02 05:30", "2030-11-03 05:30",
                                      "2030-11-04 06:30"]),
}


@pytest.mark.parametrize("case", list(DST_CASES))
async def test_daylight_saving_transitions(app: ClockedApp, clock: psycopg.Connection[Any],
                                           case: str) -> None:
    zone, cron, start, step, steps, expected = DST_CASES[case]
    begin = _utc(start)
    set_clock(clock, begin)
    app.schedule("dst", cron=cron, timezone=zone, task="tick", overlap="allow")
    await declare_all(app)
    t = Ticker(app, ["default"])
    # a worker that is up the whole time, waking every `step` minutes
    for i in range(1, steps + 1):
        await fire_at(t, clock, begin + timedelta(minutes=step * i))
    assert ticks(clock, "dst") == [_utc(s) for s in expected]


def test_cadence_dst_rules_directly() -> None:
    """The same rules, without the database (fast, exact): every tick instant is
    distinct, gap wall times shift by one hour, repeated wall times fire once."""
    c = Cadence.of(cron="30 2 * * *", timezone="Europe/Berlin")
    t, got = _utc("2030-03-29 12:00"), []
    for _ in range(3):
        t = c.after(t)
        got.append(t)
    assert got == [_utc("2030-03-30 01:30"), _utc("2030-03-31 01:30"), _utc("2030-04-01 00:30")]
    c = Cadence.of(cron="0 * * * *", timezone="America/New_York")
    t, got = _utc("2030-11-03 03:30"), []
    for _ in range(4):
        t = c.after(t)
        got.append(t)
    # 00:00 EDT, 01:00 EDT, (01:00 EST skipped), 02:00 EST, 03:00 EST
    assert got == [_utc("2030-11-03 04:00"), _utc("2030-11-03 05:00"),
                   _utc("2030-11-03 07:00"), _utc("2030-11-03 08:00")]


# -- the worker sleeps until the next tick -------------------------------------------------
async def test_an_idle_worker_wakes_for_the_next_tick_without_polling(dsn: str) -> None:
    """Real clock; the worker's poll interval is an hour, so only the tick being part
    of its next wake-up can make it fire (the upsert's NOTIFY wakes it once)."""
    app = Durable(dsn)

    @app.task("tick", revision="1")
    async def tick(ctx: Any, state: Any) -> Any:
        return Done(None)

    app.schedule("fast", every=timedelta(seconds=1), task="tick", overlap="allow")
    try:
        async with app_running(app, poll_interval=3600):
            async def two() -> bool:
                r = await app.fetchone("SELECT count(*) FROM pgdurable.schedule_runs", ())
                return r is not None and r[0] >= 2
            await until(two, "two ticks of a 1 s schedule")
    finally:
        await app.close()


def test_schedule_wakeup_is_null_without_a_live_schedule(clock: psycopg.Connection[Any]) -> None:
    """No schedule (or only paused ones) must not read as "due now" (an idle worker would spin)."""
    wakeup = "SELECT pgdurable.schedule_wakeup('{default}')"
    assert clock.execute(wakeup).fetchone() == (None,)
    clock.execute("SELECT pgdurable.upsert_schedule('m', NULL, '1 hour', 'UTC', 'tick', '1', "
                  "'{}', 'default', 3, 'skip', 'latest', 100, %s, NULL)",
                  (T0 + timedelta(minutes=30),))
    assert clock.execute(wakeup).fetchone() == (1800.0,)
    assert clock.execute("SELECT pgdurable.schedule_wakeup('{other}')").fetchone() == (None,)
    clock.execute("SELECT pgdurable.pause_schedule('m')")
    assert clock.execute(wakeup).fetchone() == (None,)


async def test_a_failing_fire_backs_off_instead_of_spinning(
        app: ClockedApp, clock: psycopg.Connection[Any]) -> None:
    app.schedule("m", every=timedelta(minutes=1), task="tick")
    await declare_all(app)
    clock.execute("""
      CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'refused by test'; END $$;
      CREATE TRIGGER refuse BEFORE INSERT ON pgdurable.schedule_runs
        FOR EACH ROW EXECUTE FUNCTION test_refuse()""")
    t = Ticker(app, ["default"])
    set_clock(clock, T0 + timedelta(minutes=1))
    t.note(0.0)
    await t.fire_if_due()
    assert t.fire_count == 1
    assert clock.execute("SELECT count(*) FROM pgdurable.runs").fetchone() == (0,)  # rolled back
    # the tick is still due, but the ticker waits ERROR_BACKOFF before trying again
    t.note(0.0)
    await t.fire_if_due()
    assert t.fire_count == 1
    assert t.timeout(3600.0) > 1.0
    clock.execute("DROP TRIGGER refuse ON pgdurable.schedule_runs")
    await t.fire_due()
    assert ticks(clock, "m") == [T0 + timedelta(minutes=1)]


async def test_a_worker_with_every_slot_busy_still_fires_ticks(dsn: str) -> None:
    app = Durable(dsn)
    release = asyncio.Event()

    @app.task("block", revision="1")
    async def block(ctx: Any, state: Any) -> Any:
        await release.wait()
        return Done(None)

    @app.task("tick", revision="1")
    async def tick(ctx: Any, state: Any) -> Any:
        return Done(None)

    app.schedule("fast", every=timedelta(seconds=1), task="tick", overlap="allow")
    try:
        blocker = await app.start("block")
        async with app_running(app, concurrency=1, poll_interval=3600) as worker:
            async def busy() -> bool:
                return worker.active_runs == [blocker]
            await until(busy, "the only slot to be taken")

            async def two() -> bool:
                r = await app.fetchone("SELECT count(*) FROM pgdurable.schedule_runs", ())
                return r is not None and r[0] >= 2
            await until(two, "two ticks while the worker's only slot is busy")
            assert worker.active_runs == [blocker]
            release.set()
    finally:
        await app.close()
