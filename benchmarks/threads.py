"""Thread and stream latency: message -> owner's next step, and emit -> stream client.

One command::

    .venv/bin/python benchmarks/threads.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its own scratch database ``pgdurable_bench_threads``. A worker runs in
its own process (``--worker``); the driver sends and follows. Latencies use
``time.monotonic()`` (system-wide CLOCK_MONOTONIC, comparable across processes).

* **message -> next step**: the thread's owner run parks on its inbox
  (``ctx.wait_inbox()``); the driver ``DurableClient.send``\\s one message every
  ``--spacing`` (20 ms). Latency = the owner's ``monotonic()`` right after
  ``await ctx.inbox()`` returned the message minus the driver's just before
  ``send`` (includes the send's commit, the wake NOTIFY, the claim, the step
  start and the inbox round trip).
* **event -> client**: a run emits one event every ``--spacing`` with its
  ``monotonic()`` taken just before ``await ctx.emit``; the driver follows it
  with ``app.stream`` and takes the latency at receipt (emit commit, NOTIFY,
  the stream's re-read).
* **baseline**: a raw LISTEN/NOTIFY round trip between the same two processes:
  the worker process sends ``NOTIFY`` (autocommit, payload = its monotonic
  time) every ``--spacing``; the driver LISTENs on a dedicated connection.

Ratios = pgdurable / baseline (p50 and p99). The duration of the ``send()``
call itself (one ``send_message`` transaction, synchronous commit) is printed
for reference: it is part of the message latency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

from pgdurable import Done, Durable, DurableClient, RunContext

DB = "pgdurable_bench_threads"
SELF = os.path.abspath(__file__)


def make_app(dsn: str) -> Durable:
    """The benchmark's tasks: a thread owner and an emitter."""
    app = Durable(dsn, pool_size=8)
    app.thread_task("", "owner")

    @app.task("owner")
    async def owner(ctx: RunContext, state: Any) -> Any:
        msgs = await ctx.inbox()
        now = time.monotonic()
        seen = list(state.get("lat", [])) if isinstance(state, dict) else []
        seen.extend(now - m.payload["t"] for m in msgs if isinstance(m.payload, dict))
        if any(m.payload == "stop" for m in msgs):
            return Done(seen, state={})
        return ctx.wait_inbox(state={"lat": seen})

    @app.task("emitter")
    async def emitter(ctx: RunContext, state: dict[str, Any]) -> Any:
        for i in range(int(state["n"])):
            await ctx.emit({"i": i, "t": time.monotonic()})
            await asyncio.sleep(float(state["spacing"]))
        return Done(None)

    return app


def worker_main(dsn: str) -> None:
    """``--worker``: run one worker until SIGTERM."""
    app = make_app(dsn)

    async def run() -> None:
        w = app.worker(concurrency=8, lease_ttl=timedelta(seconds=30))
        try:
            await w.run()
        finally:
            await app.close()

    asyncio.run(run())


def notifier_main(dsn: str, n: int, spacing: float) -> None:
    """``--notifier``: n raw NOTIFYs, payload = monotonic time."""
    with psycopg.connect(dsn, autocommit=True) as c:
        time.sleep(0.5)
        for _ in range(n):
            c.execute("SELECT pg_notify('bench_raw', %s)", (repr(time.monotonic()),))
            time.sleep(spacing)


def message_trials(dsn: str, n: int, spacing: float) -> tuple[list[float], list[float]]:
    app = make_app(dsn)
    with DurableClient(dsn, app=app) as client, psycopg.connect(dsn, autocommit=True) as c:
        first = client.send("bench", "warm-up")
        for _ in range(200):  # until the owner parks on its inbox
            row = c.execute("SELECT status FROM pgdurable.runs WHERE id = %s", (first.run_id,)).fetchone()
            if row and row[0] == "waiting":
                break
            time.sleep(0.05)
        calls = []
        for _ in range(n):
            t0 = time.monotonic()
            d = client.send("bench", {"t": t0})
            calls.append(time.monotonic() - t0)
            assert d.action == "deliver" and d.run_id == first.run_id, d
            time.sleep(spacing)
        client.send("bench", "stop")
        for _ in range(1200):
            row = c.execute("SELECT status, result FROM pgdurable.runs WHERE id = %s",
                            (first.run_id,)).fetchone()
            if row and row[0] == "completed":
                return [float(v) for v in row[1]], calls
            time.sleep(0.05)
    raise SystemExit("owner did not finish")


async def stream_trials(dsn: str, n: int, spacing: float) -> list[float]:
    app = make_app(dsn)
    out: list[float] = []
    async with app:
        rid = await app.start("emitter", {"n": n, "spacing": spacing})
        async for ev in app.stream(rid):
            if not ev.final:
                out.append(time.monotonic() - ev.event["t"])
    return out


async def notify_trials(dsn: str, n: int, spacing: float) -> list[float]:
    out: list[float] = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute("LISTEN bench_raw")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, SELF, "--notifier", dsn, "--n", str(n), "--spacing", str(spacing))
        async for note in c.notifies():
            out.append(time.monotonic() - float(note.payload))
            if len(out) == n:
                break
        await proc.wait()
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]


def ms(v: float) -> str:
    return f"{v * 1000:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dsn", default=os.environ.get(
        "PGDURABLE_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="maintenance database; a scratch database is created next to it")
    p.add_argument("--trials", type=int, default=300, help="trials of each kind")
    p.add_argument("--spacing", type=float, default=0.02, help="seconds between trials")
    p.add_argument("--worker", metavar="DSN", help=argparse.SUPPRESS)
    p.add_argument("--notifier", metavar="DSN", help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args.worker)
        return 0
    if args.notifier:
        notifier_main(args.notifier, args.n, args.spacing)
        return 0
    dsn = scratch_dsn(args.dsn, DB)
    worker = subprocess.Popen([sys.executable, SELF, "--worker", dsn])
    try:
        base = asyncio.run(notify_trials(dsn, args.trials, args.spacing))
        msg, calls = message_trials(dsn, args.trials, args.spacing)
        ev = asyncio.run(stream_trials(dsn, args.trials, args.spacing))
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        drop_scratch(args.dsn, DB)
    b50, b99 = pct(base, 50), pct(base, 99)
    print(f"trials: {args.trials} of each kind, spacing {args.spacing * 1000:.0f} ms")
    print("| what | n | p50 ms | p99 ms | mean ms | p50 / baseline | p99 / baseline |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, vals in (("raw LISTEN/NOTIFY (baseline)", base),
                       ("send() call (its commit), for reference", calls),
                       ("message -> owner's next step", msg),
                       ("stream event -> client", ev)):
        print(f"| {name} | {len(vals)} | {ms(pct(vals, 50))} | {ms(pct(vals, 99))} | "
              f"{ms(statistics.fmean(vals))} | {pct(vals, 50) / b50:.1f} | {pct(vals, 99) / b99:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
