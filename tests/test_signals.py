"""The waiting boundary (issue 5): signals, dedup, run-addressed signals,
signal-vs-park and signal-vs-timeout races, replayed wake outcomes, timers,
the waiting_runs view, and signals sent from other processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, finished, running, until

from pgdurable import (
    Done,
    Durable,
    DurableClient,
    InvalidInput,
    RunContext,
    RunNotFound,
    SignalConflict,
    Sleep,
    Wait,
)
from pgdurable.foundation.errors import translate
from pgdurable.foundation.signals import MAX_SIGNAL_TTL, parse_payload

BASE = datetime(2030, 1, 1, tzinfo=UTC)


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
    return [r[0] for r in rows]


def park(conn: psycopg.Connection[Any], rid: uuid.UUID, kind: str | None, ref: str | None,
         wake_in: str | None = None, wake_at: datetime | None = None, token: int = 1) -> str:
    rows = sql(conn, "SELECT status FROM pgdurable.park_run(%s, %s, 'w', '{}', 0, %s, %s, "
               "%s, %s::interval)", rid, token, kind, ref, wake_at, wake_in)
    return str(rows[0][0])


def send(conn: psycopg.Connection[Any], kind: str, ref: str, payload: Any = None,
         signal_id: str | None = None) -> list[uuid.UUID]:
    rows = sql(conn, "SELECT pgdurable.send_signal(%s, %s, %s::jsonb, %s, NULL)",
               kind, ref, json.dumps(payload), signal_id)
    return [r[0] for r in rows]


def claim(conn: psycopg.Connection[Any], n: int = 100, ttl: str = "1 hour",
          queue: str = "default") -> list[tuple[Any, ...]]:
    return sql(conn, "SELECT id, status, lease_token, wake FROM pgdurable.claim_runs("
               "'w', %s, ARRAY['t'], ARRAY['1'], %s, %s::interval)", [queue], n, ttl)


def at(conn: psycopg.Connection[Any], when: datetime, fn: Callable[[], Any]) -> Any:
    """Run fn in one transaction whose pgdurable.now() is ``when``."""
    with conn.transaction():
        conn.execute("SELECT set_config('pgdurable.now', %s, true)", (when.isoformat(),))
        return fn()


def count(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    return int(sql(conn, f"SELECT count(*) FROM pgdurable.{table} WHERE {where}")[0][0])


def wait_for_lock_wait(conn: psycopg.Connection[Any], pid: int) -> None:
    """Block until backend ``pid`` waits on a lock (deterministic interleaving)."""
    end = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < end:
        row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                           (pid,)).fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.005)
    raise AssertionError(f"backend {pid} never waited on a lock")


# -- R3: signal before / after / racing park -------------------------------------


def test_r3_signal_racing_park_1000_times(dsn: str, conn: psycopg.Connection[Any]) -> None:
    n = 1000
    ids = seed_leased(conn, n)
    barrier = threading.Barrier(2)
    woke: dict[int, list[uuid.UUID]] = {}
    parked: dict[int, str] = {}
    errors: list[BaseException] = []

    def parker() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i, rid in enumerate(ids):
                    barrier.wait()
                    parked[i] = park(c, rid, "r3", f"ref-{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    def signaller() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i in range(n):
                    barrier.wait()
                    woke[i] = send(c, "r3", f"ref-{i}", {"i": i})
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=parker), threading.Thread(target=signaller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    by_signal = by_park = 0
    for i, rid in enumerate(ids):
        if woke[i] == [rid]:
            assert parked[i] == "waiting"  # parked first, the signal woke it
            by_signal += 1
        else:
            assert woke[i] == [] and parked[i] == "runnable"  # park consumed it
            by_park += 1
    print(f"R3 race: {by_signal} woken by the signal, {by_park} consumed at park")
    # never lost: nobody waits; never twice: one signal row per run, consumed by it
    assert count(conn, "runs", "status = 'waiting'") == 0
    rows = sql(conn, "SELECT r.id, r.wake->'payload'->>'i', r.wake->>'signal', s.id::text, "
               "s.consumed_by FROM pgdurable.runs r JOIN pgdurable.signals s "
               "ON s.ref = r.wake->>'ref'")
    assert len(rows) == n
    index = {rid: i for i, rid in enumerate(ids)}
    for rid, i, sig, sid, consumed_by in rows:
        assert int(i) == index[rid] and sig == sid and consumed_by == rid
    assert count(conn, "signals", "consumed_at IS NULL") == 0


def test_r3_deterministic_interleavings(dsn: str, conn: psycopg.Connection[Any]) -> None:
    a, b = seed_leased(conn, 2)
    # 1. park holds the (kind, ref) lock uncommitted; the signal waits, then wakes it
    with psycopg.connect(dsn) as tx:
        assert park(tx, a, "ci", "b1") == "waiting"  # transaction open
        out: list[list[uuid.UUID]] = []
        t = threading.Thread(target=lambda: out.append(send_on(dsn, "ci", "b1")))
        t.start()
        wait_for_lock_wait(conn, pid_of_other(conn, tx))
        tx.commit()
        t.join()
    assert out == [[a]]
    # 2. the signal holds the lock uncommitted; the park waits, then consumes it
    with psycopg.connect(dsn) as tx:
        assert send(tx, "ci", "b2", {"n": 2}) == []
        res: list[str] = []
        t = threading.Thread(target=lambda: res.append(park_on(dsn, b, "ci", "b2")))
        t.start()
        wait_for_lock_wait(conn, pid_of_other(conn, tx))
        tx.commit()
        t.join()
    assert res == ["runnable"]
    assert sql(conn, "SELECT wake->'payload' FROM pgdurable.runs WHERE id = %s", b) == [({"n": 2},)]


def pid_of_other(conn: psycopg.Connection[Any], tx: psycopg.Connection[Any]) -> int:
    """The pid of the (single) backend that will wait: any other pgdurable test backend."""
    mine = {conn.info.backend_pid, tx.info.backend_pid}
    end = time.monotonic() + WAIT_LIMIT
    while time.monotonic() < end:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND wait_event_type = 'Lock'").fetchall()
        others = [r[0] for r in rows if r[0] not in mine]
        if others:
            return int(others[0])
        time.sleep(0.005)
    raise AssertionError("no backend waits on a lock")


def send_on(dsn: str, kind: str, ref: str) -> list[uuid.UUID]:
    with psycopg.connect(dsn, autocommit=True) as c:
        return send(c, kind, ref)


def park_on(dsn: str, rid: uuid.UUID, kind: str, ref: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as c:
        return park(c, rid, kind, ref)


# -- signal vs timeout -------------------------------------------------------------


def test_signal_racing_timeout_yields_one_outcome(dsn: str, conn: psycopg.Connection[Any]) -> None:
    n = 200
    ids = seed_leased(conn, n)
    for i, rid in enumerate(ids):  # run i times out exactly at BASE + i s
        park(conn, rid, "race", f"r{i}", wake_at=BASE + timedelta(seconds=i))
    barrier = threading.Barrier(2)
    claimed: dict[int, set[uuid.UUID]] = {}
    woke: dict[int, list[uuid.UUID]] = {}
    errors: list[BaseException] = []

    def timer() -> None:  # a worker whose clock reaches run i's wake_at
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i in range(n):
                    barrier.wait()
                    rows = at(c, BASE + timedelta(seconds=i), lambda: claim(c))
                    claimed[i] = {r[0] for r in rows if r[3] and r[3]["type"] == "timeout"}
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            barrier.abort()

    def signaller() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i in range(n):
                    barrier.wait()
                    woke[i] = send(c, "race", f"r{i}", {"i": i})
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=timer), threading.Thread(target=signaller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    timeouts = signals = 0
    for i, rid in enumerate(ids):
        wake = sql(conn, "SELECT wake, status FROM pgdurable.runs WHERE id = %s", rid)[0][0]
        sig = sql(conn, "SELECT consumed_by, woke FROM pgdurable.signals WHERE ref = %s", f"r{i}")
        if wake["type"] == "timeout":
            # the timeout won: the signal woke nobody and stays pending
            assert rid in claimed[i] and woke[i] == [] and sig == [(None, [])]
            timeouts += 1
        else:
            assert wake["type"] == "signal" and wake["payload"] == {"i": i}
            assert rid not in claimed[i] and woke[i] == [rid] and sig == [(rid, [rid])]
            signals += 1
    print(f"signal vs timeout: {signals} signals won, {timeouts} timeouts won")
    assert count(conn, "runs", "status = 'waiting'") == 0


# -- R4: the wake outcome is checkpointed and replayed ------------------------------


def test_r4_wake_outcome_survives_a_crash(conn: psycopg.Connection[Any]) -> None:
    a, b = seed_leased(conn, 2)
    park(conn, a, "ci", "x", wake_at=BASE)
    park(conn, b, "ci", "y", wake_in="1 hour")
    assert send(conn, "ci", "y", {"ok": True}) == [b]
    # the timer fires for a; both are claimed with a short lease ... and their worker dies
    first = {r[0]: r[3] for r in at(conn, BASE, lambda: claim(conn, ttl="1 s"))}
    assert first[a]["type"] == "timeout" and first[b]["type"] == "signal"
    # the reclaim after the lease expired sees the very same outcome (R4)
    later = BASE + timedelta(seconds=5)
    second = {r[0]: (r[1], r[3]) for r in at(conn, later, lambda: claim(conn))}
    assert second == {a: ("leased", first[a]), b: ("leased", first[b])}
    # a late signal for a's (kind, ref) does not change a's outcome: a is not waiting
    assert send(conn, "ci", "x", {"late": True}) == []
    token = sql(conn, "SELECT lease_token FROM pgdurable.runs WHERE id = %s", a)[0][0]
    at(conn, later, lambda: sql(conn, "SELECT pgdurable.checkpoint_run(%s, %s, 'w', '{}', 0)",
                                a, token))
    assert sql(conn, "SELECT wake FROM pgdurable.checkpoints WHERE run_id = %s ORDER BY step DESC "
               "LIMIT 1", a) == [(first[a],)]


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)
    yield a
    await a.close()


async def test_r4_retried_step_sees_same_wake(app: Durable) -> None:
    seen: list[dict[str, Any] | None] = []

    @app.task("flaky_after_wake", revision="1", retry_base=0.01, retry_cap=0.01)
    async def flaky(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Wait(signal=("ci", "r4"), timeout=timedelta(hours=1))
        seen.append(ctx.wake)
        if len(seen) == 1:
            raise RuntimeError("crash after seeing the wake")
        return Done(ctx.wake)

    worker = app.worker(poll_interval=0.2)
    task = asyncio.create_task(worker.run())
    try:
        rid = await app.start("flaky_after_wake")

        async def parked() -> bool:
            return (await app.get_run(rid)).status == "waiting"

        await until(parked, "park")
        assert await app.signal("ci", "r4", {"build": "green"}) == [rid]

        async def done() -> bool:
            return (await app.get_run(rid)).terminal

        await until(done, "completion")
    finally:
        await worker.stop(grace=2)
        await task
    info = await app.get_run(rid)
    assert info.status == "completed" and len(seen) == 2 and seen[0] == seen[1]
    assert seen[0] is not None and seen[0]["payload"] == {"build": "green"}


# -- R5: timers on the database clock, never early ------------------------------------


def test_r5_parked_runs_never_claimed_before_wake(conn: psycopg.Connection[Any]) -> None:
    ids = seed_leased(conn, 3)
    park(conn, ids[0], None, None, wake_at=BASE)  # Sleep(until=BASE)
    park(conn, ids[1], "ci", "t", wake_at=BASE)   # Wait with timeout at BASE
    park(conn, ids[2], "ci", "u")                 # Wait without timeout: never by a timer
    early = BASE - timedelta(microseconds=1)
    assert at(conn, early, lambda: claim(conn)) == []
    got = {r[0]: r[3] for r in at(conn, BASE, lambda: claim(conn))}
    assert set(got) == {ids[0], ids[1]}
    assert got[ids[0]] == {"type": "timeout", "kind": None, "ref": None,
                           "at": got[ids[0]]["at"]}
    assert got[ids[1]]["kind"] == "ci" and got[ids[1]]["ref"] == "t"
    # a Wait without timeout is never taken by a timer, however late it gets
    late = at(conn, BASE + timedelta(days=365), lambda: claim(conn))
    assert ids[2] not in {r[0] for r in late}
    assert sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", ids[2]) == [("waiting",)]


async def test_r5_worker_sleep_wakes_on_db_clock(app: Durable, conn: psycopg.Connection[Any]) -> None:
    @app.task("napper", revision="1")
    async def napper(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0:
            return Sleep(seconds=0.3)
        return Done(ctx.wake)

    # a long poll: only the worker's own timer bookkeeping can wake it in time
    worker = app.worker(poll_interval=30)
    task = asyncio.create_task(worker.run())
    try:
        rids = [await app.start("napper") for _ in range(3)]
        for rid in rids:
            async def done(rid: str = rid) -> bool:
                return (await app.get_run(rid)).terminal

            await until(done, "sleepers")
    finally:
        await worker.stop(grace=2)
        await task
    for rid in rids:
        info = await app.get_run(rid)
        assert info.status == "completed" and info.result["type"] == "timeout"
        # claimed (leased_at, DB clock) no earlier than the timer's wake_at
        leased_at = sql(conn, "SELECT leased_at FROM pgdurable.runs WHERE id = %s", rid)[0][0]
        assert leased_at >= datetime.fromisoformat(info.result["at"])


# -- dedup (S15) and conflicts ------------------------------------------------------------


async def test_signal_id_dedup_and_conflict(app: Durable, conn: psycopg.Connection[Any]) -> None:
    a, b, c = seed_leased(conn, 3)
    park(conn, a, "ci", "d1")
    park(conn, b, "ci", "d1")
    first = await app.signal("ci", "d1", {"v": 1}, signal_id="sig-1")
    assert sorted(first) == sorted([str(a), str(b)])
    # same id, same content: same answer, nothing delivered again
    assert sorted(await app.signal("ci", "d1", {"v": 1}, signal_id="sig-1")) == sorted(first)
    assert count(conn, "signals") == 1
    # same kind and id, other payload / ref / run: SignalConflict, nothing changed
    before = sql(conn, "SELECT id, status, wake FROM pgdurable.runs ORDER BY id")
    for args in (("ci", "d1", {"v": 2}), ("ci", "d2", {"v": 1})):
        with pytest.raises(SignalConflict):
            await app.signal(*args, signal_id="sig-1")
    with pytest.raises(SignalConflict):
        await app.signal_run(str(c), "ci", {"v": 1}, signal_id="sig-1")
    assert sql(conn, "SELECT id, status, wake FROM pgdurable.runs ORDER BY id") == before
    assert count(conn, "signals") == 1
    # the same id under another kind is another signal (ids are scoped by kind, 0029)
    assert await app.signal("cd", "d1", {"v": 1}, signal_id="sig-1") == []
    assert count(conn, "signals") == 2
    conn.execute("DELETE FROM pgdurable.signals WHERE kind = 'cd'")
    # a pending signal with an id: its duplicate is not stored again and, once the
    # signal was consumed by a park, a duplicate does not wake the next waiter
    assert await app.signal("ci", "d3", [1], signal_id="sig-2") == []
    assert await app.signal("ci", "d3", [1], signal_id="sig-2") == []
    assert count(conn, "signals", "signal_id = 'sig-2'") == 1
    assert park(conn, c, "ci", "d3") == "runnable"
    (d,) = seed_leased(conn, 1)
    assert park(conn, d, "ci", "d3") == "waiting"
    assert await app.signal("ci", "d3", [1], signal_id="sig-2") == []
    assert sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", d) == [("waiting",)]


def test_concurrent_duplicate_senders_from_processes(dsn: str, conn: psycopg.Connection[Any]) -> None:
    rids = seed_leased(conn, 2)
    for rid in rids:
        park(conn, rid, "ci", "multi")
    procs = [subprocess.Popen([sys.executable, "-m", "tests._signal_procs", "send", dsn, "ci",
                               "multi", '{"x": 1}', "same-id"], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    expected = sorted(str(r) for r in rids)
    assert [sorted(o) for o in outs] == [expected] * 3  # everyone gets the same answer
    assert count(conn, "signals") == 1
    assert count(conn, "runs", "status = 'runnable'") == 2


def test_one_notify_per_queue(dsn: str, conn: psycopg.Connection[Any]) -> None:
    ids = seed_leased(conn, 3, "qa") + seed_leased(conn, 2, "qb")
    for rid in ids:
        park(conn, rid, "ci", "fan")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgdurable_wake")
        assert len(send(conn, "ci", "fan")) == 5
        notes = list(listener.notifies(timeout=1.0))
    assert sorted(n.payload for n in notes) == ["qa", "qb"]


# -- signal_run --------------------------------------------------------------------------


async def test_signal_run_addresses_one_run(app: Durable, conn: psycopg.Connection[Any]) -> None:
    a, b, c = seed_leased(conn, 3)
    park(conn, a, "approval", "pr-1")
    park(conn, b, "approval", "pr-1")
    # wakes only a (any ref of that kind), with run_id in the wake
    assert await app.signal_run(str(a), "approval", {"ok": True}) == [str(a)]
    wake = sql(conn, "SELECT wake FROM pgdurable.runs WHERE id = %s", a)[0][0]
    assert wake["ref"] == "pr-1" and wake["run_id"] == str(a) and wake["payload"] == {"ok": True}
    assert sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", b) == [("waiting",)]
    # c is still running: kept pending for c alone, not for b waiting on the same kind
    assert await app.signal_run(c, "approval", "later", signal_id="c-1") == []
    assert sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", b) == [("waiting",)]
    assert park(conn, c, "other", "k") == "waiting"  # another kind: not consumed
    view = sql(conn, "SELECT pending_signals FROM pgdurable.waiting_runs WHERE run_id = %s", c)
    assert view == [(1,)]
    assert await app.signal_run(c, "approval", "later", signal_id="c-1") == []  # duplicate
    # c parks on the kind (any ref): the pending signal is handed over at once
    conn.execute("UPDATE pgdurable.runs SET status = 'leased', lease_owner = 'w', lease_token = 2, "
        "lease_expires_at = pgdurable.now() + interval '1 hour', wait_kind = NULL, "
        "wait_ref = NULL, wake_at = NULL WHERE id = %s", (c,))
    assert park(conn, c, "approval", "pr-9", token=2) == "runnable"
    wake = sql(conn, "SELECT wake FROM pgdurable.runs WHERE id = %s", c)[0][0]
    assert wake["payload"] == "later" and wake["ref"] == "pr-9" and wake["run_id"] == str(c)
    assert count(conn, "signals", "consumed_at IS NULL") == 0
    # unknown run, finished run
    with pytest.raises(RunNotFound):
        await app.signal_run(str(uuid.uuid4()), "approval")
    conn.execute("UPDATE pgdurable.runs SET status = 'completed', finished_at = now() WHERE id = %s", (b,))
    n = count(conn, "signals")
    assert await app.signal_run(b, "approval") == []
    assert count(conn, "signals") == n


def test_signal_run_racing_park(dsn: str, conn: psycopg.Connection[Any]) -> None:
    n = 200
    ids = seed_leased(conn, n)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def parker() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i, rid in enumerate(ids):
                    barrier.wait()
                    park(c, rid, "approval", f"p{i}")
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            barrier.abort()

    def signaller() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i, rid in enumerate(ids):
                    barrier.wait()
                    sql(c, "SELECT pgdurable.signal_run(%s, 'approval', %s::jsonb, NULL, NULL)",
                        rid, json.dumps(i))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=parker), threading.Thread(target=signaller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    rows = sql(conn, "SELECT id, status, wake->'payload' FROM pgdurable.runs")
    index = {rid: i for i, rid in enumerate(ids)}
    assert all(st == "runnable" and p == index[rid] for rid, st, p in rows)
    assert count(conn, "signals", "consumed_at IS NULL") == 0 and count(conn, "signals") == n


# -- bad input ---------------------------------------------------------------------------


async def test_bad_input_changes_nothing(app: Durable, conn: psycopg.Connection[Any]) -> None:
    (rid,) = seed_leased(conn, 1)
    app.max_signal_payload = 100
    cases: list[tuple[type[BaseException], Callable[[], Any]]] = [
        (ValueError, lambda: app.signal("", "r")),
        (ValueError, lambda: app.signal("k", "")),
        (ValueError, lambda: app.signal("k\x00", "r")),
        (TypeError, lambda: app.signal(1, "r")),  # type: ignore[arg-type]
        (ValueError, lambda: app.signal("k", "r", {"x": float("nan")})),
        (ValueError, lambda: app.signal("k", "r", "nul\x00")),
        (TypeError, lambda: app.signal("k", "r", {1, 2})),
        (ValueError, lambda: app.signal("k", "r", "x" * 200)),
        (ValueError, lambda: app.signal("k", "r", signal_id="")),
        (ValueError, lambda: app.signal("k", "r", ttl=timedelta(seconds=-1))),
        (TypeError, lambda: app.signal("k", "r", ttl=5)),  # type: ignore[arg-type]
        (ValueError, lambda: app.signal_run("not-a-uuid", "k")),
        (ValueError, lambda: app.signal_run(rid, "")),
        (ValueError, lambda: app.signal_run(rid, "k", "x" * 200)),
    ]
    for exc_type, call in cases:
        with pytest.raises(exc_type):
            await call()
    # the database checks again (psql callers)
    for query in ("SELECT pgdurable.send_signal('', 'r', NULL, NULL, NULL)",
                  "SELECT pgdurable.send_signal('k', 'r', NULL, '', NULL)",
                  "SELECT pgdurable.signal_run(gen_random_uuid(), '', NULL, NULL, NULL)"):
        with pytest.raises(InvalidInput):
            sql(conn, query)
    assert count(conn, "signals") == 0
    assert sql(conn, "SELECT status, wake FROM pgdurable.runs") == [("leased", None)]


def test_parse_payload() -> None:
    assert parse_payload(b"") is None and parse_payload(" \n") is None
    assert parse_payload(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    for bad in (b"{", b"NaN", b"[Infinity]", b'"\\u0000"', b"\xff\xfe", b"x" * 11):
        with pytest.raises(ValueError):
            parse_payload(bad, max_bytes=10)


# -- waiting_runs, cross-process wake ---------------------------------------------------


def test_waiting_runs_view(conn: psycopg.Connection[Any]) -> None:
    a, b, c, d = seed_leased(conn, 4)
    park(conn, a, None, None, wake_in="10 minutes")
    park(conn, b, "ci", "b7")
    park(conn, c, "approval", "pr-3", wake_in="1 hour")
    rows = sql(conn, "SELECT run_id, task, queue, waits_for, kind, ref, wait_since IS NOT NULL, "
               "wake_at IS NOT NULL, waited >= interval '0', pending_signals "
               "FROM pgdurable.waiting_runs ORDER BY wake_at NULLS LAST")
    assert rows == [
        (a, "t", "default", "timer", None, None, True, True, True, 0),
        (c, "t", "default", "signal_or_timeout", "approval", "pr-3", True, True, True, 0),
        (b, "t", "default", "signal", "ci", "b7", True, False, True, 0),
    ]
    assert d not in {r[0] for r in rows}


async def test_signal_from_another_process_wakes_run_in_worker(app: Durable, dsn: str) -> None:
    @app.task("ci_wait", revision="1")
    async def ci_wait(ctx: RunContext, state: Any) -> Any:
        if ctx.wake is None:
            return Wait(signal=("ci", state["build"]))
        return Done(ctx.wake["payload"])

    worker = app.worker(poll_interval=30)  # only NOTIFY can wake it in time
    task = asyncio.create_task(worker.run())
    try:
        rid = await app.start("ci_wait", {"build": "b-42"})

        async def parked() -> bool:
            return (await app.get_run(rid)).status == "waiting"

        await until(parked, "park")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests._signal_procs", "send", dsn, "ci", "b-42",
            '{"status": "green"}', stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 0 and json.loads(out) == [rid]

        async def done() -> bool:
            return (await app.get_run(rid)).terminal

        await until(done, "completion")
    finally:
        await worker.stop(grace=2)
        await task
    info = await app.get_run(rid)
    assert info.status == "completed" and info.result == {"status": "green"}


def test_sync_client_signal_and_signal_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    a, b = seed_leased(conn, 2)
    park(conn, a, "ci", "s1")
    park(conn, b, "approval", "s2")
    with DurableClient(dsn) as client:
        assert client.signal("ci", "s1", {"n": 1}, signal_id="sync-1") == [str(a)]
        assert client.signal("ci", "s1", {"n": 1}, signal_id="sync-1") == [str(a)]
        with pytest.raises(SignalConflict):
            client.signal("ci", "s1", {"n": 2}, signal_id="sync-1")
        assert client.signal_run(b, "approval", True) == [str(b)]
        with pytest.raises(RunNotFound):
            client.signal_run(uuid.uuid4(), "approval")


# -- pgdurable signal (CLI) ---------------------------------------------------------------


def test_cli_signal(dsn: str, conn: psycopg.Connection[Any]) -> None:
    from typer.testing import CliRunner

    from pgdurable.ops.cli import app as cli_app

    def cli(*args: str) -> Any:
        return CliRunner().invoke(cli_app, [*args, "--dsn", dsn], catch_exceptions=False)

    a, b = seed_leased(conn, 2)
    park(conn, a, "ci", "c1")
    park(conn, b, "ci", "c1")
    # bad input: exit 2, one line, nothing changed
    for args in (("", "c1"), ("ci", ""), ("ci", "c1", "--payload", "{oops"),
                 ("ci", "c1", "--payload", "[NaN]"), ("ci", "c1", "--payload", '"\\u0000"'),
                 ("ci", "c1", "--signal-id", "")):
        r = cli("signal", *args)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
    assert count(conn, "signals") == 0
    r = cli("signal", "ci", "c1", "--payload", '{"green": true}', "--signal-id", "cli-1")
    assert r.exit_code == 0 and sorted(r.stdout.split()) == sorted([str(a), str(b)])
    r = cli("signal", "ci", "c1", "--payload", '{"green": false}', "--signal-id", "cli-1")
    assert r.exit_code == 2 and "cli-1" in r.stderr  # SignalConflict
    r = cli("signal", "ci", "nobody")
    assert r.exit_code == 0 and r.stdout == "" and "pending" in r.stderr
    assert sql(conn, "SELECT wake->'payload' FROM pgdurable.runs WHERE id = %s", a) == [
        ({"green": True},)]


def test_expired_pending_signals_are_not_consumed(conn: psycopg.Connection[Any]) -> None:
    a, b = seed_leased(conn, 2)
    conn.execute("INSERT INTO pgdurable.signals (kind, ref, payload, expires_at) VALUES "
                 "('ci', 'old', '1', pgdurable.now() - interval '1 ms')")
    conn.execute("INSERT INTO pgdurable.signals (kind, ref, payload, run_id, expires_at) VALUES "
                 "('approval', %s, '2', %s, pgdurable.now() - interval '1 ms')", (str(b), b))
    assert park(conn, a, "ci", "old") == "waiting"
    assert park(conn, b, "approval", "any") == "waiting"
    assert count(conn, "signals", "consumed_at IS NULL") == 2
    # a fresh one with a TTL is consumed by the next park of the same (kind, ref)
    (c,) = seed_leased(conn, 1)
    sql(conn, "SELECT pgdurable.send_signal('ci', 'new', '3', NULL, '1 hour')")
    assert park(conn, c, "ci", "new") == "runnable"

# -- signal arguments a review found escaping as other errors than TypeError/ValueError
# (deeply nested payloads, a TTL past what PostgreSQL can store), through the API,
# the sync client and the CLI (the webhook app's: tests/test_webhooks.py)


def parked_on(conn: psycopg.Connection[Any], kind: str, ref: str) -> uuid.UUID:
    """One run of t/1 parked on a signal (kind, ref)."""
    (rid,) = seed_leased(conn, 1)
    park(conn, rid, kind, ref)
    return rid


def run_status(conn: psycopg.Connection[Any], rid: uuid.UUID) -> str:
    return str(sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", rid)[0][0])


def nested(depth: int) -> list[Any]:
    """[[[...]]] ``depth`` levels deep (built without recursion)."""
    root: list[Any] = []
    cur = root
    for _ in range(depth - 1):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    return root


# -- deeply nested payloads: ValueError (exit 2), never RecursionError -----------------


def test_parse_payload_refuses_deep_nesting_with_value_error() -> None:
    deep = "[" * 100_000 + "]" * 100_000  # 200 kB: well under the size limit
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_payload(deep)
    with pytest.raises(ValueError, match="nested too deeply"):
        parse_payload(deep.encode())
    assert parse_payload("[[[1]]]") == [[[1]]]


async def test_signal_refuses_deeply_nested_payload(app: Durable, dsn: str,
                                                     conn: psycopg.Connection[Any]) -> None:
    rid = parked_on(conn, "ci", "deep")
    payload = nested(5000)  # _json.validate is iterative; json.dumps recursed and blew up
    with pytest.raises(ValueError, match="nested too deeply"):
        await app.signal("ci", "deep", payload)
    with pytest.raises(ValueError, match="nested too deeply"):
        await app.signal_run(rid, "ci", payload)
    with DurableClient(dsn) as client:
        with pytest.raises(ValueError, match="nested too deeply"):
            client.signal("ci", "deep", payload)
        with pytest.raises(ValueError, match="nested too deeply"):
            client.signal_run(rid, "ci", payload)
    assert count(conn, "signals") == 0 and run_status(conn, rid) == "waiting"
    assert await app.signal("ci", "deep", nested(50)) == [str(rid)]


def test_cli_signal_refuses_deeply_nested_payload(dsn: str, conn: psycopg.Connection[Any]) -> None:
    from typer.testing import CliRunner

    from pgdurable.ops.cli import app as cli_app

    rid = parked_on(conn, "ci", "deep")
    r = CliRunner().invoke(cli_app, ["signal", "ci", "deep", "--payload", "[" * 50_000 + "]" * 50_000,
                                     "--dsn", dsn], catch_exceptions=False)
    assert r.exit_code == 2 and "nested too deeply" in r.stderr and r.stderr.count("\n") == 1
    assert count(conn, "signals") == 0 and run_status(conn, rid) == "waiting"


# -- TTL of kept signals: bounded, checked before any SQL ---------------------------


async def test_far_future_ttl_is_a_value_error(app: Durable, dsn: str,
                                              conn: psycopg.Connection[Any]) -> None:
    rid = parked_on(conn, "other", "x")  # waiting on another kind: signal_run keeps it
    for ttl in (timedelta.max, timedelta(days=999_999_999), MAX_SIGNAL_TTL + timedelta(days=1)):
        # was psycopg.errors.DatetimeFieldOverflow from the INSERT (now() + ttl)
        with pytest.raises(ValueError, match="ttl"):
            await app.signal("ci", "far", {"x": 1}, ttl=ttl)
        with pytest.raises(ValueError, match="ttl"):
            await app.signal_run(rid, "ci", {"x": 1}, ttl=ttl)
        with DurableClient(dsn) as client:
            with pytest.raises(ValueError, match="ttl"):
                client.signal("ci", "far", {"x": 1}, ttl=ttl)
            with pytest.raises(ValueError, match="ttl"):
                client.signal_run(rid, "ci", {"x": 1}, ttl=ttl)
    assert count(conn, "signals") == 0
    # the largest TTL and None (no expiry) are kept as asked
    assert await app.signal("ci", "far", {"x": 1}, ttl=MAX_SIGNAL_TTL) == []
    assert await app.signal_run(rid, "ci", {"x": 2}, ttl=None) == []
    rows = conn.execute("SELECT run_id IS NULL, expires_at - created_at >= %s, expires_at IS NULL "
                        "FROM pgdurable.signals ORDER BY id", (MAX_SIGNAL_TTL,)).fetchall()
    assert rows == [(True, True, False), (False, None, True)]


# -- Wait/Sleep arguments ------------------------------------------------------------


def test_wait_refuses_a_signal_no_sender_can_address() -> None:
    # app.signal / signal_run / the webhook refuse these kinds and refs (check_name):
    # a run parked on one can never be woken by a signal
    for sig in (("ci", "x" * 1001), ("ci", "é" * 501), ("k" * 1001, "r"), ("ci", "\ud800")):
        with pytest.raises(ValueError):
            Wait(signal=sig)
    with pytest.raises(ValueError):
        Wait.approval("x" * 1001)
    Wait(signal=("ci", "x" * 1000))
    Wait(signal=("inbox", "x" * 10_240))  # a thread's own wait: thread keys have no limit


def test_wait_and_sleep_refuse_timeouts_past_what_the_database_stores() -> None:
    # the worker turned these into timedelta(seconds=1e300) (OverflowError: the run
    # stayed leased until its lease lapsed, again and again) or stored a wake_at
    # after year 9999 that psycopg cannot load (get_run raised DataError)
    for value in (1e300, 1e12, timedelta.max, timedelta(days=999_999_999)):
        with pytest.raises(ValueError):
            Wait(signal=("ci", "x"), timeout=value)
        with pytest.raises(ValueError):
            Sleep(seconds=value)
    Wait(signal=("ci", "x"), timeout=timedelta(days=365_000))
    Sleep(seconds=timedelta(days=365_000))


async def test_far_future_sleep_fails_the_step_instead_of_breaking_get_run(
        app: Durable) -> None:
    @app.task("sleeps_forever", revision="1", max_attempts=1)
    async def sleeps(ctx: RunContext, state: Any) -> Any:
        if ctx.wake is None:
            return Sleep(seconds=1e12)  # ~31,700 years
        return Done(None)

    rid = await app.start("sleeps_forever")
    async with running(app.worker(poll_interval=0.1)):
        info = await finished(app, rid)  # was: psycopg.DataError once it parked
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "ValueError"
