"""Affinity in SQL (the affinity migration, sql/*_run_affinity.sql): a ready
run pinned to a present worker is reserved for it for its wait, then anybody's;
the holder's presence lapsing, a clean stop or a restart frees it at once; the
claim and next_wakeup apply the same rule; expired leases are never reserved.
The database clock is moved with SET LOCAL pgdurable.now (boundary pairs: 1 s
either side).

The real processes (a worker SIGKILLed while it holds a run's service, the
holder alive under several workers) are in tests/test_affinity_procs.py.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _scans import scans, scans_since
from _waiting import app_running, finished
from typer.testing import CliRunner

import pgdurable
from pgdurable import (
    Affinity,
    Continue,
    Done,
    Durable,
    InvalidInput,
    LeaseLost,
    RunContext,
    RunNotFound,
)
from pgdurable.foundation.affinity import PIN as PIN_SQL
from pgdurable.foundation.errors import translate
from pgdurable.ops import cli as cli_module

START = ("SELECT run_id FROM pgdurable.start_run('t', '1', '{}', %s, 0, 3, NULL, NULL, NULL, "
         "NULL)")
CLAIM = ("SELECT id, lease_token, wake, affinity FROM pgdurable.claim_runs(%s, ARRAY[%s], "
         "ARRAY['t'], ARRAY['1'], 10, interval '60 s')")
PIN = "SELECT pgdurable.pin_run(%s, %s, %s, %s, %s, %s::interval, %s::jsonb)"
PRESENT = "SELECT pgdurable.worker_present(%s, %s, %s::interval)"
WAKEUP = "SELECT pgdurable.next_wakeup(ARRAY[%s], ARRAY['t'], ARRAY['1'], %s)"


def sql(conn: psycopg.Connection[Any], query: str, *params: Any) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        raise translate(exc) from exc


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    rows = sql(conn, query, *params)
    assert len(rows) == 1
    return rows[0][0] if len(rows[0]) == 1 else rows[0]


def claim(conn: psycopg.Connection[Any], owner: str, queue: str = "default") -> list[Any]:
    return sql(conn, CLAIM, owner, queue)


@contextmanager
def at(conn: psycopg.Connection[Any], offset: float) -> Iterator[None]:
    """The database clock ``offset`` seconds from now, for one transaction."""
    with conn.transaction():
        conn.execute("SELECT set_config('pgdurable.now', %s, true)",
                     ((datetime.now(UTC) + timedelta(seconds=offset)).isoformat(),))
        yield


def pinned_run(conn: psycopg.Connection[Any], *, mode: str = "soft", wait: str = "10 s",
               holder: str = "A", instance: str = "a1", ttl: str = "60 s",
               queue: str = "default", info: str | None = '{"service": "browser"}') -> Any:
    """A run claimed by ``holder`` (present for ``ttl``), pinned, and given back:
    runnable, ready now, reserved for ``holder``."""
    one(conn, PRESENT, holder, instance, ttl)
    rid = one(conn, START, queue)
    (row,) = claim(conn, holder, queue)
    assert row[0] == rid and row[3] is None
    record = one(conn, PIN, rid, row[1], holder, instance, mode, wait, info)
    assert record["worker"] == holder and record["instance"] == instance
    assert one(conn, "SELECT pgdurable.release_run(%s, %s, %s)", rid, row[1], holder) == "runnable"
    return rid


def test_pin_is_fenced_and_checked(conn: psycopg.Connection[Any]) -> None:
    one(conn, PRESENT, "A", "a1", "60 s")
    rid = one(conn, START, "default")
    (row,) = claim(conn, "A")
    token = row[1]
    before = sql(conn, "SELECT * FROM pgdurable.runs WHERE id = %s", rid)
    for mode, wait, info in [("sticky", "5 s", None), ("soft", "0 s", None),
                             ("soft", "-1 s", None), ("hard", "2 days", None),
                             ("soft", None, None), ("soft", "5 s", "[1]"),
                             ("soft", "5 s", '{"x": "%s"}' % ("y" * 9000))]:
        with pytest.raises(InvalidInput):
            sql(conn, PIN, rid, token, "A", "a1", mode, wait, info)
    with pytest.raises(InvalidInput):
        sql(conn, PIN, rid, token, "A", "", "soft", "5 s", None)
    with pytest.raises(LeaseLost):
        sql(conn, PIN, rid, token + 1, "A", "a1", "soft", "5 s", None)
    with pytest.raises(LeaseLost):
        sql(conn, PIN, rid, token, "B", "b1", "soft", "5 s", None)
    assert sql(conn, "SELECT * FROM pgdurable.runs WHERE id = %s", rid) == before  # unchanged
    record = one(conn, PIN, rid, token, "A", "a1", "hard", "90 s", '{"service": "shell"}')
    assert {k: record[k] for k in ("worker", "instance", "mode", "wait", "info")} == {
        "worker": "A", "instance": "a1", "mode": "hard", "wait": 90, "info": {"service": "shell"}}
    # unpin: mode NULL clears it all
    assert one(conn, PIN, rid, token, "A", None, None, None, None) is None
    assert one(conn, "SELECT row(affinity_worker, affinity_instance, affinity_mode, "
               "affinity_wait, affinity_info, affinity_since) IS NULL FROM pgdurable.runs "
               "WHERE id = %s", rid) is True


def test_a_ready_run_waits_for_its_holder_for_its_wait(conn: psycopg.Connection[Any]) -> None:
    rid = pinned_run(conn, wait="10 s")
    assert claim(conn, "B") == []
    with at(conn, 9):
        assert claim(conn, "B") == []
    with at(conn, 11):
        (row,) = claim(conn, "B")
    assert row[0] == rid
    # the affinity is kept (it names A): the step on B sees its service lost
    assert row[3]["worker"] == "A" and row[3]["instance"] == "a1"
    assert row[3]["info"] == {"service": "browser"} and row[3]["mode"] == "soft"


def test_the_holder_claims_its_run_at_once(conn: psycopg.Connection[Any]) -> None:
    rid = pinned_run(conn, mode="hard", wait="1 hour")
    assert claim(conn, "B") == []
    (row,) = claim(conn, "A")
    assert row[0] == rid and row[1] == 2 and row[3]["mode"] == "hard"


def test_a_lapsed_presence_frees_the_run(conn: psycopg.Connection[Any]) -> None:
    """A SIGKILLed holder renews nothing: once its presence lapses (its lease
    TTL after its last renewal) anybody may take a hard-pinned run."""
    rid = pinned_run(conn, mode="hard", wait="1 hour", ttl="30 s")
    with at(conn, 29):
        assert claim(conn, "B") == []
    with at(conn, 31):
        (row,) = claim(conn, "B")
    assert row[0] == rid


def test_a_clean_stop_frees_the_run_at_once_and_wakes_its_queue(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    rid = pinned_run(conn, mode="hard", wait="1 hour", queue="browsers")
    with psycopg.connect(dsn, autocommit=True) as ear:
        ear.execute("LISTEN pgdurable_wake")
        assert one(conn, "SELECT pgdurable.worker_absent('A', 'other', '{browsers}')") is False
        assert claim(conn, "B", "browsers") == []
        assert one(conn, "SELECT pgdurable.worker_absent('A', 'a1', "
                   "'{browsers,browsers,default}')") is True
        assert sorted(n.payload for n in ear.notifies(timeout=1.0, stop_after=2)) == [
            "browsers", "default"]
    (row,) = claim(conn, "B", "browsers")
    assert row[0] == rid


def test_a_restart_under_the_same_id_is_another_instance(conn: psycopg.Connection[Any]) -> None:
    rid = pinned_run(conn, mode="hard", wait="1 hour")
    assert one(conn, PRESENT, "A", "a1", "60 s") is not None  # a renewal: still reserved
    assert claim(conn, "B") == []
    one(conn, PRESENT, "A", "a2", "60 s")  # A restarted: a2 holds no service of a1
    assert one(conn, WAKEUP, "default", "B") == 0
    (row,) = claim(conn, "B")
    assert row[0] == rid and row[3]["instance"] == "a1"


def test_a_due_timer_is_reserved_like_a_runnable_run(conn: psycopg.Connection[Any]) -> None:
    one(conn, PRESENT, "A", "a1", "1 hour")
    rid = one(conn, START, "default")
    ((_, token, _, _),) = claim(conn, "A")
    one(conn, PIN, rid, token, "A", "a1", "soft", "10 s", None)
    assert one(conn, "SELECT status FROM pgdurable.park_run(%s, %s, 'A', '{}', 0, NULL, NULL, "
               "NULL, interval '5 s')", rid, token) == "waiting"
    with at(conn, 14):
        assert claim(conn, "B") == []
    with at(conn, 16):
        (row,) = claim(conn, "B")
    assert row[0] == rid and row[2]["type"] == "timeout"
    # ... and the holder takes its own timer when due
    one(conn, PIN, rid, row[1], "B", "b1", "soft", "10 s", None)
    one(conn, PRESENT, "B", "b1", "1 hour")
    one(conn, "SELECT status FROM pgdurable.park_run(%s, %s, 'B', '{}', 0, NULL, NULL, NULL, "
        "interval '5 s')", rid, row[1])
    with at(conn, 6):
        assert claim(conn, "A") == []
        (row,) = claim(conn, "B")
    assert row[0] == rid


def test_next_wakeup_says_when_the_reservation_ends(conn: psycopg.Connection[Any]) -> None:
    """Workers that may not take a reserved run sleep until its reservation
    ends (no busy claim loop); the holder sees it due at once."""
    pinned_run(conn, wait="10 s", ttl="60 s")
    assert 9 < one(conn, WAKEUP, "default", "B") <= 10
    assert 9 < one(conn, WAKEUP, "default", None) <= 10
    assert one(conn, WAKEUP, "default", "A") == 0
    # the holder's presence lapses first: that is when the others look again
    conn.execute("UPDATE pgdurable.worker_presence SET until = pgdurable.now() + interval '3 s'")
    assert 2 < one(conn, WAKEUP, "default", "B") <= 3
    conn.execute("UPDATE pgdurable.worker_presence SET until = pgdurable.now() - interval '1 s'")
    assert one(conn, WAKEUP, "default", "B") == 0
    assert len(claim(conn, "B")) == 1


def test_an_expired_lease_is_never_reserved(conn: psycopg.Connection[Any]) -> None:
    one(conn, PRESENT, "A", "a1", "1 hour")
    rid = one(conn, START, "default")
    ((_, token, _, _),) = claim(conn, "A")
    one(conn, PIN, rid, token, "A", "a1", "hard", "1 hour", None)
    with at(conn, 61):  # A stalled: its lease lapsed though its presence did not
        (row,) = claim(conn, "B")
    assert row[0] == rid and row[1] == token + 1


def test_an_unpinned_run_goes_to_anybody(conn: psycopg.Connection[Any]) -> None:
    rid = pinned_run(conn, mode="hard", wait="1 hour")
    ((_, token, _, _),) = claim(conn, "A")
    one(conn, PIN, rid, token, "A", None, None, None, None)
    one(conn, "SELECT pgdurable.release_run(%s, %s, 'A')", rid, token)
    (row,) = claim(conn, "B")
    assert row[0] == rid and row[3] is None


def test_a_limited_queue_honours_affinity(conn: psycopg.Connection[Any]) -> None:
    """Flow-limited queues are claimed by _claim_flow: the same rule."""
    conn.execute("INSERT INTO pgdurable.queues (name, concurrency) VALUES ('limited', 5)")
    rid = pinned_run(conn, wait="10 s", queue="limited")
    plain = one(conn, START, "limited")
    (row,) = claim(conn, "B", "limited")
    assert row[0] == plain
    assert 9 < one(conn, WAKEUP, "limited", "B") <= 10
    with at(conn, 11):
        (row,) = claim(conn, "B", "limited")
    assert row[0] == rid and row[3]["worker"] == "A"


def test_the_claim_reads_runs_through_indexes_with_affine_runs(
    conn: psycopg.Connection[Any]
) -> None:
    """PITFALLS #10 with affinity: many parked and finished runs, reserved
    runnable runs ahead of the plain ones, reserved timers: the claim and the
    idle poll still read runs only through its partial indexes."""
    one(conn, PRESENT, "A", "a1", "1 hour")
    conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, status, finished_at)
      SELECT 't', '1', 'completed', now() FROM generate_series(1, 20000);
      INSERT INTO pgdurable.runs (task, revision, status, wait_kind, wait_ref, wake_at,
                                  affinity_worker, affinity_instance, affinity_mode,
                                  affinity_wait)
      SELECT 't', '1', 'waiting', 'ci', g::text, now() + interval '1 day', 'A', 'a1', 'hard',
             interval '1 hour' FROM generate_series(1, 5000) g;
      INSERT INTO pgdurable.runs (task, revision, priority, affinity_worker, affinity_instance,
                                  affinity_mode, affinity_wait)
      SELECT 't', '1', 1, 'A', 'a1', 'hard', interval '1 hour' FROM generate_series(1, 20);
      INSERT INTO pgdurable.runs (task, revision) SELECT 't', '1' FROM generate_series(1, 50);
      ANALYZE pgdurable.runs;
    """)
    with conn.transaction():
        before = scans(conn)
        rows = sql(conn, "SELECT id, affinity FROM pgdurable.claim_runs('B', '{default}', '{t}', "
                   "'{1}', 5, '60 s')")
        seq, used = scans_since(conn, before)
    assert len(rows) == 5 and all(r[1] is None for r in rows)  # the reserved 20 skipped
    assert "runs" not in seq, seq
    assert used >= {"runs_runnable_idx", "runs_leased_idx", "runs_timer_idx"}, used
    with conn.transaction():
        before = scans(conn)
        sql(conn, WAKEUP, "default", "B")
        seq, used = scans_since(conn, before)
    assert "runs" not in seq, seq
    (mine,) = sql(conn, "SELECT count(*) FROM pgdurable.claim_runs('A', '{default}', '{t}', "
                  "'{1}', 30, '60 s') WHERE affinity IS NOT NULL")
    assert mine == (20,)


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)

    @a.task("t", revision="1")
    async def t(ctx: RunContext, state: Any) -> Any:
        return Done(state)

    await a.open()
    yield a
    await a.close()


