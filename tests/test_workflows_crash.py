"""Workflows under real crashes: worker processes (``python -m pgdurable.worker
_workflow_app:app``, tests/_workflow_app.py; the ``fleet`` fixture) SIGKILLed at
every step boundary and inside every step, and a SIGSTOPped zombie. Every step execution is in the
ledger table, so the counts are read from the database."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT
from fix_fleet import Fleet, WorkerProc

START = ("SELECT run_id FROM pgdurable.start_run('agent', '1', %s::jsonb, %s, 0, 3, "
         "NULL, NULL, NULL, NULL)")
STEPS = ["search", "read", "slow", "push", "summarize", "report"]
BOUNDARIES = ["search", "read", "sleep", "slow", "push", "ci", "summarize", "approval"]

pytestmark = [pytest.mark.crash,
              pytest.mark.fleet("_workflow_app:app", ttl=4.0, poll=0.2, concurrency=2)]


def start_worker(fleet: Fleet, queue: str, **options: Any) -> WorkerProc:
    """A worker of ``queue``, named ``QUEUE-N`` (the fleet's Nth process)."""
    return fleet.start(f"{queue}-{len(fleet.all)}", queues=queue, **options)


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE wf_ledger (run_id uuid, name text, pid int, "
                 "at timestamptz DEFAULT clock_timestamp())")
    conn.execute("CREATE TABLE wf_kills (run_id uuid, point text, PRIMARY KEY (run_id, point))")
    conn.execute("CREATE TABLE wf_remote (run_id uuid PRIMARY KEY, ref text)")
    return conn


def _one(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def _ledger(conn: psycopg.Connection[Any], rid: Any) -> dict[str, int]:
    rows = conn.execute("SELECT name, count(*) FROM wf_ledger WHERE run_id = %s GROUP BY name",
                        (rid,)).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def test_sigkill_at_every_step_boundary(db: psycopg.Connection[Any], fleet: Fleet) -> None:
    """One run per kill point (its own queue and workers, all at once): each fn
    runs exactly once, except a safe one in flight at the kill (twice); the
    reconcile step in flight is reconciled, never re-run; every result equals
    the uninterrupted run's, also when the last step is ``ctx.finish``."""
    scenarios: dict[str, dict[str, Any]] = {"none": {}}
    scenarios |= {f"in:{s}": {"kill_in": s} for s in STEPS}
    scenarios |= {f"after:{b}": {"kill_after": b} for b in BOUNDARIES}
    scenarios["finish, in:report"] = {"finish": True, "kill_in": "report"}  # ctx.finish
    runs: dict[str, Any] = {}
    procs: dict[str, WorkerProc] = {}
    started: dict[str, int] = {}
    for i, (point, spec) in enumerate(scenarios.items()):
        queue = f"q{i}"
        rid = _one(db, START, json.dumps({"topic": "pg", **spec}), queue)
        runs[point] = rid
        # the approval is sent before the run waits for it: kept, then consumed
        db.execute("SELECT pgdurable.signal_run(%s, 'approval', '{\"by\": \"alice\"}', NULL, "
                   "NULL)", (rid,))
        procs[point] = start_worker(fleet, queue)
        started[point] = 1
    ci_sent: set[str] = set()
    end = time.monotonic() + 4 * WAIT_LIMIT
    while True:
        live = 0
        for point, rid in runs.items():
            status, wait_kind = _one(db, "SELECT status, wait_kind FROM pgdurable.runs "
                                         "WHERE id = %s", rid)
            if status in ("completed", "failed", "cancelled"):
                continue
            live += 1
            if status == "waiting" and wait_kind == "ci" and point not in ci_sent:
                db.execute("SELECT pgdurable.signal_run(%s, 'ci', '{\"green\": true}', NULL, "
                           "NULL)", (rid,))
                ci_sent.add(point)
            if procs[point].poll() is not None:  # killed itself: a fresh worker takes over
                procs[point] = start_worker(fleet, f"q{list(runs).index(point)}")
                started[point] += 1
        if not live:
            break
        assert time.monotonic() < end, "runs did not finish"
        time.sleep(0.05)
    results = {}
    for point, rid in runs.items():
        status, result, error = _one(db, "SELECT status, result, error FROM pgdurable.runs "
                                         "WHERE id = %s", rid)
        assert status == "completed", (point, error)
        results[point] = result
        counts = _ledger(db, rid)
        expected = {s: 1 for s in STEPS}
        killed_in = scenarios[point].get("kill_in")
        if killed_in == "push":
            expected["reconcile:push"] = 1          # reconciled, never re-run
        elif killed_in:
            expected[killed_in] = 2                 # a safe fn in flight: at most twice
        # a lease that lapses WITHOUT a kill (a CPU-starved worker missing its
        # heartbeats for a whole TTL) legitimately re-runs a safe step: the TTL
        # is generous for a loaded machine, and the logs say when it happened
        logs = "".join(w.log() for w in fleet.workers
                       if w.name.startswith(f"q{list(runs).index(point)}-"))
        assert counts == expected, (point, [line for line in logs.splitlines()
                                            if "trusted" in line or "attempt" in line])
        if point != "none":
            assert _one(db, "SELECT count(*) FROM wf_kills WHERE run_id = %s", rid) == 1, point
            assert started[point] >= 2, point
        names = [r[0] for r in db.execute(
            "SELECT state->'workflow'->>'name' FROM pgdurable.checkpoints WHERE run_id = %s "
            "ORDER BY step", (rid,)).fetchall()]
        assert names == ["search", "read", "sleep#1", "slow", "push", "signal:ci#1",
                         "summarize", "signal:approval#1", "report",
                         *([] if scenarios[point].get("finish") else ["return"])], point
    assert all(r == results["none"] for r in results.values()), results


def _until(pred: Any, what: str) -> None:
    """Poll ``pred()`` until true (a hang guard of WAIT_LIMIT per phase, not a timing assert)."""
    end = time.monotonic() + WAIT_LIMIT
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_zombie_cannot_record_a_step(db: psycopg.Connection[Any], fleet: Fleet) -> None:
    """A worker SIGSTOPped inside step 'slow' past its lease TTL, then SIGCONTed
    after another worker finished the run: its checkpoint is refused."""
    rid = _one(db, START, json.dumps({"topic": "z", "stall": 3}), "zq")
    db.execute("SELECT pgdurable.signal_run(%s, 'ci', 'true', NULL, NULL)", (rid,))
    db.execute("SELECT pgdurable.signal_run(%s, 'approval', 'true', NULL, NULL)", (rid,))
    zombie = start_worker(fleet, "zq", ttl=2.0)
    _until(lambda: _ledger(db, rid).get("slow"), "the zombie to enter step slow")
    zombie.stop()
    token = _one(db, "SELECT lease_token FROM pgdurable.runs WHERE id = %s", rid)
    _until(lambda: not _one(db, "SELECT lease_expires_at > now() FROM pgdurable.runs "
                                "WHERE id = %s", rid), "the zombie's lease to expire")
    start_worker(fleet, "zq", ttl=5.0)
    _until(lambda: _one(db, "SELECT status FROM pgdurable.runs WHERE id = %s", rid)
           == "completed", "the second worker to complete the run")
    rows_before = db.execute("SELECT step, token, state FROM pgdurable.checkpoints "
                             "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    zombie.cont()
    # the zombie's stalled fn returns straight into its fenced checkpoint
    # (the loop was blocked: no heartbeat ran first); then a graceful stop
    # makes it settle every write it has started before it exits
    _until(lambda: _ledger(db, rid).get("slow:returned"), "the zombie's step to return")
    assert zombie.terminate() == 0
    rows_after = db.execute("SELECT step, token, state FROM pgdurable.checkpoints "
                            "WHERE run_id = %s ORDER BY step", (rid,)).fetchall()
    assert rows_after == rows_before
    names = [r[2]["workflow"]["name"] for r in rows_after]
    assert names[3] == "slow" and all(r[1] != token for r in rows_after[3:])
    assert _ledger(db, rid) == {s: 1 for s in STEPS} | {"slow": 2, "slow:returned": 1}
    assert _one(db, "SELECT status FROM pgdurable.runs WHERE id = %s", rid) == "completed"
