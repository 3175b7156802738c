"""Wake latency: signal -> step starts, and the overshoot of Sleep(1 s).

One command::

    .venv/bin/python benchmarks/wake_latency.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its own scratch database ``pgdurable_bench_wake`` and migrates it. Each
mode runs one worker in its own process (concurrency 64, its own queue):

* ``notify`` -- the default worker: LISTEN ``pgdurable_wake``, poll 5 s;
* ``poll`` (the baseline) -- ``listen=False`` with the default 5 s poll, the
  mode for PgBouncer in transaction pooling.

Trials, per mode:

* **signal -> step starts**: N runs park on ``Wait(signal=("bench", ref))``
  (all parked before the first trial: the worker is idle). The driver then
  signals them one by one, ``--spacing`` apart (20 ms: longer than a wake,
  so each signal finds the worker idle; for the baseline 50 ms, so its trials
  span several polls). Latency = the step's ``time.monotonic()`` at entry
  minus the driver's just before calling ``DurableClient.signal`` (the
  system-wide CLOCK_MONOTONIC, comparable across processes): it includes the
  signal's own commit.
* **Sleep(1 s) overshoot**: runs started ``--sleep-spacing`` apart (30 ms) each
  ``Sleep(seconds=1)``; overshoot = (monotonic at the next step's entry) -
  (monotonic when the step returned Sleep) - 1 s. It includes the park's own
  round trip (~1 ms), so it slightly overstates.

Baseline trial counts are smaller (100 / 100 by default: ``--poll-trials``):
its latencies are seconds, and 500 sequential trials would take minutes. The
whole benchmark takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

from pgdurable import Done, Durable, DurableClient, RunContext, Sleep, Wait

DB = "pgdurable_bench_wake"
REV = "1"


def make_app(dsn: str) -> Durable:
    """The benchmark's tasks: a signal waiter and a 1 s sleeper."""
    app = Durable(dsn, pool_size=8)

    @app.task("waiter", revision=REV)
    async def waiter(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            return Wait(signal=("bench", state["ref"]))
        return Done({"t": time.monotonic()})

    @app.task("sleeper", revision=REV)
    async def sleeper(ctx: RunContext, state: dict[str, Any]) -> Any:
        if ctx.step == 0:
            return Sleep(seconds=1.0, state={"t_s": time.monotonic()})
        return Done({"t_s": state["t_s"], "t_w": time.monotonic()})

    return app


def worker_main(dsn: str, queue: str, listen: bool) -> None:
    """``--worker``: run one worker until SIGTERM."""
    app = make_app(dsn)

    async def run() -> None:
        w = app.worker(queues=[queue], concurrency=64, listen=listen,
                       lease_ttl=timedelta(seconds=30))
        try:
            await w.run()
        finally:
            await app.close()

    asyncio.run(run())


def wait_until(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...],
               target: int, limit: float = 120.0) -> None:
    end = time.monotonic() + limit
    while True:
        row = conn.execute(query, params).fetchone()
        if row is not None and int(row[0]) >= target:
            return
        if time.monotonic() > end:
            raise SystemExit(f"timed out: {query} {params} < {target}")
        time.sleep(0.05)


def signal_trials(client: DurableClient, conn: psycopg.Connection[Any], queue: str, n: int,
                  spacing: float) -> tuple[list[float], list[float]]:
    refs = [f"{queue}-{i}" for i in range(n)]
    ids = [client.start("waiter", {"ref": r}, queue=queue, revision=REV) for r in refs]
    wait_until(conn, "SELECT count(*) FROM pgdurable.waiting_runs WHERE queue = %s AND kind = "
               "'bench'", (queue,), n)
    time.sleep(0.5)  # let the worker settle (idle)
    sent: dict[str, float] = {}
    calls: list[float] = []
    for rid, ref in zip(ids, refs, strict=True):
        t0 = time.monotonic()
        woke = client.signal("bench", ref)
        calls.append(time.monotonic() - t0)
        sent[rid] = t0
        assert woke == [rid], (woke, rid)
        time.sleep(spacing)
    wait_until(conn, "SELECT count(*) FROM pgdurable.runs WHERE queue = %s AND task = 'waiter' "
               "AND status = 'completed'", (queue,), n)
    rows = conn.execute("SELECT id::text, result FROM pgdurable.runs WHERE queue = %s AND "
                        "task = 'waiter'", (queue,)).fetchall()
    return [r[1]["t"] - sent[r[0]] for r in rows], calls


