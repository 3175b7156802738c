"""Crash recovery with real worker processes (CONTRACT R1, R2, R6, R7, R9).

Workers are ``python -m pgdurable.worker _crash_app:app`` subprocesses
(tests/_crash_app.py, started by the ``fleet`` fixture of tests/fix_fleet.py);
every step execution is logged durably in ``test_step_log`` before the step
does anything, so every assertion is made from the database. Races are made deterministic by waiting on
``pg_stat_activity`` (a backend blocked on a lock) and on the step log, never
on sleeps. Bounds like WAIT_LIMIT only keep a broken test from hanging; the
elapsed recovery times are printed, not asserted.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pg_cluster import LocalCluster, local_cluster
from _waiting import WAIT_LIMIT
from fix_fleet import Fleet, WorkerProc

from pgdurable import LeaseLost
from pgdurable.foundation.errors import translate

START = ("SELECT run_id FROM pgdurable.start_run(%s, %s, %s::jsonb, 'default', 0, 3, "
         "NULL, NULL, NULL, NULL)")

pytestmark = [pytest.mark.crash, pytest.mark.fleet("_crash_app:app")]


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE test_step_log (run_id uuid, step int, token bigint, pid int, "
                 "event text, at timestamptz DEFAULT clock_timestamp())")
    return conn


def wait_for(pred: Callable[[], Any], what: str, limit: float = WAIT_LIMIT) -> Any:
    end = time.monotonic() + limit
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def start(conn: psycopg.Connection[Any], state: str, task: str = "steps", rev: str = "1") -> Any:
    return one(conn, START, task, rev, state)


def status(conn: psycopg.Connection[Any], rid: Any) -> str:
    return str(one(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", rid))


def wait_terminal(conn: psycopg.Connection[Any], rid: Any) -> str:
    return str(wait_for(lambda: (s := status(conn, rid)) in ("completed", "failed", "cancelled")
                        and s, f"run {rid} to finish"))


def logged(conn: psycopg.Connection[Any], rid: Any) -> list[tuple[Any, ...]]:
    """(step, token, pid, event) of every step execution of the run, in order."""
    return conn.execute("SELECT step, token, pid, event FROM test_step_log WHERE run_id = %s "
                        "ORDER BY at", (rid,)).fetchall()


def checkpoints(conn: psycopg.Connection[Any], rid: Any) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT step, token FROM pgdurable.checkpoints WHERE run_id = %s ORDER BY step",
        (rid,)).fetchall()]


def blocked_on(conn: psycopg.Connection[Any], fragment: str) -> bool:
    """Some backend of this database waits on a lock running a query containing ``fragment``."""
    return bool(one(conn, "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = "
                    "current_database() AND wait_event_type = 'Lock' AND query LIKE %s",
                    f"%{fragment}%"))


def test_r1_sigkill_mid_step_resumes_from_last_checkpoint(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    a = fleet.start("a")
    rid = start(db, '{"n": 5, "hang_at": 3}')
    wait_for(lambda: (3, 1, a.pid, "start") in logged(db, rid), "a to be inside step 3")
    assert checkpoints(db, rid) == [(1, 1), (2, 1), (3, 1)]
    b = fleet.start("b")  # polls once a minute: only the lease expiry can wake it
    a.kill()
    killed = time.monotonic()
    assert wait_terminal(db, rid) == "completed"
    print(f"R1: resumed and completed {time.monotonic() - killed:.2f} s after SIGKILL (TTL 2 s)")
    # earlier checkpoints kept (token 1), the rest written by b's claim (token 2)
    assert checkpoints(db, rid) == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]
    runs = [(s, t, p) for s, t, p, _ in logged(db, rid)]
    assert runs == [(0, 1, a.pid), (1, 1, a.pid), (2, 1, a.pid), (3, 1, a.pid),
                    (3, 2, b.pid), (4, 2, b.pid)]
    info = db.execute("SELECT state->>'i', result, lease_token, attempts, reclaims, claims "
                      "FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert info == ("5", {"i": 5}, 2, 0, 0, 2)
    assert b.terminate() == 0


def test_r2_stopped_worker_is_fenced_after_takeover(
    db: psycopg.Connection[Any], fleet: Fleet, dsn: str
) -> None:
    key = 424242
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (key,))
        a = fleet.start("a")
        rid = start(db, f'{{"n": 4, "stall_at": 1, "stall_key": {key}}}')
        # a is inside step 1 with its whole event loop blocked (no heartbeat) ...
        wait_for(lambda: blocked_on(db, "pg_advisory_lock"), "a to stall inside step 1")
        a.stop()  # ... and now the process is stopped too
        b = fleet.start("b")
        assert wait_terminal(db, rid) == "completed"
        holder.execute("SELECT pg_advisory_unlock(%s)", (key,))
    newer = db.execute("SELECT state, result, lease_token, step FROM pgdurable.runs "
                       "WHERE id = %s", (rid,)).fetchone()
    assert newer is not None and newer[1] == {"i": 4} and newer[2] == 2 and newer[3] == 4
    assert newer[0]["by"] == b.pid
    a.cont()
    # a's step returns and goes straight to its fenced checkpoint: refused
    wait_for(lambda: f"run {rid}: lease lost" in a.log(), "a to report its lease lost")
    assert a.terminate() == 0
    after = db.execute("SELECT state, result, lease_token, step FROM pgdurable.runs "
                       "WHERE id = %s", (rid,)).fetchone()
    assert after == newer  # the newer state stands
    assert checkpoints(db, rid) == [(1, 1), (2, 2), (3, 2), (4, 2)]
    assert [(s, t, p) for s, t, p, _ in logged(db, rid)] == [
        (0, 1, a.pid), (1, 1, a.pid), (1, 2, b.pid), (2, 2, b.pid), (3, 2, b.pid)]
    assert b.terminate() == 0


def test_r6_unknown_revision_stays_runnable_and_visible(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    other_rev = start(db, '{"n": 1}', rev="2")
    ghost = start(db, '{"n": 1}', task="ghost")
    a = fleet.start("a")
    # started last, so the claim that took it saw (and skipped) the older two
    mine = start(db, '{"n": 1}')
    assert wait_terminal(db, mine) == "completed"
    for rid in (other_rev, ghost):
        assert db.execute(
            "SELECT status, claims, lease_token, error FROM pgdurable.runs WHERE id = %s",
            (rid,)).fetchone() == ("runnable", 0, 0, None)
        assert logged(db, rid) == []
    # a checkpoint for a run nobody claimed (wrong revision) is refused, visibly
    with pytest.raises(LeaseLost):
        try:
            db.execute("SELECT pgdurable.checkpoint_run(%s, 0, 'a', '{\"x\": 1}', 0)",
                       (other_rev,))
        except psycopg.Error as exc:
            raise translate(exc) from exc
    assert one(db, "SELECT state FROM pgdurable.runs WHERE id = %s", other_rev) == {"n": 1}
    # the operator retires revision 2 explicitly; the ghost task is left alone
    assert one(db, "SELECT pgdurable.mark_incompatible('steps', '2', 'revision 2 retired')") == 1
    err = one(db, "SELECT error FROM pgdurable.runs WHERE id = %s", other_rev)
    assert status(db, other_rev) == "incompatible" and err["type"] == "IncompatibleCheckpoint"
    assert "revision 2 retired" in err["message"]
    assert status(db, ghost) == "runnable"
    assert a.poll() is None and a.terminate() == 0


def test_r7_cancel_stops_a_leased_run_promptly_via_notify(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    # TTL 300 s: heartbeats every 100 s, so only the NOTIFY can deliver the cancel
    a = fleet.start("a", ttl=300.0)
    rid = start(db, '{"n": 3, "hang_at": 1}')
    wait_for(lambda: (1, 1, a.pid, "start") in logged(db, rid), "a to be inside step 1")
    sent = time.monotonic()
    assert one(db, "SELECT pgdurable.cancel_run(%s)", rid) == "leased"
    assert wait_terminal(db, rid) == "cancelled"
    print(f"R7: cancelled {time.monotonic() - sent:.3f} s after cancel_run (heartbeat 100 s)")
    assert (1, 1, a.pid, "cancelled") in logged(db, rid)  # the step itself was cancelled
    err = one(db, "SELECT error FROM pgdurable.runs WHERE id = %s", rid)
    assert err["type"] == "RunCancelled"
    assert checkpoints(db, rid) == [(1, 1)]
    assert a.poll() is None and a.terminate() == 0


@pytest.mark.slow
def test_r7_cancel_racing_completion_both_orders(
    db: psycopg.Connection[Any], fleet: Fleet, dsn: str
) -> None:
    """The completion (write_steps) and cancel_run queue on the run's row lock (held by the
    test) in a chosen order; the first to get the lock wins, and the final
    status says which."""
    a = fleet.start("a", ttl=60.0)
    for i, order in enumerate(["complete_first", "cancel_first"] * 3):
        key = 5000 + i
        with psycopg.connect(dsn, autocommit=True) as gate, \
                psycopg.connect(dsn) as row_lock, psycopg.connect(dsn, autocommit=True) as canc:
            gate.execute("SELECT pg_advisory_lock(%s)", (key,))
            rid = start(db, f'{{"n": 1, "gate_at": 0, "gate_key": {key}}}')
            wait_for(lambda: blocked_on(db, "pg_advisory_lock"), "the step to reach the gate")
            row_lock.execute("SELECT 1 FROM pgdurable.runs WHERE id = %s FOR UPDATE", (rid,))
            got: list[str] = []

            def cancel() -> None:
                got.append(one(canc, "SELECT pgdurable.cancel_run(%s)", rid))  # noqa: B023

            t = threading.Thread(target=cancel)
            if order == "cancel_first":
                t.start()
                wait_for(lambda: blocked_on(db, "cancel_run"), "cancel_run to queue")
                gate.execute("SELECT pg_advisory_unlock(%s)", (key,))
                wait_for(lambda: blocked_on(db, "write_steps"), "the completion (write_steps) to queue")
            else:
                gate.execute("SELECT pg_advisory_unlock(%s)", (key,))
                wait_for(lambda: blocked_on(db, "write_steps"), "the completion (write_steps) to queue")
                t.start()
                wait_for(lambda: blocked_on(db, "cancel_run"), "cancel_run to queue")
            row_lock.commit()
            t.join(WAIT_LIMIT)
        final = wait_terminal(db, rid)
        info = db.execute("SELECT result, error->>'type', state->>'i' FROM pgdurable.runs "
                          "WHERE id = %s", (rid,)).fetchone()
        if order == "complete_first":
            assert (final, got) == ("completed", ["completed"])
            assert info == ({"i": 1}, None, "1")
        else:
            assert (final, got) == ("cancelled", ["leased"])
            assert info == (None, "RunCancelled", "1")  # the final state is still saved
    assert a.terminate() == 0


def test_sigterm_gives_the_lease_back_at_once(
    db: psycopg.Connection[Any], fleet: Fleet, dsn: str
) -> None:
    # TTL 300 s: b can only get the run through the give-back, never by expiry
    a = fleet.start("a", ttl=300.0)
    key = 6060
    with psycopg.connect(dsn, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (key,))
        rid = start(db, f'{{"n": 3, "gate_at": 1, "gate_key": {key}}}')
        wait_for(lambda: blocked_on(db, "pg_advisory_lock"), "a to be inside step 1")
        b = fleet.start("b", ttl=300.0)
        a.send(signal.SIGTERM)
        wait_for(lambda: "stopping" in a.log(), "a to handle SIGTERM")
        assert a.poll() is None  # a waits for its running step (grace 30 s)
        gate.execute("SELECT pg_advisory_unlock(%s)", (key,))
        assert a.wait() == 0
    assert wait_terminal(db, rid) == "completed"
    # step 1 finished and was checkpointed by a, then b continued at once
    assert checkpoints(db, rid) == [(1, 1), (2, 1), (3, 2)]
    assert [(s, t, p) for s, t, p, _ in logged(db, rid)] == [
        (0, 1, a.pid), (1, 1, a.pid), (2, 2, b.pid)]
    info = db.execute("SELECT error, reclaims, claims FROM pgdurable.runs WHERE id = %s",
                      (rid,)).fetchone()
    assert info == (None, 0, 2)  # a give-back, not a reclaim after expiry
    assert b.terminate() == 0


@pytest.mark.slow
def test_poison_run_that_kills_its_workers_fails(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    rid = start(db, '{"n": 3, "kill_at": 1}', task="poison")  # max_reclaims=1
    dead: list[WorkerProc] = []
    for n in range(5):
        w = fleet.start(f"w{n}")
        wait_for(lambda: w.poll() is not None or status(db, rid) == "failed",  # noqa: B023
                 f"worker w{n} to die or the run to fail")
        if w.poll() is None:
            break
        assert w.returncode == -signal.SIGKILL
        dead.append(w)
    assert status(db, rid) == "failed" and len(dead) == 2
    err, attempts, reclaims = db.execute(
        "SELECT error, attempts, reclaims FROM pgdurable.runs WHERE id = %s", (rid,)).fetchone()
    assert err["type"] == "PoisonRun" and "max_reclaims 1" in err["message"]
    assert (attempts, reclaims) == (0, 2)  # crashes are not failed steps
    assert checkpoints(db, rid) == [(1, 1)]
    assert [(s, t, p) for s, t, p, _ in logged(db, rid)] == [
        (0, 1, dead[0].pid), (1, 1, dead[0].pid), (1, 2, dead[1].pid)]


@pytest.mark.slow
def test_four_workers_500_runs_each_step_once(db: psycopg.Connection[Any], fleet: Fleet) -> None:
    workers = [fleet.start(f"w{i}", ttl=10.0, poll=1.0, concurrency=16) for i in range(4)]
    db.execute("SELECT pgdurable.start_run('steps', '1', '{\"n\": 3}', 'default', 0, 3, "
               "NULL, NULL, NULL, NULL) FROM generate_series(1, 500)")
    wait_for(lambda: one(db, "SELECT count(*) FROM pgdurable.runs WHERE status = 'completed'")
             == 500, "500 runs to complete", limit=180.0)
    assert one(db, "SELECT count(*) FROM pgdurable.checkpoints") == 1500
    assert db.execute("SELECT run_id, step FROM pgdurable.checkpoints GROUP BY 1, 2 "
                      "HAVING count(DISTINCT token) > 1").fetchall() == []
    # no crash, so every step ran exactly once, in one process
    assert one(db, "SELECT count(*) FROM test_step_log") == 1500
    assert db.execute("SELECT run_id, step FROM test_step_log GROUP BY 1, 2 "
                      "HAVING count(*) > 1").fetchall() == []
    by_pid = db.execute("SELECT pid, count(*) FROM test_step_log GROUP BY 1").fetchall()
    print("steps per worker pid:", sorted(n for _, n in by_pid))
    assert {p for p, _ in by_pid} <= {w.pid for w in workers}
    for w in workers:
        assert w.terminate() == 0


def _server_up(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as c:
            c.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def _ensure_server(dsn: str, cluster: LocalCluster) -> None:
    """Whatever happened, leave the server running (the same cluster, never another)."""
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if _server_up(dsn):
            return
        time.sleep(0.2)
    cluster.start()
    wait_for(lambda: _server_up(dsn), "postgres to start")


@pytest.fixture
def own_cluster(dsn: str) -> LocalCluster:
    """The cluster serving the suite's DSN, which this test may restart; else a skip."""
    found = local_cluster(dsn)
    if isinstance(found, str):
        pytest.skip(f"cannot restart the server under test from here: {found}")
    return found


