"""The end-to-end driver shared by ``benchmarks/throughput.py`` and
``benchmarks/workflows.py``: one worker process, timed batches of runs.

``worker_process(dsn, "module:app")`` starts ``python -m pgdurable.worker``
with ``benchmarks/`` on its path (the apps live in ``_*_app.py`` here) and
yields once its listener is connected; it is stopped with SIGTERM at the end.
``timed_runs(conn, task, n)`` empties the runs table, enqueues ``n`` runs in
batches of :data:`BATCH` (one ``start_run`` statement each) and returns the
seconds from the first enqueue to the last completion on the database clock.
Imported as ``_driver`` (``python benchmarks/X.py`` puts ``benchmarks/`` first
on ``sys.path``).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
BATCH = 500

# -- enqueue %s runs of task %s (revision %s) in one statement
START = ("SELECT pgdurable.start_run(%s, %s, '{}', 'default', 0, 3, NULL, NULL, NULL, NULL) "
         "FROM generate_series(1, %s)")
# -- progress of the batch: completed, failed or cancelled, last finish
PROGRESS = ("SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status IN ('failed', 'cancelled')), "
            "max(finished_at) FROM pgdurable.runs")
# -- a worker's listener is connected (its pool is open by then)
LISTENING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
             "AND query LIKE 'LISTEN %'")  # pgdurable_wake, or another schema's <schema>_wake


@contextmanager
def worker_process(dsn: str, app: str, *, concurrency: int = 32, pool_size: int = 8,
                   schema: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A ``python -m pgdurable.worker APP`` process, yielded once it listens.

    ``pool_size`` reaches the app as ``BENCH_POOL_SIZE``, ``schema`` as
    ``PGDURABLE_SCHEMA``. Lease TTL 60 s, poll 5 s.
    """
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{HERE.parent}",
           "PGDURABLE_DSN": dsn, "BENCH_POOL_SIZE": str(pool_size)}
    env.pop("PGDURABLE_SCHEMA", None)
    if schema is not None:
        env["PGDURABLE_SCHEMA"] = schema
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgdurable.worker", app, "--concurrency", str(concurrency),
         "--lease-ttl", "60", "--poll", "5"], env=env, cwd=HERE.parent)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            for _ in range(600):
                row = c.execute(LISTENING).fetchone()
                if row and row[0]:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {proc.returncode}")
                time.sleep(0.05)
            else:
                raise RuntimeError("worker did not start")
        time.sleep(0.5)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def timed_runs(c: psycopg.Connection[Any], task: str, runs: int, *, revision: str = "1",
               limit: float = 600.0) -> float:
    """Seconds from the first enqueue of ``runs`` runs of ``task`` to the last
    completion (database clock). The runs table is emptied and vacuumed first."""
    c.execute("TRUNCATE pgdurable.runs CASCADE")
    c.execute("VACUUM ANALYZE pgdurable.runs")
    c.execute("VACUUM ANALYZE pgdurable.checkpoints")
    row = c.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    t0 = row[0]
    left = runs
    while left > 0:
        n = min(BATCH, left)
        c.execute(START, (task, revision, n))
        left -= n
    deadline = time.monotonic() + limit
    while True:
        row = c.execute(PROGRESS).fetchone()
        assert row is not None
        if row[0] + row[1] >= runs:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {row[0]} of {runs} {task} runs completed")
        time.sleep(0.05)
    if row[1]:
        raise RuntimeError(f"{row[1]} {task} runs did not complete")
    return float((row[2] - t0).total_seconds())


# -- the backends serving this database (the worker's pool and this connection)
BACKENDS = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"


def _cpu(pid: int) -> float | None:
    """User + system CPU seconds of local process ``pid``; None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by one worker process and the database backends of
    its database (read from ``/proc``: the server must run on this machine).

    Unlike wall-clock time, this hardly depends on what else the machine
    runs, so it is the steadier measure on a shared machine. ``start()`` then
    ``stop()``: the seconds in between, or None where ``/proc`` cannot tell.
    """

    def __init__(self, c: psycopg.Connection[Any], worker_pid: int) -> None:
        self._c, self._worker = c, worker_pid
        self._at: dict[int, float | None] = {}

    def _read(self) -> dict[int, float | None]:
        pids = {self._worker, *(r[0] for r in self._c.execute(BACKENDS).fetchall())}
        return {pid: _cpu(pid) for pid in pids}

    def start(self) -> None:
        self._at = self._read()

    def stop(self) -> float | None:
        now, total = self._read(), 0.0
        for pid, cpu in now.items():
            if cpu is None:
                return None
            total += cpu - (self._at.get(pid) or 0.0)  # a new backend: all of it
        return total


def spread(values: list[float], fmt: str = ".2f") -> str:
    """``median M (middle half A-B, all X-Y, n=N)`` of ``values``."""
    med = statistics.median(values)
    if len(values) < 4:
        return f"median {med:{fmt}} (all {min(values):{fmt}}-{max(values):{fmt}}, n={len(values)})"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (f"median {med:{fmt}} (middle half {q1:{fmt}}-{q3:{fmt}}, all "
            f"{min(values):{fmt}}-{max(values):{fmt}}, n={len(values)})")


def load() -> str:
    """The machine's load averages (1, 5, 15 min), for the record."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f}"
