"""History at scale: prune a day by partition drop vs the batched delete; hot-path cost.

One command::

    .venv/bin/python benchmarks/history_scale.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--rows 1000000] [--days 30] [--blocks 20] [--seconds 1.5]

``--dsn`` names a maintenance database; two scratch databases are created (and
dropped at the end):

* ``pgdurable_bench_history_flat``: fully migrated, then ``checkpoints`` and
  ``run_events`` replaced by plain tables with the same columns, keys, indexes
  and trigger (so the comparison is partitioning alone, not the features of the
  migrations since; the views that read them are dropped);
* ``pgdurable_bench_history_parts``: fully migrated (daily partitions).

Both get the same dataset, bulk-inserted with ``generate_series``: ``--rows``
checkpoint rows (default 1,000,000; the issue's figure is 10,000,000 -- pass
``--rows 10000000`` on a machine that has the time) in runs of 10 steps, spread
evenly over ``--days`` days, every run completed (and last updated) an hour into
its day, then
``VACUUM ANALYZE``.

Measured, in each database:

1. **Hot path** (``--blocks`` pairs of blocks of ``--seconds`` s, flat then
   partitioned, alternating, so load from other processes hits both alike): one
   client loop of start_run, claim_runs, 3 x (emit_event + checkpoint_run),
   complete_run. Reported: runs/s, and the ratio partitioned/flat of each pair
   (adjacent blocks): its median (target >= 0.9) and its spread (min, quartiles,
   max). The load average is printed before and after. Then the same loop inside
   the server (a DO block, ``ENGINE``: 100 runs in one transaction, rolled back),
   alternating too: the engine's time per run without the client round trips
   and commits, which load from other processes disturbs less (but it holds its
   locks across runs, so it hides the cost of taking them in each transaction).
   And, when the server runs on this machine, the CPU time its backend spends per
   run of the client loop (``/proc/<pid>/stat``, utime + stime; ``--blocks`` / 2
   alternating pairs of 150 runs): the measure load from other processes
   disturbs least, since waiting for a CPU is not counted.
2. **Prune the oldest days** (``--prune-days``, 3), one day at a time, while
   ``--workers`` threads (4) claim and checkpoint in a loop: flat = the current
   retention (``prune_runs`` batches of 1,000 runs);
   partitioned = ``drop_history_partitions`` (the day's partition), then the
   same ``prune_runs`` batches for the runs rows (the new retention). Reported:
   the time, the WAL written by the pruning backend (``EXPLAIN (ANALYZE, WAL)``:
   exact, unaffected by other sessions) and ``pg_current_wal_lsn()`` before and
   after (cluster-wide: includes the worker thread and anyone else on the
   server), and the claim p99 of the worker threads during the prune against their
   p99 in the 3 s just before (same threads, same database), with the number of
   claims in each (a p99 of a few dozen claims is close to their maximum).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn

import pgdurable

FLAT, PARTS = "pgdurable_bench_history_flat", "pgdurable_bench_history_parts"
START = ("SELECT run_id FROM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, "
         "NULL, NULL)")
CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs(%s, '{default}', '{t}', '{1}', 1,"
         " '60 s'::interval)")
EMIT = "SELECT pgdurable.emit_event(%s, %s, %s, 0, '{\"delta\": \"token\"}')"
CHECKPOINT = "SELECT pgdurable.checkpoint_run(%s, %s, %s, '{\"messages\": [1, 2, 3]}', 0)"
COMPLETE = "SELECT pgdurable.complete_run(%s, %s, %s, '{}', 'null', 0)"
# runs of 10 checkpoints, one day in every `days`, created `k` days ago at midnight + 1 s,
# finished an hour later
BULK = """
CREATE TEMP TABLE b ON COMMIT DROP AS
  SELECT gen_random_uuid() AS id, g %% %(days)s + 1 AS k FROM generate_series(1, %(runs)s) g;
INSERT INTO pgdurable.runs (id, task, revision, status, step, finished_at, updated_at, result,
                            created_at)
SELECT id, 't', '1', 'completed', 10,
       date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - k * interval '1 day'
         + interval '1 hour',
       date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - k * interval '1 day'
         + interval '1 hour', 'null',
       date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - k * interval '1 day'
  FROM b;
INSERT INTO pgdurable.checkpoints (run_id, step, token, state, created_at)
SELECT id, s, 1, '{"messages": [1, 2, 3]}',
       date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' - k * interval '1 day'
         + s * interval '1 s'
  FROM b, generate_series(1, 10) s;
