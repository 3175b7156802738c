"""Trickle under contention: runs started one at a time by a producer, against
our own drain rate, quiet and with a CPU hog; pgqueuer doing the same.

One command (pgqueuer needs the ``bench`` extra: ``pip install -e '.[bench]'``)::

    .venv/bin/python benchmarks/trickle.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and drops) the
scratch database ``pgdurable_bench_trickle``. One worker process per system
(pgdurable: ``app.worker()``, concurrency 16, task ``three``: three steps, two
checkpoints and the completion; pgqueuer: its defaults, one job per run whose
three "steps" are no-ops, since it has no checkpoints). The driver process is
the producer. Two phases, each measuring, in this order:

* **drain** (baseline): ``--runs`` runs inserted by one ``start_many`` with a
  1 s delayed start, so the worker finds them all at once;
* **trickle**: the producer calls ``await app.start(...)`` ``--runs`` times,
  one after the other, as fast as it can;
* **producer alone**: the same starts on a queue no worker serves (then
  deleted): the ceiling of any trickle, printed as ``alone / drain``;
* **pgqueuer trickle**: the same with ``Queries.enqueue``.

Rate = runs / (the worker's ``time.monotonic()`` at the end of the last run's
last step - the first run's first step (drain) or the first enqueue call
(trickle)); CLOCK_MONOTONIC is system-wide. Phase ``quiet`` runs as the machine
is; phase ``hog`` adds one busy-loop process per CPU (normal priority) for
the whole phase. Targets (issue 21): trickle >= 0.8x drain quiet, >= 0.6x
drain under the hog, and our trickle under the hog ahead of pgqueuer's.

``--worker-commit-off`` is a diagnostic, never a setting to run with: our
worker process connects with ``synchronous_commit = off`` (``PGOPTIONS``), so
its claims and step writes do not wait for their WAL flush. That is not a
guarantee pgdurable keeps (a checkpoint lost in a server crash would run its
step again); the difference to a run without it is what the worker's durable
commits cost the trickle, the producer's included.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import _peers
import psycopg
from _scratch import add_watch_args, drop_scratch, scratch_dsn, set_watch

from pgdurable import Continue, Done, Durable, RunContext, Start

DB = "pgdurable_bench_trickle"
ALONE = "bench-alone"  # a queue no worker serves
HOG = "while True: pass"


def _say(*words: object) -> None:
    """Report an event with its time: a buffered write, flushed by :func:`_flusher`
    (a write system call per event, to a pipe, would be the harness's cost in
    the measured worker, paid per run)."""
    sys.stdout.write(" ".join(map(str, words)) + f" {time.monotonic():.9f}\n")


async def _flusher() -> None:
    """Flush the worker's reports every 20 ms (the times are in the lines)."""
    while True:
        await asyncio.sleep(0.02)
        sys.stdout.flush()


async def _reporting(main: Any) -> None:
    flusher = asyncio.create_task(_flusher())
    try:
        await main
    finally:
        flusher.cancel()
        sys.stdout.flush()


def make_app(dsn: str) -> Durable:
    app = Durable(dsn, pool_size=8)

    @app.task("three", revision="1")
    async def three(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            _say("first", state["p"])
        if ctx.step < 2:
            return Continue(state)
        _say("end", state["p"])
        return Done(None)

    return app


async def our_worker(dsn: str) -> None:
    async with make_app(dsn) as app:
        await app.worker(queues=["bench"]).run()


def worker_main(system: str, dsn: str) -> None:
    print("ready", flush=True)
    if system == "pgdurable":
        asyncio.run(_reporting(our_worker(dsn)))
    else:
        asyncio.run(_reporting(_peers.WORKER[system](dsn, lambda p: _say("end", p), steps=3)))


class Worker:
    """A worker process and the times it reports (``first``/``end`` per run).

    Its output is read all along by a task of the driver (a pipe left unread
    while the producer runs would fill and stall the worker)."""

    def __init__(self, system: str, dsn: str, env: dict[str, str] | None = None) -> None:
        self.system = system
        self.dsn = dsn
        self.env = env or {}
        self.proc: asyncio.subprocess.Process | None = None
        self._lines: asyncio.Queue[tuple[str, str, float]] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--worker", self.system, "--dsn", self.dsn,
            stdout=subprocess.PIPE, env={**os.environ, **self.env, "PYTHONPATH": os.pathsep.join(
                filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))},
        )
        assert self.proc.stdout is not None
        assert (await self.proc.stdout.readline()).strip() == b"ready"
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            kind, payload, t = line.decode().split()
            self._lines.put_nowait((kind, payload, float(t)))

    async def times(self, prefix: str, n: int) -> tuple[float, float]:
        """(first step of the first run, end of the last run) of n runs ``prefix-*``."""
        first: float | None = None
        ends = 0
        last = 0.0
        while ends < n:
            kind, payload, t = await asyncio.wait_for(self._lines.get(), 120)
            if not payload.startswith(prefix + "-"):
                continue
            if kind == "first":
                first = t if first is None else min(first, t)
            else:
                ends += 1
                last = max(last, t)
        return (first or 0.0), last

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 20)
        if self._reader is not None:
            self._reader.cancel()


