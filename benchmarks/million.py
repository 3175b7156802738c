"""The article's scale: many parked runs on one database, timer and signal storms,
and an idle fleet, each against a baseline measured in the same run.

One command::

    .venv/bin/python benchmarks/million.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--parked 10000,100000,1000000] [--storm 100000] [--senders 8] [--workers 4]
        [--idle-window 30] [--probes 200] [--quick]

``--quick`` (parked 2,000 and 10,000; storms of 5,000; 5 s windows; 50 probes) proves
it runs in a few minutes. Four parts, in one scratch database, with ``--workers``
worker processes of ``benchmarks/_million_app.py`` up throughout:

1. **Parked runs.** The population of runs waiting on a signal ``("bench", id)`` with
   a timeout spread over the next three days grows to each size of ``--parked``
   (created by the driver in batches of 5,000: ``start_run``, then ``claim_runs`` and
   ``park_run`` in the same transaction -- the functions a worker calls). At each size
   (and first on the empty database, the baseline): the idle fleet over
   ``--idle-window`` seconds -- CPU of the worker processes and of their backends (from
   ``/proc``), transactions a second on the database, the workers' resident memory --
   then ``--probes`` sequential probes: ``start()`` latency, enqueue-to-claim latency
   (``leased_at - created_at``, database clock) and a 3-step run's end-to-end latency
   (``start`` to ``result``, LISTEN), p50 and p99 and their ratio to the empty
   database; the size of ``runs`` (table and indexes) per run and what autovacuum did.
2. **Timer storm.** ``--storm`` parked runs whose timers fall due in the same second:
   the time from that second until all of them completed their next step, against the
   same number of fresh runs (committed at once) drained by the same workers; no run
   claimed more than twice (created, woken), and the sequential scans of ``runs``
   during the storm (0: no claim scans the parked ones).
3. **Signal storm.** ``--storm`` signals to as many parked runs by ``--senders``
   concurrent senders (``send_signal``, one statement each): signals a second against
   the same number of bare single-row INSERTs by the same senders; the time until every
   run resumed; the NOTIFYs a LISTEN connection received per signal.
4. **Retention.** ``prune_runs`` of the finished runs (the storms') while the fleet
   serves probes: the probes' end-to-end p99 during the prune against before it.

The wake fan-in at 10,000 children is ``benchmarks/fan_out.py --n 10000``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from _driver import load
from _scratch import drop_scratch, scratch_dsn

import pgdurable
from pgdurable.retention import prune_sync

HERE = Path(__file__).resolve().parent
DB = "pgdurable_bench_million"
BATCH = 5000
# -- start n parked-to-be runs (the same transaction claims and parks them)
START_N = ("SELECT count(*) FROM (SELECT pgdurable.start_run('parked', '1', '{}', 'default', 0, "
           "3, NULL, NULL, NULL, NULL) FROM generate_series(1, %s)) s")
# -- claim them (this transaction's runs: nothing else is runnable) and park each on its
# -- signal, with a timeout at %s (a fixed time) or spread over the next three days (NULL)
PARK = ("SELECT count(*) FROM (SELECT pgdurable.park_run(c.id, c.lease_token, 'million-driver', "
        "'{}'::jsonb, 0, 'bench', c.id::text, coalesce(%s::timestamptz, now() + interval "
        "'1 hour' + random() * interval '3 days'), NULL) FROM pgdurable.claim_runs("
        "'million-driver', '{default}', '{parked}', '{1}', %s, '5 min') c) s")
# -- the database's client backends of the fleet (every backend but this connection's)
BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
XACTS = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
RUNS_STATS = ("SELECT seq_scan, coalesce(idx_scan, 0), n_dead_tup, autovacuum_count, "
              "autoanalyze_count FROM pg_stat_user_tables WHERE relid = 'pgdurable.runs'::regclass")
SIZE = ("SELECT pg_table_size('pgdurable.runs'), pg_indexes_size('pgdurable.runs'), "
        "(SELECT count(*) FROM pgdurable.runs)")
LISTENING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND query LIKE 'LISTEN pgdurable%'")


def cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


@contextmanager
def fleet(dsn: str, n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` worker processes of _million_app (concurrency 32 each), once all listen."""
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}", "PGDURABLE_DSN": dsn,
           "PGDURABLE_LOG_LEVEL": "WARNING"}
    procs = [subprocess.Popen([sys.executable, "-m", "pgdurable.worker", "_million_app:app",
                               "--concurrency", "32", "--lease-ttl", "60", "--poll", "5"],
                              env=env, cwd=HERE.parent) for _ in range(n)]
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(1200):
                row = c.execute(LISTENING).fetchone()
                if row and row[0] >= n:
                    break
                time.sleep(0.05)
        time.sleep(1.0)
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def park(dsn: str, n: int, wake_at: str | None = None) -> float:
    """Park ``n`` more runs (batches of :data:`BATCH`); the seconds it took."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn) as c:
        left = n
        while left > 0:
            k = min(BATCH, left)
            with c.transaction():
                c.execute(START_N, (k,))
                row = c.execute(PARK, (wake_at, k)).fetchone()
                assert row is not None and row[0] == k, (row, k)
            left -= k
    return time.perf_counter() - t0


@dataclass
class Idle:
    cpu_pct: float
    xacts_per_s: float
    rss_mb: float


def idle(dsn: str, workers: list[subprocess.Popen[bytes]], window: float) -> Idle:
    with psycopg.connect(dsn, autocommit=True) as c:
        backends = [r[0] for r in c.execute(BACKENDS).fetchall()]
        pids = [w.pid for w in workers] + backends
        cpu0 = sum(cpu_seconds(p) for p in pids)
        x0 = c.execute(XACTS).fetchone()
        time.sleep(window)
        backends2 = [r[0] for r in c.execute(BACKENDS).fetchall()]
        cpu1 = sum(cpu_seconds(p) for p in {*pids, *backends2})
        x1 = c.execute(XACTS).fetchone()
    assert x0 is not None and x1 is not None
    # this connection's own statements: the three above (BACKENDS twice, XACTS once more)
    return Idle(100 * (cpu1 - cpu0) / window, (x1[0] - x0[0] - 3) / window,
                sum(rss_mb(w.pid) for w in workers))


@dataclass
class Probes:
    start_ms: list[float]
    claim_ms: list[float]
    e2e_ms: list[float]


async def probe(dsn: str, n: int) -> Probes:
    app = pgdurable.Durable(dsn, pool_size=4)
    out = Probes([], [], [])
    async with app:
        ids = []
        for _ in range(n):
            t0 = time.perf_counter()
            rid = await app.start("noop3", {}, revision="1")
            t1 = time.perf_counter()
            await app.result(rid, timeout=120)
            t2 = time.perf_counter()
            out.start_ms.append((t1 - t0) * 1000)
            out.e2e_ms.append((t2 - t0) * 1000)
            ids.append(rid)
    with psycopg.connect(dsn) as c:
        rows = c.execute("SELECT extract(epoch FROM leased_at - created_at) * 1000 FROM "
                         "pgdurable.runs WHERE id = ANY(%s::uuid[])",
                         ([str(i) for i in ids],)).fetchall()
    out.claim_ms = [float(r[0]) for r in rows if r[0] is not None]
    return out


def show_probes(label: str, p: Probes, base: Probes | None) -> None:
    def cell(name: str, mine: list[float], theirs: list[float] | None) -> str:
        ratio = "" if theirs is None else (f" ({pct(mine, .5) / pct(theirs, .5):.2f}x / "
                                           f"{pct(mine, .99) / pct(theirs, .99):.2f}x)")
        return f"{name} p50 {pct(mine, .5):.1f} p99 {pct(mine, .99):.1f} ms{ratio}"

    print(f"  {label}: " + "; ".join([
        cell("start()", p.start_ms, base.start_ms if base else None),
        cell("claim", p.claim_ms, base.claim_ms if base else None),
        cell("3-step run", p.e2e_ms, base.e2e_ms if base else None)]), flush=True)


def part_parked(dsn: str, workers: list[subprocess.Popen[bytes]], sizes: list[int],
                window: float, probes: int) -> None:
    print("1. parked runs (ratios: to the empty database, p50 / p99)", flush=True)
    base_idle = idle(dsn, workers, window)
    base = asyncio.run(probe(dsn, probes))
    print(f"  0 parked: idle fleet {base_idle.cpu_pct:.2f} % of a core, "
          f"{base_idle.xacts_per_s:.1f} transactions/s, workers {base_idle.rss_mb:.0f} MB",
          flush=True)
    show_probes("0 parked", base, None)
    have = 0
    for size in sizes:
        took = park(dsn, size - have)
        print(f"  parked {size - have} more in {took:.1f} s "
              f"({(size - have) / took:.0f} runs/s)", flush=True)
        have = size
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ANALYZE pgdurable.runs")
        i = idle(dsn, workers, window)
        p = asyncio.run(probe(dsn, probes))
        with psycopg.connect(dsn) as c:
            table, index, count = c.execute(SIZE).fetchone() or (0, 0, 1)
            st = c.execute(RUNS_STATS).fetchone()
        print(f"  {size} parked: idle fleet {i.cpu_pct:.2f} % of a core, {i.xacts_per_s:.1f} "
              f"transactions/s, workers {i.rss_mb:.0f} MB; runs {table / count:.0f} B + "
              f"indexes {index / count:.0f} B per run; autovacuum runs {st and st[3]}, "
              f"analyzes {st and st[4]}, dead tuples {st and st[2]}", flush=True)
        show_probes(f"{size} parked", p, base)


def finished(c: psycopg.Connection[Any], task: str, since: str) -> tuple[int, Any, int]:
    row = c.execute("SELECT count(*) FILTER (WHERE status = 'completed'), max(finished_at), "
                    "max(claims) FROM pgdurable.runs WHERE task = %s AND created_at >= %s",
                    (task, since)).fetchone()
    assert row is not None
    return int(row[0]), row[1], int(row[2] or 0)


def wait_done(c: psycopg.Connection[Any], task: str, since: str, n: int) -> tuple[Any, int]:
    for _ in range(36000):
        done, last, claims = finished(c, task, since)
        if done >= n:
            return last, claims
        time.sleep(0.05)
    raise RuntimeError(f"{task}: {done} of {n} completed")


def part_timer_storm(dsn: str, n: int) -> None:
    print(f"2. timer storm: {n} parked runs due in the same second, against {n} fresh runs",
          flush=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        since = str(c.execute("SELECT now()").fetchone()[0])  # type: ignore[index]
        lead = max(15.0, n / 2000)
        due = str(c.execute("SELECT now() + %s * interval '1 s'", (lead,)).fetchone()[0])  # type: ignore[index]
        park(dsn, n, due)
        scans0 = c.execute(RUNS_STATS).fetchone()
        last, claims = wait_done(c, "parked", since, n)
        scans1 = c.execute(RUNS_STATS).fetchone()
        storm = (last - c.execute("SELECT %s::timestamptz", (due,)).fetchone()[0]).total_seconds()  # type: ignore[index]
        c.execute("DELETE FROM pgdurable.runs WHERE task = 'fresh'")
        with c.transaction():
            t0 = c.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            c.execute("SELECT count(*) FROM (SELECT pgdurable.start_run('fresh', '1', '{}', "
                      "'default', 0, 3, NULL, NULL, NULL, NULL) FROM generate_series(1, %s)) s",
                      (n,))
        flast, _ = wait_done(c, "fresh", str(t0), n)
        fresh = (flast - t0).total_seconds()
    assert scans0 is not None and scans1 is not None
    print(f"  storm {storm:.2f} s, fresh {fresh:.2f} s: {storm / fresh:.2f}x (target <= 1.25); "
          f"max claims per stormed run {claims} (2 = created, woken once); sequential scans "
          f"of runs during the storm {scans1[0] - scans0[0]}", flush=True)


def part_signal_storm(dsn: str, n: int, senders: int) -> None:
    print(f"3. signal storm: {n} signals by {senders} senders, against {n} bare INSERTs",
          flush=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        since = str(c.execute("SELECT now()").fetchone()[0])  # type: ignore[index]
        park(dsn, n, "infinity")
        ids = [str(r[0]) for r in c.execute(
            "SELECT id FROM pgdurable.runs WHERE task = 'parked' AND status = 'waiting' "
            "AND created_at >= %s AND wake_at = 'infinity'", (since,)).fetchall()]
        c.execute("CREATE TABLE IF NOT EXISTS public.bench_inserts (id text, payload jsonb)")
    notes = {"n": 0}
    stop = threading.Event()

    def listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as lc:
            lc.execute("LISTEN pgdurable_wake")
            lc.execute("LISTEN pgdurable_events")
            while not stop.is_set():
                for _ in lc.notifies(timeout=0.2, stop_after=1000):
                    notes["n"] += 1

    def send(chunk: list[str], statement: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as sc:
            for rid in chunk:
                sc.execute(statement, (rid,))

    def timed(statement: str) -> float:
        chunks = [ids[i::senders] for i in range(senders)]
        threads = [threading.Thread(target=send, args=(ch, statement)) for ch in chunks]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    time.sleep(0.5)
    t_sig = timed("SELECT pgdurable.send_signal('bench', %s, '{}'::jsonb, NULL, NULL)")
    with psycopg.connect(dsn, autocommit=True) as c:
        last, claims = wait_done(c, "parked", since, n)
        first = c.execute("SELECT min(created_at) FROM pgdurable.signals WHERE kind = 'bench'"
                          ).fetchone()
        resumed = (last - first[0]).total_seconds() if first and first[0] else float("nan")
    stop.set()
    listener.join()
    t_ins = timed("INSERT INTO public.bench_inserts VALUES (%s, '{}'::jsonb)")
    print(f"  signals {n / t_sig:.0f}/s, bare INSERTs {n / t_ins:.0f}/s: "
          f"{t_ins / t_sig:.2f}x; every run resumed {resumed:.1f} s after the first signal; "
          f"{notes['n'] / n:.3f} NOTIFYs per signal; max claims per run {claims}", flush=True)


def part_retention(dsn: str, probes: int) -> None:
    print("4. retention: prune the finished runs while the fleet serves probes", flush=True)
    before = asyncio.run(probe(dsn, probes))
    result: dict[str, Any] = {}

    def prune() -> None:
        t0 = time.perf_counter()
        result["pruned"] = prune_sync(dsn, timedelta(0)).runs
        result["s"] = time.perf_counter() - t0

    with psycopg.connect(dsn) as c:
        done = c.execute("SELECT count(*) FROM pgdurable.runs WHERE status = 'completed'"
                         ).fetchone()
    pruner = threading.Thread(target=prune)
    pruner.start()
    during = Probes([], [], [])
    while pruner.is_alive():
        p = asyncio.run(probe(dsn, 10))
        during.e2e_ms += p.e2e_ms
        during.claim_ms += p.claim_ms
        during.start_ms += p.start_ms
    pruner.join()
    print(f"  pruned {result.get('pruned')} of {done and done[0]} finished runs in "
          f"{result.get('s', 0):.1f} s; {len(during.e2e_ms)} probes during it", flush=True)
    show_probes("during the prune (ratio to before)", during, before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--parked", default="10000,100000,1000000")
    ap.add_argument("--storm", type=int, default=100_000)
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--idle-window", type=float, default=30.0)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.parked, args.storm, args.idle_window, args.probes = "2000,10000", 5000, 5.0, 50
    sizes = [int(x) for x in args.parked.split(",")]
    dsn = scratch_dsn(args.dsn, DB)
    print(f"million: parked {sizes}, storms of {args.storm}, {args.workers} workers; {load()}",
          flush=True)
    try:
        with ExitStack() as stack:
            workers = stack.enter_context(fleet(dsn, args.workers))
            part_parked(dsn, workers, sizes, args.idle_window, args.probes)
            part_timer_storm(dsn, args.storm)
            part_signal_storm(dsn, args.storm, args.senders)
            part_retention(dsn, args.probes)
    finally:
        drop_scratch(args.dsn, DB)
    print(f"done; {load()}")


if __name__ == "__main__":
    main()
