"""Retention: pgdurable.prune_runs / prune_preview and pgdurable.retention."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgdurable import Durable, InvalidInput
from pgdurable.ops.retention import (
    PruneResult,
    parse_age,
    prune,
    prune_sync,
    run_pruner,
    run_pruner_sync,
)
from tests import _ops_procs

# n finished runs of `status`, finished `age` ago, each with 2 checkpoints, 1 effect,
# 1 event and 1 consumed signal
SEED = """
WITH r AS (
  INSERT INTO pgdurable.runs (task, revision, queue, status, finished_at, step)
  SELECT 'old', '1', %(queue)s, %(status)s, pgdurable.now() - %(age)s::interval, 2
    FROM generate_series(1, %(n)s)
  RETURNING id),
c AS (INSERT INTO pgdurable.checkpoints (run_id, step, token, state)
      SELECT id, s, 1, '{}' FROM r, generate_series(1, 2) s),
e AS (INSERT INTO pgdurable.effects (run_id, key, status, token, result)
      SELECT id, 'k', 'succeeded', 1, '1' FROM r),
v AS (INSERT INTO pgdurable.run_events (run_id, seq, event) SELECT id, 1, '{}' FROM r)
INSERT INTO pgdurable.signals (kind, ref, consumed_by, consumed_at)
SELECT 'ci', id::text, id, pgdurable.now() FROM r
"""


def seed(conn: psycopg.Connection[Any], n: int, status: str = "completed",
         age: str = "8 days", queue: str = "default") -> None:
    conn.execute(SEED, {"n": n, "status": status, "age": age, "queue": queue})


def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    out = {}
    for table in ("runs", "checkpoints", "effects", "run_events", "signals"):
        row = conn.execute(f"SELECT count(*) FROM pgdurable.{table}").fetchone()
        assert row is not None
        out[table] = row[0]
    return out


def test_parse_age() -> None:
    assert parse_age("7d") == timedelta(days=7)
    assert parse_age("12h") == timedelta(hours=12)
    assert parse_age("30m") == timedelta(minutes=30)
    assert parse_age("90s") == parse_age("90") == timedelta(seconds=90)
    assert parse_age("2w") == timedelta(weeks=2)
    assert parse_age("1.5h") == timedelta(minutes=90)
    for bad in ("", "7 days", "-1d", "d", "7y", "1e9"):
        with pytest.raises(InvalidInput, match="bad age"):
            parse_age(bad)
    with pytest.raises(TypeError):
        parse_age(7)  # type: ignore[arg-type]


def test_prune_deletes_old_terminal_runs_with_history_and_keeps_the_rest(
    conn: psycopg.Connection[Any],
) -> None:
    for status in ("completed", "failed", "cancelled", "incompatible"):
        seed(conn, 3, status)
    seed(conn, 2, "completed", age="6 days")  # too young
    # live runs, however old, are never pruned
    conn.execute("""
      INSERT INTO pgdurable.runs (task, revision, status, created_at, finished_at, wait_kind, wait_ref)
      SELECT 'live', '1', s, now() - interval '30 days', NULL,
             CASE WHEN s = 'waiting' THEN 'ci' END, CASE WHEN s = 'waiting' THEN 'x' END
        FROM unnest(ARRAY['runnable', 'leased', 'waiting']) s""")
    # an unconsumed signal past its TTL by more than the cut-off, and a live pending one
    conn.execute("""INSERT INTO pgdurable.signals (kind, ref, expires_at) VALUES
                    ('ci', 'gone', now() - interval '8 days'), ('ci', 'kept', now() + interval '1 day')""")
    before = counts(conn)
    preview = prune_sync(conn, "7d", dry_run=True)
    assert preview == PruneResult(12, 24, 12, 12, 13, dry_run=True)
    assert counts(conn) == before, "a dry run deletes nothing"

    result = prune_sync(conn, timedelta(days=7), batch=5)
    assert (result.runs, result.checkpoints, result.effects, result.events, result.signals) == (
        12, 24, 12, 12, 13)
    assert result.batches == 3 and not result.skipped and result.rows == 73
    after = counts(conn)
    assert after == {"runs": before["runs"] - 12, "checkpoints": before["checkpoints"] - 24,
                     "effects": before["effects"] - 12, "run_events": before["run_events"] - 12,
                     "signals": before["signals"] - 13}
    left = conn.execute("SELECT task, status FROM pgdurable.runs ORDER BY 1, 2").fetchall()
    assert left == [("live", "leased"), ("live", "runnable"), ("live", "waiting"),
                    ("old", "completed"), ("old", "completed")]
    assert prune_sync(conn, "7d") == PruneResult(batches=1)


def test_prune_boundary_pair(conn: psycopg.Connection[Any]) -> None:
    """finished_at = cut-off - 1 s is pruned; cut-off + 1 s is kept (database clock)."""
    with conn.transaction():
        conn.execute("SET LOCAL pgdurable.now = '2030-01-10 00:00:00+00'")
        conn.execute("""INSERT INTO pgdurable.runs (task, revision, status, finished_at) VALUES
                        ('a', '1', 'completed', '2030-01-02 23:59:59+00'),
                        ('b', '1', 'completed', '2030-01-03 00:00:01+00')""")
        row = conn.execute("SELECT runs FROM pgdurable.prune_runs('7 days', 10)").fetchone()
        assert row == (1,)
        assert conn.execute("SELECT task FROM pgdurable.runs").fetchall() == [("b",)]


def test_bad_input_changes_nothing(conn: psycopg.Connection[Any]) -> None:
    seed(conn, 3)
    before = counts(conn)
    with pytest.raises(InvalidInput):
        prune_sync(conn, timedelta(days=-1))
    with pytest.raises(InvalidInput):
        prune_sync(conn, "soon")
    with pytest.raises(InvalidInput):
        prune_sync(conn, "7d", batch=0)
    with pytest.raises(InvalidInput):
        prune_sync(conn, "7d", batch=100_001)
    with pytest.raises(TypeError):
        prune_sync(conn, 7)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        prune_sync(conn, "7d", batch=True)
    with pytest.raises(TypeError):
        prune_sync(42, "7d")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        prune_sync("mysql://x/y", "7d")
    # the SQL function judges the same way (psql users)
    with pytest.raises(psycopg.Error) as exc:
        conn.execute("SELECT * FROM pgdurable.prune_runs('-1 day', 10)")
    assert exc.value.sqlstate == "PD000"
    with pytest.raises(psycopg.Error) as exc:
        conn.execute("SELECT * FROM pgdurable.prune_runs('1 day', 0)")
    assert exc.value.sqlstate == "PD000"
    assert counts(conn) == before


def test_exclusive_prune_skips_while_another_pruner_holds_the_lock(
    conn: psycopg.Connection[Any], dsn: str,
) -> None:
    seed(conn, 5)
    with psycopg.connect(dsn) as other:  # a pruner mid-batch: holds the xact lock
        other.execute("SELECT pg_advisory_xact_lock(pgdurable.prune_lock_key())")
        skipped = prune_sync(conn, "7d", exclusive=True)
        assert skipped.skipped and skipped.runs == 0 and skipped.batches == 1
        assert counts(conn)["runs"] == 5
        # a manual, non-exclusive prune is not held up
        assert prune_sync(conn, "7d", batch=2).runs == 5
        other.rollback()
    seed(conn, 2)
    assert prune_sync(conn, "7d", exclusive=True).runs == 2


async def test_async_prune_with_every_target(dsn: str, conn: psycopg.Connection[Any]) -> None:
    seed(conn, 4)
    batches: list[PruneResult] = []
    assert (await prune(dsn, "7d", batch=3, on_batch=batches.append)).runs == 4
    assert [b.runs for b in batches] == [3, 1]
    seed(conn, 2)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
        assert (await prune(aconn, "7d", dry_run=True)).runs == 2
        assert (await prune(aconn, "7d")).runs == 2
    seed(conn, 2)
    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True}, open=False) as pool:
        assert (await prune(pool, "7d", pause=0.01, batch=1)).runs == 2
    seed(conn, 2)
    async with Durable(dsn) as app:
        assert (await prune(app, "7d")).runs == 2
    seed(conn, 2)
    with ConnectionPool(dsn, kwargs={"autocommit": True}, open=False) as spool:
        assert prune_sync(spool, "7d").runs == 2
    with pytest.raises(TypeError):
        await prune(object(), "7d")  # type: ignore[arg-type]


async def test_pruners_in_two_apps_share_the_work(dsn: str, conn: psycopg.Connection[Any]) -> None:
    seed(conn, 50)
    seed(conn, 3, age="1 day")
    turns: list[PruneResult] = []
    stop, all_pruned = asyncio.Event(), asyncio.Event()

    def record(result: PruneResult) -> None:
        turns.append(result)
        if sum(t.runs for t in turns) >= 50:
            all_pruned.set()

    async with Durable(dsn) as a, Durable(dsn) as b:
        tasks = [asyncio.create_task(run_pruner(app, every=0.05, older_than="7d", batch=7,
                                                pause=0, stop=stop, on_prune=record))
                 for app in (a, b)]
        await asyncio.wait_for(all_pruned.wait(), timeout=20)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
    assert counts(conn)["runs"] == 3
    assert sum(t.runs for t in turns) == 50
    with pytest.raises(InvalidInput):
        await run_pruner(dsn, every=0)


def test_sync_pruner_in_a_thread(dsn: str, conn: psycopg.Connection[Any]) -> None:
    seed(conn, 20)
    stop, pruned = threading.Event(), threading.Event()
    turns: list[PruneResult] = []

    def record(result: PruneResult) -> None:
        turns.append(result)
        if sum(t.runs for t in turns) >= 20:
            pruned.set()

    thread = threading.Thread(target=run_pruner_sync, kwargs={
        "target": dsn, "every": 0.05, "older_than": "7d", "batch": 6, "stop": stop,
        "on_prune": record})
    thread.start()
    try:
        assert pruned.wait(20)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive() and counts(conn)["runs"] == 0
    with pytest.raises(InvalidInput):
        run_pruner_sync(dsn, older_than="-")


PRUNE_RUNS = 200_000


@pytest.mark.slow
def test_pruning_200k_runs_never_blocks_a_concurrent_claim(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """No claim waits on the prune while 200k runs are pruned.

    200,000 finished runs (each with a checkpoint) are bulk-inserted; a separate
    process claims runnable runs one at a time on its own connection (with a
    5 ms lock_timeout: a claim blocked by the prune's locks fails, and is
    counted) and times every claim while the prune runs in batches of 1,000.
    """
    conn.execute("""
      WITH r AS (
        INSERT INTO pgdurable.runs (task, revision, status, finished_at, step)
        SELECT 'old', '1', 'completed', now() - interval '30 days', 1
          FROM generate_series(1, %s) RETURNING id)
      INSERT INTO pgdurable.checkpoints (run_id, step, token, state) SELECT id, 1, 1, '{}' FROM r
    """, (PRUNE_RUNS,))
    conn.execute("""INSERT INTO pgdurable.runs (task, revision, queue)
                    SELECT 'probe.task', '1', 'probe' FROM generate_series(1, 20000)""")
    conn.execute("ANALYZE pgdurable.runs")
    ctx = multiprocessing.get_context("spawn")
    ready, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_ops_procs.claim_latencies, args=(dsn, ready, stop, out))
    proc.start()
    try:
        assert ready.wait(30)
        time.sleep(0.3)
        t_start = time.time()
        result = prune_sync(dsn, "7d", batch=1000)
        t_end = time.time()
        time.sleep(0.2)
        stop.set()
        samples = out.get(timeout=30)
    finally:
        stop.set()
        proc.join(30)
    assert result.runs == PRUNE_RUNS and result.checkpoints == PRUNE_RUNS
    assert result.batches == PRUNE_RUNS // 1000 + 1
    during = [s for t, s, _ in samples if t_start <= t <= t_end]
    before = [s for t, s, _ in samples if t < t_start]
    blocked = sum(1 for _, _, n in samples if n == -1)
    assert blocked == 0, f"{blocked} claims waited on a lock during the prune"
    assert all(n == 1 for _, _, n in samples), "every probe claim found a run"
    assert len(during) >= 20, f"only {len(during)} claims overlapped the prune"
    worst = max(during)
    print(f"\nprune of {PRUNE_RUNS} runs: {t_end - t_start:.2f} s in {result.batches} batches; "
          f"{len(during)} claims during it, max {worst * 1000:.1f} ms "
          f"(before: max {max(before) * 1000 if before else 0:.1f} ms)")
    # latency is reported, not asserted (no timing thresholds in tests): blocking
    # is judged by the database's lock_timeout above
