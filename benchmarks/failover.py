"""Recovery from a failover: the primary stopped with ``-m immediate`` mid-load, the
standby promoted, against the lease TTL (issue 46).

One command::

    .venv/bin/python benchmarks/failover.py [--ttl 10] [--rounds 3] [--runs 60]
        [--modes sync,async]

Each round starts its own pair of local PostgreSQL instances (the tests' helper,
tests/_failover_cluster.py: initdb, ``pg_basebackup -R``, ``synchronous_standby_names``
for ``sync``; run as the ``postgres`` OS user when we are root), migrates a database,
starts two worker processes (``python -m pgdurable.worker _failover_app:app``, the
tests' app: ``chain`` runs of 8 steps of 50 ms, concurrency 4, lease TTL ``--ttl``)
on the multi-host DSN ``host=a,b port=P,S target_session_attrs=read-write``, enqueues
``--runs`` runs, and once 4 of them are leased stops the primary
(``pg_ctl stop -m immediate``) and promotes the standby (``pg_ctl promote``). The
workers are not restarted. Printed per mode, over the rounds (``spread``):

* ``promoted``: seconds from the stop until ``pg_ctl promote`` returned;
* ``first claim``: from the stop to the first claim on the new primary (the
  least ``leased_at`` later than the promotion request, read by polling the new
  primary every 10 ms, so before a later claim of the same run overwrites it),
  and its ratio to the lease TTL: the baseline is the TTL, what a failover
  would cost if the runs held at the stop had to wait for their leases to lapse;
* ``all done``: from the stop until every run completed; and the same without a
  failover (the baseline, rounds alternated: the same load, timed from the moment
  4 runs are leased); their difference, the time the failover added, as a ratio to
  the TTL.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from _driver import load, spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the pair helper and the app are the tests'
from _failover_cluster import Pair, binaries, start_pair  # noqa: E402

import pgdurable  # noqa: E402

# -- enqueue %s chain runs of 8 steps (never waiting)
START = ("SELECT pgdurable.start_run('chain', '1', "
         "'{\"n\": 8, \"wait_at\": -1, \"sleep\": 0.05}', 'default', 0, 3, "
         "NULL, NULL, NULL, NULL) FROM generate_series(1, %s)")
LEASED = "SELECT count(*) FROM pgdurable.runs WHERE status = 'leased'"
FIRST_CLAIM = ("SELECT extract(epoch FROM min(leased_at))::float8 FROM pgdurable.runs "
               "WHERE leased_at > to_timestamp(%s)")
DONE = "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FROM pgdurable.runs"
LISTENING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND query = 'LISTEN pgdurable_cancel'")


def _poll(conn: psycopg.Connection[object], sql: str, params: tuple[object, ...] = (),
          *, limit: float = 300.0) -> object:
    end = time.monotonic() + limit
    while True:
        row = conn.execute(sql, params).fetchone()
        if row is not None and row[0]:
            return row[0]
        if time.monotonic() > end:
            raise RuntimeError(f"timed out: {sql}")
        time.sleep(0.01)


def one_round(bindir: Path, sync: bool, ttl: float, runs: int,
              fail: bool = True) -> tuple[float, float, float]:
    """(promoted, first claim, all done), seconds after the stop; without ``fail``
    nothing is stopped (the baseline): only ``all done`` is measured."""
    pair: Pair = start_pair(synchronous=sync, bindir=bindir)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with psycopg.connect(pair.primary.dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE app")
        dsn = pair.dsn_for("app")
        pgdurable.migrate(dsn)
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}",
               "PGDURABLE_DSN": dsn, "PGDURABLE_LOG": "ERROR"}
        for name in ("a", "b"):
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "pgdurable.worker", "_failover_app:app",
                 "--concurrency", "4", "--lease-ttl", str(ttl), "--poll", "5",
                 "--worker-id", name], env=env, cwd=ROOT, stderr=subprocess.DEVNULL))
        with psycopg.connect(dsn, autocommit=True) as c:
            _poll(c, LISTENING + " HAVING count(*) >= 2", limit=60)
            c.execute(START, (runs,))
            _poll(c, LEASED + " HAVING count(*) >= 4", limit=60)
        stopped = time.time()
        promoted = first = 0.0
        if fail:
            pair.primary.stop("immediate")
            promoting = time.time()
            pair.standby.promote()
            promoted = time.time() - stopped
        with psycopg.connect(dsn, autocommit=True) as c:
            if fail:
                first = float(_poll(c, FIRST_CLAIM, (promoting,))) - stopped  # type: ignore[arg-type]
            end = time.monotonic() + 300
            while True:
                row = c.execute(DONE).fetchone()
                assert row is not None
                if row[0] == row[1]:
                    break
                if time.monotonic() > end:
                    raise RuntimeError(f"not all runs completed: {row}")
                time.sleep(0.01)
            done = time.time() - stopped
        return promoted, first, done
    finally:
        for w in workers:
            w.kill()
            w.wait()
        pair.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ttl", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--modes", default="sync,async")
    a = p.parse_args()
    bindir = binaries()
    if isinstance(bindir, str):
        raise SystemExit(bindir)
    print(f"failover: {a.runs} runs x 8 steps, 2 workers x 4, lease TTL {a.ttl:g} s, "
          f"{a.rounds} rounds per mode; {load()}")
    for mode in a.modes.split(","):
        results, base = [], []
        for _ in range(a.rounds):  # alternated: a failover, then the same load without
            results.append(one_round(bindir, mode == "sync", a.ttl, a.runs))
            base.append(one_round(bindir, mode == "sync", a.ttl, a.runs, fail=False)[2])
        promoted = [r[0] for r in results]
        first = [r[1] for r in results]
        done = [r[2] for r in results]
        print(f"{mode:5}  promoted {spread(promoted)} s")
        print(f"{mode:5}  first claim {spread(first)} s; / TTL {spread([f / a.ttl for f in first])}")
        print(f"{mode:5}  all done {spread(done)} s; without a failover {spread(base)} s; "
              f"added by the failover {spread([d - b for d, b in zip(done, base, strict=True)])} s"
              f"; / TTL {spread([(d - b) / a.ttl for d, b in zip(done, base, strict=True)])}")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