"""


# the hot-path loop inside the server: microseconds per run (one transaction, rolled back)
ENGINE = """
DO $$
DECLARE
  t0 timestamptz := clock_timestamp();
  rid uuid;
  tok bigint;
BEGIN
  FOR i IN 1..%(n)s LOOP
    PERFORM pgdurable.start_run('t', '1', '{}', 'default', 0, 3, NULL, NULL, NULL, NULL);
    SELECT c.id, c.lease_token INTO rid, tok
      FROM pgdurable.claim_runs('engine', '{default}', '{t}', '{1}', 1, '60 s'::interval) c;
    FOR j IN 1..3 LOOP
      PERFORM pgdurable.emit_event(rid, tok, 'engine', 0, '{"delta": "token"}');
      PERFORM pgdurable.checkpoint_run(rid, tok, 'engine', '{"messages": [1, 2, 3]}', 0);
    END LOOP;
    PERFORM pgdurable.complete_run(rid, tok, 'engine', '{}', 'null', 0);
  END LOOP;
  RAISE EXCEPTION 'us=%%', extract(epoch FROM clock_timestamp() - t0) * 1e6 / %(n)s
    USING ERRCODE = 'PD999';
END
$$
"""


def engine(dsn: str, runs: int = 100) -> float:
    """Microseconds per run of the hot-path loop inside the server (rolled back)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            psycopg.ClientCursor(c).execute(ENGINE, {"n": runs})
        except psycopg.Error as exc:
            if exc.sqlstate != "PD999" or exc.diag.message_primary is None:
                raise
            return float(exc.diag.message_primary.removeprefix("us="))
    raise AssertionError("the engine loop did not report")


