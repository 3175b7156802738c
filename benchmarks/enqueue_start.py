"""Enqueue -> start latency: from ``start()`` returning to the run's first step
running, pgdurable against pgqueuer and procrastinate doing the same.

One command (needs the ``bench`` extra: ``pip install -e '.[bench]'``)::

    .venv/bin/python benchmarks/enqueue_start.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and drops) its
own scratch database ``pgdurable_bench_enqueue_start`` with all three schemas.
Each system has ONE idle worker process (pgdurable: ``app.worker()`` defaults,
concurrency 16; pgqueuer: ``PgQueuer.run()`` defaults; procrastinate:
``run_worker_async(concurrency=10)``, LISTEN/NOTIFY on). The driver process
enqueues one run/job at a time (pgdurable: ``await app.start(...)``; pgqueuer:
``Queries.enqueue``; procrastinate: ``defer_async``) and waits for it to start
before the next one (``--spacing`` later), so every trial finds its worker idle.

Latency = the worker's ``time.monotonic()`` at the first line of the step/job
minus the driver's right after the enqueue call returned (CLOCK_MONOTONIC is
system-wide on Linux: comparable across processes). Rounds alternate between
the systems (order rotated each round) so that they share the machine's
conditions. Targets (issue 21): our p50 <= the best peer's p50, our p99 <= 2x
that p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import _peers
from _scratch import drop_scratch, scratch_dsn

from pgdurable import Done, Durable, RunContext

DB = "pgdurable_bench_enqueue_start"
OURS = "pgdurable"


def _say(payload: str) -> None:
    sys.stdout.write(f"{payload} {time.monotonic():.9f}\n")
    sys.stdout.flush()


def make_app(dsn: str) -> Durable:
    app = Durable(dsn, pool_size=4)

    @app.task("first", revision="1")
    async def first(ctx: RunContext, state: dict[str, Any]) -> Any:
        _say(state["p"])
        return Done(None)

    return app


async def our_worker(dsn: str, on_job: Any, steps: int = 1) -> None:
    app = make_app(dsn)
    async with app:
        await app.worker(queues=["bench"]).run()


def worker_main(system: str, dsn: str) -> None:
    run = our_worker if system == OURS else _peers.WORKER[system]
    print("ready", flush=True)
    asyncio.run(run(dsn, _say))


class Worker:
    """A worker process and the start times it reports."""

    def __init__(self, system: str, dsn: str) -> None:
        self.system = system
        self.dsn = dsn
        self.proc: asyncio.subprocess.Process | None = None
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", self.system, "--dsn", self.dsn,
            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))},
        )
        assert self.proc.stdout is not None
        assert (await self.proc.stdout.readline()).strip() == b"ready"
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            payload, _, t = line.decode().partition(" ")
            fut = self.waiting.pop(payload, None)
            if fut is not None and not fut.done():
                fut.set_result(float(t))

    def expect(self, payload: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[payload] = fut
        return fut

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 20)


async def producer(system: str, dsn: str) -> tuple[Any, Any]:
    if system != OURS:
        return await _peers.PRODUCER[system](dsn)
    app = Durable(dsn, pool_size=2)
    await app.open()

    async def start(payload: str) -> Any:
        return await app.start("first", {"p": payload}, revision="1", queue="bench")

    return start, app.close


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def bench(dsn: str, systems: list[str], rounds: int, trials: int, spacing: float,
                warmup: int) -> dict[str, list[float]]:
    workers = {s: Worker(s, dsn) for s in systems}
    producers = {s: await producer(s, dsn) for s in systems}
    lat: dict[str, list[float]] = {s: [] for s in systems}
    try:
        for w in workers.values():
            await w.start()
        await asyncio.sleep(1.0)  # listeners connected, first polls done
        for r in range(rounds + 1):  # round 0: warm-up, not counted
            order = systems[r % len(systems):] + systems[:r % len(systems)]
            for s in order:
                enqueue = producers[s][0]
                for i in range(warmup if r == 0 else trials):
                    payload = f"{s}-{r}-{i}"
                    fut = workers[s].expect(payload)
                    await enqueue(payload)
                    t0 = time.monotonic()
                    t1 = await asyncio.wait_for(fut, 30)
                    if r > 0:
                        lat[s].append(t1 - t0)
                    await asyncio.sleep(spacing)
    finally:
        for w in workers.values():
            await w.stop()
        for _, close in producers.values():
            await close()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--trials", type=int, default=150, help="per system per round")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--spacing", type=float, default=0.01, help="seconds between trials")
    ap.add_argument("--peers", default=",".join(_peers.PEERS))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, args.dsn)
        return
    peers = [p for p in args.peers.split(",") if p]
    missing = [p for p in peers if p not in _peers.available()]
    if missing:
        sys.exit(f"missing peers {missing}: pip install -e '.[bench]'")
    dsn = scratch_dsn(args.dsn, DB)
    try:
        for p in peers:
            asyncio.run(_peers.INSTALL[p](dsn))
        load0 = os.getloadavg()[0]
        t = time.monotonic()
        lat = asyncio.run(bench(dsn, [OURS, *peers], args.rounds, args.trials, args.spacing,
                                args.warmup))
        took = time.monotonic() - t
    finally:
        drop_scratch(args.dsn, DB)
    print(f"enqueue -> first step starts ({args.rounds} alternating rounds x {args.trials} "
          f"sequential trials per system; load avg {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{took:.0f} s)")
    print(f"{'system':<14} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    p50 = {}
    for s, xs in lat.items():
        p50[s] = pct(xs, 50)
        print(f"{s:<14} {p50[s] * 1e3:8.2f} {pct(xs, 90) * 1e3:8.2f} {pct(xs, 99) * 1e3:8.2f} "
              f"{statistics.fmean(xs) * 1e3:8.2f}")
    if peers:
        best = min(peers, key=lambda p: p50[p])
        ours50, ours99 = p50[OURS], pct(lat[OURS], 99)
        print(f"ratio p50 ours / best peer ({best}) = {ours50 / p50[best]:.2f}  "
              f"(target <= 1.00: {'met' if ours50 <= p50[best] else 'NOT met'})")
        print(f"ratio p99 ours / best peer's p50 = {ours99 / p50[best]:.2f}  "
              f"(target <= 2.00: {'met' if ours99 <= 2 * p50[best] else 'NOT met'})")


if __name__ == "__main__":
    main()