async def test_a_run_started_with_the_affinity_of_another(
    app: Durable, conn: psycopg.Connection[Any], dsn: str
) -> None:
    """start(affinity_of=...) copies that run's affinity in the start's own
    statement; get_run shows it; an unknown run starts nothing."""
    first = pinned_run(conn, mode="hard", wait="2 min", info='{"sandbox": "s-1"}')
    info = (await app.get_run(first)).affinity
    assert isinstance(info, Affinity)
    assert (info.worker, info.instance, info.mode, info.wait, info.info) == (
        "A", "a1", "hard", 120.0, {"sandbox": "s-1"})
    follow = await app.start("t", {"n": 2}, affinity_of=first, metadata={"turn": 2},
                             idempotency_key="turn-2")
    got = (await app.get_run(follow)).affinity
    assert got is not None and (got.worker, got.instance, got.mode, got.wait, got.info) == (
        "A", "a1", "hard", 120.0, {"sandbox": "s-1"})
    # composed with the other start options (metadata) in the same statement
    assert one(conn, "SELECT metadata FROM pgdurable.runs WHERE id = %s", follow) == {"turn": 2}
    # an idempotent repeat finds the run: nothing changes
    plain = await app.start("t", {}, idempotency_key="plain")
    assert await app.start("t", {}, idempotency_key="plain", affinity_of=first) == plain
    assert (await app.get_run(plain)).affinity is None
    before = one(conn, "SELECT count(*) FROM pgdurable.runs")
    with pytest.raises(RunNotFound):
        await app.start("t", {}, affinity_of=uuid.uuid4())
    with pytest.raises(ValueError):
        await app.start("t", {}, affinity_of="not-a-run-id")
    assert one(conn, "SELECT count(*) FROM pgdurable.runs") == before
    # the sync client too
    with pgdurable.DurableClient(dsn) as client:
        synced = client.get_run(client.start("t", {}, revision="1", affinity_of=first)).affinity
    assert synced is not None and (synced.worker, synced.mode, synced.info) == (
        "A", "hard", {"sandbox": "s-1"})
    # B may not take the follow-ups yet (A is present): only the plain run; A takes them
    assert [str(r[0]) for r in claim(conn, "B")] == [plain]
    assert follow in {str(r[0]) for r in claim(conn, "A")}


