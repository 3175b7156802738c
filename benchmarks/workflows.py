"""Workflows vs tasks: throughput, and the cost of resuming a long history.

One command (about 40 s on a quiet machine, under 2 minutes loaded)::

    .venv/bin/python benchmarks/workflows.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--runs 1000] [--rounds 12] [--concurrency 32] [--long 1000] [--resumes 5]

``--dsn`` names a maintenance database; the benchmark creates (and drops) its
scratch database ``pgdurable_bench_workflows``.

1. Throughput, same logic both ways, same worker process: ``--rounds`` rounds,
   each ``--runs`` runs of the task ``noop3`` (three no-op steps), of the
   workflow ``wf3`` (three no-op recorded steps, ``return await ctx.step``)
   and of ``wf3f`` (the same ending in ``return await ctx.finish``), the
   order rotating, enqueue to last completion on the database clock
   (benchmarks/_workflows_app.py; the driver is benchmarks/_driver.py, shared
   with benchmarks/throughput.py). Ratio per round = workflow runs/s / task
   runs/s; reported: its median and spread (target >= 0.8), and the fenced
   writes per run (checkpoint rows): ``wf3`` writes one more than the task
   (its last step's checkpoint, then the completion: a returned step is
   durable before the code after it runs); ``wf3f`` and the task write the
   last step and the completion in one statement. Also, where the server runs
   on this machine: the CPU seconds per run of the worker process and of the
   database backends serving it (from ``/proc``), a cost ratio that depends
   far less on what else a shared machine runs than the wall-clock one.
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
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from _driver import HERE, CpuMeter, load, spread, timed_runs, worker_process
from _scratch import drop_scratch, scratch_dsn

DB = "pgdurable_bench_workflows"


def writes_per_run(c: psycopg.Connection[Any]) -> float:
    """Checkpoint rows (= fenced writes) per run of the batch just timed."""
    row = c.execute("SELECT (SELECT count(*) FROM pgdurable.checkpoints)::float "
                    "/ greatest(1, (SELECT count(*) FROM pgdurable.runs))").fetchone()
    assert row is not None
    return float(row[0])


#: the task, the workflow ending in ``return await ctx.step(...)``, the
#: workflow ending in ``return await ctx.finish(...)``
STYLES = {"noop3": "task noop3", "wf3": "workflow wf3 (step + return)",
          "wf3f": "workflow wf3f (finish)"}


def throughput(dsn: str, runs: int, rounds: int, concurrency: int) -> None:
    names = list(STYLES)
    rates: dict[str, list[float]] = {t: [] for t in names}
    cpu: dict[str, list[float]] = {t: [] for t in names}  # ms per run
    writes: dict[str, float] = {}
    with (psycopg.connect(dsn, autocommit=True) as c,
          worker_process(dsn, "_workflows_app:app", concurrency=concurrency) as worker):
        meter = CpuMeter(c, worker.pid)
        for task in names:  # warm-up (prepared statements, caches)
            timed_runs(c, task, 500)
        for r in range(rounds):
            for task in names[r % 3:] + names[:r % 3]:  # each order in turn
                meter.start()
                rates[task].append(runs / timed_runs(c, task, runs))
                used = meter.stop()
                if used is not None:
                    cpu[task].append(used * 1000 / runs)
                writes[task] = writes_per_run(c)
            print(f"round {r + 1}: " + " | ".join(f"{t} {rates[t][-1]:5.0f}" for t in names)
                  + f" runs/s | ratios {rates['wf3'][-1] / rates['noop3'][-1]:.2f} "
                  f"{rates['wf3f'][-1] / rates['noop3'][-1]:.2f} | {load()}")
    for task in names:
        used = f"; CPU ms per run {spread(cpu[task], '.3f')}" if cpu[task] else ""
        print(f"{STYLES[task]}: runs/s {spread(rates[task], '.0f')}; {writes[task]:g} "
              f"fenced writes per run{used}")
    for task in names[1:]:
        ratios = [w / t for w, t in zip(rates[task], rates["noop3"], strict=True)]
        print(f"throughput ratio {STYLES[task]} / task: {spread(ratios)} (target >= 0.8)")
        if cpu[task]:
            costs = [t / w for w, t in zip(cpu[task], cpu["noop3"], strict=True)]
            print(f"  CPU per run, task / workflow (the same ratio measured by cost, steadier "
                  f"under load): {spread(costs)}")


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

    from pgdurable.models.workflows import LOAD_HISTORY

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
        if sql == LOAD_HISTORY.sql:
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
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--long", type=int, default=1000)
    parser.add_argument("--resumes", type=int, default=5)
    args = parser.parse_args()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        print(f"{args.runs} runs per round, one worker process, concurrency {args.concurrency}; "
              f"{load()}")
        throughput(dsn, args.runs, args.rounds, args.concurrency)
        asyncio.run(resume_cost(dsn, args.long, args.resumes))
    finally:
        drop_scratch(args.dsn, DB)


if __name__ == "__main__":
    main()
