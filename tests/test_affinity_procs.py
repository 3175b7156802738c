"""Affinity with real worker processes (tests/_affinity_app.py, tests/fix_fleet.py).

The stateful service is a fake browser session held in one worker process's
memory. Every step records (in ``test_affinity_log``) which worker ran it,
whether it was told its service was lost and whether it rebuilt the browser,
so every assertion is made from the database. Races are ordered by waiting on
``pg_stat_activity`` (a backend blocked on a lock, listeners up) and on the
log, never on sleeps; the one time shown (kill -> takeover) is printed, not
asserted. Workers poll once a minute: only NOTIFYs and the due times the
database reports (next_wakeup: a reservation's end, a presence lapse, a lease
expiry) move them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT
from fix_fleet import Fleet, WorkerProc

pytestmark = [pytest.mark.crash, pytest.mark.fleet("_affinity_app:app")]

START = ("SELECT run_id FROM pgdurable.start_run(%s, '1', %s::jsonb, %s, %s, 3, NULL, NULL, "
         "NULL, NULL)")
SIGNAL = "SELECT pgdurable.send_signal('next', %s, '{}', NULL, NULL)"
GATE_KEY = 373737


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE test_affinity_log (run_id uuid, step int, pid int, worker text, "
                 "lost boolean, built boolean, restored text, session text, event text, "
                 "at timestamptz DEFAULT clock_timestamp())")
    return conn


def wait_for(pred: Callable[[], Any], what: str) -> Any:
    end = time.monotonic() + WAIT_LIMIT
    while not (got := pred()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return got


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def start(conn: psycopg.Connection[Any], task: str, state: dict[str, Any], *,
          queue: str = "default", priority: int = 0) -> str:
    return str(one(conn, START, task, json.dumps(state), queue, priority))


def step_log(conn: psycopg.Connection[Any], rid: str, step: int) -> tuple[Any, ...] | None:
    """(worker, lost, built, restored, session) of step ``step``'s last execution."""
    return conn.execute("SELECT worker, lost, built, restored, session FROM test_affinity_log "
                        "WHERE run_id = %s AND step = %s ORDER BY at DESC LIMIT 1",
                        (rid, step)).fetchone()


def logged(conn: psycopg.Connection[Any], rid: str, step: int) -> tuple[Any, ...]:
    return wait_for(lambda: step_log(conn, rid, step), f"step {step} of run {rid}")


def status(conn: psycopg.Connection[Any], rid: str) -> str:
    return str(one(conn, "SELECT status FROM pgdurable.runs WHERE id = %s", rid))


def parked(conn: psycopg.Connection[Any], rid: str) -> None:
    wait_for(lambda: status(conn, rid) == "waiting", f"run {rid} to park")


def finished(conn: psycopg.Connection[Any], rid: str) -> tuple[str, Any]:
    wait_for(lambda: status(conn, rid) in ("completed", "failed", "cancelled"), f"run {rid} to end")
    return one(conn, "SELECT status, result FROM pgdurable.runs WHERE id = %s", rid)


def blocked_on_gate(conn: psycopg.Connection[Any]) -> bool:
    return bool(one(conn, "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = "
                    "current_database() AND wait_event_type = 'Lock' AND query LIKE "
                    "'%%pg_advisory_lock%%'"))


def holder_pinned(conn: psycopg.Connection[Any], fleet: Fleet, mode: str, wait: float,
                  n: int) -> tuple[WorkerProc, str, str]:
    """Worker ``a`` alone claims a browse run and pins it (step 0, browser built
    there): (a, run id, browser session)."""
    a = fleet.start("a", queues="default,a-only", concurrency=1)
    rid = start(conn, "browse", {"mode": mode, "wait": wait, "n": n})
    assert logged(conn, rid, 0) == ("a", False, True, None, logged(conn, rid, 0)[4])
    parked(conn, rid)
    return a, rid, logged(conn, rid, 0)[4]


@contextmanager
def holder_busy(conn: psycopg.Connection[Any], fleet: Fleet, dsn: str) -> Iterator[Any]:
    """Workers b and c up and listening, and the holder a busy: its one slot
    held by a gated run (in a queue only a serves) until the block ends."""
    fleet.start("b", concurrency=2)
    fleet.start("c", concurrency=2)
    fleet.ready()
    with psycopg.connect(dsn, autocommit=True) as gatekeeper:
        gatekeeper.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        start(conn, "gate", {"key": GATE_KEY}, queue="a-only")
        wait_for(lambda: blocked_on_gate(conn), "a to be busy with the gate")
        yield
        gatekeeper.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))


