"""Idle cost of a process's listeners: one notifier against the four listeners before it.

One command::

    .venv/bin/python benchmarks/idle_listeners.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--baseline-ref 681b78c] [--window 130] [--warmup 5]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards drops)
its own scratch database ``pgdurable_bench_idle_listeners``. Two processes run
``benchmarks/_idle_listeners_app.py`` at once, idle, each with a worker, a stream
follower, a ``result()`` waiter and a dashboard live page (every option at its
default): one on this checkout, the baseline on ``--baseline-ref`` (default: the
commit before the notifier, where the worker, the streams, the result waiters and the
dashboard each held their own LISTEN connection), extracted with ``git archive``
into a temporary directory and put first on ``PYTHONPATH``.

Measured over the same ``--window`` (default 130 s: two of the old listeners'
60 s health checks and six presence renewals fit in it): the server's backends of
each process (``pg_stat_activity`` by ``application_name``, in the middle of the
window), its listening connections and the statements they ran (counted in the
process: every ``AsyncConnection.execute``), all statements of the process, and its
CPU time. Printed: each figure for both, and the ratio (this checkout / baseline).
A measurement during which the server restarted (every connection is made again) is
discarded and taken again (``--tries``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from _scratch import drop_scratch, scratch_dsn
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
DB = "pgdurable_bench_idle_listeners"
APP = Path(__file__).resolve().parent / "_idle_listeners_app.py"
START = ("SELECT run_id FROM pgdurable.start_run('outside', '1', '{}', 'elsewhere', 0, 3, "
         "NULL, NULL, NULL, NULL)")
BACKENDS = ("SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %%' "
            "OR query LIKE 'UNLISTEN %%' OR query LIKE 'SELECT pgdurable.listen_presence%%' "
            "OR query = 'SELECT 1') FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s")


class Proc:
    def __init__(self, name: str, dsn: str, rid: str, src: Path, warmup: float,
                 window: float) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(src)}
        self.proc = subprocess.Popen(
            [sys.executable, str(APP), make_conninfo(dsn, application_name=name), rid,
             str(warmup), str(window)], cwd=src, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.measuring = threading.Event()
        self.result: dict[str, Any] | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "measuring" in msg:
                self.measuring.set()
            else:
                self.result = msg

    def wait(self) -> dict[str, Any]:
        rc = self.proc.wait(600)
        assert self.proc.stderr is not None
        if rc != 0 or self.result is None:
            raise SystemExit(f"{self.name} failed ({rc}): {self.proc.stderr.read()}")
        return self.result


STARTED = "SELECT pg_postmaster_start_time()"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--baseline-ref", default="681b78c")
    ap.add_argument("--window", type=float, default=130.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--tries", type=int, default=3)
    args = ap.parse_args()
    for _ in range(args.tries):
        if measure(args):
            return
        print("the server restarted during the measurement (its figures count reconnects); "
              "measuring again", file=sys.stderr)
    raise SystemExit("the server restarted during every try")


def measure(args: argparse.Namespace) -> bool:
    """One measurement, printed; False (nothing printed) if the server restarted meanwhile."""
    dsn = scratch_dsn(args.dsn, DB)
    with psycopg.connect(args.dsn) as c:
        started = c.execute(STARTED).fetchone()
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                psycopg.connect(dsn, autocommit=True) as c:
            archive = subprocess.run(["git", "archive", args.baseline_ref], cwd=ROOT,
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            runs = [c.execute(START).fetchone()[0] for _ in range(2)]  # type: ignore[index]
            procs = [Proc("pgd_idle_now", dsn, str(runs[0]), ROOT, args.warmup, args.window),
                     Proc("pgd_idle_base", dsn, str(runs[1]), Path(tmp), args.warmup,
                          args.window)]
            for p in procs:
                if not p.measuring.wait(300):
                    raise SystemExit(f"{p.name} did not start: {p.proc.poll()}")
            time.sleep(args.window / 2)
            backends = {p.name: c.execute(BACKENDS, (p.name,)).fetchone() for p in procs}
            now, base = (p.wait() for p in procs)
    finally:
        drop_scratch(args.dsn, DB)
    with psycopg.connect(args.dsn) as c:
        if c.execute(STARTED).fetchone() != started:
            return False
    b_now, b_base = backends["pgd_idle_now"], backends["pgd_idle_base"]
    assert b_now is not None and b_base is not None
    rows = [
        ("server backends of the process", b_now[0], b_base[0]),
        ("  of which listening (by their last statement)", b_now[1], b_base[1]),
        ("listening connections (counted in the process)", now["listening"],
         base["listening"]),
        ("listener statements / min", 60 * now["listener_statements"] / now["window"],
         60 * base["listener_statements"] / base["window"]),
        ("all statements / min", 60 * now["statements"] / now["window"],
         60 * base["statements"] / base["window"]),
        ("CPU ms / min", 60e3 * now["cpu"] / now["window"], 60e3 * base["cpu"] / base["window"]),
    ]
    print(f"idle {now['window']:.0f} s; listener statements: now {now['listener_kinds']}, "
          f"baseline {base['listener_kinds']}")
    print(f"{'':48} {'notifier':>10} {'baseline':>10} {'ratio':>7}")
    for what, a, b in rows:
        ratio = f"{a / b:.2f}" if b else "-"
        print(f"{what:48} {a:>10.1f} {b:>10.1f} {ratio:>7}")
    return True


if __name__ == "__main__":
    main()
