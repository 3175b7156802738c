"""Lease throughput from Python vs pgbench running the same SQL functions.

One command::

    .venv/bin/python benchmarks/leases.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards
drops) its own scratch database ``pgdurable_bench_leases`` and migrates it.
For each operation (acquire, renew, release) and each client count (1 and 8)
it measures ops/s for

* ``async``: :class:`pgdurable.AsyncPostgresLeaseProvider`, one coroutine per
  client, one pooled connection per client, prepared statements, binary params;
* ``async-pipe``: the same provider with ``pipeline=True``: the clients'
  concurrent calls share round trips and commits on ``--lanes`` pipelined
  connections (one batch = one transaction);
* ``sync``: :class:`pgdurable.PostgresLeaseProvider`, one thread per client;
* ``sync-pipe``: the same with ``pipeline=True``;
* ``pgbench``: ``pgbench -M prepared -c N -j 1 -T s -f <script>`` calling the
  same SQL functions, one call per transaction;

and prints, per round, each contender's ratio to the pgbench of the same
round (the contenders run one after another in each round, in rotating order),
then the worst and the median round per contender. Under each round: the
client CPU per call of each contender (pgbench: its own process; the Python
providers: their process, server excluded) and the mean calls per batch of the
pipelined ones. The CPU figures hold on a loaded machine, the ratios do not. Every client works on its own 100 keys
(``bench-<client>-<n>``, n random), so the numbers measure the call path, not
lock contention; before each measurement every client holds all its keys (TTL 1 h),
so each renew extends a live lease. "release" is an acquire + release cycle (two calls; a release
of a free key would be a no-op that writes nothing), counted as cycles/s on
both sides. Timings on a shared machine are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn
from psycopg.conninfo import conninfo_to_dict

from pgdurable import AsyncPostgresLeaseProvider, PostgresLeaseProvider

DB = "pgdurable_bench_leases"
TTL = 3_600_000  # long enough that nothing expires during a run
KEYS = 100

# pgbench scripts: the same SQL functions the providers call (bytea keys via convert_to).
_KEY = "convert_to('bench-' || :client_id || '-' || :n, 'UTF8')"
_OWNER = "convert_to('client-' || :client_id, 'UTF8')"
SCRIPTS = {
    "acquire": f"\\set n random(0, {KEYS - 1})\n"
               f"SELECT * FROM pgdurable.acquire_lease({_KEY}, {_OWNER}, {TTL});\n",
    "renew": f"\\set n random(0, {KEYS - 1})\n"
             f"SELECT pgdurable.renew_lease({_KEY}, {_OWNER}, {TTL}, NULL);\n",
    "release": f"\\set n random(0, {KEYS - 1})\n"
               f"SELECT * FROM pgdurable.acquire_lease({_KEY}, {_OWNER}, {TTL});\n"
               f"SELECT pgdurable.release_lease({_KEY}, {_OWNER}, NULL);\n",
}
OPS = ("acquire", "renew", "release")


def hold_all(dsn: str, clients: int) -> None:
    """Make every client hold all its keys (so each renew really extends a live lease)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            "SELECT pgdurable.acquire_lease(convert_to('bench-' || c || '-' || n, 'UTF8'),"
            " convert_to('client-' || c, 'UTF8'), %s)"
            " FROM generate_series(0, %s) c, generate_series(0, %s) n",
            (TTL, clients - 1, KEYS - 1),
        )


def key(client: int) -> str:
    return f"bench-{client}-{random.randrange(KEYS)}"


# ---------------------------------------------------------------- client-side notes

STATS: dict[str, float] = {}
"""The last measurement's client CPU per call (µs) and mean calls per batch."""


def note(calls: int, cpu_seconds: float, batches: int) -> None:
    STATS["cpu_us"] = cpu_seconds / max(calls, 1) * 1e6
    STATS["batch"] = calls / batches if batches else 1.0


# ---------------------------------------------------------------- async


