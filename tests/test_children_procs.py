"""Child runs with real worker processes (issue 14).

* A parent fans out 100 children across 3 worker processes; one worker is
  SIGKILLed midway. Exactly 100 children exist, each completed, and the parent
  is claimed exactly twice (started, woken once) with every result; a second
  process waits for the parent's result with ``DurableClient.result``.
* A step that starts children and then loses its lease (its worker SIGSTOPped
  until another worker took the run over) creates no duplicate: the new attempt
  finds the same children, and the stale attempt's later start is refused.

Workers are ``python -m pgdurable.worker _children_app:app`` (tests/_children_app.py),
started by the ``fleet`` fixture (tests/fix_fleet.py).
Every wait is on database state (bounded by WAIT_LIMIT only to not hang).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, until_sync
from fix_fleet import Fleet

START = ("SELECT run_id::text FROM pgdurable.start_run(%s, '1', %s::jsonb, 'default', 0, 3, "
         "NULL, NULL, NULL, NULL)")

pytestmark = [pytest.mark.crash, pytest.mark.fleet("_children_app:app", poll=0.5, grace=5.0)]


@pytest.fixture
def db(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE test_child_log (run_id uuid, step int, token bigint, pid int, "
                 "event text)")
    return conn


def one(conn: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def test_fan_out_100_across_3_workers_with_one_sigkilled(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    pid = one(db, START, "fan", json.dumps({"n": 100, "sleep": 0.1}))
    client = fleet.spawn("client", "-m", "_children_app", "result", pid, str(WAIT_LIMIT))
    workers = [fleet.start(f"w{i}") for i in range(3)]
    # midway: the parent has parked on its children, some but not all are done
    until_sync(lambda: one(db, "SELECT status = 'waiting' AND (SELECT count(*) FROM "
                           "pgdurable.runs c WHERE c.parent_run_id = p.id AND c.status = "
                           "'completed') >= 10 FROM pgdurable.runs p WHERE p.id = %s", pid),
               "parent parked with 10 children done")
    done_at_kill = one(db, "SELECT count(*) FROM pgdurable.runs WHERE parent_run_id = %s "
                       "AND status = 'completed'", pid)
    workers[0].kill()
    until_sync(lambda: one(db, "SELECT status IN ('completed', 'failed', 'cancelled') "
                           "FROM pgdurable.runs WHERE id = %s", pid), "parent done")
    status, claims, result = db.execute(
        "SELECT status, claims, result FROM pgdurable.runs WHERE id = %s", (pid,)).fetchone() or ()
    assert status == "completed", fleet.logs()
    assert done_at_kill < 100
    assert claims == 2  # started once, woken once: not once per child
    kids = db.execute("SELECT id::text, status, result FROM pgdurable.runs "
                      "WHERE parent_run_id = %s", (pid,)).fetchall()
    assert len(kids) == 100
    reclaimed = one(db, "SELECT count(*) FROM pgdurable.runs WHERE parent_run_id = %s "
                    "AND claims > 1", pid)
    print(f"children done at the kill: {done_at_kill}; reclaimed after it: {reclaimed}")
    assert {k[1] for k in kids} == {"completed"}
    assert sorted(k[2]["i"] for k in kids) == list(range(100))
    outcomes = result["children"]
    assert set(outcomes) == {k[0] for k in kids}
    assert all(v["status"] == "completed" and v["result"] is not None for v in outcomes.values())
    # the parent's two steps ran once each (no re-run of the fan-out step)
    assert db.execute("SELECT step, count(*) FROM test_child_log WHERE run_id = %s GROUP BY step "
                      "ORDER BY step", (pid,)).fetchall() == [(0, 1), (1, 1)]
    # the other process got the same result through DurableClient.result
    assert client.wait(timeout=WAIT_LIMIT) == 0
    got = json.loads(client.log().strip().splitlines()[-1])
    assert got == result


def test_step_that_loses_its_lease_starts_no_duplicate_children(
    db: psycopg.Connection[Any], fleet: Fleet
) -> None:
    pid = one(db, START, "stall", "{}")
    a = fleet.start("a", ttl=2.0)
    until_sync(lambda: one(db, "SELECT count(*) FROM test_child_log WHERE run_id = %s AND "
                           "event = 'started' AND token = 1", pid), "first attempt started")
    a.stop()  # no heartbeat: its lease lapses
    fleet.start("b", ttl=2.0)
    until_sync(lambda: one(db, "SELECT status = 'completed' FROM pgdurable.runs WHERE id = %s",
                           pid), "parent completed by the second worker")
    # the zombie attempt wakes up: it either tries one more child (refused by
    # the fence) or is stopped by its own heartbeat first; then it exits
    assert a.terminate() == 0  # SIGCONT, SIGTERM
    kids = db.execute("SELECT child_key, status FROM pgdurable.runs WHERE parent_run_id = %s "
                      "ORDER BY child_key", (pid,)).fetchall()
    assert kids == [("k0", "completed"), ("k1", "completed"), ("k2", "completed")]
    tokens = db.execute("SELECT DISTINCT token FROM test_child_log WHERE run_id = %s AND "
                        "event = 'started' ORDER BY token", (pid,)).fetchall()
    assert len(tokens) == 2  # both attempts started "their" children: the same three
    assert one(db, "SELECT count(*) FROM test_child_log WHERE event = 'k3 started'") == 0
    result = one(db, "SELECT result FROM pgdurable.runs WHERE id = %s", pid)
    assert len(result["children"]) == 3