async def phase(name: str, dsn: str, app: Durable, ours: Worker, peer: Worker | None,
                pgq_enqueue: Any, runs: int) -> dict[str, float]:
    out: dict[str, float] = {}
    # drain: every run at once (a delayed start makes them due together)
    starts = [Start("three", {"p": f"{name}D-{i}"}, queue="bench", delay=timedelta(seconds=1))
              for i in range(runs)]
    await app.start_many(starts)
    first, last = await ours.times(f"{name}D", runs)
    out["drain"] = runs / (last - first)
    # trickle: one start() at a time
    t0 = time.monotonic()
    for i in range(runs):
        await app.start("three", {"p": f"{name}T-{i}"}, queue="bench")
    produced = time.monotonic() - t0
    _, last = await ours.times(f"{name}T", runs)
    out["trickle"] = runs / (last - t0)
    out["producer"] = runs / produced
    # the producer alone: the same starts on a queue no worker serves (the
    # ceiling of any trickle: no worker can run runs faster than they start)
    t0 = time.monotonic()
    for i in range(runs):
        await app.start("three", {"p": f"{name}A-{i}"}, queue=ALONE)
    out["alone"] = runs / (time.monotonic() - t0)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute("DELETE FROM pgdurable.runs WHERE queue = %s", (ALONE,))
    if peer is not None:
        t0 = time.monotonic()
        for i in range(runs):
            await pgq_enqueue(f"{name}P-{i}")
        _, last = await peer.times(f"{name}P", runs)
        out["pgqueuer"] = runs / (last - t0)
    return out


async def bench(dsn: str, runs: int, hogs: int, with_peer: bool,
                commit_off: bool = False) -> dict[str, dict[str, float]]:
    ours = Worker("pgdurable", dsn,
                  {"PGOPTIONS": "-c synchronous_commit=off"} if commit_off else None)
    peer = Worker("pgqueuer", dsn) if with_peer else None
    app = make_app(dsn)
    await app.open()
    enqueue, close = await _peers.pgqueuer_producer(dsn) if with_peer else (None, None)
    results: dict[str, dict[str, float]] = {}
    try:
        await ours.start()
        if peer is not None:
            await peer.start()
        await asyncio.sleep(1.0)
        await phase("warm", dsn, app, ours, peer, enqueue, 200)
        for name in ("quiet", "hog"):
            procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", HOG)
                     for _ in range(hogs if name == "hog" else 0)]
            try:
                if procs:
                    await asyncio.sleep(1.0)  # the hog's load is there before we start
                load = os.getloadavg()[0]
                results[name] = await phase(name, dsn, app, ours, peer, enqueue, runs)
                results[name]["load"] = max(load, os.getloadavg()[0])
            finally:
                for p in procs:
                    p.kill()
                    await p.wait()
    finally:
        await ours.stop()
        if peer is not None:
            await peer.stop()
        await app.close()
        if close is not None:
            await close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--runs", type=int, default=1500)
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-loop processes")
    ap.add_argument("--no-peer", action="store_true", help="skip pgqueuer")
    ap.add_argument("--worker-commit-off", action="store_true",
                    help="diagnostic: our worker's commits do not wait for the WAL flush")
    add_watch_args(ap)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, args.dsn)
        return
    with_peer = not args.no_peer
    if with_peer and "pgqueuer" not in _peers.available():
        sys.exit("pgqueuer is missing: pip install -e '.[bench]' (or --no-peer)")
    dsn = scratch_dsn(args.dsn, DB)
    try:
        set_watch(dsn, args)
        if with_peer:
            asyncio.run(_peers.pgqueuer_install(dsn))
        t = time.monotonic()
        res = asyncio.run(bench(dsn, args.runs, args.hogs, with_peer, args.worker_commit_off))
        took = time.monotonic() - t
    finally:
        drop_scratch(args.dsn, DB)
    print(f"trickle vs drain, {args.runs} three-step runs per measurement, one worker process "
          f"({took:.0f} s; hog = {args.hogs} busy-loop processes)")
    if args.worker_commit_off:
        print("DIAGNOSTIC: our worker ran with synchronous_commit = off (its commits did not "
              "wait for the WAL flush); these are not pgdurable's guarantees")
    print(f"{'phase':<6} {'load':>5} {'drain/s':>8} {'trickle/s':>9} {'ratio':>6} "
          f"{'producer/s':>10} {'alone/s':>8} {'ceiling':>7} {'pgqueuer/s':>10}")
    for name, r in res.items():
        pgq = f"{r['pgqueuer']:10.0f}" if "pgqueuer" in r else f"{'-':>10}"
        print(f"{name:<6} {r['load']:5.1f} {r['drain']:8.0f} {r['trickle']:9.0f} "
              f"{r['trickle'] / r['drain']:6.2f} {r['producer']:10.0f} {r['alone']:8.0f} "
              f"{r['alone'] / r['drain']:7.2f} {pgq}")
    print("(producer/s: its start() rate while the worker runs the runs; alone/s: the same "
          "starts with no worker taking them; ceiling = alone / drain, the most a trickle "
          "ratio can be)")
    q, h = res["quiet"], res["hog"]
    print(f"ratio trickle/drain quiet = {q['trickle'] / q['drain']:.2f} (target >= 0.80: "
          f"{'met' if q['trickle'] >= 0.8 * q['drain'] else 'NOT met'})")
    print(f"ratio trickle/drain hog   = {h['trickle'] / h['drain']:.2f} (target >= 0.60: "
          f"{'met' if h['trickle'] >= 0.6 * h['drain'] else 'NOT met'})")
    if "pgqueuer" in h:
        print(f"ratio ours/pgqueuer trickle under the hog = {h['trickle'] / h['pgqueuer']:.2f} "
              f"(target > 1.00: {'met' if h['trickle'] > h['pgqueuer'] else 'NOT met'})")


if __name__ == "__main__":
    main()
