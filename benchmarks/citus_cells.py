"""Per-cell throughput on Citus vs the same job on a plain PostgreSQL, in the same run.

One command::

    .venv/bin/python benchmarks/citus_cells.py [--runs 2000] [--rounds 3] [--concurrency 32]
        [--pool-size 8] [--coordinator]

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
  connected to the coordinator.

The job is benchmarks/throughput.py's: one worker process
(``_throughput_app:app``), ``--runs`` runs of ``noop3`` (3 no-op steps)
enqueued in batches of 500, timed from the first enqueue to the last
completion on the database clock (benchmarks/_driver.py). The targets are
alternated round by round; reported: runs/s per target and round, and the
ratio cell / plain of each round (target >= 0.7, issue 46).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg
from _driver import load, spread, timed_runs, worker_process

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))

import _citus_cluster  # noqa: E402

from pgdurable.foundation.migrations import migrate  # noqa: E402
from pgdurable.ops.citus import cell_dsn, distribute_schema  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--coordinator", action="store_true",
                        help="also through the coordinator")
    args = parser.parse_args()
    why = _citus_cluster.missing()
    if why:
        sys.exit(f"citus_cells: {why}")
    with _citus_cluster.cluster() as cluster:
        coordinator = cluster.create_database("pgd_bench_cell")
        migrate(coordinator)
        node = distribute_schema(coordinator)
        with psycopg.connect(cluster.coordinator.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE pgd_bench_plain")
        plain = cluster.dsn(cluster.coordinator, "pgd_bench_plain")
        migrate(plain)
        targets = {"plain": plain, "cell": cell_dsn(coordinator)}
        if args.coordinator:
            targets["via-coordinator"] = coordinator
        print(f"{args.runs} runs x 3 no-op steps, one worker process, concurrency "
              f"{args.concurrency}, pool {args.pool_size}; cell on {node.host}:{node.port}; "
              f"{load()}")
        rates: dict[str, list[float]] = {t: [] for t in targets}
        for r in range(1, args.rounds + 1):
            for name, dsn in targets.items():
                with (psycopg.connect(dsn, autocommit=True) as c,
                      worker_process(dsn, "_throughput_app:app", concurrency=args.concurrency,
                                     pool_size=args.pool_size)):
                    timed_runs(c, "noop3", 300)  # warm-up
                    secs = timed_runs(c, "noop3", args.runs)
                rates[name].append(args.runs / secs)
                print(f"round {r} {name:>15}: {args.runs / secs:7.0f} runs/s ({secs:.2f} s)")
            print(f"round {r}: cell / plain {rates['cell'][-1] / rates['plain'][-1]:.2f}"
                  + (f", via-coordinator / plain "
                     f"{rates['via-coordinator'][-1] / rates['plain'][-1]:.2f}"
                     if args.coordinator else ""))
        for name in targets:
            if name != "plain":
                ratios = [a / b for a, b in zip(rates[name], rates["plain"], strict=True)]
                print(f"{name} / plain: {spread(ratios)}"
                      + (" (target >= 0.7)" if name == "cell" else ""))
        print(load())


if __name__ == "__main__":
    main()
