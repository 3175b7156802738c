"""The article's scale: a million parked runs on one database, timer and signal storms,
a wake fan-in, retention at that size and an idle fleet, each against a baseline measured
in the same run.

One command::

    .venv/bin/python benchmarks/million.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--parked 10000,100000,1000000] [--storm 100000] [--senders 8] [--workers 4]
        [--fanin 10000] [--idle-window 20] [--probes 200] [--park-jobs 2]
        [--park-via clone|functions] [--parts parked,timer,signal,fanin,retention] [--quick]

``--quick`` (parked 2,000 and 10,000; storms of 5,000; a fan-in of 1,000; 5 s windows;
40 probes) proves it runs in a few minutes. In one scratch database, with ``--workers``
worker processes of ``benchmarks/_million_app.py`` up throughout (concurrency 32 each):

1. **Parked runs.** The population of runs waiting on a signal ``("bench", id)`` with
   a timeout spread over the next three days grows to each size of ``--parked``, on
   ``--park-jobs`` connections: a first batch of 5,000 by the functions a worker calls
   (``start_run``, then ``claim_runs`` and ``park_run`` in the same transaction), the
   rest copies of the rows they wrote for its first run (new ids, signals and timers;
   one INSERT of 50,000 runs and their checkpoints per transaction: ~20,000 runs/s
   against ~2,250; ``--park-via functions`` parks every run through the functions).
   First on the empty database, then at each size: the idle fleet over
   ``--idle-window`` seconds, twice in a row (CPU of the worker processes and their
   backends from ``/proc``, transactions a second on the database, buffers of
   pgdurable's tables read per transaction, the workers' resident memory); ``--probes`` sequential probes -- ``start()`` latency, enqueue-to-claim
   latency (``leased_at - created_at``, database clock) and a 3-step run's end-to-end
   latency (``start`` to ``result``) -- alternated in rounds with the same probes on a
   second, empty scratch database served by its own fleet of the same size (the
   baseline: both under the same machine load), p50 and p99 and their ratios; the bytes
   of ``runs`` (table, indexes) and of its checkpoints per run, and what autovacuum did.
2. **Timer storm.** ``--storm`` parked runs whose timers fall due in the same second:
   the time from that second until all of them completed their next step, against the
   same number of fresh runs (committed at once) drained by the same workers from their
   commit; per run in each (robust to the machine's load): the CPU of the fleet and its
   backends, the buffers read, the runs a claim took; the most claims of a stormed run
   (2: created, woken once); the sequential scans of ``runs`` during the storm, and the
   plan of the claim's timer branch.
3. **Signal storm.** ``--storm`` signals to as many of the parked runs by ``--senders``
   concurrent senders (``send_signal``, one statement and transaction each): signals a
   second against the same number of bare single-row INSERTs by the same senders, and
   -- to show what bounds it -- bare INSERTs that also ``pg_notify`` in their
   transaction, and signals that wake no run (no NOTIFY); the time until every run
   resumed; the NOTIFYs a LISTEN connection received per signal.
4. **Wake fan-in.** A parent starting ``--fanin`` children (``ctx.start_child`` 16 at
   a time; then, as a second parent, all in one ``ctx.start_children``) and waiting for
   all of them, against as many independent runs started by the driver 16 at a time,
   alternated twice: time per child, and how often the parent was claimed (2: started,
   woken once).
5. **Retention.** Parked runs are cancelled until half of all runs are finished; then
   ``prune_runs`` of every finished run while the fleet serves probes: the claim and
   end-to-end p99 during the prune against before it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from _driver import load
from _scratch import drop_scratch, scratch_dsn
from psycopg import sql

import pgdurable
from pgdurable.retention import prune_sync

HERE = Path(__file__).resolve().parent
DB = "pgdurable_bench_million"
BATCH = 5000
PARTS = ("parked", "timer", "signal", "fanin", "retention")
# -- start n parked-to-be runs (the same transaction claims and parks them)
START_N = ("SELECT count(*) FROM (SELECT pgdurable.start_run('parked', '1', '{}', 'default', 0, "
           "3, NULL, NULL, NULL, NULL) FROM generate_series(1, %s)) s")
# -- claim them (this transaction's runs: nothing else of the task is runnable) and park
# -- each on its signal, with a timeout at %s (a fixed time) or spread over the next
# -- three days (NULL)
PARK = ("SELECT count(*) FROM (SELECT pgdurable.park_run(c.id, c.lease_token, 'million-driver', "
        "'{}'::jsonb, 0, 'bench', c.id::text, coalesce(%s::timestamptz, now() + interval "
        "'1 hour' + random() * interval '3 days'), NULL) FROM pgdurable.claim_runs("
        "'million-driver', '{default}', '{parked}', '{1}', %s, '5 min') c) s")
# -- copy the parked run %(proto)s (parked by START_N and PARK: every column as those
# -- functions wrote it) as %(n)s more parked runs, and its checkpoint with each: a new id,
# -- each waiting on its own signal ("bench", id) with its own timeout (at %(at)s, or spread
# -- over the next three days), created in this transaction; one INSERT per table, no
# -- dead tuple (the functions leave three per run: inserted runnable, claimed, parked)
CLONE = ("WITH n AS (SELECT gen_random_uuid() AS id, coalesce(%(at)s::timestamptz, now() "
         "+ interval '1 hour' + random() * interval '3 days') AS w FROM generate_series(1, "
         "%(n)s)), r AS (INSERT INTO pgdurable.runs SELECT x.* FROM pgdurable.runs p CROSS "
         "JOIN n CROSS JOIN LATERAL jsonb_populate_record(p, jsonb_build_object('id', n.id, "
         "'wait_ref', n.id, 'wake_at', n.w, 'created_at', now(), 'updated_at', now(), "
         "'wait_since', now(), 'created_xact', pg_current_xact_id()::text::bigint)) x "
         "WHERE p.id = %(proto)s RETURNING id) INSERT INTO pgdurable.checkpoints SELECT x.* "
         "FROM pgdurable.checkpoints c CROSS JOIN r CROSS JOIN LATERAL jsonb_populate_record("
         "c, jsonb_build_object('run_id', r.id, 'created_at', now())) x "
         "WHERE c.run_id = %(proto)s")
CLONE_BATCH = 50_000
# -- the database's client backends of the fleet (every backend but this connection's)
BACKENDS = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
XACTS = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
# -- buffers (hit or read) of pgdurable's tables and indexes so far
BUFFERS = ("SELECT sum(coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0) + "
           "coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)) FROM pg_statio_user_tables "
           "WHERE schemaname = 'pgdurable'")
RUNS_STATS = ("SELECT seq_scan, coalesce(idx_scan, 0), n_dead_tup, autovacuum_count, "
              "autoanalyze_count, vacuum_count FROM pg_stat_user_tables "
              "WHERE relid = 'pgdurable.runs'::regclass")
# -- bytes of runs (table with TOAST, indexes), of the checkpoints partitions, the row count
SIZE = ("SELECT pg_table_size('pgdurable.runs'), pg_indexes_size('pgdurable.runs'), "
        "(SELECT sum(pg_total_relation_size(t.relid)) FROM pg_partition_tree("
        "'pgdurable.checkpoints') t WHERE t.isleaf), (SELECT count(*) FROM pgdurable.runs)")
LISTENING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND query LIKE 'LISTEN pgdurable%'")
# -- is any run runnable or leased, or (with %s not NULL) a timer due by %s still waiting
ANY_BUSY = ("SELECT EXISTS (SELECT FROM pgdurable.runs WHERE status = 'runnable') OR EXISTS ("
            "SELECT FROM pgdurable.runs WHERE status = 'leased') OR (%s::timestamptz IS NOT NULL "
            "AND EXISTS (SELECT FROM pgdurable.runs WHERE status = 'waiting' AND wake_at IS NOT "
            "NULL AND queue = 'default' AND wake_at <= %s::timestamptz))")
LAST_FINISH = ("SELECT max(finished_at) FROM pgdurable.runs WHERE status IN "
               "('completed', 'failed', 'cancelled', 'incompatible')")
# -- the claim's timer branch (claim_runs, c: per queue an ordered, LIMITed walk), as the
# -- storm's first claim sees it
TIMER_BRANCH = ("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) "
                "SELECT x.id FROM unnest('{default}'::text[]) AS qn(name) CROSS JOIN LATERAL ("
                "SELECT r.id, r.wake_at FROM pgdurable.runs r WHERE r.status = 'waiting' AND "
                "r.wake_at IS NOT NULL AND r.queue = qn.name AND r.wake_at <= %s "
                "AND (r.task, r.revision) IN (('parked', '1')) ORDER BY r.wake_at LIMIT 32 "
                "FOR UPDATE SKIP LOCKED) x ORDER BY x.wake_at LIMIT 32")
PARK_RATE = {"runs_per_s": 1000.0}  # until a park measures it (clone: ~10,000-20,000)


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


def one(c: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the first row of ``query``."""
    row = c.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


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
                if one(c, LISTENING) >= n:
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