def async_op(p: AsyncPostgresLeaseProvider, op: str, c: int) -> Callable[[], Awaitable[Any]]:
    owner = f"client-{c}"
    if op == "acquire":
        return lambda: p.acquire_lease(key(c), owner, TTL)
    if op == "renew":
        return lambda: p.renew_lease(key(c), owner, TTL)

    async def cycle() -> None:
        k = key(c)
        await p.acquire_lease(k, owner, TTL)
        await p.release_lease(k, owner)

    return cycle


async def run_async(dsn: str, op: str, clients: int, seconds: float, lanes: int = 0) -> float:
    size = lanes or clients
    async with AsyncPostgresLeaseProvider(dsn, min_size=size, max_size=size,
                                          pipeline=bool(lanes),
                                          pipeline_lanes=max(lanes, 1)) as p:
        counts = [0] * clients
        stop = asyncio.Event()

        async def client(c: int) -> None:
            fn = async_op(p, op, c)
            for _ in range(10):  # warm-up: connections open, statements prepared
                await fn()
            await start.wait()
            n = 0
            while not stop.is_set():
                await fn()
                n += 1
            counts[c] = n

        start = asyncio.Event()
        tasks = [asyncio.create_task(client(c)) for c in range(clients)]
        await asyncio.sleep(0.5)
        t0, cpu0 = time.perf_counter(), time.process_time()
        batches0 = p._lanes.batches if p._lanes else 0
        start.set()
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        note(sum(counts), time.process_time() - cpu0,
             (p._lanes.batches - batches0) if p._lanes else 0)
        return sum(counts) / (time.perf_counter() - t0)


# ---------------------------------------------------------------- sync (threads)


def sync_op(p: PostgresLeaseProvider, op: str, c: int) -> Callable[[], Any]:
    owner = f"client-{c}"
    if op == "acquire":
        return lambda: p.acquire_lease(key(c), owner, TTL)
    if op == "renew":
        return lambda: p.renew_lease(key(c), owner, TTL)

    def cycle() -> None:
        k = key(c)
        p.acquire_lease(k, owner, TTL)
        p.release_lease(k, owner)

    return cycle


def run_sync(dsn: str, op: str, clients: int, seconds: float, lanes: int = 0) -> float:
    size = lanes or clients
    with PostgresLeaseProvider(dsn, min_size=size, max_size=size, pipeline=bool(lanes),
                               pipeline_lanes=max(lanes, 1)) as p:
        counts = [0] * clients
        ready = threading.Barrier(clients + 1)
        stop = threading.Event()

        def client(c: int) -> None:
            fn = sync_op(p, op, c)
            for _ in range(10):
                fn()
            ready.wait()
            n = 0
            while not stop.is_set():
                fn()
                n += 1
            counts[c] = n

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        ready.wait()
        t0, cpu0 = time.perf_counter(), time.process_time()
        batches0 = p._lanes.batches if p._lanes else 0
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join()
        note(sum(counts), time.process_time() - cpu0,
             (p._lanes.batches - batches0) if p._lanes else 0)
        return sum(counts) / (time.perf_counter() - t0)


# ---------------------------------------------------------------- pgbench


