"""Runs API and the SQL state machine of 0003_runs (no worker loop here)."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from _scans import scans, scans_since

import pgdurable
from pgdurable import Durable, DurableClient, LeaseLost, RunNotFound, UnknownTask
from pgdurable.foundation.errors import ProviderClosed, translate


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Durable]:
    a = Durable(dsn)

    @a.task("t", revision="1")
    async def t(ctx: pgdurable.RunContext, state: Any) -> Any:
        return pgdurable.Done(state)

    yield a
    await a.close()


def sql(conn: psycopg.Connection[Any], query: str, *params: Any) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(query, params).fetchall()
    except psycopg.Error as exc:
        raise translate(exc) from exc


def claim(conn: psycopg.Connection[Any], owner: str = "w1", n: int = 10,
          tasks: tuple[str, ...] = ("t",), revs: tuple[str, ...] = ("1",),
          ttl: str = "60 s") -> list[tuple[Any, ...]]:
    return sql(conn, "SELECT id, status, lease_token, wake, state FROM pgdurable.claim_runs("
               "%s, %s, %s, %s, %s, %s::interval)", owner, ["default"], list(tasks), list(revs),
               n, ttl)


def count(conn: psycopg.Connection[Any], where: str = "true") -> int:
    return int(conn.execute(f"SELECT count(*) FROM pgdurable.runs WHERE {where}").fetchone()[0])  # type: ignore[index]


async def test_start_get_and_defaults(app: Durable) -> None:
    rid = await app.start("t", {"a": [1, "x"]}, priority=3, deadline=timedelta(hours=1), budget=10)
    info = await app.get_run(rid)
    assert info.id == rid and info.status == "runnable" and info.state == {"a": [1, "x"]}
    assert info.task == "t" and info.revision == "1" and info.priority == 3 and info.step == 0
    assert info.deadline_at is not None and info.budget == 10.0 and info.spent == 0.0
    assert not info.terminal


async def test_bad_input_changes_nothing(app: Durable, conn: psycopg.Connection[Any]) -> None:
    bad_states: list[Any] = [{"s": {1, 2}}, {"n": math.nan}, {"o": object()}, {"x": "a\x00b"},
                             {1: "int key"}]
    for state in bad_states:
        with pytest.raises((TypeError, ValueError), match="state"):
            await app.start("t", state)
    with pytest.raises(UnknownTask):
        await app.start("nope", {})
    with pytest.raises(TypeError):
        await app.start("t", {}, queue=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        await app.start("t", {}, queue="")
    with pytest.raises(TypeError):
        await app.start("t", {}, priority="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await app.start("t", {}, deadline="soon")
    with pytest.raises(ValueError):
        await app.start("t", {}, deadline=timedelta(seconds=-1))
    with pytest.raises(ValueError):
        await app.start("t", {}, deadline=datetime(2030, 1, 1))  # naive
    with pytest.raises(ValueError):
        await app.start("t", {}, budget=-1)
    with pytest.raises(TypeError):
        await app.start("t", {}, idempotency_key=5)  # type: ignore[arg-type]
    assert count(conn) == 0
    with pytest.raises(RunNotFound):
        await app.get_run(uuid.uuid4())
    with pytest.raises(RunNotFound):
        await app.cancel(str(uuid.uuid4()))
    with pytest.raises(ValueError):
        await app.get_run("not-a-uuid")
    with pytest.raises(TypeError):
        await app.get_run(42)
    with pytest.raises(ValueError):
        await app.signal("", "r")
    with pytest.raises(ValueError):
        await app.signal("k", "r", {"bad": math.inf})
    assert conn.execute("SELECT count(*) FROM pgdurable.signals").fetchone() == (0,)
    await app.close()
    with pytest.raises(ProviderClosed):
        await app.start("t", {})
    with pytest.raises(ProviderClosed):
        await app.get_run(uuid.uuid4())


async def test_idempotent_start_also_concurrent(app: Durable, conn: psycopg.Connection[Any]) -> None:
    a = await app.start("t", {"n": 1}, idempotency_key="k1")
    b = await app.start("t", {"n": 2}, idempotency_key="k1")
    assert a == b and (await app.get_run(a)).state == {"n": 1}
    ids = await asyncio.gather(*(app.start("t", {"i": i}, idempotency_key="k2") for i in range(12)))
    assert len(set(ids)) == 1
    assert count(conn, "idempotency_key = 'k2'") == 1


async def test_transactional_start(app: Durable, dsn: str, conn: psycopg.Connection[Any]) -> None:
    listener = psycopg.connect(dsn, autocommit=True)
    listener.execute("LISTEN pgdurable_wake")
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        rid = await app.start("t", {"tx": 1}, conn=c)
        assert count(conn) == 0  # not visible before commit
        assert list(listener.notifies(timeout=0.2)) == []
        await c.rollback()
        assert count(conn) == 0
        rid = await app.start("t", {"tx": 2}, conn=c)
        assert list(listener.notifies(timeout=0.2)) == []  # NOTIFY waits for commit
        await c.commit()
    assert (await app.get_run(rid)).state == {"tx": 2}
    notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [(n.channel, n.payload) for n in notes] == [("pgdurable_wake", "default")]
    listener.close()


def test_fencing_stale_token_is_refused(conn: psycopg.Connection[Any]) -> None:
    rid = sql(conn, "SELECT run_id FROM pgdurable.start_run('t','1','{\"v\":0}','default',0,3,"
              "NULL,NULL,NULL,NULL)")[0][0]
    (row,) = claim(conn)
    token = row[2]
    assert sql(conn, "SELECT pgdurable.checkpoint_run(%s, %s, 'w1', '{\"v\":1}', 0)",
               rid, token) == [("leased",)]
    # lease expires; another worker claims it with a higher token
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = pgdurable.now() - interval '1 s'")
    (row2,) = claim(conn, owner="w2")
    assert row2[2] == token + 1 and row2[4] == {"v": 1}
    for q in ("SELECT pgdurable.checkpoint_run(%s, %s, 'w1', '{\"v\":9}', 0)",
              "SELECT pgdurable.complete_run(%s, %s, 'w1', '{\"v\":9}', '1', 0)",
              "SELECT pgdurable.release_run(%s, %s, 'w1')",
              "SELECT pgdurable.ack_cancel(%s, %s, 'w1', 0)",
              "SELECT pgdurable.fail_run(%s, %s, 'w1', '{}', 0, '0 s', false)",
              "SELECT * FROM pgdurable.park_run(%s, %s, 'w1', '{}', 0, NULL, NULL, NULL, '1 s')",
              "SELECT * FROM pgdurable.effect_begin(%s, %s, 'w1', 'k')"):
        with pytest.raises(LeaseLost):
            sql(conn, q, rid, token)
    # right token, wrong owner: refused too
    with pytest.raises(LeaseLost):
        sql(conn, "SELECT pgdurable.checkpoint_run(%s, %s, 'w1', '{}', 0)", rid, token + 1)
    st = sql(conn, "SELECT state, step, status, lease_owner FROM pgdurable.runs")
    assert st == [({"v": 1}, 1, "leased", "w2")]
    assert sql(conn, "SELECT step, token FROM pgdurable.checkpoints") == [(1, token)]


def _seed(conn: psycopg.Connection[Any], n: int = 1, **cols: Any) -> list[uuid.UUID]:
    ids = []
    for _ in range(n):
        rid = sql(conn, "SELECT run_id FROM pgdurable.start_run('t','1','{}','default',0,3,"
                  "NULL,NULL,NULL,NULL)")[0][0]
        for k, v in cols.items():
            conn.execute(f"UPDATE pgdurable.runs SET {k} = {v} WHERE id = %s", (rid,))
        ids.append(rid)
    return ids


def test_claim_boundary_pair_expired_leases(conn: psycopg.Connection[Any]) -> None:
    (old,) = _seed(conn, status="'leased'", lease_owner="'dead'", lease_token="5",
                   lease_expires_at="pgdurable.now() - interval '1 s'")
    (live,) = _seed(conn, status="'leased'", lease_owner="'alive'", lease_token="7",
                    lease_expires_at="pgdurable.now() + interval '1 s'")
    rows = claim(conn)
    assert [(r[0], r[1], r[2]) for r in rows] == [(old, "leased", 6)]
    # a reclaim is counted apart from failed steps (attempts)
    info = sql(conn, "SELECT attempts, reclaims, claims, error->>'type' FROM pgdurable.runs "
               "WHERE id = %s", old)
    assert info == [(0, 1, 1, "LeaseExpired")]
    assert sql(conn, "SELECT lease_owner, lease_token FROM pgdurable.runs WHERE id = %s", live) == [
        ("alive", 7)]


def _claim_bounded(conn: psycopg.Connection[Any], bounds: Any) -> list[tuple[Any, ...]]:
    return sql(conn, "SELECT id, status FROM pgdurable.claim_runs('w1', %s, %s, %s, 10, "
               "'60 s', %s)", ["default"], ["t"], ["1"], bounds)


def test_poison_run_fails_after_bound(conn: psycopg.Connection[Any]) -> None:
    expire = "UPDATE pgdurable.runs SET lease_expires_at = pgdurable.now() - interval '1 s'"
    (rid,) = _seed(conn, status="'leased'", lease_owner="'dead'", attempts="2",
                   lease_expires_at="pgdurable.now() - interval '1 s'")
    # failed steps (attempts) do not make a crash fatal: reclaims are counted apart
    for n in (1, 2):
        assert _claim_bounded(conn, [2]) == [(rid, "leased")]
        conn.execute(expire)
        assert sql(conn, "SELECT reclaims, attempts FROM pgdurable.runs") == [(n, 2)]
    # a checkpoint is progress: it resets the count
    token = sql(conn, "SELECT lease_token FROM pgdurable.runs")[0][0]
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = pgdurable.now() + interval '1 s'")
    sql(conn, "SELECT pgdurable.checkpoint_run(%s, %s, 'w1', '{}', 0)", rid, token)
    assert sql(conn, "SELECT reclaims FROM pgdurable.runs") == [(0,)]
    for _ in (1, 2):
        conn.execute(expire)
        assert _claim_bounded(conn, [2]) == [(rid, "leased")]
    conn.execute(expire)
    assert _claim_bounded(conn, [2]) == [(rid, "failed")]
    ((status, err, owner, reclaims),) = sql(
        conn, "SELECT status, error, lease_owner, reclaims FROM pgdurable.runs")
    assert (status, err["type"], owner, reclaims) == ("failed", "PoisonRun", None, 3)
    assert "max_reclaims 2" in err["message"]
    # default bound (NULL array or element) is 5; bound 0 fails at the first expiry
    (r2,) = _seed(conn, status="'leased'", lease_owner="'dead'", reclaims="4",
                  lease_expires_at="pgdurable.now() - interval '1 s'")
    assert _claim_bounded(conn, None) == [(r2, "leased")]
    conn.execute(expire + " WHERE id = %s", (r2,))
    assert _claim_bounded(conn, [None]) == [(r2, "failed")]
    (r3,) = _seed(conn, status="'leased'", lease_owner="'dead'",
                  lease_expires_at="pgdurable.now() - interval '1 s'")
    assert _claim_bounded(conn, [0]) == [(r3, "failed")]
    (_rid2,) = _seed(conn, status="'leased'", lease_owner="'dead'",
                    cancel_requested_at="pgdurable.now()",
                    lease_expires_at="pgdurable.now() - interval '1 s'")
    assert claim(conn)[0][1] == "cancelled"


def test_timers_never_claimed_early(conn: psycopg.Connection[Any]) -> None:
    (_rid,) = _seed(conn, status="'waiting'", wait_kind="'ci'", wait_ref="'b1'",
                   wake_at="pgdurable.now() + interval '10 s'")
    assert claim(conn) == []
    with conn.transaction():
        conn.execute("SELECT set_config('pgdurable.now', %s, true)",
                     ((datetime.now(UTC) + timedelta(seconds=9)).isoformat(),))
        assert claim(conn) == []
    with conn.transaction():
        conn.execute("SELECT set_config('pgdurable.now', %s, true)",
                     ((datetime.now(UTC) + timedelta(seconds=11)).isoformat(),))
        rows = claim(conn)
    assert len(rows) == 1 and rows[0][3]["type"] == "timeout" and rows[0][3]["kind"] == "ci"
    assert sql(conn, "SELECT wait_kind, wake_at, wake->>'type' FROM pgdurable.runs") == [
        (None, None, "timeout")]
    # a retry backoff (available_at in the future) is not claimed early either
    _seed(conn, available_at="pgdurable.now() + interval '5 s'")
    assert claim(conn) == []


def test_claim_only_known_task_revisions(conn: psycopg.Connection[Any]) -> None:
    rid = sql(conn, "SELECT run_id FROM pgdurable.start_run('t','2','{}','default',0,3,"
              "NULL,NULL,NULL,NULL)")[0][0]
    assert claim(conn, tasks=("t",), revs=("1",)) == []
    assert claim(conn, tasks=("u", "t"), revs=("2", "1")) == []
    assert sql(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", rid) == [("runnable",)]
    assert [r[0] for r in claim(conn, tasks=("t",), revs=("2",))] == [rid]


def test_claim_batch_size_honoured(conn: psycopg.Connection[Any]) -> None:
    _seed(conn, 10)
    _seed(conn, 2, status="'leased'", lease_owner="'x'",
          lease_expires_at="pgdurable.now() - interval '1 s'")
    _seed(conn, 2, status="'waiting'", wake_at="pgdurable.now() - interval '1 s'")
    assert len(claim(conn, n=3)) == 3
    assert count(conn, "status = 'leased' AND lease_owner = 'w1'") == 3
    assert len(claim(conn, n=100)) == 11
    assert claim(conn, n=0) == []


def test_claim_order_priority_then_age(conn: psycopg.Connection[Any]) -> None:
    (low,) = _seed(conn)
    (high,) = _seed(conn, priority="5")
    assert [r[0] for r in claim(conn, n=1)] == [high]
    assert [r[0] for r in claim(conn, n=1)] == [low]


def test_renew_runs_one_statement(conn: psycopg.Connection[Any]) -> None:
    ids = _seed(conn, 3)
    rows = claim(conn, ttl="5 s")
    tokens = {r[0]: r[2] for r in rows}
    ids_l, toks = list(tokens), [tokens[i] for i in tokens]
    toks[0] += 100  # stale
    renewed = sql(conn, "SELECT id, cancel_requested FROM pgdurable.renew_runs('w1', %s, %s, "
                  "'60 s'::interval)", ids_l, toks)
    assert {r[0] for r in renewed} == set(ids_l[1:]) and len(ids) == 3
    left = sql(conn, "SELECT id FROM pgdurable.runs WHERE lease_expires_at > pgdurable.now() + "
               "interval '30 s'")
    assert {r[0] for r in left} == set(ids_l[1:])
    # an expired lease is never resurrected
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = pgdurable.now() - interval '1 s'")
    assert sql(conn, "SELECT id FROM pgdurable.renew_runs('w1', %s, %s, '60 s'::interval)",
               ids_l, [tokens[i] for i in ids_l]) == []


def test_cancel_states_and_race_with_complete(conn: psycopg.Connection[Any]) -> None:
    (a,) = _seed(conn)
    assert sql(conn, "SELECT pgdurable.cancel_run(%s)", a) == [("cancelled",)]
    assert sql(conn, "SELECT pgdurable.cancel_run(%s)", a) == [("cancelled",)]  # no-op
    (w,) = _seed(conn, status="'waiting'", wait_kind="'k'", wait_ref="'r'")
    assert sql(conn, "SELECT pgdurable.cancel_run(%s)", w) == [("cancelled",)]
    assert sql(conn, "SELECT wait_kind FROM pgdurable.runs WHERE id = %s", w) == [(None,)]
    # leased: cancel first, then the worker completes -> cancel wins
    (c1,) = _seed(conn)
    (row,) = claim(conn)
    assert sql(conn, "SELECT pgdurable.cancel_run(%s)", c1) == [("leased",)]
    assert sql(conn, "SELECT pgdurable.complete_run(%s, %s, 'w1', '{\"s\":1}', '\"r\"', 0)",
               c1, row[2]) == [("cancelled",)]
    assert sql(conn, "SELECT status, result, state FROM pgdurable.runs WHERE id = %s", c1) == [
        ("cancelled", None, {"s": 1})]
    # complete first, then cancel -> completed, cancel is a no-op
    (c2,) = _seed(conn)
    (row,) = claim(conn)
    assert sql(conn, "SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', '\"r\"', 0)",
               c2, row[2]) == [("completed",)]
    assert sql(conn, "SELECT pgdurable.cancel_run(%s)", c2) == [("completed",)]
    # a cancel request is seen at the next checkpoint boundary
    (c3,) = _seed(conn)
    (row,) = claim(conn)
    sql(conn, "SELECT pgdurable.cancel_run(%s)", c3)
    assert sql(conn, "SELECT pgdurable.checkpoint_run(%s, %s, 'w1', '{}', 0)", c3, row[2]) == [
        ("cancelled",)]


def test_cancel_leased_notifies(conn: psycopg.Connection[Any], dsn: str) -> None:
    (rid,) = _seed(conn)
    claim(conn)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgdurable_cancel")
        sql(conn, "SELECT pgdurable.cancel_run(%s)", rid)
        notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == [str(rid)]


def test_signal_before_park_is_delivered(conn: psycopg.Connection[Any]) -> None:
    (rid,) = _seed(conn)
    (row,) = claim(conn)
    assert sql(conn, "SELECT pgdurable.send_signal('ci', 'b1', '{\"ok\":true}', NULL, NULL)") == []
    assert sql(conn, "SELECT count(*) FROM pgdurable.signals WHERE consumed_at IS NULL") == [(1,)]
    got = sql(conn, "SELECT status FROM pgdurable.park_run(%s, %s, 'w1', '{\"p\":1}', 0, 'ci', "
              "'b1', NULL, '1 hour')", rid, row[2])
    assert got == [("runnable",)]
    st = sql(conn, "SELECT status, wait_kind, wake->>'type', wake->'payload', state, lease_owner "
             "FROM pgdurable.runs")
    assert st == [("runnable", None, "signal", {"ok": True}, {"p": 1}, None)]
    assert sql(conn, "SELECT consumed_by FROM pgdurable.signals") == [(rid,)]
    (row,) = claim(conn)
    assert row[3]["payload"] == {"ok": True}
    # checkpoint records the wake the step saw, then clears it
    sql(conn, "SELECT pgdurable.checkpoint_run(%s, %s, 'w1', '{}', 0)", rid, row[2])
    assert sql(conn, "SELECT wake->>'type' FROM pgdurable.checkpoints WHERE step = 2") == [
        ("signal",)]
    assert sql(conn, "SELECT wake FROM pgdurable.runs") == [(None,)]


def test_signal_wakes_parked_runs_and_dedups(conn: psycopg.Connection[Any]) -> None:
    ids = _seed(conn, 2)
    rows = claim(conn)
    for r in rows:
        sql(conn, "SELECT * FROM pgdurable.park_run(%s, %s, 'w1', '{}', 0, 'ci', 'b2', NULL, NULL)",
            r[0], r[2])
    assert count(conn, "status = 'waiting'") == 2
    woke = sql(conn, "SELECT pgdurable.send_signal('ci', 'b2', '1', 'sig-1', NULL)")
    assert {r[0] for r in woke} == set(ids)
    assert count(conn, "status = 'runnable' AND wake->>'type' = 'signal'") == 2
    # a duplicate signal_id changes nothing and returns the first answer again (S15)
    before = sql(conn, "SELECT id, status, wake FROM pgdurable.runs ORDER BY id")
    again = sql(conn, "SELECT pgdurable.send_signal('ci', 'b2', '1', 'sig-1', NULL)")
    assert sorted(again) == sorted(woke)
    assert sql(conn, "SELECT id, status, wake FROM pgdurable.runs ORDER BY id") == before
    assert sql(conn, "SELECT count(*) FROM pgdurable.signals") == [(1,)]
    # an expired pending signal is not consumed
    conn.execute("INSERT INTO pgdurable.signals (kind, ref, payload, expires_at) "
                 "VALUES ('ci', 'b3', '1', pgdurable.now() - interval '1 s')")
    (r,) = claim(conn, n=1)
    assert sql(conn, "SELECT status FROM pgdurable.park_run(%s, %s, 'w1', '{}', 0, 'ci', 'b3', "
               "NULL, NULL)", r[0], r[2]) == [("waiting",)]


def test_effect_functions(conn: psycopg.Connection[Any]) -> None:
    (rid,) = _seed(conn)
    (row,) = claim(conn)
    tok = row[2]
    assert sql(conn, "SELECT status FROM pgdurable.effect_begin(%s, %s, 'w1', 'e')", rid, tok) == [
        ("started",)]
    sql(conn, "SELECT pgdurable.effect_finish(%s, %s, 'w1', 'e', true, '{\"x\":1}', NULL)", rid, tok)
    assert sql(conn, "SELECT status, result FROM pgdurable.effect_begin(%s, %s, 'w1', 'e')",
               rid, tok) == [("succeeded", {"x": 1})]


def test_claim_uses_partial_indexes(conn: psycopg.Connection[Any]) -> None:
    """The claim, the idle poll and the heartbeat read runs only through indexes.

    Checked by what the executor did, not by a plan printout: this backend's
    scan counters (``pg_stat_xact_user_tables``, ``pg_stat_get_xact_numscans``) before and after
    each call, inside one transaction (pending counters are flushed only
    between transactions, so the difference is exactly that call's scans). It
    needs no module (auto_explain) and means the same on every server.
    """
    conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, status, finished_at)
      SELECT 't', '1', 'completed', now() FROM generate_series(1, 20000);
      INSERT INTO pgdurable.runs (task, revision, status, wait_kind, wait_ref, wake_at)
      SELECT 't', '1', 'waiting', 'ci', g::text, now() + interval '1 day'
        FROM generate_series(1, 5000) g;
      INSERT INTO pgdurable.runs (task, revision) SELECT 't', '1' FROM generate_series(1, 50);
      ANALYZE pgdurable.runs;
    """)
    partial = {"runs_runnable_idx", "runs_leased_idx", "runs_timer_idx"}
    with conn.transaction():
        before = scans(conn)
        rows = claim(conn, n=5)
        seq, used = scans_since(conn, before)
    assert len(rows) == 5
    assert not seq, f"sequential scans in claim_runs: {seq}"
    assert used >= partial, used
    # the idle poll and the heartbeat read only their partial index / the primary key
    with conn.transaction():
        before = scans(conn)
        sql(conn, "SELECT pgdurable.next_wakeup(%s, %s, %s)", ["default"], ["t"], ["1"])
        sql(conn, "SELECT * FROM pgdurable.renew_runs('w1', %s, %s, '60 s')",
            [r[0] for r in rows], [r[2] for r in rows])
        seq, used = scans_since(conn, before)
    assert not seq, f"sequential scans in next_wakeup/renew_runs: {seq}"
    assert used >= {"runs_timer_idx", "runs_leased_idx"}, used
    # min(available_at) of the runnable set: either runnable partial index will do
    # (runs_runnable_key_idx, flow control, has the same predicate)
    assert used & {"runs_runnable_idx", "runs_runnable_key_idx"}, used


