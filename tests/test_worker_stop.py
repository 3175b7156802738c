"""A stopped worker process ends within its grace period plus a constant, even when
step code ignores the stop, and its runs go on elsewhere (real processes).

``python -m pgdurable.worker --grace 2`` gets SIGTERM while a step of tests/_stop_app.py
misbehaves: a sync step sleeping in its thread (no cancellation reaches it), an
async step that swallows every ``CancelledError``, an async step that blocks the
event loop once cancelled. Without a bound the first process lives until the
sleep ends and the second for ever (``asyncio.run`` and the interpreter's exit
wait for them). Each test asserts that the process exits (the wait is generous:
it only keeps a broken test from hanging) and that another worker then runs the
run. A step that lets itself be cancelled still stops cleanly (exit 0).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import until_sync
from fix_fleet import Fleet, WorkerProc

from pgdurable import DurableClient
from pgdurable.ops.worker_process import SETTLE_LIMIT, WATCHDOG_AFTER_GRACE

GRACE = 2.0
TTL = 60.0  # longer than any of these tests waits: a run goes on because it was given back
#: How long the test waits for the process to exit: the bound, plus slack for a loaded
#: machine. A process without the bound lives 120 s (or for ever) and fails the wait.
EXIT_WAIT = GRACE + WATCHDOG_AFTER_GRACE + 30.0

pytestmark = [pytest.mark.crash, pytest.mark.fleet("_stop_app:app", ttl=TTL, grace=GRACE,
                                                   poll=0.5, concurrency=2)]


@pytest.fixture
def marks(fleet: Fleet, tmp_path: Path) -> Path:
    """The folder where a step on worker ``a`` says it runs (``STOP_DIR``)."""
    d = tmp_path / "marks"
    d.mkdir()
    fleet._env["STOP_DIR"] = str(d)
    return d


def start(fleet: Fleet, task: str) -> str:
    with DurableClient(fleet.dsn) as client:
        return client.start(task, {}, revision="1")


def run_row(conn: psycopg.Connection[Any], rid: str) -> tuple[Any, ...]:
    row = conn.execute("SELECT status, lease_owner, lease_token, result FROM pgdurable.runs "
                       "WHERE id = %s", (rid,)).fetchone()
    assert row is not None
    return tuple(row)


def stop_and_wait(w: WorkerProc) -> int:
    """SIGTERM ``w`` and wait for it to exit (failing the test if it does not)."""
    w.send(signal.SIGTERM)
    try:
        return w.wait(timeout=EXIT_WAIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"worker {w.name} still runs {EXIT_WAIT:.0f} s after SIGTERM "
                             f"(grace {GRACE:g} s):\n{w.log()}") from None


def taken_by_b(fleet: Fleet, conn: psycopg.Connection[Any], rid: str) -> None:
    fleet.start("b")
    until_sync(lambda: run_row(conn, rid)[0] == "completed", f"run {rid} to complete on b")
    assert run_row(conn, rid)[3] == {"by": "b"}


@pytest.mark.parametrize("task", ["sync_sleeper", "swallower"])
def test_a_step_that_ignores_the_stop_does_not_hold_the_process(
    fleet: Fleet, marks: Path, conn: psycopg.Connection[Any], task: str
) -> None:
    a = fleet.start("a")
    fleet.ready(a)
    rid = start(fleet, task)
    until_sync(lambda: (marks / rid).exists(), "the step to run on a")
    assert run_row(conn, rid)[:3] == ("leased", "a", 1)
    t0 = time.monotonic()
    code = stop_and_wait(a)
    took = time.monotonic() - t0
    log = a.log()
    # ended by the process itself, saying what still ran; not a clean exit
    assert code == 1, log
    said = [line for line in log.splitlines() if "step code still runs after the stop" in line]
    assert len(said) == 1, log
    if task == "sync_sleeper":
        # the engine gave the run back when it cancelled the step; its thread sleeps on
        assert "pgdurable-step" in said[0] and "_stop_app.py" in said[0], log
    else:
        # the step swallowed its cancellation: the run is still held when run()
        # returns, and given back before the process ends
        assert f"gave back 1 run(s) whose step did not stop: {rid}" in log, log
        assert f"runs {rid}; 1 task(s) that ignore cancellation" in said[0], log
    assert "still running" not in log  # ended right away, not by the watchdog
    print(f"{task}: exited {took:.1f} s after SIGTERM (grace {GRACE:g} s, settle "
          f"{SETTLE_LIMIT:g} s, watchdog at +{WATCHDOG_AFTER_GRACE:g} s)")
    # given back at its last checkpoint, not left leased until the TTL
    assert run_row(conn, rid)[:2] == ("runnable", None)
    taken_by_b(fleet, conn, rid)


def test_the_watchdog_ends_a_process_whose_loop_is_blocked(
    fleet: Fleet, marks: Path, conn: psycopg.Connection[Any]
) -> None:
    """Once cancelled, the step blocks the event loop: nothing of the worker runs,
    not even its own clean-up. The watchdog armed at SIGTERM ends the process
    ``grace`` + WATCHDOG_AFTER_GRACE seconds later; the lease, which nobody renews
    any more, lapses, and the run goes on elsewhere."""
    a = fleet.start("a", ttl=5.0)
    fleet.ready(a)
    rid = start(fleet, "blocker")
    until_sync(lambda: (marks / rid).exists(), "the step to run on a")
    code = stop_and_wait(a)
    log = a.log()
    assert code == 1, log
    assert f"still running {GRACE + WATCHDOG_AFTER_GRACE:.0f} s after the stop was asked" in log
    assert f"runs held {rid}" in log, log
    taken_by_b(fleet, conn, rid)


def test_a_step_that_lets_itself_be_cancelled_stops_cleanly(
    fleet: Fleet, marks: Path, conn: psycopg.Connection[Any]
) -> None:
    a = fleet.start("a")
    fleet.ready(a)
    rid = start(fleet, "polite")
    until_sync(lambda: (marks / rid).exists(), "the step to run on a")
    code = stop_and_wait(a)
    log = a.log()
    assert code == 0, log
    assert "still runs" not in log and "still running" not in log, log
    assert run_row(conn, rid)[:2] == ("runnable", None)
    taken_by_b(fleet, conn, rid)
