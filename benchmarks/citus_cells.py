"""Per-cell throughput on Citus vs the same job on a plain PostgreSQL, in the same run.

One command::

    .venv/bin/python benchmarks/citus_cells.py [--runs 2000] [--rounds 3] [--concurrency 32]
        [--pool-size 8] [--coordinator] [--two-cells] [--phases]

Starts its own Citus cluster (tests/_citus_cluster.py: a coordinator and two
workers on free ports, in a temporary directory, removed at the end; Citus
must be installed: ``../shared/vendor/citus/build.sh``). On it:

* **plain**: a database on the coordinator's server WITHOUT the citus
  extension (same binaries, same configuration, the Citus planner hook idle):
  the baseline;
* **cell**: a database with citus, migrated on the coordinator, the
  ``pgdurable`` schema distributed (``pgdurable.ops.citus.distribute_schema``:
  all its tables on one worker node), the worker process connected straight
  to that node (``cell_dsn``);
* with ``--coordinator``, also the same cell with the worker process
  connected to the coordinator;
* with ``--two-cells``, also two cells at the same time, one on each worker
  node (a second database, its schema moved to the other node with
  ``citus_move_shard_placement``), each with its own worker process and
  driver, against two plain databases on the coordinator's server at the
  same time (the same CPU contention on this machine's cores);
* with ``--phases``, first a probe of the hot path's phases on one connection,
  plain and cell: 32 ``start_run`` calls, one ``claim_runs`` of 32, a
  ``write_steps`` of 32 continuing and one of 32 completing (ms, medians of 20
  repetitions after 5 warm-ups);
* with ``--statements``, first single statements (``start_run``, a bare INSERT
  into ``runs``, an UPDATE of one ``runs`` row by id), each its own transaction,
  with pgbench against the cell's node and the plain database, alternated: what
  Citus adds to one statement, which bounds the job's ratio.

The job is benchmarks/throughput.py's: one worker process
(``_throughput_app:app``), ``--runs`` runs of ``noop3`` (3 no-op steps)
enqueued in batches of 500, timed from the first enqueue to the last
completion on the database clock (benchmarks/_driver.py). The targets are
alternated round by round; reported: runs/s per target and round, and the
ratio cell / plain of each round (target >= 0.7, issue 46).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from _driver import load, spread, timed_runs, worker_process

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))

import _citus_cluster  # noqa: E402

from pgdurable.foundation.migrations import migrate  # noqa: E402
from pgdurable.ops.citus import CellNode, cell_dsn, distribute_schema  # noqa: E402


def _cell(cluster: _citus_cluster.Cluster, name: str, avoid: CellNode | None = None) -> str:
    """A migrated, distributed database; moved off ``avoid``'s node if it landed there."""
    coordinator = cluster.create_database(name)
    migrate(coordinator)
    node = distribute_schema(coordinator)
    if avoid is not None and node.port == avoid.port:
        other = next(w for w in cluster.workers if w.port != node.port)
        with psycopg.connect(coordinator, autocommit=True) as c:
            row = c.execute("SELECT shardid FROM citus_shards "
                            "WHERE table_name = 'pgdurable.runs'::regclass").fetchone()
            assert row is not None
            c.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, "
                      "shard_transfer_mode => 'block_writes')",
                      (row[0], node.host, node.port, "127.0.0.1", other.port))
    return coordinator


def _plain(cluster: _citus_cluster.Cluster, name: str) -> str:
    with psycopg.connect(cluster.coordinator.dsn, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    dsn = cluster.dsn(cluster.coordinator, name)
    migrate(dsn)
    return dsn


def _run(dsn: str, runs: int, args: argparse.Namespace, out: list[float],
         barrier: threading.Barrier | None = None) -> None:
    with (psycopg.connect(dsn, autocommit=True) as c,
          worker_process(dsn, "_throughput_app:app", concurrency=args.concurrency,
                         pool_size=args.pool_size)):
        timed_runs(c, "noop3", 300)  # warm-up
        if barrier is not None:
            barrier.wait()
        out.append(runs / timed_runs(c, "noop3", runs))


def _pair(dsns: tuple[str, str], args: argparse.Namespace) -> list[float]:
    """runs/s of each of two targets run at the same time."""
    out: list[list[float]] = [[], []]
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=_run, args=(d, args.runs, args, o, barrier))
               for d, o in zip(dsns, out, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o[0] for o in out]


