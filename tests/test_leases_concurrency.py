"""Lease races with real processes: L5 (50 acquirers), L7 (no owner=None loss),
L13 (1,000 transfers while 4 processes hammer acquire)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import until_sync as wait_until

from pgdurable import PostgresLeaseProvider

HELPER = str(Path(__file__).resolve().parent / "_lease_procs.py")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, HELPER, *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def read_json(p: subprocess.Popen[str]) -> Any:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        err = p.stderr.read() if p.stderr else ""
        raise AssertionError(f"helper died: {err}")
    return json.loads(line)




@pytest.mark.slow
def test_l5_fifty_processes_race_for_a_free_key(dsn: str, conn: psycopg.Connection[Any]) -> None:
    n = 50
    dbname = conn.info.dbname
    # Hold a table lock that conflicts with INSERT: every acquirer blocks inside
    # its acquire_lease call; releasing it lets all 50 race for the free key.
    gate = psycopg.connect(dsn)
    gate.execute("LOCK TABLE pgdurable.leases IN SHARE ROW EXCLUSIVE MODE")
    procs = [spawn("acquire", dsn, "thread:race", f"owner-{i}") for i in range(n)]
    try:
        for p in procs:
            assert read_json(p) == "ready"

        def all_blocked() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND application_name = 'pgdurable' AND wait_event_type = 'Lock'",
                (dbname,),
            ).fetchone()
            return bool(row and row[0] == n)

        wait_until(all_blocked, "50 acquirers blocked on the gate")
        gate.rollback()
        results = [read_json(p) for p in procs]
    finally:
        gate.close()
        for p in procs:
            p.wait(timeout=60)
    winners = [r for r in results if r["acquired"]]
    assert len(winners) == 1
    winner = winners[0]["owner"]
    assert all(r["owner"] == winner for r in results)
    assert winners[0]["token"] == 1
    with PostgresLeaseProvider(dsn) as lp:
        assert lp.get_lease_owner("thread:race") == winner


@pytest.mark.slow
def test_l7_a_loser_never_sees_no_owner_while_holders_churn(dsn: str) -> None:
    procs = [spawn("flip", dsn, "thread:flip", f"o{i}", "400") for i in range(3)]
    try:
        for p in procs:
            assert read_json(p) == "ready"
        results = [read_json(p) for p in procs]
    finally:
        for p in procs:
            p.wait(timeout=60)
    assert sum(r["won"] for r in results) >= 1
    assert [r["none_owner"] for r in results] == [0, 0, 0]


@pytest.mark.slow
def test_l13_transfers_under_hammering_never_let_c_in(dsn: str) -> None:
    key = "thread:handoff"
    with PostgresLeaseProvider(dsn) as lp:
        first = lp.acquire_lease(key, "run-0", 60_000)
        assert first.acquired
        hammers = [spawn("hammer", dsn, key, "c") for _ in range(4)]
        try:
            for p in hammers:
                assert read_json(p) == "ready"  # every hammer is acquiring already
            tokens = [first.token]
            for i in range(1, 1001):
                assert lp.transfer_lease(key, f"run-{i - 1}", f"run-{i}", 60_000)
                if i % 100 == 0:
                    lease = lp.get_lease(key)
                    assert lease is not None and lease.owner == f"run-{i}"
                    tokens.append(lease.token)
        finally:
            for p in hammers:
                assert p.stdin is not None
                p.stdin.close()
            results = [read_json(p) for p in hammers]
            for p in hammers:
                p.wait(timeout=60)
        assert lp.get_lease_owner(key) == "run-1000"
        assert tokens == [1 + 100 * j for j in range(11)]  # one new token per transfer
    assert all(r["won"] == 0 for r in results), results
    assert all(r["none_owner"] == 0 for r in results), results
    assert sum(r["attempts"] for r in results) > 4