def sleep_trials(client: DurableClient, conn: psycopg.Connection[Any], queue: str, n: int,
                 spacing: float) -> list[float]:
    for _ in range(n):
        client.start("sleeper", {}, queue=queue, revision=REV)
        time.sleep(spacing)
    wait_until(conn, "SELECT count(*) FROM pgdurable.runs WHERE queue = %s AND task = 'sleeper' "
               "AND status = 'completed'", (queue,), n)
    rows = conn.execute("SELECT result FROM pgdurable.runs WHERE queue = %s AND task = 'sleeper'",
                        (queue,)).fetchall()
    return [r[0]["t_w"] - r[0]["t_s"] - 1.0 for r in rows]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": pct(values, 50), "p95": pct(values, 95),
            "p99": pct(values, 99), "max": max(values), "mean": statistics.fmean(values)}


def run_mode(dsn: str, mode: str, n_signal: int, n_sleep: int, spacing: float,
             sleep_spacing: float) -> dict[str, dict[str, float]]:
    queue = f"bench-{mode}"
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", dsn,
                             "--queue", queue, "--listen", "1" if mode == "notify" else "0"])
    try:
        with DurableClient(dsn) as client, psycopg.connect(dsn, autocommit=True) as conn:
            lat, calls = signal_trials(client, conn, queue, n_signal, spacing)
            over = sleep_trials(client, conn, queue, n_sleep, sleep_spacing)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {"signal": summary(lat), "call": summary(calls), "sleep": summary(over)}


def ms(v: float) -> str:
    return f"{v * 1000:.1f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default=os.environ.get(
        "PGDURABLE_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="maintenance database; a scratch database is created next to it")
    p.add_argument("--trials", type=int, default=500, help="signal trials (notify mode)")
    p.add_argument("--sleep-trials", type=int, default=200, help="Sleep(1 s) trials (notify)")
    p.add_argument("--poll-trials", type=int, default=100, help="trials of each kind, baseline")
    p.add_argument("--spacing", type=float, default=0.02, help="seconds between signals")
    p.add_argument("--sleep-spacing", type=float, default=0.03, help="seconds between sleepers")
    p.add_argument("--worker", metavar="DSN", help=argparse.SUPPRESS)
    p.add_argument("--queue", help=argparse.SUPPRESS)
    p.add_argument("--listen", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args.worker, args.queue, args.listen == "1")
        return 0
    started = time.monotonic()
    dsn = scratch_dsn(args.dsn, DB)
    try:
        results = {
            "notify": run_mode(dsn, "notify", args.trials, args.sleep_trials, args.spacing,
                               args.sleep_spacing),
            "poll": run_mode(dsn, "poll", args.poll_trials, args.poll_trials,
                             max(args.spacing, 0.05), args.sleep_spacing),
        }
    finally:
        drop_scratch(args.dsn, DB)
    print(f"wake latency (ms), worker concurrency 64, default poll 5 s; "
          f"{time.monotonic() - started:.0f} s total")
    print(f"{'what':<28}{'mode':<8}{'n':>5}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}")
    for what, key in (("signal -> step starts", "signal"), ("  of which signal() call", "call"),
                      ("Sleep(1 s) overshoot", "sleep")):
        for mode in ("notify", "poll"):
            s = results[mode][key]
            print(f"{what:<28}{mode:<8}{int(s['n']):>5}{ms(s['p50']):>9}{ms(s['p95']):>9}"
                  f"{ms(s['p99']):>9}{ms(s['max']):>9}")
    sig_n, sig_p = results["notify"]["signal"], results["poll"]["signal"]
    print(f"baseline ratio (poll-only / notify), signal -> step: p50 "
          f"{sig_p['p50'] / sig_n['p50']:.0f}x, p99 {sig_p['p99'] / sig_n['p99']:.0f}x")
    targets = [("signal p50 <= 5 ms", sig_n["p50"] <= 0.005),
               ("signal p99 <= 25 ms", sig_n["p99"] <= 0.025),
               ("Sleep overshoot p99 <= 50 ms", results["notify"]["sleep"]["p99"] <= 0.050)]
    print("targets: " + ", ".join(f"{name}: {'met' if ok else 'MISSED'}" for name, ok in targets))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