def park(dsn: str, n: int, wake_at: str | None = None, jobs: int = 2, via: str = "clone") -> float:
    """Park ``n`` more runs; the seconds it took. Records the rate in :data:`PARK_RATE`
    (the timer storm's lead time).

    ``via="functions"``: all of them in batches of :data:`BATCH` on ``jobs`` connections,
    each batch ``start_run``, ``claim_runs`` and ``park_run`` in one transaction (the
    functions a worker calls; ~0.5-1 ms of server time per run). ``via="clone"`` (the
    default, ~10x faster): the first batch so, the rest copies of its first run
    (:data:`CLONE`: the rows those functions wrote, new ids, signals and timers) in
    batches of :data:`CLONE_BATCH` on the same connections."""
    seed = n if via == "functions" else min(n, BATCH)

    def by_functions(k_total: int) -> None:
        with psycopg.connect(dsn) as c:
            left = k_total
            while left > 0:
                k = min(BATCH, left)
                with c.transaction():
                    c.execute(START_N, (k,))
                    got = one(c, PARK, (wake_at, k))
                    assert got == k, (got, k)
                left -= k

    def by_clone(k_total: int, proto: str) -> None:
        with psycopg.connect(dsn) as c:
            left = k_total
            while left > 0:
                k = min(CLONE_BATCH, left)
                with c.transaction():
                    cur = c.execute(CLONE, {"at": wake_at, "n": k, "proto": proto})
                    assert cur.rowcount == k, (cur.rowcount, k)
                left -= k

    def spread(total: int, target: Callable[..., None], *args: Any) -> None:
        shares = [total // jobs + (1 if i < total % jobs else 0) for i in range(jobs)]
        threads = [threading.Thread(target=target, args=(k, *args)) for k in shares if k]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        t_db = one(c, "SELECT clock_timestamp()")
    spread(seed, by_functions)
    if n > seed:
        with psycopg.connect(dsn, autocommit=True) as c:
            proto = one(c, "SELECT id::text FROM pgdurable.runs WHERE task = 'parked' AND "
                           "status = 'waiting' AND created_at >= %s ORDER BY created_at LIMIT 1",
                        (t_db,))
        spread(n - seed, by_clone, proto)
    took = time.perf_counter() - t0
    if n >= BATCH:
        PARK_RATE["runs_per_s"] = n / took
    return took


@dataclass
class Idle:
    cpu_pct: float
    xacts_per_s: float
    rss_mb: float
    workers_pct: float = 0.0
    buffers_per_xact: float = 0.0


def idle(dsn: str, workers: list[subprocess.Popen[bytes]], window: float,
         settle: float = 11.0) -> Idle:
    """The idle fleet over ``window`` s: CPU (% of a core) of the worker processes and of
    their backends (from /proc), transactions a second, the workers' resident memory, and
    the buffers of pgdurable's tables and indexes read per transaction (pg_statio: robust
    to the machine's load, and what grows if an idle statement's plan reads the parked
    runs)."""
    # let the last batch's wake settle, and the backends' statistics of it be flushed
    # (an idle backend flushes its pending pg_stat counters within 10 s)
    time.sleep(settle)
    with psycopg.connect(dsn, autocommit=True) as c:
        backends = [r[0] for r in c.execute(BACKENDS).fetchall()]
        pids = [w.pid for w in workers] + backends
        cpu0 = sum(cpu_seconds(p) for p in pids)
        w0 = sum(cpu_seconds(w.pid) for w in workers)
        x0, b0 = one(c, XACTS), one(c, BUFFERS)
        time.sleep(window)
        backends2 = [r[0] for r in c.execute(BACKENDS).fetchall()]
        cpu1 = sum(cpu_seconds(p) for p in {*pids, *backends2})
        w1 = sum(cpu_seconds(w.pid) for w in workers)
        c.execute("SELECT pg_stat_clear_snapshot()")
        x1, b1 = one(c, XACTS), one(c, BUFFERS)
    # this connection's own statements: BACKENDS twice, XACTS and BUFFERS twice, the clear
    xacts = max(1, x1 - x0 - 5)
    return Idle(100 * (cpu1 - cpu0) / window, xacts / window,
                sum(rss_mb(w.pid) for w in workers), 100 * (w1 - w0) / window,
                (b1 - b0) / xacts)


@dataclass
class Probes:
    start_ms: list[float]
    claim_ms: list[float]
    e2e_ms: list[float]

    def add(self, other: Probes) -> None:
        self.start_ms += other.start_ms
        self.claim_ms += other.claim_ms
        self.e2e_ms += other.e2e_ms


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


def probe_pair(dsn: str, empty_dsn: str, n: int, rounds: int = 4) -> tuple[Probes, Probes]:
    """``n`` probes on each database, in ``rounds`` alternating rounds (order swapped each
    round): (this database's, the empty database's)."""
    mine, base = Probes([], [], []), Probes([], [], [])
    per = max(1, n // rounds)
    for r in range(rounds):
        order = [(dsn, mine), (empty_dsn, base)]
        for d, acc in (order if r % 2 == 0 else order[::-1]):
            acc.add(asyncio.run(probe(d, per)))
    return mine, base


def show_probes(label: str, p: Probes, base: Probes | None) -> None:
    def cell(name: str, mine: list[float], theirs: list[float] | None) -> str:
        ratio = "" if theirs is None else (f" ({pct(mine, .5) / pct(theirs, .5):.2f}x / "
                                           f"{pct(mine, .99) / pct(theirs, .99):.2f}x)")
        return f"{name} p50 {pct(mine, .5):.1f} p99 {pct(mine, .99):.1f} ms{ratio}"

    print(f"  {label}: " + "; ".join([
        cell("start()", p.start_ms, base.start_ms if base else None),
        cell("claim", p.claim_ms, base.claim_ms if base else None),
        cell("3-step run", p.e2e_ms, base.e2e_ms if base else None)]), flush=True)


def part_parked(dsn: str, empty_dsn: str, workers: list[subprocess.Popen[bytes]],
                sizes: list[int], window: float, probes: int, jobs: int, via: str) -> None:
    print("1. parked runs (probes alternated with an empty database's; ratios to it, "
          "p50 / p99)", flush=True)
    base_idle = idle(dsn, workers, window)
    print(f"  0 parked: idle fleet {base_idle.cpu_pct:.2f} % of a core (workers "
          f"{base_idle.workers_pct:.2f} %), {base_idle.xacts_per_s:.2f} transactions/s, "
          f"{base_idle.buffers_per_xact:.1f} buffers/transaction, workers "
          f"{base_idle.rss_mb:.0f} MB", flush=True)
    mine, base = probe_pair(dsn, empty_dsn, probes)
    show_probes("0 parked vs empty (the harness's own spread)", mine, base)
    have = 0
    for size in sizes:
        took = park(dsn, size - have, jobs=jobs, via=via)
        print(f"  parked {size - have} more in {took:.1f} s "
              f"({(size - have) / took:.0f} runs/s on {jobs} connections, via {via}); {load()}",
              flush=True)
        have = size
        with psycopg.connect(dsn, autocommit=True) as c:
            st = c.execute(RUNS_STATS).fetchone()
            assert st is not None
            t0 = time.perf_counter()
            c.execute("VACUUM ANALYZE pgdurable.runs")
            print(f"  after parking: dead tuples in runs {st[2]}, autovacuums of runs so far "
                  f"{st[3]}; a VACUUM ANALYZE of runs took {time.perf_counter() - t0:.1f} s "
                  f"(what autovacuum does in the background; measured after it)", flush=True)
        i = idle(dsn, workers, window)
        again = idle(dsn, workers, window, settle=0.0)
        mine, base = probe_pair(dsn, empty_dsn, probes)
        with psycopg.connect(dsn) as c:
            table, index, history, count = c.execute(SIZE).fetchone() or (0, 0, 0, 1)
            st = c.execute(RUNS_STATS).fetchone()
        assert st is not None
        print(f"  {size} parked: idle fleet {i.cpu_pct:.2f} % of a core (workers "
              f"{i.workers_pct:.2f} %), {i.xacts_per_s:.2f} transactions/s, "
              f"{i.buffers_per_xact:.1f} buffers/transaction, workers {i.rss_mb:.0f} MB; "
              f"per run: runs {table / count:.0f} B "
              f"+ its indexes {index / count:.0f} B + checkpoints {history / count:.0f} B; "
              f"autovacuums of runs {st[3]}, autoanalyzes {st[4]}, dead tuples {st[2]}",
              flush=True)
        print(f"  {size} parked, the next {window:.0f} s: idle fleet {again.cpu_pct:.2f} % of a "
              f"core (workers {again.workers_pct:.2f} %), {again.xacts_per_s:.2f} "
              f"transactions/s, {again.buffers_per_xact:.1f} buffers/transaction", flush=True)
        show_probes(f"{size} parked vs empty", mine, base)


def wait_idle(c: psycopg.Connection[Any], due: Any = None, timeout: float = 1800) -> None:
    """Until no run is runnable or leased (and, with ``due``, no timer due by then waits).
    Asks every 0.2 s whether one exists (never counts them: a count of a storm's 100,000
    due timers every 50 ms was CPU taken from the fleet it measures); when the last run
    finished is read from the database (``finished_at``), not from this loop."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if not one(c, ANY_BUSY, (due, due)):
            return
        time.sleep(0.2)
    raise RuntimeError("runs left unfinished")


# -- claim_runs calls so far (track_functions), blocks (hit or read) of runs' heap and of
# -- the claim's two index walks so far
CLAIM_BLOCKS = ("SELECT (SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE "
                "funcname = 'claim_runs'), (SELECT heap_blks_hit + heap_blks_read FROM "
                "pg_statio_user_tables WHERE relid = 'pgdurable.runs'::regclass), (SELECT "
                "idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes WHERE indexrelid = "
                "'pgdurable.runs_timer_idx'::regclass), (SELECT idx_blks_hit + idx_blks_read "
                "FROM pg_statio_user_indexes WHERE indexrelid = "
                "'pgdurable.runs_runnable_idx'::regclass)")


def meter(c: psycopg.Connection[Any], workers: list[subprocess.Popen[bytes]]) -> list[float]:
    """[CPU seconds of the workers and of every backend of the database (/proc), buffers of
    pgdurable's tables and indexes, claim_runs calls, blocks of runs' heap, runs_timer_idx
    and runs_runnable_idx], so far; the statistics flushed first (an idle backend flushes its
    counters within 10 s: call it with the fleet idle for that long)."""
    pids = [w.pid for w in workers] + [r[0] for r in c.execute(BACKENDS).fetchall()]
    c.execute("SELECT pg_stat_clear_snapshot()")
    blocks = c.execute(CLAIM_BLOCKS).fetchone()
    assert blocks is not None
    return [sum(cpu_seconds(p) for p in pids), float(one(c, BUFFERS)),
            *(float(b or 0) for b in blocks)]


def part_timer_storm(dsn: str, n: int, jobs: int, via: str,
                     workers: list[subprocess.Popen[bytes]]) -> None:
    print(f"2. timer storm: {n} parked runs due in the same second, against {n} fresh runs",
          flush=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        since = one(c, "SELECT now()")
        rate = PARK_RATE["runs_per_s"] if via == "functions" else max(
            5000.0, PARK_RATE["runs_per_s"])
        lead = max(15.0, 1.5 * n / rate + 5) + 11
        due = one(c, "SELECT now() + %s * interval '1 s'", (lead,))
        park(dsn, n, str(due), jobs, via)
        assert one(c, "SELECT now() < %s", (due,)), "parking took longer than the lead time"
        plan = [r[0] for r in c.execute(TIMER_BRANCH, (due,)).fetchall()]
        scans0 = c.execute(RUNS_STATS).fetchone()
        while one(c, "SELECT now() < %s - interval '0.5 s'", (due,)):
            time.sleep(0.05)
        m0 = meter(c, workers)
        while one(c, "SELECT now() < %s", (due,)):
            time.sleep(0.05)
        wait_idle(c, due)
        scans1 = c.execute(RUNS_STATS).fetchone()
        storm = (one(c, LAST_FINISH) - due).total_seconds()
        claims = one(c, "SELECT max(claims) FROM pgdurable.runs WHERE task = 'parked' "
                        "AND created_at >= %s AND wake_at IS NULL", (since,))
        woke = one(c, "SELECT count(*) FILTER (WHERE result->>'woke' = 'timeout') FROM "
                      "pgdurable.runs WHERE task = 'parked' AND created_at >= %s", (since,))
        time.sleep(11)
        m1 = meter(c, workers)
        c.execute("SELECT count(*) FROM (SELECT pgdurable.start_run('fresh', '1', '{}', "
                  "'default', 0, 3, NULL, NULL, NULL, NULL) FROM generate_series(1, %s)) s",
                  (n,))
        t0 = one(c, "SELECT now()")  # just after the commit that made them runnable
        wait_idle(c)
        fresh = (one(c, LAST_FINISH) - t0).total_seconds()
        time.sleep(11)
        m2 = meter(c, workers)
    assert scans0 is not None and scans1 is not None
    ds = [(b - a) / n for a, b in zip(m0, m1, strict=True)]
    df = [(b - a) / n for a, b in zip(m1, m2, strict=True)]
    print(f"  storm {storm:.2f} s ({n / storm:.0f} runs/s), fresh {fresh:.2f} s "
          f"({n / fresh:.0f} runs/s): {storm / fresh:.2f}x (target <= 1.25); {woke} woken by "
          f"their timer; max claims per stormed run {claims} (2 = created, woken once); "
          f"sequential scans of runs during the storm {scans1[0] - scans0[0]}; {load()}",
          flush=True)
    print(f"  per run, storm vs fresh: fleet CPU {1e6 * ds[0]:.0f} vs {1e6 * df[0]:.0f} us "
          f"({ds[0] / df[0]:.2f}x); buffers {ds[1]:.1f} vs {df[1]:.1f} "
          f"({ds[1] / df[1]:.2f}x): runs' heap {ds[3]:.1f} vs {df[3]:.1f}, runs_timer_idx "
          f"{ds[4]:.2f} vs {df[4]:.2f}, runs_runnable_idx {ds[5]:.2f} vs {df[5]:.2f}; runs per "
          f"claim {1 / max(ds[2], 1e-9):.1f} vs {1 / max(df[2], 1e-9):.1f}; the fleet used "
          f"{ds[0] * n / storm:.2f} vs {df[0] * n / fresh:.2f} cores", flush=True)
    print("  the claim's timer branch with the storm parked (before it is due):", flush=True)
    for line in plan:
        print(f"    {line}", flush=True)


def senders_rate(dsn: str, refs: list[str], statement: str, senders: int,
                 batch: int = 1, params: Callable[[list[str]], tuple[Any, ...]] | None = None,
                 ) -> float:
    """``statement`` per ref (``batch`` 1) or per ``batch`` refs (``params(chunk)``), one
    transaction each, by ``senders`` threads: refs per second."""
    def send(chunk: list[str]) -> None:
        with psycopg.connect(dsn, autocommit=True) as sc:
            if batch == 1:
                for ref in chunk:
                    sc.execute(statement, (ref,))
            else:
                assert params is not None
                for k in range(0, len(chunk), batch):
                    sc.execute(statement, params(chunk[k:k + batch]))

    threads = [threading.Thread(target=send, args=(refs[i::senders],)) for i in range(senders)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(refs) / (time.perf_counter() - t0)


class Listener:
    """Counts the NOTIFYs of pgdurable_wake and pgdurable_events while it runs."""

    def __init__(self, dsn: str) -> None:
        self.n = 0
        self._dsn = dsn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._ready = threading.Event()

    def _listen(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as lc:
            lc.execute("LISTEN pgdurable_wake")
            lc.execute("LISTEN pgdurable_events")
            self._ready.set()
            while not self._stop.is_set():
                for _ in lc.notifies(timeout=0.2, stop_after=1000):
                    self.n += 1

    def __enter__(self) -> Listener:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)
        self._stop.set()
        self._thread.join()


def resumed_since(dsn: str, t0: Any) -> float:
    """Seconds from ``t0`` until no run is runnable or leased (the last finish)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        wait_idle(c)
        return float((one(c, LAST_FINISH) - t0).total_seconds())


def part_signal_storm(dsn: str, n: int, senders: int, jobs: int, batch: int,
                      via: str) -> None:
    single = max(1, n // 4)
    print(f"3. signal storm: {n} signals to as many parked runs by {senders} senders: "
          f"{single} one per transaction (send_signal), {n - single} in batches of {batch} "
          f"(send_signals); against bare INSERTs", flush=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        refs = [r[0] for r in c.execute(
            "SELECT wait_ref FROM pgdurable.runs WHERE status = 'waiting' AND "
            "wait_kind = 'bench' LIMIT %s", (n,)).fetchall()]
        if len(refs) < n:
            park(dsn, n - len(refs), None, jobs, via)
            refs = [r[0] for r in c.execute(
                "SELECT wait_ref FROM pgdurable.runs WHERE status = 'waiting' AND "
                "wait_kind = 'bench' LIMIT %s", (n,)).fetchall()]
        c.execute("DROP TABLE IF EXISTS public.bench_inserts")
        c.execute("CREATE TABLE public.bench_inserts (id text, payload jsonb)")
        t_a = one(c, "SELECT now()")
    with Listener(dsn) as la:
        sig = senders_rate(dsn, refs[:single], "SELECT pgdurable.send_signal('bench', %s, "
                                               "'{}'::jsonb, NULL, NULL)", senders)
    resumed_a = resumed_since(dsn, t_a)
    with psycopg.connect(dsn, autocommit=True) as c:
        t_b = one(c, "SELECT now()")
    with Listener(dsn) as lb:
        many = senders_rate(dsn, refs[single:], "SELECT count(*) FROM pgdurable.send_signals("
                                                "%s::text[], %s::text[], %s::text[]::jsonb[])",
                            senders, batch, lambda ch: (["bench"] * len(ch), ch, ["{}"] * len(ch)))
    resumed_b = resumed_since(dsn, t_b)
    with psycopg.connect(dsn, autocommit=True) as c:
        claims = one(c, "SELECT max(claims) FROM pgdurable.runs WHERE id = ANY(%s::uuid[])",
                     (refs,))
        woke = one(c, "SELECT count(*) FROM pgdurable.runs WHERE id = ANY(%s::uuid[]) AND "
                      "result->>'woke' = 'signal'", (refs,))
    ins = senders_rate(dsn, refs, "INSERT INTO public.bench_inserts VALUES (%s, '{}'::jsonb)",
                       senders)
    ins_many = senders_rate(dsn, refs, "INSERT INTO public.bench_inserts SELECT r, '{}'::jsonb "
                                       "FROM unnest(%s::text[]) r", senders, batch,
                            lambda ch: (ch,))
    # what bounds a waking signal: the same INSERT with a NOTIFY in its transaction, and a
    # signal that wakes no run (stored pending: no NOTIFY); a fifth as many each
    few = refs[: max(1, n // 5)]
    ins_notify = senders_rate(dsn, few, "WITH i AS (INSERT INTO public.bench_inserts VALUES "
                                        "(%s, '{}'::jsonb) RETURNING 1) SELECT "
                                        "pg_notify('bench_notify', 'default') FROM i", senders)
    quiet = senders_rate(dsn, few, "SELECT pgdurable.send_signal('bench_nobody', %s, "
                                   "'{}'::jsonb, NULL, NULL)", senders)
    print(f"  one per transaction: signals {sig:.0f}/s, bare single-row INSERTs {ins:.0f}/s: "
          f"{sig / ins:.2f}x; its {single} runs all resumed {resumed_a:.1f} s after the first "
          f"signal; {la.n / single:.3f} NOTIFYs per signal", flush=True)
    print(f"  in batches of {batch}: signals {many:.0f}/s: {many / ins:.2f}x bare single-row "
          f"INSERTs, {many / ins_many:.2f}x bare {batch}-row INSERTs ({ins_many:.0f} rows/s); "
          f"its {n - single} runs all resumed {resumed_b:.1f} s after the first batch began; "
          f"{lb.n / (n - single):.4f} NOTIFYs per signal", flush=True)
    print(f"  all {n}: {woke} woken by their signal, max claims per run {claims} "
          f"(2 = created, woken once); {load()}", flush=True)
    print(f"  the bound: bare INSERT + pg_notify {ins_notify:.0f}/s ({ins_notify / ins:.2f}x "
          f"bare INSERTs; one-per-transaction signals at {sig / ins_notify:.2f}x of it); "
          f"signals that wake no run (no NOTIFY) {quiet:.0f}/s ({quiet / ins:.2f}x bare "
          f"INSERTs)", flush=True)


@dataclass
class FanIn:
    """One mode's seconds: from the first start to the last start (``started``) and from
    there to the end (``tail``): the last child's, or the parent's, completion."""

    started: list[float]
    tail: list[float]

    def total(self) -> float:
        return sum(self.started) + sum(self.tail)


async def fan_in_rounds(dsn: str, n: int, rounds: int) -> tuple[FanIn, FanIn, FanIn,
                                                                list[Any]]:
    app = pgdurable.Durable(dsn, pool_size=20)
    ind, fan, batch = FanIn([], []), FanIn([], []), FanIn([], [])
    seen: list[Any] = []
    async with app:
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(rounds):
                t0 = one(c, "SELECT now()")
                for i in range(0, n, 16):
                    await asyncio.gather(*(app.start("child", None, revision="1")
                                           for _ in range(i, min(n, i + 16))))
                t1 = one(c, "SELECT now()")
                await asyncio.to_thread(wait_idle, c)
                ind.started.append((t1 - t0).total_seconds())
                ind.tail.append((one(c, LAST_FINISH) - t1).total_seconds())
                for mode, acc in ((False, fan), (True, batch)):
                    t0 = one(c, "SELECT now()")
                    pid = await app.start("fanin", {"n": n, "batch": mode}, revision="1")
                    await app.result(pid, timeout=1800)
                    # the parent's step 1 checkpoint: written as it parked on its children
                    row = c.execute("SELECT r.finished_at, r.claims, r.result, c.created_at "
                                    "FROM pgdurable.runs r JOIN pgdurable.checkpoints c "
                                    "ON c.run_id = r.id AND c.step = 1 WHERE r.id = %s",
                                    (pid,)).fetchone()
                    assert row is not None
                    acc.started.append((row[3] - t0).total_seconds())
                    acc.tail.append((row[0] - row[3]).total_seconds())
                    seen.append((row[1], row[2]))
    return ind, fan, batch, seen


def part_fan_in(dsn: str, n: int) -> None:
    print(f"4. wake fan-in: a parent with {n} children (ctx.start_child 16 at a time; "
          f"ctx.start_children, one statement), against {n} independent runs "
          f"(alternated, 2 rounds)", flush=True)
    ind, fan, batch, seen = asyncio.run(fan_in_rounds(dsn, n, 2))

    def show(f: FanIn) -> str:
        return (f"{f.total() / len(f.tail):.1f} s ({1000 * f.total() / len(f.tail) / n:.2f} ms "
                f"per run; starting {', '.join(f'{t:.1f}' for t in f.started)} s, then until "
                f"done {', '.join(f'{t:.1f}' for t in f.tail)} s)")

    def vs(f: FanIn) -> str:
        return (f"{f.total() / ind.total():.2f}x (starting "
                f"{sum(f.started) / sum(ind.started):.2f}x, the rest "
                f"{sum(f.tail) / max(sum(ind.tail), 1e-9):.2f}x)")

    print(f"  independent {show(ind)}", flush=True)
    print(f"  children by start_child {show(fan)}: {vs(fan)}", flush=True)
    print(f"  children by start_children {show(batch)}: {vs(batch)}", flush=True)
    print(f"  parents (claims, result) {seen} (2 claims = started, woken once); {load()}",
          flush=True)


def part_retention(dsn: str, probes: int, workers: list[subprocess.Popen[bytes]],
                   pause: float = 0.0) -> None:
    print("5. retention: prune the finished half of the runs while the fleet serves probes",
          flush=True)
    with psycopg.connect(dsn, autocommit=True) as c:
        total = one(c, "SELECT count(*) FROM pgdurable.runs")
        done = one(c, "SELECT count(*) FROM pgdurable.runs WHERE status IN "
                      "('completed', 'failed', 'cancelled', 'incompatible')")
        t0 = time.perf_counter()
        cancelled = 0
        while done + cancelled < total // 2:
            cancelled += one(c, "SELECT count(pgdurable.cancel_run(id)) FROM (SELECT id FROM "
                                "pgdurable.runs WHERE status = 'waiting' AND wait_kind = 'bench' "
                                "LIMIT %s) s", (min(BATCH, total // 2 - done - cancelled),))
        print(f"  {total} runs, {done} finished; cancelled {cancelled} parked runs in "
              f"{time.perf_counter() - t0:.1f} s: {done + cancelled} finished", flush=True)
        c.execute("VACUUM ANALYZE pgdurable.runs")

        def usage() -> tuple[float, float, Any]:
            """CPU seconds of the workers and every backend of the database, the clock,
            the WAL position (cluster-wide: other databases' writes count too)."""
            return (meter(c, workers)[0], time.perf_counter(),
                    one(c, "SELECT pg_current_wal_lsn()"))

        u0 = usage()
        before = asyncio.run(probe(dsn, probes))
        u1 = usage()
    result: dict[str, Any] = {}

    def prune() -> None:
        t0 = time.perf_counter()
        result["pruned"] = prune_sync(dsn, timedelta(0), pause=pause).runs
        result["s"] = time.perf_counter() - t0

    pruner = threading.Thread(target=prune)
    pruner.start()
    during = Probes([], [], [])
    while pruner.is_alive():
        during.add(asyncio.run(probe(dsn, 10)))
    pruner.join()
    with psycopg.connect(dsn, autocommit=True) as c:
        u2 = (meter(c, workers)[0], time.perf_counter(), one(c, "SELECT pg_current_wal_lsn()"))
        wal = [one(c, "SELECT pg_wal_lsn_diff(%s, %s)", (b[2], a[2])) for a, b in
               ((u0, u1), (u1, u2))]
    print(f"  the database's backends and the workers used {(u1[0] - u0[0]) / (u1[1] - u0[1]):.2f} "
          f"cores before the prune, {(u2[0] - u1[0]) / (u2[1] - u1[1]):.2f} during it (the "
          f"pruner's and the probes' backends included; 2 CPUs); WAL written (the cluster's) "
          f"{float(wal[0]) / (u1[1] - u0[1]) / 1e6:.1f} MB/s before, "
          f"{float(wal[1]) / (u2[1] - u1[1]) / 1e6:.1f} MB/s during", flush=True)
    print(f"  pruned {result.get('pruned')} runs in {result.get('s', 0):.1f} s (pause {pause} s "
          f"between batches) "
          f"({result.get('pruned', 0) / max(result.get('s', 1), 1e-9):.0f} runs/s); "
          f"{len(during.e2e_ms)} probes during it; {load()}", flush=True)
    show_probes("before the prune", before, None)
    show_probes("during the prune (ratio to before)", during, before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--parked", default="10000,100000,1000000")
    ap.add_argument("--storm", type=int, default=100_000)
    ap.add_argument("--senders", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--fanin", type=int, default=10_000)
    ap.add_argument("--idle-window", type=float, default=20.0)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--park-jobs", type=int, default=2)
    ap.add_argument("--park-via", choices=("clone", "functions"), default="clone",
                    help="clone (default): a batch parked by the functions, the rest copies of "
                         "its rows; functions: every run by start_run, claim_runs, park_run")
    ap.add_argument("--signal-batch", type=int, default=100)
    ap.add_argument("--prune-pause", type=float, default=0.0,
                    help="seconds between the prune's batches (prune_sync(pause=...))")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--db", default=DB, help="the scratch database (and <db>_empty)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.parked, args.storm, args.fanin = "2000,10000", 5000, 1000
        args.idle_window, args.probes = 5.0, 40
    sizes = [int(x) for x in args.parked.split(",")]
    parts = set(args.parts.split(","))
    assert parts <= set(PARTS), f"--parts: of {PARTS}"
    t_start = time.perf_counter()
    db, empty_db = args.db, f"{args.db}_empty"
    dsn = scratch_dsn(args.dsn, db)
    with psycopg.connect(dsn, autocommit=True) as c:  # pg_stat_user_functions: claims counted
        c.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(
            sql.Identifier(db)))
    print(f"million: parked {sizes}, storms of {args.storm}, fan-in {args.fanin}, "
          f"{args.workers} workers, parts {sorted(parts)}; {platform.node()}, "
          f"{os.cpu_count()} CPUs; {load()}", flush=True)
    try:
        with ExitStack() as stack:
            workers = stack.enter_context(fleet(dsn, args.workers))
            if "parked" in parts:
                empty_dsn = scratch_dsn(args.dsn, empty_db)
                with fleet(empty_dsn, args.workers):
                    part_parked(dsn, empty_dsn, workers, sizes, args.idle_window, args.probes,
                                args.park_jobs, args.park_via)
                drop_scratch(args.dsn, empty_db)
            if "timer" in parts:
                part_timer_storm(dsn, args.storm, args.park_jobs, args.park_via, workers)
            if "signal" in parts:
                part_signal_storm(dsn, args.storm, args.senders, args.park_jobs, args.signal_batch,
                                  args.park_via)
            if "fanin" in parts:
                part_fan_in(dsn, args.fanin)
            if "retention" in parts:
                part_retention(dsn, args.probes, workers, args.prune_pause)
    finally:
        drop_scratch(args.dsn, db, empty_db)
    print(f"done in {(time.perf_counter() - t_start) / 60:.1f} min; {load()}")


if __name__ == "__main__":
    main()
