"""Thread ownership and signal routing (CONTRACT S1-S5, S8, S9, S12, S15) on a real Postgres."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, finished, until, until_sync
from _waiting import app_running as running
from fix_fleet import Fleet, WorkerProc

from pgdurable import (
    Continue,
    Done,
    Durable,
    DurableClient,
    InvalidInput,
    RunContext,
    SignalConflict,
    UnknownTask,
)
from pgdurable.runs.threads import Delivery, thread_lease_key
from tests._thread_procs import app as procs_app
from tests._thread_procs import create_scratch

ROOT = Path(__file__).resolve().parent.parent
LEASE_HELPER = str(Path(__file__).resolve().parent / "_lease_procs.py")


def q1(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def proc(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    # a sender, not a worker: a raw process because the test reads its answer from its
    # stdout (last_json), which the fleet merges with stderr into a log file
    return subprocess.Popen(
        [sys.executable, "-m", "tests._thread_procs", args[0], dsn, *args[1:]],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, **(env or {})},
    )


#: The workers of the process tests (the ``fleet`` fixture, tests/fix_fleet.py), with
#: their options as before it (the worker's own concurrency, 16).
FLEET = pytest.mark.fleet("tests._thread_procs:app", ttl=2.0, poll=0.5, grace=1.0,
                          concurrency=16)


def worker_proc(fleet: Fleet, ttl: float = 2.0, env: dict[str, str] | None = None
                ) -> WorkerProc:
    return fleet.start(f"w{len(fleet.all) + 1}", ttl=ttl, env=env)


def last_json(p: subprocess.Popen[str]) -> Any:
    out, err = p.communicate(timeout=WAIT_LIMIT)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def all_consumed(conn: psycopg.Connection[Any], thread: str, n: int) -> Callable[[], bool]:
    def check() -> bool:
        return bool(q1(conn, "SELECT count(*) = %s FROM pgdurable.thread_messages "
                             "WHERE thread_key = %s AND consumed_at IS NOT NULL", (n, thread)))
    return check


def thread_idle(conn: psycopg.Connection[Any], thread: str) -> Callable[[], bool]:
    def check() -> bool:
        return bool(q1(conn, "SELECT NOT EXISTS (SELECT FROM pgdurable.runs WHERE thread_key = %s "
                             "AND status NOT IN ('completed','failed','cancelled'))", (thread,)))
    return check


# -- SQL and API basics ----------------------------------------------------------


async def test_send_starts_a_run_then_delivers_to_it(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    async with app:
        d1 = await app.send("chat:1", {"text": "hi"})
        d2 = await app.send("chat:1", {"text": "again"}, sender="web")
    assert isinstance(d1, Delivery)
    assert (d1.action, d2.action) == ("wake", "deliver")
    assert d1.run_id == d2.run_id and (d1.seq, d2.seq) == (1, 2)
    row = conn.execute(
        "SELECT run_id::text, inbox_depth, owned, run_status, lease_owner "
        "FROM pgdurable.thread_owners WHERE thread_key = 'chat:1'").fetchone()
    assert row is not None
    assert row[:4] == (d1.run_id, 2, True, "runnable")
    assert row[4] == f"{d1.run_id}:0"  # owner is an attempt, not the bare run id
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs WHERE thread_key = 'chat:1'") == 1


async def test_s15_same_message_id_is_stored_once_and_conflicts_are_rejected(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    app.task("chat")(lambda ctx, s: Done(None))
    async with app:
        d1 = await app.send("t", {"n": 1}, message_id="m-1")
        d2 = await app.send("t", {"n": 1}, message_id="m-1")
        with pytest.raises(SignalConflict):
            await app.send("t", {"n": 2}, message_id="m-1")
    assert not d1.duplicate and d2.duplicate
    assert (d2.action, d2.run_id, d2.seq) == (d1.action, d1.run_id, d1.seq)
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages") == 1
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs") == 1


async def test_s15_a_duplicate_executes_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    seen: list[Any] = []

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        msgs = await ctx.inbox()
        seen.extend(m.payload for m in msgs)
        return Continue(state) if msgs else Done(None)

    async with app:
        for _ in range(3):
            await app.send("t", "hello", message_id="same")
        async with running(app):
            await until(lambda: asyncio.sleep(0, thread_idle(conn, "t")()), "thread idle")
    assert seen == ["hello"]


async def test_bad_input_is_rejected_and_writes_nothing(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("chat:", "chat")
    app.task("chat")(lambda ctx, s: Done(None))
    async with app:
        with pytest.raises(ValueError):
            await app.send("", "x")
        with pytest.raises(ValueError):
            await app.send("chat:\ud800", "x")  # lone surrogate (NUL is fine: test_thread_keys)
        with pytest.raises(TypeError):
            await app.send(42, "x")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await app.send("chat:1", {1, 2})
        with pytest.raises(ValueError):
            await app.send("chat:1", float("nan"))
        with pytest.raises(ValueError):
            await app.send("chat:1", "x", message_id="")
        with pytest.raises(UnknownTask):
            await app.send("other:1", "x")
        with pytest.raises(ValueError):
            app.thread_task("x", "chat", idle_ttl=timedelta(0))
    assert q1(conn, "SELECT count(*) FROM pgdurable.threads") == 0
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs") == 0
    with pytest.raises(psycopg.Error) as ei:
        conn.execute("SELECT * FROM pgdurable.send_message('t', '', '1', NULL, 'chat', '1', "
                     "'default', 0, 3)")
    assert ei.value.sqlstate == "PD000"


def test_sync_twin_sends(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    app.task("chat")(lambda ctx, s: Done(None))
    with DurableClient(app=app) as client:
        d1 = client.send("web:1", {"q": 1})
        d2 = client.send("web:1", {"q": 2})
    assert (d1.action, d2.action, d2.run_id) == ("wake", "deliver", d1.run_id)
    # a web process that does not import the task code names the revision
    with DurableClient(dsn) as bare:
        with pytest.raises(UnknownTask):
            bare.send("web:2", "x")
        bare.thread_task("web:", "chat", revision="7", queue="agents")
        d3 = bare.send("web:2", "x")
    row = conn.execute("SELECT task, revision, queue FROM pgdurable.runs WHERE id = %s",
                       (d3.run_id,)).fetchone()
    assert row == ("chat", "7", "agents")


# -- inbox semantics ---------------------------------------------------------------


def test_inbox_consumption_is_checkpointed_with_the_step(conn: psycopg.Connection[Any]) -> None:
    """SQL level: a retried step sees its messages again; a checkpointed one never again."""
    send = ("SELECT run_id::text FROM pgdurable.send_message('t', %s, %s, NULL, 'chat', '1', "
            "'default', 0, 5)")
    rid = q1(conn, send, ("a", '"a"'))
    q1(conn, send, ("b", '"b"'))
    claim = ("SELECT lease_token FROM pgdurable.claim_runs(%s, '{default}', '{chat}', '{1}', 1, "
             "'30 s')")
    take = "SELECT payload FROM pgdurable.take_messages(%s, %s, %s) ORDER BY seq"
    tok = q1(conn, claim, ("w1",))
    assert [r[0] for r in conn.execute(take, (rid, tok, "w1"))] == ["a", "b"]
    conn.execute("SELECT pgdurable.fail_run(%s, %s, 'w1', '{}', 0, '0', false)", (rid, tok))
    tok2 = q1(conn, claim, ("w2",))
    q1(conn, send, ("c", '"c"'))
    assert [r[0] for r in conn.execute(take, (rid, tok2, "w2"))] == ["a", "b", "c"]
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages WHERE consumed_at IS NULL") == 3
    conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w2', '{}', 0)", (rid, tok2))
    assert conn.execute(take, (rid, tok2, "w2")).fetchall() == []
    rows = conn.execute("SELECT consumed_by::text, consumed_step FROM pgdurable.thread_messages").fetchall()
    assert rows == [(rid, 0)] * 3
    # the stale attempt is fenced
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(take, (rid, tok, "w1"))
    assert ei.value.sqlstate == "PD001"


async def test_s3_follow_up_reaches_the_active_run_at_its_next_step(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    gate = asyncio.Event()
    in_step = asyncio.Event()
    got: list[tuple[str, int, list[Any]]] = []

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        msgs = await ctx.inbox()
        got.append((ctx.run_id, ctx.step, [m.payload for m in msgs]))
        if ctx.step == 0:
            in_step.set()
            await gate.wait()
            return Continue(state)
        return Continue(state) if msgs else Done(None)

    async with app, running(app):
        d1 = await app.send("t", "first")
        await asyncio.wait_for(in_step.wait(), WAIT_LIMIT)
        d2 = await app.send("t", "second")
        assert (d2.action, d2.run_id) == ("deliver", d1.run_id)
        gate.set()
        await until(lambda: asyncio.sleep(0, thread_idle(conn, "t")()), "thread idle")
    assert got[0] == (d1.run_id, 0, ["first"])
    assert got[1] == (d1.run_id, 1, ["second"])
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs") == 1


async def test_a_parked_owner_is_woken_by_a_send(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    got: list[Any] = []

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        msgs = await ctx.inbox()
        got.extend(m.payload for m in msgs)
        if "bye" in got:
            return Done(len(got))
        return ctx.wait_inbox()

    async with app, running(app):
        d1 = await app.send("t", "hi")
        await until(lambda: asyncio.sleep(0, q1(conn, "SELECT status FROM pgdurable.runs") == "waiting"),
                    "owner parked")
        # parked owners keep the thread (lease extended by idle_ttl)
        assert q1(conn, "SELECT owned FROM pgdurable.thread_owners") is True
        d2 = await app.send("t", "bye")
        assert (d2.action, d2.run_id) == ("deliver", d1.run_id)
        await until(lambda: asyncio.sleep(0, thread_idle(conn, "t")()), "thread idle")
    assert got == ["hi", "bye"]
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs") == 1


# -- handoff -------------------------------------------------------------------------


def _hammer(dsn: str, key: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, LEASE_HELPER, "hammer", dsn, key, "c"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == "ready"
    return p


def test_s4_handoff_by_transfer_never_lets_a_hammering_acquirer_in(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    send = ("SELECT run_id::text FROM pgdurable.send_message('h', %s, '1', NULL, 'chat', '1', "
            "'default', 0, 3)")
    claim = ("SELECT id::text, lease_token FROM pgdurable.claim_runs('w', '{default}', '{chat}', "
             "'{1}', 1, '30 s')")
    q1(conn, send, ("m0",))
    hammer = _hammer(dsn, thread_lease_key("h"))
    try:
        runs = []
        for i in range(1, 41):
            row = conn.execute(claim).fetchone()
            assert row is not None
            rid, tok = row
            runs.append(rid)
            conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w')", (rid, tok))
            q1(conn, send, (f"m{i}",))  # queued follow-up
            conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)", (rid, tok))
            owner = q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners")
            assert owner is not None and not owner.startswith(rid)
    finally:
        out, err = hammer.communicate(input="", timeout=WAIT_LIMIT)
        assert hammer.returncode == 0, err
        counts = json.loads(out.strip().splitlines()[-1])
    assert counts["won"] == 0 and counts["none_owner"] == 0 and counts["attempts"] > 0
    assert len(set(runs)) == 40
    # every follow-up came from a transfer: one token step per attempt change
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs WHERE thread_key = 'h'") == 41


def test_s5_lost_lease_routes_pending_messages_to_the_winner(conn: psycopg.Connection[Any]) -> None:
    send = ("SELECT action, run_id::text FROM pgdurable.send_message('s5', %s, %s, NULL, 'chat', "
            "'1', 'default', 0, 3)")
    r1 = conn.execute(send, ("a", '"a"')).fetchone()
    assert r1 is not None and r1[0] == "wake"
    rid = r1[1]
    tok = q1(conn, "SELECT lease_token FROM pgdurable.claim_runs('w1', '{default}', '{chat}', "
                   "'{1}', 1, '30 s')")
    conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w1')", (rid, tok))
    assert conn.execute(send, ("b", '"b"')).fetchone() == ("deliver", rid)
    # the owner's thread lease lapses (renewals failed) and X takes the thread
    conn.execute("UPDATE pgdurable.leases SET expires_at = now() - interval '1 s' "
                 "WHERE key = pgdurable.thread_lease_key('s5')")
    x = q1(conn, "INSERT INTO pgdurable.runs (task, revision, thread_key, thread_no) "
                 "VALUES ('chat', '1', 's5', 99) RETURNING id::text")
    got = conn.execute("SELECT acquired FROM pgdurable.acquire_lease("
                       "pgdurable.thread_lease_key('s5'), pgdurable._thread_owner(%s, 0), 60000)",
                       (x,)).fetchone()
    assert got == (True,)
    # the old owner's inbox() now reports the loss
    with pytest.raises(psycopg.Error) as ei:
        conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w1')", (rid, tok))
    assert ei.value.sqlstate == "PD001"
    # completion: transfer fails, acquire loses -> pending messages go to X
    conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w1', '{}', 'null', 0)", (rid, tok))
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs WHERE thread_key = 's5'") == 2
    rows = conn.execute("SELECT message_id, run_id::text, consumed_by::text FROM "
                        "pgdurable.thread_messages ORDER BY seq").fetchall()
    # 'a' was taken in R1's completed step -> consumed by R1; 'b' goes to X
    assert rows == [("a", rid, rid), ("b", x, None)]
    assert q1(conn, "SELECT run_id::text FROM pgdurable.thread_owners") == x
    assert conn.execute(send, ("c", '"c"')).fetchone() == ("deliver", x)


def test_s9_never_delivered_without_a_recipient(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgdurable.acquire_lease(pgdurable.thread_lease_key('f'), "
                 "convert_to('someone-else', 'UTF8'), 60000)")
    with pytest.raises(psycopg.Error) as ei:
        conn.execute("SELECT * FROM pgdurable.send_message('f', 'm', '1', NULL, 'chat', '1', "
                     "'default', 0, 3)")
    assert ei.value.sqlstate == "PD001"
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages") == 0


def test_s12_a_stale_attempt_cannot_release_its_successors_lease(conn: psycopg.Connection[Any]) -> None:
    rid = q1(conn, "SELECT run_id::text FROM pgdurable.send_message('s12', 'm', '1', NULL, 'chat', "
                   "'1', 'default', 0, 5)")
    claim = ("SELECT lease_token FROM pgdurable.claim_runs(%s, '{default}', '{chat}', '{1}', 1, "
             "'30 s')")
    t1 = q1(conn, claim, ("w1",))
    assert q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners") == f"{rid}:{t1}"
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
                 (rid,))  # the first attempt's worker stalls past its lease
    t2 = q1(conn, claim, ("w2",))
    assert t2 == t1 + 1
    owner = q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners")
    assert owner == f"{rid}:{t2}"
    # the stale attempt's cleanup is a no-op
    assert q1(conn, "SELECT pgdurable.release_lease(pgdurable.thread_lease_key('s12'), "
                    "pgdurable._thread_owner(%s, %s))", (rid, t1)) is False
    assert q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners") == owner
    assert q1(conn, "SELECT owned FROM pgdurable.thread_owners") is True


# -- processes ----------------------------------------------------------------------


@pytest.mark.slow
@FLEET
def test_s1_three_processes_on_an_idle_thread_start_exactly_one_run(
    dsn: str, conn: psycopg.Connection[Any], fleet: Fleet
) -> None:
    create_scratch(dsn)
    conn.execute("INSERT INTO pgdurable.threads (thread_key) VALUES ('s1')")
    # hold the idle thread's row so that the three sends race at one instant
    with psycopg.connect(dsn) as gate:
        gate.execute("SELECT FROM pgdurable.threads WHERE thread_key = 's1' FOR UPDATE")
        ps = [proc(dsn, "send", "s1", f"p{i}", json.dumps({"from": i})) for i in range(3)]
        until_sync(lambda: q1(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                    "current_database() AND wait_event_type = 'Lock'") == 3,
                   "three senders blocked on the thread row")
        gate.commit()
    results = [last_json(p) for p in ps]
    actions = sorted(r["action"] for r in results)
    assert actions == ["deliver", "deliver", "wake"]
    assert len({r["run_id"] for r in results}) == 1
    winner = results[0]["run_id"]
    w = worker_proc(fleet)
    try:
        until_sync(thread_idle(conn, "s1"), "thread idle")
        until_sync(all_consumed(conn, "s1", 3), "all consumed")
    finally:
        w.terminate()
    assert q1(conn, "SELECT count(DISTINCT consumed_by) FROM pgdurable.thread_messages") == 1
    assert q1(conn, "SELECT min(consumed_by::text) FROM pgdurable.thread_messages") == winner
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs") == 1
    assert q1(conn, "SELECT count(*) FROM public.t_consumed") == 3


@pytest.mark.slow
@FLEET
def test_s2_a_sender_that_exits_right_after_send_is_still_consumed(
    dsn: str, conn: psycopg.Connection[Any], fleet: Fleet
) -> None:
    create_scratch(dsn)
    p = proc(dsn, "send", "s2", "only", '"durable"')
    d = last_json(p)
    assert d["action"] == "wake"
    w = worker_proc(fleet)
    try:
        until_sync(all_consumed(conn, "s2", 1), "consumed")
    finally:
        w.terminate()
    assert q1(conn, "SELECT payload FROM public.t_consumed") == "durable"


@pytest.mark.slow
@pytest.mark.crash
@FLEET
def test_s8_owner_sigkilled_the_thread_moves_and_queued_messages_are_consumed(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, fleet: Fleet
) -> None:
    create_scratch(dsn)
    block = tmp_path / "block"
    block.write_text("1")
    env = {"PGD_BLOCK_FILE": str(block)}
    with DurableClient(dsn, app=procs_app) as client:
        first = client.send("s8", "one")
        a = worker_proc(fleet, ttl=1.5, env=env)
        try:
            # wait until the step has recorded "one" (it then blocks): killing it
            # any earlier would make "step 0 saw one twice" a matter of timing
            until_sync(lambda: q1(conn, "SELECT count(*) FROM public.t_consumed") == 1,
                       "step 0 consumed 'one'")
            owner1 = q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners")
            second = client.send("s8", "two")
            assert (second.action, second.run_id) == ("deliver", first.run_id)
        finally:
            a.kill()  # SIGKILL, reaped
    block.unlink()
    b = worker_proc(fleet, ttl=1.5)
    try:
        until_sync(all_consumed(conn, "s8", 2), "queued messages consumed")
        until_sync(thread_idle(conn, "s8"), "thread idle")
    finally:
        b.terminate()
    rows = conn.execute("SELECT consumed_by::text FROM pgdurable.thread_messages").fetchall()
    assert rows == [(first.run_id,), (first.run_id,)]
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs") == 1
    owner2 = q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners")
    assert owner2 != owner1  # the new attempt took the thread (then released it)
    # step 0 ran again after the crash and saw "one" again
    assert q1(conn, "SELECT count(*) FROM public.t_steps WHERE step = 0") == 2
    assert q1(conn, "SELECT count(*) FROM public.t_consumed WHERE step = 0 AND payload = '\"one\"'") == 2


@pytest.mark.slow
@FLEET
def test_eight_senders_fifty_messages_one_run_at_a_time(
    dsn: str, conn: psycopg.Connection[Any], fleet: Fleet
) -> None:
    create_scratch(dsn)
    workers = [worker_proc(fleet, ttl=5.0) for _ in range(2)]
    try:
        fleet.ready(*workers)  # both listening
        senders = [proc(dsn, "sender", "busy", f"s{i}", "50") for i in range(8)]
        results = [last_json(p) for p in senders]
        assert sum(r["wake"] + r["deliver"] for r in results) == 400
        until_sync(all_consumed(conn, "busy", 400), "400 consumed")
        until_sync(thread_idle(conn, "busy"), "thread idle")
    finally:
        for w in workers:
            w.terminate()
    # at most one run active at any instant (recorded step intervals never overlap)
    steps = conn.execute("SELECT run_id, started_at, ended_at FROM public.t_steps "
                         "ORDER BY started_at").fetchall()
    for prev, nxt in itertools.pairwise(steps):
        assert prev[2] is not None and prev[2] <= nxt[1], (prev, nxt)
    # every message consumed exactly once, each sender's order kept
    consumed = conn.execute(
        "SELECT c.payload FROM public.t_consumed c JOIN pgdurable.runs r ON r.id = c.run_id "
        "ORDER BY r.thread_no, c.step, c.seq").fetchall()
    payloads = [c[0] for c in consumed]
    assert len(payloads) == 400
    assert len({(p["sender"], p["i"]) for p in payloads}) == 400
    for s in range(8):
        mine = [p["i"] for p in payloads if p["sender"] == f"s{s}"]
        assert mine == list(range(50))
    print("runs:", q1(conn, "SELECT count(*) FROM pgdurable.runs"), "steps:", len(steps))
    # every delivery named a run that exists
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages m "
                    "LEFT JOIN pgdurable.runs r ON r.id = m.run_id WHERE r.id IS NULL") == 0


def test_the_thread_lease_follows_the_run(conn: psycopg.Connection[Any]) -> None:
    """Renewed with the heartbeat, extended by idle_ttl on park, released or handed over at the end."""
    send = ("SELECT run_id::text FROM pgdurable.send_message('L', %s, '1', NULL, 'chat', '1', "
            "'default', 0, 3, NULL, '2 hours')")
    lease = ("SELECT expires_at - now() FROM pgdurable.leases "
             "WHERE key = pgdurable.thread_lease_key('L') AND owner IS NOT NULL")
    rid = q1(conn, send, ("a",))
    assert q1(conn, lease) > timedelta(hours=1, minutes=59)  # runnable owner: idle_ttl
    tok = q1(conn, "SELECT lease_token FROM pgdurable.claim_runs('w', '{default}', '{chat}', "
                   "'{1}', 1, '30 s')")
    run_lease = "SELECT lease_expires_at FROM pgdurable.runs WHERE id = %s"
    thread_exp = ("SELECT expires_at FROM pgdurable.leases "
                  "WHERE key = pgdurable.thread_lease_key('L')")
    assert q1(conn, thread_exp) >= q1(conn, run_lease, (rid,))
    conn.execute("SELECT * FROM pgdurable.renew_runs('w', ARRAY[%s]::uuid[], ARRAY[%s]::bigint[], "
                 "'90 s')", (rid, tok))
    assert q1(conn, thread_exp) >= q1(conn, run_lease, (rid,))
    assert q1(conn, lease) > timedelta(seconds=80)
    conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w')", (rid, tok))
    conn.execute("SELECT * FROM pgdurable.park_run(%s, %s, 'w', '{}', 0, 'inbox', 'L', NULL)",
                 (rid, tok))
    assert q1(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)) == "waiting"
    assert q1(conn, lease) > timedelta(hours=1, minutes=59)  # parked owner keeps the thread
    # a send wakes the parked owner; cancelling it with that message pending starts a follow-up
    assert q1(conn, send, ("b",)) == rid
    assert q1(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", (rid,)) == "runnable"
    assert q1(conn, "SELECT pgdurable.cancel_run(%s)", (rid,)) == "cancelled"
    nxt = q1(conn, "SELECT run_id::text FROM pgdurable.thread_owners")
    assert nxt not in (None, rid)
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages WHERE run_id = %s "
                    "AND consumed_at IS NULL", (nxt,)) == 1
    # the follow-up consumes it and ends with nothing pending: the lease is released
    tok = q1(conn, "SELECT lease_token FROM pgdurable.claim_runs('w', '{default}', '{chat}', "
                   "'{1}', 1, '30 s')")
    assert [r[0] for r in conn.execute("SELECT message_id FROM pgdurable.take_messages(%s, %s, 'w')",
                                       (nxt, tok))] == ["b"]
    conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)", (nxt, tok))
    assert q1(conn, "SELECT owned FROM pgdurable.thread_owners") is False
    assert q1(conn, "SELECT owner FROM pgdurable.leases") is None
    # ... and the next send starts a new owner, which inherits the state of the last run
    conn.execute("UPDATE pgdurable.runs SET state = '{\"memory\": 1}' WHERE id = %s", (nxt,))
    d = conn.execute("SELECT action, run_id::text FROM pgdurable.send_message('L', 'c', '1', NULL, "
                     "'chat', '1', 'default', 0, 3)").fetchone()
    assert d is not None and d[0] == "wake"
    assert q1(conn, "SELECT state FROM pgdurable.runs WHERE id = %s", (d[1],)) == {"memory": 1}


def test_a_poison_message_does_not_start_runs_forever(conn: psycopg.Connection[Any]) -> None:
    send = ("SELECT action FROM pgdurable.send_message('p', %s, '1', NULL, 'chat', '1', "
            "'default', 0, 1)")
    claim = ("SELECT id::text, lease_token FROM pgdurable.claim_runs('w', '{default}', '{chat}', "
             "'{1}', 1, '30 s')")
    assert q1(conn, send, ("poison",)) == "wake"
    for _ in range(3):  # each run takes the message and fails; a follow-up gets it again
        row = conn.execute(claim).fetchone()
        assert row is not None
        conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w')", row)
        conn.execute("SELECT pgdurable.fail_run(%s, %s, 'w', '{}', 0, '0', true)", row)
    assert conn.execute(claim).fetchone() is None  # max_unproductive_runs (3): no 4th run
    assert q1(conn, "SELECT count(*) FROM pgdurable.runs WHERE status = 'failed'") == 3
    row = conn.execute("SELECT owned, inbox_depth FROM pgdurable.thread_owners").fetchone()
    assert row == (False, 1)  # released; the message is kept, not dropped
    assert q1(conn, send, ("next",)) == "wake"  # the next send tries again
    row = conn.execute(claim).fetchone()
    assert row is not None
    got = [r[0] for r in conn.execute("SELECT message_id FROM pgdurable.take_messages(%s, %s, 'w')",
                                      row)]
    assert got == ["poison", "next"]
    conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)", row)
    assert q1(conn, "SELECT unproductive_runs FROM pgdurable.threads") == 0


def test_a_task_that_ignores_its_inbox_does_not_start_runs_forever(
    conn: psycopg.Connection[Any]
) -> None:
    claim = ("SELECT id::text, lease_token FROM pgdurable.claim_runs('w', '{default}', '{chat}', "
             "'{1}', 1, '30 s')")
    conn.execute("SELECT * FROM pgdurable.send_message('i', 'm', '1', NULL, 'chat', '1', "
                 "'default', 0, 3)")
    for _ in range(3):  # each run completes without calling inbox()
        row = conn.execute(claim).fetchone()
        assert row is not None
        conn.execute("SELECT pgdurable.complete_run(%s, %s, 'w', '{}', 'null', 0)", row)
    assert conn.execute(claim).fetchone() is None
    assert conn.execute("SELECT owned, inbox_depth FROM pgdurable.thread_owners").fetchone() == (
        False, 1)


async def test_sends_racing_a_parking_owner_neither_deadlock_nor_lose(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """park_run (run row -> wait lock -> lease row via the trigger) vs send_message."""
    app = Durable(dsn, pool_size=6)
    app.thread_task("", "chat")
    got: list[Any] = []

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        msgs = await ctx.inbox()
        got.extend(m.payload for m in msgs)
        if sum(1 for p in got if p == "last") == 2:
            return Done(len(got))
        return ctx.wait_inbox()

    async def sender(name: str) -> None:
        for i in range(150):
            await app.send("race", [name, i])
        await app.send("race", "last", message_id=f"last-{name}")

    async with app, running(app):
        await app.send("race", "start")
        await asyncio.gather(sender("a"), sender("b"))
        await until(lambda: asyncio.sleep(0, thread_idle(conn, "race")()), "thread idle")
    assert len(got) == 303
    for name in ("a", "b"):
        assert [p[1] for p in got if isinstance(p, list) and p[0] == name] == list(range(150))


def test_prune_thread_messages_deletes_only_old_consumed_messages(conn: psycopg.Connection[Any]) -> None:
    send = ("SELECT run_id::text FROM pgdurable.send_message('r', %s, '1', NULL, 'chat', '1', "
            "'default', 0, 3)")
    rid = q1(conn, send, ("a",))
    q1(conn, send, ("b",))
    tok = q1(conn, "SELECT lease_token FROM pgdurable.claim_runs('w', '{default}', '{chat}', "
                   "'{1}', 1, '30 s')")
    conn.execute("SELECT * FROM pgdurable.take_messages(%s, %s, 'w')", (rid, tok))
    conn.execute("SELECT pgdurable.checkpoint_run(%s, %s, 'w', '{}', 0)", (rid, tok))
    q1(conn, send, ("c",))  # pending
    prune = "SELECT pgdurable.prune_thread_messages(%s, %s)"
    assert q1(conn, prune, (timedelta(hours=1), 10)) == 0  # too recent
    assert q1(conn, prune, (timedelta(0), 1)) == 1  # batches
    assert q1(conn, prune, (timedelta(0), 10)) == 1
    assert [r[0] for r in conn.execute("SELECT message_id FROM pgdurable.thread_messages")] == ["c"]
    with pytest.raises(psycopg.Error) as ei:
        conn.execute(prune, (timedelta(0), 0))
    assert ei.value.sqlstate == "PD000"


async def test_sync_steps_use_the_sync_twins(dsn: str, conn: psycopg.Connection[Any]) -> None:
    app = Durable(dsn)
    app.thread_task("", "chat")
    got: list[Any] = []

    @app.task("chat")
    def chat(ctx: RunContext, state: Any) -> Any:  # a sync step: runs in a worker thread
        msgs = ctx.inbox_sync()
        got.extend(m.payload for m in msgs)
        for m in msgs:
            ctx.emit_sync({"echo": m.payload})
        return Done(None)

    async with app:
        d = await app.send("sync", "hello")
        async with running(app):
            events = [ev async for ev in app.stream(d.run_id, poll=0.2)]
        ctx = RunContext(run_id=d.run_id, task="chat", step=0, attempt=1, token=0, wake=None,
                         deadline=None, budget=None, spent=0.0)
        with pytest.raises(RuntimeError):  # not in a sync step's thread
            ctx.inbox_sync()
    assert got == ["hello"]
    assert [e.event for e in events] == [{"echo": "hello"}, events[-1].event] and events[-1].final


def test_a_run_failed_by_reclaim_hands_over_a_lease_an_older_attempt_holds(
    conn: psycopg.Connection[Any]
) -> None:
    """The worker died; a send re-acquired the lapsed thread lease for the run's attempt;
    the reclaim then ends the run (token + 1 and terminal in one UPDATE: here a pending
    cancel): the follow-up still gets the thread."""
    rid = q1(conn, "SELECT run_id::text FROM pgdurable.send_message('o', 'a', '1', NULL, 'chat', "
                   "'1', 'default', 0, 1)")
    claim = ("SELECT id::text, lease_token, status FROM pgdurable.claim_runs(%s, '{default}', "
             "'{chat}', '{1}', 1, '30 s')")
    row = conn.execute(claim, ("w1",)).fetchone()
    assert row is not None and row[2] == "leased"
    conn.execute("UPDATE pgdurable.leases SET expires_at = now() - interval '1 s' "
                 "WHERE key = pgdurable.thread_lease_key('o')")
    d = conn.execute("SELECT action, run_id::text FROM pgdurable.send_message('o', 'b', '2', NULL, "
                     "'chat', '1', 'default', 0, 1)").fetchone()
    assert d == ("deliver", rid)  # re-acquired for the unfinished run's attempt
    assert q1(conn, "SELECT lease_owner FROM pgdurable.thread_owners") == f"{rid}:{row[1]}"
    assert q1(conn, "SELECT pgdurable.cancel_run(%s)", (rid,)) == "leased"  # requested
    conn.execute("UPDATE pgdurable.runs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
                 (rid,))
    again = conn.execute(claim, ("w2",)).fetchone()  # the reclaim settles the cancel
    assert again is not None and again[0] == rid and again[2] == "cancelled"
    assert again[1] == row[1] + 1
    nxt = q1(conn, "SELECT run_id::text FROM pgdurable.thread_owners")
    assert nxt not in (None, rid)
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages WHERE run_id = %s", (nxt,)) == 2


# -- found by a review: the inbox across calls and attempts, the follow-up's route,
# retrying an older run of a thread


async def test_a_second_inbox_in_the_same_step_returns_only_new_messages(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """``while msgs := await ctx.inbox()`` used to loop forever on the same messages."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    calls: list[list[Any]] = []
    sent = asyncio.Event()

    @app.task("chat")
    async def chat(ctx: RunContext, state: Any) -> Any:
        while len(calls) < 5:  # bound: the bug returned "a" on every call
            msgs = await ctx.inbox()
            calls.append([m.payload for m in msgs])
            if not msgs:
                break
            if len(calls) == 1:  # a message that arrives during the step
                await app.send("t", "b")
                sent.set()
        return Done(None)

    async with app:
        d = await app.send("t", "a")
        async with running(app):
            await finished(app, d.run_id)
    assert sent.is_set()
    assert calls == [["a"], ["b"], []]
    # both were consumed by the step's checkpoint, exactly once
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages "
                    "WHERE consumed_by = %s", (d.run_id,)) == 2


