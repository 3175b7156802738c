"""Invariant 7 at scale: 10,000 parked runs cost an idle worker (almost) nothing.

The worker runs in its own process (tests._signal_procs idle). Over a
measurement window it reports its own CPU time (``time.process_time``: every
thread of the process) and the statements it issued (every pool statement
goes through ``Durable.fetchone``/``fetchall``, counted by a subclass; the
LISTEN connection issues nothing while idle, its health check runs after 60 s
of silence). No statement is counted by the server, so other tests running
on the same server cannot disturb the count.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import psycopg
import pytest

POLL = 0.5
WARMUP = 1.5
WINDOW = 4.0


@pytest.mark.slow
def test_idle_worker_with_10000_parked_runs(dsn: str, conn: psycopg.Connection[Any]) -> None:
    # half wait for a signal only, half also have a timer a day away
    conn.execute(
        "INSERT INTO pgdurable.runs (task, revision, status, step, wait_kind, wait_ref, "
        "wait_since, wake_at) SELECT 'parked', '1', 'waiting', 1, 'never', i::text, "
        "pgdurable.now(), CASE WHEN i % 2 = 0 THEN pgdurable.now() + interval '1 day' END "
        "FROM generate_series(1, 10000) AS i")
    conn.execute("ANALYZE pgdurable.runs")
    out = subprocess.run(
        [sys.executable, "-m", "tests._signal_procs", "idle", dsn, str(POLL), str(WARMUP),
         str(WINDOW)], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"idle worker over {got['wall']:.2f} s: {got['statements']} statements, "
          f"{got['cpu'] * 1000:.1f} ms CPU ({100 * got['cpu'] / got['wall']:.2f}% of one core)")
    # at most one statement per (jittered, >= 0.8 * POLL) poll interval, plus one edge
    assert got["statements"] <= math.ceil(got["wall"] / (0.8 * POLL)) + 1
    # near-zero CPU: a busy-polling loop would burn a whole core (100%)
    assert got["cpu"] < 0.05 * got["wall"]
    # nothing was claimed: parked runs stay parked
    assert conn.execute("SELECT count(*) FROM pgdurable.runs WHERE status = 'waiting'"
                        ).fetchone() == (10000,)
