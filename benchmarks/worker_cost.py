"""What one run costs the worker process, this checkout against an earlier revision.

One command::

    .venv/bin/python benchmarks/worker_cost.py [--baseline 543545c] [--runs 5000]
        [--rounds 4] [--opcode-runs 300] [--dsn postgresql://postgres@127.0.0.1:5432/postgres]

The same workload as ``benchmarks/throughput.py`` (runs of ``noop3``: 3 no-op steps,
one worker process at concurrency 32), run by two trees: this checkout and
``--baseline`` (a git revision, exported with ``git archive`` into a temporary folder;
each tree migrates its own scratch database with its own code). The two alternate
round by round. Per round and tree:

* runs/s, enqueue to completion (the database clock), as throughput.py;
* the worker process's CPU per run and its database backends' CPU per run (utime +
  stime from ``/proc``): on a shared machine these move far less than wall time;
* once per tree, the Python bytecode instructions the worker executes per run
  (``sys.settrace`` with opcode events, installed by a ``sitecustomize`` on the
  worker's path, switched on by SIGUSR1 and off by SIGUSR2 around ``--opcode-runs``
  runs): a count that does not depend on the machine's load at all, and the
  functions that execute the most of them.

Printed: each round, then the medians and the ratios this/baseline. The worker's own
Python is the serial resource of one worker process (its one event loop), so its cost
per run bounds how many runs one process can drive; the database's share is printed
beside it. Issue 39 used it to find and remove what the move to a worker made of
parts had added per run (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from _driver import BACKENDS, LISTENING, _cpu, load, spread, timed_runs
from psycopg import sql
from psycopg.conninfo import make_conninfo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# the worker's sitecustomize when counting opcodes: per (file, function), between
# SIGUSR1 and SIGUSR2, written to $PGDURABLE_OPCOUNT at exit
_OPCOUNT_SITE = '''
import atexit, collections, os, signal, sys
_counts = collections.Counter()
_on = [False]
def _tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    key = (frame.f_code.co_filename, frame.f_code.co_name)
    def local(frame, event, arg):
        if event == "opcode" and _on[0]:
            _counts[key] += 1
        return local
    return local
signal.signal(signal.SIGUSR1, lambda *a: _on.__setitem__(0, True))
signal.signal(signal.SIGUSR2, lambda *a: _on.__setitem__(0, False))
sys.settrace(_tracer)
def _dump():
    with open(os.environ["PGDURABLE_OPCOUNT"], "w") as f:
        for (fn, name), n in _counts.items():
            f.write(f"{n}\\t{fn}\\t{name}\\n")
atexit.register(_dump)
'''


def export(rev: str, into: Path) -> Path:
    """The tree of git revision ``rev``, exported into ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def migrate(tree: Path, admin: str, db: str) -> str:
    """A scratch database ``db`` migrated by ``tree``'s own code; its DSN."""
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
    dsn = make_conninfo(admin, dbname=db)
    code = "import pgdurable, sys; pgdurable.migrate(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, dsn], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tempfile.gettempdir())
    return dsn