async def test_a_step_pins_unpins_and_starts_a_child_where_its_service_is(
    app: Durable, conn: psycopg.Connection[Any]
) -> None:
    """The step API in a worker: pin (checked, written once), the affinity kept
    across the steps of a lease, unpin; a child started with affinity_of the
    pinned run; the worker's presence written from its first pin, removed when
    it stops."""
    seen: list[Any] = []

    @app.task("pinning", revision="1")
    async def pinning(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            assert ctx.affinity is None and not ctx.service_lost
            for bad in ({"mode": "sticky"}, {"mode": "soft", "wait": 0},
                        {"mode": "hard", "wait": 86_401}, {"mode": "soft", "info": [1]}):
                with pytest.raises((TypeError, ValueError)):
                    await ctx.pin(**bad)
            got = await ctx.pin("hard", wait=timedelta(seconds=30), info={"service": "shell"})
            again = await ctx.pin("hard", wait=30.0, info={"service": "shell"})  # no write
            seen.append((got, again, ctx.service_lost, one(
                conn, "SELECT count(*) FROM pgdurable.worker_presence")))
            child = await ctx.start_child("t", {}, key="c", affinity_of=ctx.run_id)
            return Continue({"child": child})
        seen.append((ctx.affinity, ctx.service_lost))
        await ctx.unpin()
        await ctx.unpin()  # nothing to clear: no write
        return Done(ctx.affinity)

    pins: list[tuple[Any, ...]] = []
    orig = app.fetchone

    async def spy(sql_text: str, params: tuple[Any, ...], **kw: Any) -> Any:
        if sql_text == PIN_SQL:
            pins.append(params)
        return await orig(sql_text, params, **kw)

    app.fetchone = spy  # type: ignore[method-assign]
    async with app_running(app) as worker:
        rid = await app.start("pinning", {})
        info = await finished(app, rid)
    assert info.status == "completed" and info.result is None and info.affinity is None
    (got, again, lost, present), (kept, lost_later) = seen
    assert isinstance(got, Affinity) and got is again and not lost and present == 1
    assert (got.worker, got.instance, got.mode, got.wait, got.info) == (
        worker.worker_id, worker.instance, "hard", 30.0, {"service": "shell"})
    assert kept == got and not lost_later
    assert [p[4] for p in pins] == ["hard", None]  # one pin, one unpin
    child = await app.get_run(info.state["child"])
    assert child.affinity is not None and child.affinity.worker == worker.worker_id
    assert one(conn, "SELECT count(*) FROM pgdurable.worker_presence") == 0  # withdrawn


async def test_a_sync_step_pins_with_pin_sync(app: Durable) -> None:
    @app.task("sync_pin", revision="1")
    def sync_pin(ctx: RunContext, state: Any) -> Any:
        got = ctx.pin_sync("soft", wait=2)
        lost = ctx.service_lost
        ctx.unpin_sync()
        return Done({"mode": got.mode, "wait": got.wait, "lost": lost,
                     "after": ctx.affinity is None})

    async with app_running(app):
        info = await finished(app, await app.start("sync_pin", {}))
    assert info.result == {"mode": "soft", "wait": 2.0, "lost": False, "after": True}


def test_pgdurable_run_shows_the_affinity(conn: psycopg.Connection[Any], dsn: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_module.out, "width", 250)
    rid = pinned_run(conn, mode="hard", wait="2 min")
    r = CliRunner().invoke(cli_module.app, ["run", str(rid), "--dsn", dsn], catch_exceptions=False)
    assert r.exit_code == 0
    assert "hard to worker A (wait 00:02:00)" in r.stdout and '"service": "browser"' in r.stdout


def test_the_claim_is_costed_as_before_and_not_jit_compiled(conn: psycopg.Connection[Any]) -> None:
    """The affinity filter must not change what the planner thinks the claim
    costs: a probe of worker_presence costed per candidate row pushed the
    generic plan of the timer branch past jit_above_cost, and every claim was
    JIT-compiled (~50 ms each at 75,000 parked timers). Here, at 20,000 timers
    and jit_above_cost 20,000 (the claim without affinity costs ~4,000 there),
    no nested statement of the claim or of next_wakeup may be JIT-compiled."""
    if not one(conn, "SELECT pg_jit_available()"):
        pytest.skip("JIT is not available on this server")
    conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, status, wait_since, wake_at)
      SELECT 't', '1', 'waiting', now(), now() + interval '1 day' + g * interval '1 ms'
        FROM generate_series(1, 20000) g;
      INSERT INTO pgdurable.runs (task, revision) SELECT 't', '1' FROM generate_series(1, 20);
      ANALYZE pgdurable.runs;
    """)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice", "client_min_messages = notice",
                    "jit = on", "jit_above_cost = 20000"):
        conn.execute("SET " + setting)
    for _ in range(3):
        claim(conn, "B")
        one(conn, WAKEUP, "default", "B")
    assert len(notices) > 6
    jitted = [n for n in notices if "JIT:" in n]
    assert not jitted, jitted[0]


def test_next_wakeup_walks_the_timers_in_order(conn: psycopg.Connection[Any]) -> None:
    """The idle poll finds the first timer this worker may take by walking
    runs_timer_idx in wake_at order; the timers it passed over (reserved for
    another present worker) count when their reservations end."""
    one(conn, PRESENT, "A", "a1", "1 hour")
    conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, status, wait_since, wake_at)
      SELECT 't', '1', 'waiting', now(), now() + interval '100 s' FROM generate_series(1, 3);
      INSERT INTO pgdurable.runs (task, revision, status, wait_since, wake_at, affinity_worker,
                                  affinity_instance, affinity_mode, affinity_wait)
      VALUES ('t', '1', 'waiting', now(), now() + interval '10 s', 'A', 'a1', 'hard', '30 s'),
             ('t', '1', 'waiting', now(), now() + interval '20 s', 'A', 'a1', 'soft', '200 s'),
             ('t', '1', 'waiting', now(), now() + interval '50 s', 'gone', 'g1', 'hard', '1 day');
    """)
    assert 9 < one(conn, WAKEUP, "default", "A") <= 10  # its own timer, at once
    assert 39 < one(conn, WAKEUP, "default", "B") <= 40  # A's 10 s timer + its 30 s wait
    conn.execute("UPDATE pgdurable.runs SET wake_at = wake_at + interval '60 s' "
                 "WHERE affinity_mode = 'hard' AND affinity_worker = 'A'")
    assert 49 < one(conn, WAKEUP, "default", "B") <= 50  # the absent holder's: at its time
    conn.execute("DELETE FROM pgdurable.runs WHERE affinity_worker = 'gone'")
    assert 99 < one(conn, WAKEUP, "default", "B") <= 100  # A's timer at 70 s + 30, the plain
    conn.execute("UPDATE pgdurable.worker_presence SET until = pgdurable.now() + interval '5 s'")
    assert 19 < one(conn, WAKEUP, "default", "B") <= 20  # A lapses in 5 s: its 20 s timer is B's


