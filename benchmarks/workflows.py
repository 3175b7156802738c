"""Workflows vs tasks: throughput, and the cost of resuming a long history.

One command::

    .venv/bin/python benchmarks/workflows.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 3000] [--rounds 3] [--concurrency 32] [--long 1000] [--resumes 5]

``--dsn`` names a maintenance database; the benchmark creates (and drops) its
scratch database ``pgdurable_bench_workflows``.

1. Throughput, same logic both ways, same worker process, alternating rounds:
   ``--runs`` runs of the task ``noop3`` (three no-op steps) against as many
   runs of the workflow ``wf3`` (three no-op recorded steps), enqueue to last
   completion on the database clock (benchmarks/_workflows_app.py). Ratio =
   workflow runs/s / task runs/s (target >= 0.8). A workflow writes one row
   more per run than the task (its last step's checkpoint, then the
   completion; the task's last step IS its completion).
2. Resume cost, in-process worker: runs of ``long`` record 1 or ``--long``
   steps and park on a signal; after the signal, the time from the claim
   statement's answer to the first new step's function call (the history load
   and the replay of every recorded step in between), and the number of
   history queries. Ratio = long / short (target <= 5, one memo query).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_workflows"
HERE = Path(__file__).resolve().parent
BATCH = 500


def start_worker(dsn: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}", "PGDURABLE_DSN": dsn}
    return subprocess.Popen(
        [sys.executable, "-m", "pgdurable.worker", "_workflows_app:app",
         "--concurrency", str(concurrency), "--lease-ttl", "60", "--poll", "5"],
        env=env, cwd=HERE.parent)


def wait_listening(conn: psycopg.Connection[Any]) -> None:
    for _ in range(600):
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND query LIKE 'LISTEN pgdurable%'").fetchone()
        if row and row[0]:
            return
        time.sleep(0.05)
    raise RuntimeError("worker did not start")


def one_batch(c: psycopg.Connection[Any], task: str, runs: int) -> float:
    """Seconds from the first enqueue to the last completion (database clock)."""
    c.execute("TRUNCATE pgdurable.runs CASCADE")
    c.execute("VACUUM ANALYZE pgdurable.runs")
    c.execute("VACUUM ANALYZE pgdurable.checkpoints")
    row = c.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    t0 = row[0]
    left = runs
    while left > 0:
        n = min(BATCH, left)
        c.execute("SELECT pgdurable.start_run(%s, '1', '{}', 'default', 0, 3, NULL, NULL, NULL, "
                  "NULL) FROM generate_series(1, %s)", (task, n))
        left -= n
    deadline = time.monotonic() + 300
    while True:
        row = c.execute("SELECT count(*) FILTER (WHERE status = 'completed'), "
                        "count(*) FILTER (WHERE status IN ('failed', 'cancelled')), "
                        "max(finished_at) FROM pgdurable.runs").fetchone()
        assert row is not None
        if row[0] + row[1] >= runs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {row[0]} of {runs} {task} runs completed")
        time.sleep(0.1)
    if row[1]:
        raise RuntimeError(f"{row[1]} {task} runs did not complete")
    return float((row[2] - t0).total_seconds())


def throughput(dsn: str, runs: int, rounds: int, concurrency: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        worker = start_worker(dsn, concurrency)
        try:
            wait_listening(c)
            time.sleep(0.5)
            one_batch(c, "wf3", 500)  # warm-up (prepared statements, caches)
            one_batch(c, "noop3", 500)
            ratios = []
            for r in range(1, rounds + 1):
                order = ("noop3", "wf3") if r % 2 else ("wf3", "noop3")
                secs = {task: one_batch(c, task, runs) for task in order}
                task_rps, wf_rps = runs / secs["noop3"], runs / secs["wf3"]
                ratios.append(wf_rps / task_rps)
                print(f"round {r}: task noop3 {task_rps:6.0f} runs/s | workflow wf3 "
                      f"{wf_rps:6.0f} runs/s | ratio {wf_rps / task_rps:.2f}")
            print(f"throughput ratio workflow/task: median {statistics.median(ratios):.2f} "
                  f"(target >= 0.8)")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)


async def until(get: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool]) -> None:
    """Poll ``get()`` every 10 ms until ``ok`` of its answer."""
    for _ in range(6000):
        if ok(await get()):
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("timed out")


async def resume_cost(dsn: str, long_n: int, resumes: int) -> None:
    os.environ["PGDURABLE_DSN"] = dsn
    sys.path.insert(0, str(HERE))
    import _workflows_app as wa

    from pgdurable.workflows import LOAD_HISTORY

    app = wa.app
    claimed: dict[str, float] = {}
    loads: dict[str, int] = {}
    fetchall, fetchone = app.fetchall, app.fetchone

    async def timed(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        rows = await fetchall(sql, params, **kw)
        if "claim_runs" in sql:
            now = time.monotonic()
            for r in rows:
                claimed[str(r[0])] = now
        return rows

    async def counted(sql: str, params: tuple[Any, ...], **kw: Any) -> Any:
        if sql == LOAD_HISTORY:
            loads[str(params[0])] = loads.get(str(params[0]), 0) + 1
        return await fetchone(sql, params, **kw)

    app.fetchall, app.fetchone = timed, counted  # type: ignore[method-assign]
    results: dict[int, list[float]] = {1: [], long_n: []}
    async with app:
        worker = app.worker(concurrency=4, poll_interval=1.0)
        task = asyncio.create_task(worker.run())
        try:
            for _ in range(resumes):
                for n in (1, long_n):
                    rid = await app.start("long", n)
                    await until(lambda rid=rid: app.get_run(rid), lambda i: i.status == "waiting")
                    loads.pop(rid, None)
                    await app.signal("go", rid)
                    await until(lambda rid=rid: app.get_run(rid), lambda i: i.terminal)
                    assert loads.get(rid) == 1, loads.get(rid)
                    results[n].append(wa.first_new_step[rid] - claimed[rid])
        finally:
            await worker.stop()
            await task
    short = statistics.median(results[1]) * 1000
    longer = statistics.median(results[long_n]) * 1000
    print(f"claim -> first new step, median of {resumes}: after 1 recorded step {short:.2f} ms, "
          f"after {long_n} {longer:.2f} ms; ratio {longer / short:.1f} (target <= 5); "
          "history queries per resume: 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--resumes", type=int, default=5)
    args = parser.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        print(f"{args.runs} runs per round, one worker process, concurrency {args.concurrency}")
        throughput(dsn, args.runs, args.rounds, args.concurrency)
        asyncio.run(resume_cost(dsn, args.long, args.resumes))
    finally:
        drop_scratch(args.dsn, DB)


if __name__ == "__main__":
    main()
