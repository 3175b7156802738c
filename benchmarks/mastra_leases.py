"""Lease ops/s from Node (@pgdurable/mastra) vs the Python async provider vs pgbench.

One command (after ``make install`` and ``cd clients/mastra && npm ci && npm run build``)::

    .venv/bin/python benchmarks/mastra_leases.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

In one run, on one scratch database (``pgdurable_bench_mastra``), for acquire
and renew at 1 and 8 clients, it measures ops/s of

* ``node``: ``PgDurablePubSub.acquireLease`` / ``renewLease`` (clients/mastra,
  node-postgres, one pooled connection and one async loop per client,
  named prepared statements), run by ``clients/mastra/bench/leases.mjs``;
* ``async``: :class:`pgdurable.AsyncPostgresLeaseProvider` (benchmarks/leases.py);
* ``pgbench``: ``pgbench -M prepared -c N -j 1`` on the same SQL functions;

and prints node / pgbench and node / async. Keys, owners and TTLs are those of
benchmarks/leases.py (each client on its own 100 keys, all held before each
measurement). Each cell is the best of ``--rounds`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _scratch import drop_scratch, scratch_dsn
from leases import hold_all, run_async, run_pgbench
from psycopg.conninfo import conninfo_to_dict

DB = "pgdurable_bench_mastra"
CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "mastra"


def node_url(dsn: str) -> str:
    """The scratch conninfo as a URL for node-postgres."""
    info = conninfo_to_dict(dsn)
    auth = info.get("user", "postgres") + (f":{info['password']}" if info.get("password") else "")
    return f"postgresql://{auth}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info['dbname']}"


def run_node(node: str, dsn: str, op: str, clients: int, seconds: float) -> float:
    out = subprocess.run(
        [node, "bench/leases.mjs", node_url(dsn), op, str(clients), str(seconds)],
        cwd=CLIENT_DIR, capture_output=True, text=True, check=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["ops_per_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsn", default=os.environ.get(
        "PGDURABLE_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--pgbench", default=shutil.which("pgbench") or "/usr/bin/pgbench")
    ap.add_argument("--node", default=shutil.which("node") or "node")
    args = ap.parse_args()
    if not (CLIENT_DIR / "dist" / "esm" / "index.js").exists():
        print("build the client first: cd clients/mastra && npm ci && npm run build", file=sys.stderr)
        return 2
    clients = [int(x) for x in args.clients.split(",")]
    dsn = scratch_dsn(args.dsn, DB)
    print(f"lease ops/s, best of {args.rounds} x {args.seconds:g} s per cell, database {DB}")
    print(f"{'op':<8} {'clients':>7} {'pgbench':>9} {'async':>9} {'node':>9} "
          f"{'node/pgbench':>12} {'node/async':>10}")
    try:
        for op in ("acquire", "renew"):
            for n in clients:
                base = a = js = 0.0
                for _ in range(args.rounds):
                    hold_all(dsn, n)
                    base = max(base, run_pgbench(args.pgbench, dsn, op, n, args.seconds))
                    hold_all(dsn, n)
                    a = max(a, asyncio.run(run_async(dsn, op, n, args.seconds)))
                    hold_all(dsn, n)
                    js = max(js, run_node(args.node, dsn, op, n, args.seconds))
                print(f"{op:<8} {n:>7} {base:>9.0f} {a:>9.0f} {js:>9.0f} "
                      f"{js / base:>12.2f} {js / a:>10.2f}", flush=True)
    finally:
        drop_scratch(args.dsn, DB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