PHASE_START = ("SELECT pgdurable.start_run('noop3', '1', '{}'::jsonb, 'default', 0, 3, NULL, "
               "NULL, NULL, NULL) FROM generate_series(1, %s)")
PHASE_CLAIM = ("SELECT id, lease_token FROM pgdurable.claim_runs('probe', '{default}', "
               "'{noop3}', '{1}', %s, '60s')")
PHASE_WRITE = ("SELECT * FROM pgdurable.write_steps('probe', %s, %s, %s::jsonb[], %s::numeric[], "
               "%s, %s::jsonb[])")


def phases(dsn: str, n: int = 32) -> dict[str, float]:
    """Median ms of each phase of the hot path for ``n`` runs (see the docstring)."""
    times: dict[str, list[float]] = {"start": [], "claim": [], "write": [], "complete": []}
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(25):
            t0 = time.perf_counter()
            c.execute(PHASE_START, (n,)).fetchall()
            t1 = time.perf_counter()
            rows = c.execute(PHASE_CLAIM, (n,)).fetchall()
            t2 = time.perf_counter()
            ids, tokens = [r[0] for r in rows], [r[1] for r in rows]
            common = (ids, tokens, ["{}"] * len(ids), [0] * len(ids))
            c.execute(PHASE_WRITE, (*common, [False] * len(ids), [None] * len(ids))).fetchall()
            t3 = time.perf_counter()
            c.execute(PHASE_WRITE, (*common, [True] * len(ids), [None] * len(ids))).fetchall()
            t4 = time.perf_counter()
            if i >= 5:
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    times[k].append(v * 1000)
        c.execute("TRUNCATE pgdurable.runs CASCADE")
    return {k: statistics.median(v) for k, v in times.items()}


#: One statement each, as pgbench scripts (``--statements``): what a cell costs per
#: statement, each its own transaction (a durable commit, as the engine's).
STATEMENTS = {
    "start_run": "SELECT run_id FROM pgdurable.start_run('noop3', '1', '{}'::jsonb, 'bench', 0, "
                 "3, NULL, NULL, NULL, NULL);",
    "INSERT runs": "INSERT INTO pgdurable.runs (task, revision, state, queue, priority, "
                   "max_attempts) VALUES ('noop3', '1', '{}', 'bench', 0, 3) RETURNING id;",
    "UPDATE runs by id": "UPDATE pgdurable.runs SET priority = priority WHERE id = '{id}';",
}


def _tps(bindir: Path, script: Path, dsn: str, seconds: int) -> float:
    out = subprocess.run([str(bindir / "pgbench"), "-n", "-M", "prepared", "-c", "1",
                          "-T", str(seconds), "-f", str(script), dsn],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split("tps = ")[1].split()[0])