def backend_cpu(c: psycopg.Connection[Any]) -> float | None:
    """Seconds of CPU the connection's server backend has used (None: not local)."""
    row = c.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    try:
        with open(f"/proc/{row[0]}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_run(dsn: str, runs: int = 150) -> float | None:
    """Microseconds of server CPU per run of the client loop (None: server not local)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(10):
            one_run(c, "cpu")
        c0 = backend_cpu(c)
        for _ in range(runs):
            one_run(c, "cpu")
        c1 = backend_cpu(c)
    return None if c0 is None or c1 is None else (c1 - c0) * 1e6 / runs


def load() -> str:
    """The 1, 5 and 15 minute load averages (as uptime prints them)."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


# the fully migrated schema with checkpoints and run_events as plain tables: same
# columns, keys, indexes, defaults, checks and trigger, no partitions
UNPARTITION = """
ALTER TABLE pgdurable.checkpoints RENAME TO checkpoints_parts;
ALTER TABLE pgdurable.run_events RENAME TO run_events_parts;
CREATE TABLE pgdurable.checkpoints (LIKE pgdurable.checkpoints_parts INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING INDEXES) WITH (autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 0);
CREATE TABLE pgdurable.run_events (LIKE pgdurable.run_events_parts INCLUDING DEFAULTS
  INCLUDING CONSTRAINTS INCLUDING INDEXES) WITH (autovacuum_vacuum_scale_factor = 0.05,
  autovacuum_vacuum_cost_delay = 0);
CREATE TRIGGER checkpoints_notify AFTER INSERT ON pgdurable.checkpoints
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
  EXECUTE FUNCTION pgdurable._checkpoints_notify();
DROP TABLE pgdurable.checkpoints_parts, pgdurable.run_events_parts CASCADE;
"""


def flat_dsn(admin: str) -> str:
    """A scratch database with today's schema, history tables unpartitioned."""
    dsn = scratch_dsn(admin, FLAT)
    with psycopg.connect(dsn) as c:
        c.execute(UNPARTITION)
    return dsn


def seed(dsn: str, rows: int, days: int, parts: bool) -> float:
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as c:
        if parts:
            c.execute("SELECT pgdurable.create_history_partitions(7, %s)", (days + 1,))
        with c.transaction():
            # several statements: parameters bound client-side
            psycopg.ClientCursor(c).execute(BULK, {"runs": rows // 10, "days": days})
        c.execute("VACUUM ANALYZE pgdurable.runs")
        c.execute("VACUUM ANALYZE pgdurable.checkpoints")
    return time.perf_counter() - t0


def one_run(c: psycopg.Connection[Any], owner: str, claims: list[float] | None = None) -> None:
    c.execute(START)
    t0 = time.perf_counter()
    row = c.execute(CLAIM, (owner,), prepare=True).fetchone()
    if claims is not None:
        claims.append((time.perf_counter() - t0) * 1000)
    if row is None:
        return
    rid, token = row
    for _ in range(3):
        c.execute(EMIT, (rid, token, owner), prepare=True)
        c.execute(CHECKPOINT, (rid, token, owner), prepare=True)
    c.execute(COMPLETE, (rid, token, owner), prepare=True)


def throughput(dsn: str, seconds: float) -> float:
    with psycopg.connect(dsn, autocommit=True) as c:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            one_run(c, "hot")
            n += 1
        return n / (time.perf_counter() - t0)


class Worker(threading.Thread):
    """Claims and checkpoints in a loop; records claim latencies by phase."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.phase = "before"
        self.claims: dict[str, list[float]] = {"before": [], "during": []}
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while not self.stop.is_set():
                one_run(c, "bench-worker", self.claims[self.phase])


def wal_of(c: psycopg.Connection[Any], query: str, params: tuple[Any, ...]) -> int:
    plan = c.execute("EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + query, params).fetchone()
    assert plan is not None
    doc = plan[0] if isinstance(plan[0], list) else json.loads(plan[0])
    return int(doc[0]["Plan"].get("WAL Bytes", 0))


def lsn(c: psycopg.Connection[Any]) -> int:
    row = c.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
    assert row is not None
    return int(row[0])


def prune_days(dsn: str, days: int, parts: bool, warmup: float, workers: int,
               ndays: int) -> dict[str, Any]:
    """Prune the ``ndays`` oldest days, one at a time, while worker threads claim and
    checkpoint; WAL and time are totals."""
    ws = [Worker(dsn) for _ in range(workers)]
    for w in ws:
        w.start()
    time.sleep(warmup)
    with psycopg.connect(dsn, autocommit=True) as c:
        before = c.execute("SELECT count(*) FROM pgdurable.checkpoints").fetchone()
        for w in ws:
            w.phase = "during"
        l0, elapsed, wal = lsn(c), 0.0, 0
        wal_drop, t_drop = 0, 0.0
        for k in range(ndays):
            # the cut-off: just after the oldest day left ends, before the next one's runs
            # finish
            row = c.execute("SELECT now() - (date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME"
                            " ZONE 'UTC' - %s * interval '1 day' + interval '30 min')",
                            (days - 1 - k,)).fetchone()
            assert row is not None
            age = row[0]
            t0 = time.perf_counter()
            if parts:
                one = wal_of(c, "SELECT count(*) FROM pgdurable.drop_history_partitions(%s)",
                             (age,))
                t_drop += time.perf_counter() - t0
                wal_drop += one
                wal += one
            while True:
                wal += wal_of(c, "SELECT * FROM pgdurable.prune_runs(%s, 1000)", (age,))
                row = c.execute("SELECT count(*) FROM pgdurable.runs WHERE status = 'completed'"
                                " AND finished_at <= now() - %s", (age,)).fetchone()
                if row == (0,):
                    break
            elapsed += time.perf_counter() - t0
        l1 = lsn(c)
        for w in ws:
            w.claims["after"] = []
            w.phase = "after"
        after = c.execute("SELECT count(*) FROM pgdurable.checkpoints").fetchone()
    for w in ws:
        w.stop.set()
    for w in ws:
        w.join()
    claims = {k: [x for w in ws for x in w.claims[k]] for k in ("before", "during")}
    assert before is not None and after is not None

    def p99(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) >= 2 else float("nan")

    return {"seconds": elapsed, "wal": wal, "lsn_diff": l1 - l0, "wal_drop": wal_drop, "t_drop": t_drop,
            "p99_before": p99(claims["before"]), "p99_during": p99(claims["during"]),
            "claims_during": len(claims["during"]), "claims_before": len(claims["before"]),
            "max_during": max(claims["during"], default=float("nan")),
            "deleted": before[0] - after[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=20, help="pairs of hot-path blocks")
    ap.add_argument("--prune-days", type=int, default=3,
                    help="oldest days pruned, one at a time (more claims to judge the p99 by)")
    ap.add_argument("--workers", type=int, default=4,
                    help="worker threads claiming and checkpointing during the prune")
    ap.add_argument("--seconds", type=float, default=1.5, help="length of one hot-path block")
    ap.add_argument("--keep", action="store_true", help="keep the scratch databases")
    args = ap.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}"
          f", pgdurable {pgdurable.__version__}; {args.rows:,} checkpoint rows over "
          f"{args.days} days per database; load average {load()}")
    try:
        flat, parts = flat_dsn(args.dsn), scratch_dsn(args.dsn, PARTS)
        for name, dsn, p in (("flat", flat, False), ("partitioned", parts, True)):
            print(f"seed {name}: {seed(dsn, args.rows, args.days, p):.1f} s")
        rates: dict[str, list[float]] = {"flat": [], "partitioned": []}
        for dsn in (flat, parts):
            throughput(dsn, 1.0)  # warm the server's caches alike
        for _ in range(args.blocks):
            for name, dsn in (("flat", flat), ("partitioned", parts)):
                rates[name].append(throughput(dsn, args.seconds))
        f, q = statistics.median(rates["flat"]), statistics.median(rates["partitioned"])
        pairs = sorted(b / a for a, b in zip(rates["flat"], rates["partitioned"], strict=True))
        quart = statistics.quantiles(pairs, n=4) if len(pairs) >= 2 else [pairs[0]] * 3
        print(f"hot path runs/s (1 client; start, claim, 3 x emit+checkpoint, complete; "
              f"{args.blocks} x {args.seconds:g} s blocks each): flat median {f:.0f} "
              f"({' '.join(f'{x:.0f}' for x in rates['flat'])}), partitioned median {q:.0f} "
              f"({' '.join(f'{x:.0f}' for x in rates['partitioned'])})")
        print(f"hot path ratio partitioned/flat per pair: median {statistics.median(pairs):.2f} "
              f"(target >= 0.9); min {pairs[0]:.2f}, quartiles {quart[0]:.2f}-{quart[2]:.2f}, "
              f"max {pairs[-1]:.2f}; load average {load()}")
        us: dict[str, list[float]] = {"flat": [], "partitioned": []}
        for _ in range(args.blocks):
            for name, dsn in (("flat", flat), ("partitioned", parts)):
                us[name].append(engine(dsn))
        epairs = sorted(a / b for a, b in zip(us["flat"], us["partitioned"], strict=True))
        print(f"engine loop inside the server, us per run: flat median "
              f"{statistics.median(us['flat']):.0f}, partitioned median "
              f"{statistics.median(us['partitioned']):.0f}; throughput ratio partitioned/flat "
              f"per pair: median {statistics.median(epairs):.2f}, min {epairs[0]:.2f}, max "
              f"{epairs[-1]:.2f}; load average {load()}")
        cpu: dict[str, list[float]] = {"flat": [], "partitioned": []}
        for _ in range(max(2, args.blocks // 2)):
            for name, dsn in (("flat", flat), ("partitioned", parts)):
                x = cpu_per_run(dsn)
                if x is not None:
                    cpu[name].append(x)
        if cpu["flat"] and cpu["partitioned"]:
            cpairs = sorted(a / b for a, b in zip(cpu["flat"], cpu["partitioned"], strict=True))
            print(f"server CPU per run of the client loop (backend utime + stime): flat median "
                  f"{statistics.median(cpu['flat']):.0f} us, partitioned median "
                  f"{statistics.median(cpu['partitioned']):.0f} us; throughput ratio "
                  f"partitioned/flat per pair: median {statistics.median(cpairs):.2f}, min "
                  f"{cpairs[0]:.2f}, max {cpairs[-1]:.2f}; load average {load()}")
        else:
            print("server CPU per run: not measured (the server does not run on this machine)")
        res = {"flat": prune_days(flat, args.days, False, 3.0, args.workers, args.prune_days),
               "partitioned": prune_days(parts, args.days, True, 3.0, args.workers,
                                         args.prune_days)}
        for name, r in res.items():
            print(f"prune the {args.prune_days} oldest days one at a time, {name}: "
                  f"{r['deleted']:,} checkpoint rows in "
                  f"{r['seconds']:.2f} s; WAL of the pruning backend {r['wal'] / 1e6:.2f} MB; "
                  f"lsn diff {r['lsn_diff'] / 1e6:.2f} MB; worker claim p99 "
                  f"{r['p99_before']:.2f} ms before / {r['p99_during']:.2f} ms during "
                  f"({r['claims_before']} claims before, {r['claims_during']} during; max during"
                  f" {r['max_during']:.2f} ms)")
        a, b = res["flat"], res["partitioned"]
        print(f"partition drops alone: {b['t_drop']:.3f} s, WAL {b['wal_drop'] / 1e3:.1f} kB")
        print(f"WAL, batched delete / partition drop: {a['wal'] / max(b['wal_drop'], 1):.0f}x "
              f"(target >= 50x); / whole new retention (drop + runs rows): "
              f"{a['wal'] / max(b['wal'], 1):.1f}x; time flat/partitioned "
              f"{a['seconds'] / b['seconds']:.1f}x; load average {load()}")
    finally:
        if not args.keep:
            drop_scratch(args.dsn, FLAT, PARTS)


if __name__ == "__main__":
    main()