def run_pgbench(pgbench: str, dsn: str, op: str, clients: int, seconds: float) -> float:
    info = conninfo_to_dict(dsn)
    env = dict(os.environ)
    for k, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                   ("password", "PGPASSWORD")):
        if info.get(k):
            env[var] = str(info[k])
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(SCRIPTS[op])
        script = f.name
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(
            [pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", "1",
             "-T", str(max(1, round(seconds))), "-f", script, str(info["dbname"])],
            capture_output=True, text=True, env=env, check=True,
        ).stdout
    finally:
        os.unlink(script)
    m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if not m:
        raise RuntimeError(f"cannot parse pgbench output:\n{out}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    n = re.search(r"number of transactions actually processed: ([0-9]+)", out)
    note(int(n.group(1)) if n else 0,
         ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime, 0)
    return float(m.group(1))


# ---------------------------------------------------------------- main


def measure(name: str, args: argparse.Namespace, dsn: str, op: str, n: int) -> float:
    """One contender's ops/s for ``op`` at ``n`` clients."""
    hold_all(dsn, n)
    if name == "pgbench":
        return run_pgbench(args.pgbench, dsn, op, n, args.seconds)
    if name == "async":
        return asyncio.run(run_async(dsn, op, n, args.seconds))
    if name == "async-pipe":
        return asyncio.run(run_async(dsn, op, n, args.seconds, args.lanes))
    if name == "sync":
        return run_sync(dsn, op, n, args.seconds)
    return run_sync(dsn, op, n, args.seconds, args.lanes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=os.environ.get(
        "PGDURABLE_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="maintenance database; a scratch database is created next to it")
    ap.add_argument("--seconds", type=float, default=1.0, help="duration of each measurement")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per cell (each gives ratios)")
    ap.add_argument("--clients", default="1,8", help="comma-separated client counts")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated: acquire,renew,release")
    ap.add_argument("--contenders", default="async,async-pipe,sync,sync-pipe",
                    help="comma-separated: async,async-pipe,sync,sync-pipe")
    ap.add_argument("--lanes", type=int, default=2,
                    help="pipelined connections (batches in flight) of the -pipe contenders")
    ap.add_argument("--pgbench", default=shutil.which("pgbench") or "/usr/bin/pgbench")
    args = ap.parse_args()
    clients = [int(x) for x in args.clients.split(",")]
    ops = [o for o in args.ops.split(",") if o]
    names = [c for c in args.contenders.split(",") if c]
    dsn = scratch_dsn(args.dsn, DB)
    print(f"pgdurable lease benchmark: {args.rounds} rounds x {args.seconds:g} s per contender "
          f"and cell, database {DB}, pgbench -M prepared -j 1, pipeline lanes {args.lanes}; "
          f"ratio = Python / pgbench of the same round (target >= 0.70)")
    print(f"{'op':<8} {'clients':>7} {'round':>5} {'pgbench':>8} "
          + " ".join(f"{c:>10} {'ratio':>5}" for c in names))
    worst: dict[tuple[str, int], float] = {}
    try:
        for op in ops:
            for n in clients:
                ratios: dict[str, list[float]] = {c: [] for c in names}
                for r in range(args.rounds):
                    order = ["pgbench", *names]
                    order = order[r % len(order):] + order[:r % len(order)]
                    got, cpu, batch = {}, {}, {}
                    for c in order:
                        got[c] = measure(c, args, dsn, op, n)
                        cpu[c], batch[c] = STATS["cpu_us"], STATS["batch"]
                    cells = []
                    for c in names:
                        ratios[c].append(got[c] / got["pgbench"])
                        cells.append(f"{got[c]:>10.0f} {ratios[c][-1]:>5.2f}")
                    print(f"{op:<8} {n:>7} {r + 1:>5} {got['pgbench']:>8.0f} "
                          + " ".join(cells), flush=True)
                    print(f"{'':>22}client CPU us/call: "
                          + " ".join(f"{c} {cpu[c]:.0f}" for c in order)
                          + "; calls/batch: "
                          + " ".join(f"{c} {batch[c]:.1f}" for c in names if "pipe" in c))
                print(f"{op:<8} {n:>7} {'worst/median':>14}  "
                      + "  ".join(f"{c} {min(v):.2f}/{statistics.median(v):.2f}"
                                  for c, v in ratios.items()), flush=True)
                for c, v in ratios.items():
                    worst[(c, n)] = min(worst.get((c, n), 9.9), min(v))
    finally:
        drop_scratch(args.dsn, DB)
    for n in clients:
        print(f"worst round at {n} client(s): "
              + ", ".join(f"{c} {worst[(c, n)]:.2f}" for c in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