def statements(targets: dict[str, str], rounds: int = 5, seconds: int = 3) -> None:
    """Per statement, transactions/s of pgbench on the cell's node and on the plain
    database, alternated; prints the ratio cell / plain of each round."""
    bindir = _citus_cluster.citus_bindir()
    assert isinstance(bindir, Path)
    with tempfile.TemporaryDirectory() as tmp:
        scripts: dict[str, dict[str, Path]] = {}
        for name in ("plain", "cell"):
            with psycopg.connect(targets[name], autocommit=True) as c:
                row = c.execute("SELECT run_id FROM pgdurable.start_run('noop3', '1', "
                                "'{}'::jsonb, 'bench', 0, 3, NULL, NULL, NULL, NULL)").fetchone()
                assert row is not None
            scripts[name] = {}
            for i, (what, text) in enumerate(STATEMENTS.items()):
                path = Path(tmp) / f"{name}{i}.sql"
                path.write_text(text.replace("{id}", str(row[0])) + "\n")
                scripts[name][what] = path
        for what in STATEMENTS:
            ratios = []
            for _ in range(rounds):
                got = {n: _tps(bindir, scripts[n][what], targets[n], seconds)
                       for n in ("plain", "cell")}
                ratios.append(got["cell"] / got["plain"])
            print(f"statement {what:>18}: cell / plain {spread(ratios)} (pgbench -M prepared, "
                  f"1 client, {rounds} x {seconds} s each, alternated)")
        for name in ("plain", "cell"):
            with psycopg.connect(targets[name], autocommit=True) as c:
                c.execute("TRUNCATE pgdurable.runs CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--coordinator", action="store_true",
                        help="also through the coordinator")
    parser.add_argument("--two-cells", action="store_true",
                        help="also two cells on two workers at the same time")
    parser.add_argument("--phases", action="store_true",
                        help="first, the hot path's phases on one connection")
    parser.add_argument("--statements", action="store_true",
                        help="first, single statements' cost with pgbench")
    args = parser.parse_args()
    os.environ.setdefault("PGDURABLE_LOG", "WARNING")  # the worker processes' log
    why = _citus_cluster.missing()
    if why:
        sys.exit(f"citus_cells: {why}")
    with _citus_cluster.cluster() as cluster:
        coordinator = _cell(cluster, "pgd_bench_cell")
        node = distribute_schema(coordinator)
        plain = _plain(cluster, "pgd_bench_plain")
        targets = {"plain": plain, "cell": cell_dsn(coordinator)}
        if args.coordinator:
            targets["via-coordinator"] = coordinator
        if args.two_cells:
            second = cell_dsn(_cell(cluster, "pgd_bench_cell2", avoid=node))
            cells = (targets["cell"], second)
            plains = (plain, _plain(cluster, "pgd_bench_plain2"))
            print(f"two cells: {cells[0].split('port=')[1]} and {second.split('port=')[1]}")
        if args.phases:
            for name in ("plain", "cell"):
                got = phases(targets[name])
                print(f"phases {name:>5} (ms, 32 runs): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
        if args.statements:
            statements(targets)
        print(f"{args.runs} runs x 3 no-op steps, one worker process, concurrency "
              f"{args.concurrency}, pool {args.pool_size}; cell on {node.host}:{node.port}; "
              f"{load()}")
        rates: dict[str, list[float]] = {t: [] for t in targets}
        pair_ratios: list[list[float]] = [[], []]
        for r in range(1, args.rounds + 1):
            for name, dsn in targets.items():
                out: list[float] = []
                _run(dsn, args.runs, args, out)
                rates[name].append(out[0])
                print(f"round {r} {name:>15}: {out[0]:7.0f} runs/s")
            print(f"round {r}: cell / plain {rates['cell'][-1] / rates['plain'][-1]:.2f}"
                  + (f", via-coordinator / plain "
                     f"{rates['via-coordinator'][-1] / rates['plain'][-1]:.2f}"
                     if args.coordinator else ""))
            if args.two_cells:
                p2 = _pair(plains, args)
                c2 = _pair(cells, args)
                for i in (0, 1):
                    pair_ratios[i].append(c2[i] / p2[i])
                print(f"round {r} two at once: plain {p2[0]:.0f} + {p2[1]:.0f} runs/s, "
                      f"cells {c2[0]:.0f} + {c2[1]:.0f} runs/s; cell / plain "
                      f"{pair_ratios[0][-1]:.2f} and {pair_ratios[1][-1]:.2f}")
        for name in targets:
            if name != "plain":
                ratios = [a / b for a, b in zip(rates[name], rates["plain"], strict=True)]
                print(f"{name} / plain: {spread(ratios)}"
                      + (" (target >= 0.7)" if name == "cell" else ""))
        if args.two_cells:
            for i in (0, 1):
                print(f"two at once, cell {i + 1} / plain {i + 1}: {spread(pair_ratios[i])}")
        print(load())


if __name__ == "__main__":
    main()