def test_presence_is_matched_by_worker_and_instance_exactly(conn: psycopg.Connection[Any]) -> None:
    """A present worker whose id and instance, run together, spell another
    pair's does not hold that pair's runs."""
    one(conn, PRESENT, "x\x1fy", "z", "1 hour")
    one(conn, PRESENT, 'w,"', "i", "1 hour")
    conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, affinity_worker, affinity_instance, affinity_mode,
                                  affinity_wait)
      VALUES ('t', '1', 'x', E'y\\x1fz', 'hard', '1 hour'), ('t', '1', 'w', '",i', 'hard', '1 hour'),
             ('t', '1', 'w,"', 'i', 'hard', '1 hour')""")
    rows = claim(conn, "B")
    assert sorted(r[3]["worker"] for r in rows) == ["w", "x"]  # not the present w," 's


def test_affine_started_run_gives_affinity_only_to_a_run_its_transaction_inserted(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    """As tag_started_run (0029): retry + cancel touch an existing run in the
    caller's transaction; that run must not be pinned by the start helper."""
    first = pinned_run(conn, mode="hard", wait="1 hour")
    victim = one(conn, START, "default")
    conn.execute("SELECT pgdurable.cancel_run(%s)", (victim,))
    with psycopg.connect(dsn) as c:
        c.execute("SELECT pgdurable.retry_run(%s)", (victim,))
        c.execute("SELECT pgdurable.cancel_run(%s)", (victim,))
        c.execute("SELECT pgdurable.affine_started_run(%s, %s)", (victim, first))
        mine = c.execute(START, ("default",)).fetchone()
        assert mine is not None
        c.execute("SELECT pgdurable.affine_started_run(%s, %s)", (mine[0], first))
        c.commit()
    pinned = dict(conn.execute("SELECT id, affinity_worker FROM pgdurable.runs WHERE id = ANY (%s)",
                               ([victim, mine[0]],)).fetchall())
    assert pinned == {victim: None, mine[0]: "A"}