def test_restart_targets_the_server_under_test(dsn: str, own_cluster: LocalCluster) -> None:
    """The restart test's target is the suite's server (identification only: no restart)."""
    with psycopg.connect(dsn) as c:
        row = c.execute("SELECT current_setting('data_directory'), current_setting('port')::int"
                        ).fetchone()
    assert row is not None
    assert (own_cluster.data_dir, own_cluster.port) == (Path(row[0]).resolve(), row[1])
    if own_cluster.debian is None:
        # the embedded server (or a hand-started one) is restarted with its own pg_ctl
        assert (own_cluster.pg_ctl.parent / "postgres").exists()


@pytest.mark.slow
def test_r9_postgres_restart_mid_run(dsn: str, fleet: Fleet, own_cluster: LocalCluster) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE test_step_log (run_id uuid, step int, token bigint, pid int, "
                  "event text, at timestamptz DEFAULT clock_timestamp())")
        c.execute("SELECT pgdurable.start_run('steps', '1', '{\"n\": 3, \"sleep\": 0.05}', "
                  "'default', 0, 3, NULL, NULL, NULL, NULL) FROM generate_series(1, 150)")
        a = fleet.start("a", ttl=2.0, poll=1.0, concurrency=8)
        wait_for(lambda: one(c, "SELECT count(*) FROM pgdurable.runs WHERE status = "
                             "'completed'") >= 20, "some runs to complete")
        print("R9: restarting", own_cluster.describe(), "with",
              one(c, "SELECT count(*) FROM pgdurable.runs WHERE status = 'completed'"),
              "of 150 runs completed")
    try:
        own_cluster.restart()
    finally:
        _ensure_server(dsn, own_cluster)
    assert a.poll() is None  # the worker survived the restart
    with psycopg.connect(dsn, autocommit=True) as c:
        wait_for(lambda: one(c, "SELECT count(*) FROM pgdurable.runs WHERE status = "
                             "'completed'") == 150, "every run to complete", limit=120.0)
        assert one(c, "SELECT count(*) FROM pgdurable.checkpoints") == 450
        assert c.execute("SELECT id FROM pgdurable.runs WHERE result <> '{\"i\": 3}'"
                         ).fetchall() == []
    assert a.terminate() == 0
    assert "reconnecting" in a.log()  # its listener did see the restart