def _worker(tree: Path, dsn: str, extra_path: str = "",
            env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(p for p in (extra_path, str(HERE), str(tree)) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgdurable.worker", "_throughput_app:app", "--concurrency", "32",
         "--lease-ttl", "600", "--poll", "5"],
        env={**os.environ, **(env or {}), "PYTHONPATH": path, "PGDURABLE_DSN": dsn,
             "BENCH_POOL_SIZE": "8", "PGDURABLE_LOG": "WARNING"},
        cwd=tempfile.gettempdir())
    with psycopg.connect(dsn, autocommit=True) as c:
        for _ in range(1200):
            row = c.execute(LISTENING).fetchone()
            if row and row[0]:
                return proc
            if proc.poll() is not None:
                raise RuntimeError(f"the worker of {tree} exited with {proc.returncode}")
            time.sleep(0.05)
    raise RuntimeError(f"the worker of {tree} did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)


def one_round(tree: Path, dsn: str, runs: int) -> tuple[float, float, float]:
    """(runs/s, worker CPU µs per run, backends' CPU µs per run) of one round."""
    proc = _worker(tree, dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            timed_runs(c, "noop3", 500)  # warm-up
            me = c.execute("SELECT pg_backend_pid()").fetchone()

            def cpu() -> tuple[float, dict[int, float]]:
                pids = [r[0] for r in c.execute(BACKENDS).fetchall() if (r[0],) != me]
                return _cpu(proc.pid) or 0.0, {p: _cpu(p) or 0.0 for p in pids}

            w0, b0 = cpu()
            secs = timed_runs(c, "noop3", runs)
            w1, b1 = cpu()
    finally:
        _stop(proc)
    backends = sum(b1[p] - b0.get(p, 0.0) for p in b1)
    return runs / secs, (w1 - w0) / runs * 1e6, backends / runs * 1e6


def opcodes(tree: Path, dsn: str, runs: int) -> collections.Counter[tuple[str, str]]:
    """Bytecode instructions the worker executed per (file, function) over ``runs`` runs."""
    with tempfile.TemporaryDirectory() as site:
        (Path(site) / "sitecustomize.py").write_text(_OPCOUNT_SITE)
        out = Path(site) / "counts.tsv"
        proc = _worker(tree, dsn, site, {"PGDURABLE_OPCOUNT": str(out)})
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                timed_runs(c, "noop3", 50, limit=1800)
                proc.send_signal(signal.SIGUSR1)
                timed_runs(c, "noop3", runs, limit=1800)
                proc.send_signal(signal.SIGUSR2)
        finally:
            _stop(proc)
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for line in out.read_text().splitlines():
            n, fn, name = line.split("\t")
            short = fn.split("site-packages/")[-1].split("python3.11/")[-1]
            counts["pgdurable" if "/pgdurable/" in fn else short, name] += int(n)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--baseline", default="543545c",
                        help="git revision to compare with (default: 543545c, before issue 39)")
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--opcode-runs", type=int, default=300,
                        help="runs traced for the opcode count (0: skip it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT, "baseline": export(args.baseline, Path(tmp) / "baseline")}
        dbs = {name: f"pgdurable_bench_cost_{name}" for name in trees}
        dsns = {name: migrate(tree, args.dsn, dbs[name]) for name, tree in trees.items()}
        try:
            print(f"{args.runs} runs x 3 no-op steps, one worker, concurrency 32: this "
                  f"checkout vs {args.baseline}, alternated; {load()}")
            got: dict[str, list[tuple[float, float, float]]] = {n: [] for n in trees}
            for r in range(args.rounds):
                for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                    res = one_round(trees[name], dsns[name], args.runs)
                    got[name].append(res)
                    print(f"round {r + 1} {name:8}: {res[0]:6.0f} runs/s, worker "
                          f"{res[1]:5.0f} µs/run, backends {res[2]:5.0f} µs/run; {load()}",
                          flush=True)
            for i, what in enumerate(("runs/s", "worker CPU µs/run", "backends CPU µs/run")):
                this = [g[i] for g in got["this"]]
                base = [g[i] for g in got["baseline"]]
                print(f"{what}: this {spread(this, '.0f')}; baseline {spread(base, '.0f')}; "
                      f"ratio {statistics.median(this) / statistics.median(base):.3f}")
            if args.opcode_runs:
                ops = {n: opcodes(trees[n], dsns[n], args.opcode_runs) for n in trees}
                per = {n: sum(c.values()) / args.opcode_runs for n, c in ops.items()}
                print(f"Python opcodes per run: this {per['this']:.0f}, baseline "
                      f"{per['baseline']:.0f}, ratio {per['this'] / per['baseline']:.3f}")
                _top(ops, args.opcode_runs)
        finally:
            from _scratch import drop_scratch

            drop_scratch(args.dsn, *dbs.values())


def _top(ops: dict[str, collections.Counter[tuple[str, str]]], runs: int) -> None:
    """The functions whose opcodes per run differ most between the two trees."""
    keys: set[tuple[str, str]] = set(ops["this"]) | set(ops["baseline"])

    def diff(k: tuple[str, str]) -> float:
        return (ops["this"][k] - ops["baseline"][k]) / runs

    print("  largest differences per run (this - baseline), by (file or package, function):")
    for k in sorted(keys, key=lambda k: -abs(diff(k)))[:12]:
        print(f"  {diff(k):+7.0f}  {ops['baseline'][k] / runs:6.0f} -> "
              f"{ops['this'][k] / runs:6.0f}  {k[0]}:{k[1]}")


if __name__ == "__main__":
    main()