def test_sync_client(dsn: str, app: Durable) -> None:
    with DurableClient(dsn, app=app) as client:
        rid = client.start("t", {"s": 1}, idempotency_key="c1")
        assert client.start("t", {"s": 2}, idempotency_key="c1") == rid
        assert client.get_run(rid).state == {"s": 1}
        assert client.cancel(rid) == "cancelled"
        with pytest.raises(RunNotFound):
            client.get_run(uuid.uuid4())
        with pytest.raises(ValueError):
            client.start("t", {"bad": math.nan})
        assert client.signal("k", "r", {"x": 1}) == []
        with psycopg.connect(dsn) as c:
            rid2 = client.start("t", {}, conn=c)
            c.rollback()
        with pytest.raises(RunNotFound):
            client.get_run(rid2)
    with pytest.raises(ProviderClosed):
        client.get_run(rid)
    # without an app: revision= is required for a task it does not know
    with DurableClient(dsn) as bare:
        with pytest.raises(UnknownTask):
            bare.start("t", {})
        assert bare.get_run(bare.start("t", {}, revision="1")).revision == "1"


def test_concurrent_claimers_never_share_a_run(dsn: str, conn: psycopg.Connection[Any]) -> None:
    import threading

    _seed(conn, 200)
    got: list[list[uuid.UUID]] = [[] for _ in range(4)]
    barrier = threading.Barrier(4)

    def claimer(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait()
            while rows := claim(c, owner=f"w{i}", n=7):
                assert len(rows) <= 7
                got[i].extend(r[0] for r in rows)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [rid for g in got for rid in g]
    assert len(every) == len(set(every)) == 200
    assert count(conn, "status = 'leased' AND lease_token = 1 AND claims = 1") == 200


def test_write_steps_batch_fences_each_run(conn: psycopg.Connection[Any]) -> None:
    """One statement for many runs: each row fenced and judged on its own."""
    ids = [sql(conn, "SELECT run_id FROM pgdurable.start_run('t','1','{}','default',0,3,"
                     "NULL,NULL,NULL,NULL)")[0][0] for _ in range(4)]
    tokens = {r[0]: r[2] for r in claim(conn)}
    cont, done, stale, cancelled = ids
    assert sql(conn, "SELECT pgdurable.cancel_run(%s)", cancelled) == [("leased",)]
    rows = sql(conn, "SELECT id, status FROM pgdurable.write_steps('w1', %s, %s::bigint[], "
               "%s::text[]::jsonb[], %s::numeric[], %s, %s::text[]::jsonb[])",
               ids, [tokens[cont], tokens[done], tokens[stale] + 1, tokens[cancelled]],
               ['{"c": 1}', '{"d": 1}', '{"s": 1}', '{"x": 1}'], [0.0, 1.5, 0.0, 0.0],
               [False, True, False, True], [None, '"ok"', None, '"no"'])
    assert dict(rows) == {cont: "leased", done: "completed", stale: "lost",
                          cancelled: "cancelled"}
    got = {r[0]: r[1:] for r in sql(
        conn, "SELECT id, status, state, step, result, spent, lease_owner IS NULL "
        "FROM pgdurable.runs")}
    assert got[cont] == ("leased", {"c": 1}, 1, None, 0, False)
    assert got[done] == ("completed", {"d": 1}, 1, "ok", 1.5, True)
    assert got[stale] == ("leased", {}, 0, None, 0, False)  # untouched
    assert got[cancelled] == ("cancelled", {"x": 1}, 1, None, 0, True)  # state still saved
    assert sorted(r[0] for r in sql(conn, "SELECT run_id FROM pgdurable.checkpoints")) == sorted(
        [cont, done, cancelled])

# -- holes a review found in the SQL engine: no run is lost (invariant 3), bad input
# changes nothing (8), and the indexes the engine relies on. The SQL functions are
# called directly (one connection, the database clock).


def _start_r1(conn: psycopg.Connection[Any], task: str = "t") -> uuid.UUID:
    """A runnable run of ``task``, revision r1."""
    row = conn.execute(
        "SELECT run_id FROM pgdurable.start_run(%s, 'r1', '{}'::jsonb, 'default', 0, 3, NULL, "
        "NULL, NULL, NULL)",
        (task,),
    ).fetchone()
    assert row is not None
    rid: uuid.UUID = row[0]
    return rid


def _claim_raw(conn: psycopg.Connection[Any], owner: str = "w1", ttl: str | None = "30 seconds"
               ) -> list[tuple[Any, ...]]:
    """claim_runs of t/r1 (the raw psycopg error, with its sqlstate, if refused)."""
    return conn.execute(
        "SELECT id, status, lease_token FROM pgdurable.claim_runs(%s, ARRAY['default'], "
        "ARRAY['t'], ARRAY['r1'], 10, %s::interval)",
        (owner, ttl),
    ).fetchall()


def _row(conn: psycopg.Connection[Any], rid: uuid.UUID) -> dict[str, Any]:
    """The run's row, by column name."""
    cur = conn.execute("SELECT * FROM pgdurable.runs WHERE id = %s", (rid,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def test_fk_columns_referencing_runs_are_indexed(conn: psycopg.Connection[Any]) -> None:
    """Every column with a foreign key to pgdurable.runs leads an index that
    covers every non-NULL value: deleting a run (prune_runs, ON DELETE
    CASCADE) must not scan the whole referencing table once per deleted run."""
    rows = conn.execute(
        """
        SELECT c.conrelid::regclass::text, a.attname,
               EXISTS (SELECT FROM pg_index i
                        WHERE i.indrelid = c.conrelid AND i.indkey[0] = c.conkey[1]
                          AND (i.indpred IS NULL
                               OR pg_get_expr(i.indpred, i.indrelid)
                                  = format('(%I IS NOT NULL)', a.attname))) AS indexed
          FROM pg_constraint c
          JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
         WHERE c.contype = 'f' AND c.confrelid = 'pgdurable.runs'::regclass
        """
    ).fetchall()
    assert rows, "expected foreign keys to pgdurable.runs"
    missing = [f"{t}.{col}" for t, col, ok in rows if not ok]
    assert missing == []


@pytest.mark.parametrize("ttl", [None, "0 seconds", "-5 seconds"])
def test_claim_runs_rejects_a_lease_that_cannot_expire_or_is_already_over(
    conn: psycopg.Connection[Any], ttl: str | None
) -> None:
    """A NULL ttl would leave a 'leased' run with lease_expires_at NULL: never
    renewed, never reclaimed (lost, invariant 3). Bad input: PD000, no claim."""
    rid = _start_r1(conn)
    with pytest.raises(psycopg.Error) as ei:
        _claim_raw(conn, ttl=ttl)
    assert ei.value.sqlstate == "PD000"
    r = _row(conn, rid)
    assert r["status"] == "runnable" and r["lease_token"] == 0 and r["claims"] == 0


@pytest.mark.parametrize("ttl", [None, "0 seconds"])
def test_renew_runs_rejects_a_null_or_empty_ttl(conn: psycopg.Connection[Any], ttl: str | None) -> None:
    """renew_runs with a NULL ttl set lease_expires_at = NULL on a leased run:
    it could then never be reclaimed. Bad input: PD000, the lease unchanged."""
    rid = _start_r1(conn)
    [(cid, status, token)] = _claim_raw(conn)
    assert cid == rid and status == "leased"
    before = _row(conn, rid)["lease_expires_at"]
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.renew_runs('w1', ARRAY[%s::uuid], ARRAY[%s::bigint], "
            "%s::interval)",
            (rid, token, ttl),
        )
    assert ei.value.sqlstate == "PD000"
    after = _row(conn, rid)
    assert after["status"] == "leased" and after["lease_expires_at"] == before


def test_write_steps_with_ragged_arrays_changes_nothing(conn: psycopg.Connection[Any]) -> None:
    """unnest pads shorter arrays with NULL: a missing done[i] made run i
    'leased' with lease_owner and lease_expires_at NULL (unreachable forever).
    Arrays of different lengths or NULL ids/tokens/states/done: PD000."""
    a, b = _start_r1(conn), _start_r1(conn)
    claimed = {row[0]: row[2] for row in _claim_raw(conn)}
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.write_steps('w1', ARRAY[%s, %s]::uuid[], "
            "ARRAY[%s, %s]::bigint[], ARRAY['{\"n\": 1}', '{\"n\": 1}']::jsonb[], "
            "ARRAY[0, 0]::numeric[], ARRAY[false]::boolean[], ARRAY[NULL, NULL]::jsonb[])",
            (a, b, claimed[a], claimed[b]),
        )
    assert ei.value.sqlstate == "PD000"
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.write_steps('w1', ARRAY[%s]::uuid[], ARRAY[%s]::bigint[], "
            "ARRAY['{}']::jsonb[], ARRAY[0]::numeric[], ARRAY[NULL]::boolean[], "
            "ARRAY[NULL]::jsonb[])",
            (a, claimed[a]),
        )
    assert ei.value.sqlstate == "PD000"
    for rid in (a, b):
        r = _row(conn, rid)
        assert r["status"] == "leased" and r["step"] == 0
        assert r["lease_owner"] == "w1" and r["lease_expires_at"] is not None
    # the well-formed call still works
    rows = conn.execute(
        "SELECT * FROM pgdurable.write_steps('w1', ARRAY[%s, %s]::uuid[], "
        "ARRAY[%s, %s]::bigint[], ARRAY['{}', '{}']::jsonb[], ARRAY[0, NULL]::numeric[], "
        "ARRAY[false, true]::boolean[], ARRAY[NULL, '1']::jsonb[])",
        (a, b, claimed[a], claimed[b]),
    ).fetchall()
    assert dict(rows) == {a: "leased", b: "completed"}


def test_park_run_timer_without_a_wake_time_is_rejected(conn: psycopg.Connection[Any]) -> None:
    """A plain timer park (kind/ref NULL) with neither wake_at nor wake_in and
    no deadline parked the run 'waiting' on nothing: no timer, no signal can
    wake it (lost, invariant 3). Bad input: PD000, nothing changes."""
    rid = _start_r1(conn)
    [(_, _, token)] = _claim_raw(conn)
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(
            "SELECT * FROM pgdurable.park_run(%s, %s, 'w1', '{\"n\": 1}'::jsonb, 0, NULL, NULL, "
            "NULL, NULL)",
            (rid, token),
        )
    assert ei.value.sqlstate == "PD000"
    r = _row(conn, rid)
    assert r["status"] == "leased" and r["step"] == 0 and r["state"] == {}
    # a wait on a signal without a timeout stays valid (a signal can satisfy it)
    row = conn.execute(
        "SELECT status, wake_at FROM pgdurable.park_run(%s, %s, 'w1', '{}'::jsonb, 0, 'ci', "
        "'b1', NULL, NULL)",
        (rid, token),
    ).fetchone()
    assert row == ("waiting", None)


def test_claim_does_not_starve_expired_leases_and_due_timers(conn: psycopg.Connection[Any]) -> None:
    """claim_runs took runnable runs first and cut the union at p_limit, so
    while the runnable backlog filled every claim, a run whose worker crashed
    (expired lease) or whose timer was due was never claimed: its "future"
    never came (invariant 3; Sleep overshoot without bound). Same priority:
    the run that has been due the longest is claimed first, whatever the
    branch; a higher priority still goes first."""
    crashed, sleeper = _start_r1(conn), _start_r1(conn)
    tokens = {row[0]: row[2] for row in _claim_raw(conn)}
    # sleeper: a timer due since 2000; crashed: its worker's lease lapsed in 2000
    conn.execute(
        "SELECT * FROM pgdurable.park_run(%s, %s, 'w1', '{}'::jsonb, 0, NULL, NULL, "
        "'2000-01-01 00:00:00+00', NULL)",
        (sleeper, tokens[sleeper]),
    )
    conn.execute(
        "UPDATE pgdurable.runs SET lease_expires_at = '2000-01-01 00:00:01+00' WHERE id = %s",
        (crashed,),
    )
    backlog = [_start_r1(conn) for _ in range(3)]  # runnable since now
    got = []
    for _ in range(2):
        [(rid, status, _)] = conn.execute(
            "SELECT id, status, lease_token FROM pgdurable.claim_runs('w2', ARRAY['default'], "
            "ARRAY['t'], ARRAY['r1'], 1, '30 s'::interval)"
        ).fetchall()
        assert status == "leased"
        got.append(rid)
    assert got == [sleeper, crashed]
    # priority still wins over age
    high = conn.execute(
        "SELECT run_id FROM pgdurable.start_run('t', 'r1', '{}'::jsonb, 'default', 5, 3, NULL, "
        "NULL, NULL, NULL)"
    ).fetchone()
    assert high is not None
    claim = (
        "SELECT id FROM pgdurable.claim_runs('w2', ARRAY['default'], ARRAY['t'], ARRAY['r1'], "
        "%s, '30 s'::interval)"
    )
    assert conn.execute(claim, (1,)).fetchall() == [(high[0],)]
    assert {r[0] for r in conn.execute(claim, (10,)).fetchall()} == set(backlog)
