"""Worker processes for a test: ``python -m pgdurable.worker MODULE:app`` subprocesses.

:class:`Fleet` starts named workers of one test app (a module in tests/, run
with ``PYTHONPATH=tests`` and ``PGDURABLE_DSN``), each with its own log file;
each sees its name in ``AFFINITY_WORKER`` (and ``--worker-id``). Used by
tests/test_crash.py and tests/test_affinity_procs.py. Whatever is
still running at the end of the test is SIGKILLed. Waits are bounded by
WAIT_LIMIT only to keep a broken test from hanging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from _waiting import WAIT_LIMIT

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


class WorkerProc:
    """One worker subprocess."""

    def __init__(self, dsn: str, log_dir: Path, app: str, name: str, *, queues: str,
                 ttl: float, poll: float, concurrency: int, grace: float) -> None:
        self.name = name
        self.log_path = log_dir / f"worker-{name}.log"
        env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}",
               "PGDURABLE_DSN": dsn, "PGDURABLE_LOG": "INFO", "AFFINITY_WORKER": name}
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgdurable.worker", app, "--queues", queues,
                 "--lease-ttl", str(ttl), "--poll", str(poll), "--concurrency", str(concurrency),
                 "--grace", str(grace), "--worker-id", name],
                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: nothing of the process runs again (no clean stop, no write)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_LIMIT)

    def terminate(self) -> int:
        """SIGCONT (in case it is stopped) + SIGTERM, a clean stop; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT_LIMIT)


class Fleet:
    """The workers of one test (:meth:`start`); :meth:`cleanup` kills what is left."""

    def __init__(self, dsn: str, log_dir: Path, app: str) -> None:
        self.dsn, self.log_dir, self.app = dsn, log_dir, app
        self.all: list[WorkerProc] = []

    def start(self, name: str, *, queues: str = "default", ttl: float = 2.0,
              poll: float = 60.0, concurrency: int = 4, grace: float = 30.0) -> WorkerProc:
        w = WorkerProc(self.dsn, self.log_dir, self.app, name, queues=queues, ttl=ttl,
                       poll=poll, concurrency=concurrency, grace=grace)
        self.all.append(w)
        return w

    def cleanup(self) -> None:
        for w in self.all:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGKILL)
                w.proc.wait(timeout=WAIT_LIMIT)