async def test_a_retried_step_still_sees_the_messages_a_failed_attempt_took(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """The per-attempt filter must not hide reserved messages from the retry."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    calls: list[list[Any]] = []

    @app.task("chat", max_attempts=3, retry_base=0.01, retry_cap=0.01)
    async def chat(ctx: RunContext, state: Any) -> Any:
        calls.append([m.payload for m in await ctx.inbox()])
        if len(calls) == 1:
            raise RuntimeError("transient")
        return Done(None)

    async with app:
        d = await app.send("t", "a")
        async with running(app):
            info = await finished(app, d.run_id)
    assert info.status == "completed"
    assert calls == [["a"], ["a"]]


async def test_a_follow_up_run_takes_the_route_of_the_latest_send(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """A deploy: the thread's owner runs revision 1; a sender on the new code
    (revision 2) delivers to it; the owner completes without consuming that
    message. The follow-up run must be revision 2 (the latest send's route),
    which the new workers claim; a revision-1 follow-up would wait forever
    once the old workers are gone."""
    old, new = Durable(dsn), Durable(dsn)
    old.thread_task("", "chat", revision="1")
    new.thread_task("", "chat", revision="2")
    in_step, release = asyncio.Event(), asyncio.Event()
    seen: dict[str, list[Any]] = {"1": [], "2": []}

    @old.task("chat", revision="1")
    async def chat_v1(ctx: RunContext, state: Any) -> Any:
        seen["1"] += [m.payload for m in await ctx.inbox()]
        in_step.set()
        await release.wait()
        return Done()  # the message sent meanwhile stays pending: a follow-up

    @new.task("chat", revision="2")
    async def chat_v2(ctx: RunContext, state: Any) -> Any:
        seen["2"] += [m.payload for m in await ctx.inbox()]
        return Done()

    async with old, new:
        async with running(old):
            first = await old.send("t", "hello")
            await asyncio.wait_for(in_step.wait(), WAIT_LIMIT)
            second = await new.send("t", "after the deploy")
            assert (first.action, second.action) == ("wake", "deliver")
            assert second.run_id == first.run_id
            release.set()
            assert (await finished(old, first.run_id)).status == "completed"
        follow_up = q1(conn, "SELECT id::text FROM pgdurable.runs WHERE thread_key = 't' "
                             "AND thread_no = 2")
        assert follow_up is not None
        assert q1(conn, "SELECT revision FROM pgdurable.runs WHERE id = %s", (follow_up,)) == "2"
        async with running(new):
            assert (await finished(new, follow_up)).status == "completed"
    assert seen == {"1": ["hello"], "2": ["after the deploy"]}
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages "
                    "WHERE consumed_at IS NULL") == 0


async def test_only_the_latest_run_of_a_thread_can_be_retried(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Reviving an older run of a thread would give the thread two live runs
    competing for it: refused (InvalidInput, nothing changes). The latest run
    can be retried, takes the thread again and consumes what waits."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    broken = True

    @app.task("chat", max_attempts=1)
    async def chat(ctx: RunContext, state: Any) -> Any:
        if broken:
            raise RuntimeError("broken tool")
        await ctx.inbox()
        return Done()

    async with app:
        async with running(app):
            first = await app.send("t", "one")
            # each failed run hands the pending message to a follow-up, until
            # max_unproductive_runs (3) runs in a row failed
            await until(lambda: _failed_runs(app, conn, 3), "three failed runs of the thread")
        ids = [r[0] for r in conn.execute("SELECT id::text FROM pgdurable.runs "
                                          "WHERE thread_key = 't' ORDER BY thread_no")]
        assert len(ids) == 3 and ids[0] == first.run_id
        for older in ids[:2]:
            with pytest.raises(InvalidInput, match="not the latest run of its thread"):
                await app.retry(older)
            assert (await app.get_run(older)).status == "failed"  # unchanged
        broken = False
        assert await app.retry(ids[2]) == "runnable"
        async with running(app):
            assert (await finished(app, ids[2])).status == "completed"
    assert q1(conn, "SELECT count(*) FROM pgdurable.thread_messages "
                    "WHERE consumed_at IS NULL") == 0


async def _failed_runs(app: Durable, conn: psycopg.Connection[Any], n: int) -> bool:
    return bool(q1(conn, "SELECT count(*) FROM pgdurable.runs WHERE thread_key = 't' "
                         "AND status = 'failed'") == n)


async def test_a_message_taken_by_a_failed_attempt_is_not_consumed_by_a_later_one(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Attempt 1 of step 0 takes "m1" and fails; attempt 2 of step 0 does not
    call inbox() and checkpoints. "m1" must not be consumed by that checkpoint
    (the code that checkpointed never saw it): step 1 receives it."""
    app = Durable(dsn)
    app.thread_task("", "chat")
    got: list[tuple[int, int, list[Any]]] = []

    @app.task("chat", max_attempts=3, retry_base=0.0, retry_cap=0.0)
    async def chat(ctx: RunContext, state: Any) -> Any:
        if ctx.step == 0 and ctx.attempt == 1:
            got.append((ctx.step, ctx.attempt, [m.payload for m in await ctx.inbox()]))
            raise RuntimeError("tool failed after reading the inbox")
        if ctx.step == 0:
            return Continue({"skipped_inbox": True})  # this attempt never reads it
        got.append((ctx.step, ctx.attempt, [m.payload for m in await ctx.inbox()]))
        return Done()

    async with app:
        async with running(app):
            d = await app.send("t", "m1")
            assert (await finished(app, d.run_id)).status == "completed"
    assert [(s, m) for s, _, m in got] == [(0, ["m1"]), (1, ["m1"])]
    assert q1(conn, "SELECT consumed_step FROM pgdurable.thread_messages "
                    "WHERE message_id IS NOT NULL") == 1