def test_a_killed_holder_s_run_continues_elsewhere_and_rebuilds(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    """Hard-pinned to a, parked; a is SIGKILLed; the signal makes the run ready,
    reserved for a for an hour -- but a's presence lapses (its 2 s lease TTL)
    and b or c claims it: the step sees its service lost, rebuilds the browser
    from the checkpoint (page-1) and pins the run to itself."""
    a, rid, session = holder_pinned(db, fleet, "hard", 3600, 4)
    fleet.start("b", concurrency=2)
    fleet.start("c", concurrency=2)
    fleet.ready()
    db.execute(SIGNAL, (rid,))
    assert logged(db, rid, 1) == ("a", False, False, None, session)  # a is alive: a
    parked(db, rid)
    a.kill()
    killed = time.monotonic()
    db.execute(SIGNAL, (rid,))
    worker, lost, built, restored, new_session = logged(db, rid, 2)
    print(f"taken over {time.monotonic() - killed:.2f} s after SIGKILL (presence TTL 2 s)")
    assert worker in ("b", "c") and lost and built and restored == "page-1"
    assert new_session != session
    record = one(db, "SELECT affinity_worker, affinity_mode, affinity_info FROM pgdurable.runs "
                 "WHERE id = %s", rid)
    assert record == (worker, "hard", {"service": "browser", "session": new_session})
    parked(db, rid)
    db.execute(SIGNAL, (rid,))
    assert finished(db, rid) == ("completed", {"visited": ["page-2", "page-3"],
                                               "session": new_session})
    assert logged(db, rid, 3) == (worker, False, False, None, new_session)


def test_a_holder_killed_mid_step_is_recovered_with_its_service_lost(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    """a is SIGKILLed inside step 1: its lease lapses, another worker runs step 1
    again from the checkpoint and is told the browser is gone."""
    a = fleet.start("a", concurrency=1)
    rid = start(db, "browse", {"mode": "soft", "wait": 60, "n": 3, "hang_at": 1})
    session = logged(db, rid, 0)[4]
    parked(db, rid)
    fleet.start("b", concurrency=2)
    fleet.ready()
    db.execute(SIGNAL, (rid,))
    assert logged(db, rid, 1) == ("a", False, False, None, session)  # a hangs in it
    a.kill()
    wait_for(lambda: step_log(db, rid, 1)[0] == "b", "b to run step 1 again")
    assert step_log(db, rid, 1) == ("b", True, True, "page-0", step_log(db, rid, 1)[4])
    parked(db, rid)
    db.execute(SIGNAL, (rid,))
    status_, result = finished(db, rid)
    assert status_ == "completed" and result["visited"] == ["page-1", "page-2"]


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_the_next_steps_go_to_the_live_holder(
    db: psycopg.Connection[Any], fleet: Fleet, dsn: str, mode: str
) -> None:
    """Three workers; the holder a is busy (its one slot held by a gated run)
    when the run becomes ready. b and c are idle and claim: the probe started
    after the run, one priority lower, is taken -- so they looked -- and the run
    is not. When a's slot frees, a takes its run: same browser, nothing lost."""
    a, rid, session = holder_pinned(db, fleet, mode, 120, 3)
    with holder_busy(db, fleet, dsn):
        db.execute(SIGNAL, (rid,))
        assert status(db, rid) == "runnable"
        probe = start(db, "probe", {}, priority=-1)
        assert finished(db, probe)[1]["worker"] in ("b", "c")
        assert status(db, rid) == "runnable"  # b/c passed it over: it waits for a
        assert step_log(db, rid, 1) is None
    assert logged(db, rid, 1) == ("a", False, False, None, session)
    parked(db, rid)
    db.execute(SIGNAL, (rid,))
    assert finished(db, rid) == ("completed", {"visited": ["page-0", "page-1", "page-2"],
                                               "session": session})
    assert logged(db, rid, 2) == ("a", False, False, None, session)
    assert a.poll() is None


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_a_busy_holder_does_not_starve_its_run(
    db: psycopg.Connection[Any], fleet: Fleet, dsn: str, mode: str
) -> None:
    """The holder stays busy past the pin's wait (1 s: a soft preference window,
    or a hard timeout): b or c takes the run then, and its step is told the
    service is not there (the holder is alive, but elsewhere)."""
    _a, rid, session = holder_pinned(db, fleet, mode, 1.0, 2)
    with holder_busy(db, fleet, dsn):
        db.execute(SIGNAL, (rid,))
        worker, lost, built, restored, new_session = logged(db, rid, 1)
        assert worker in ("b", "c") and lost and built and restored == "page-0"
        assert new_session != session
        assert finished(db, rid)[0] == "completed"
