"""The ``fleet`` fixture: real worker processes of a test app (a pytest plugin,
registered by tests/conftest.py, as psycopg registers its ``tests/fix_*.py``).

A test module names the app its workers run, and the workers' defaults, once::

    pytestmark = pytest.mark.fleet("_crash_app:app", ttl=10.0)   # + the defaults of start()

and a test takes ``fleet``::

    a = fleet.start("a")        # python -m pgdurable.worker _crash_app:app --worker-id a ...
    fleet.ready(a)              # its listener LISTENs (pg_stat_activity): it claims from now
    a.kill()                    # SIGKILL (and reaped); a.stop() / a.cont(): SIGSTOP / SIGCONT
    assert a.terminate() == 0   # SIGCONT + SIGTERM, a clean stop: its exit code
    fleet.spawn("client", "-m", "_children_app", "result", rid)   # any other process

* **Workers** run ``python -m pgdurable.worker APP`` with ``PYTHONPATH=tests``,
  ``PGDURABLE_DSN`` (the test's database), ``PGDURABLE_LOG=INFO``, and their name as
  ``--worker-id``, as ``FLEET_WORKER`` and in ``PGAPPNAME`` (``fleet-NAME``: the
  application_name of every connection they open, which :meth:`Fleet.ready` and a test
  can find in ``pg_stat_activity``). The options of :meth:`Fleet.start` default to
  the marker's keywords, then to :data:`DEFAULTS`.
* **Logs**: each process writes its stdout and stderr to ``NAME.log`` in the test's
  ``tmp_path`` (:meth:`Proc.log`); when a test fails, its report gets a "fleet logs"
  section with every log (:meth:`Fleet.logs`).
* **Cleanup**: each process is the leader of its own process group; at the end of the
  test, passed or failed, every group still alive is SIGKILLed (a stopped process
  too) and every process reaped, so no process outlives its test.

Every wait is bounded by WAIT_LIMIT only to keep a broken test from hanging.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import WAIT_LIMIT, WORKERS_LISTENING

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

#: What :meth:`Fleet.start` passes when neither the call nor the marker says.
DEFAULTS: dict[str, Any] = {"queues": "default", "ttl": 2.0, "poll": 60.0, "concurrency": 4,
                            "grace": 30.0}
#: Is the worker whose connections carry this application_name listening?
_LISTENING = WORKERS_LISTENING + " AND application_name = %s"
_FLEET = pytest.StashKey["Fleet"]()


class Proc:
    """One subprocess of a fleet (its own process group), logging to :attr:`log_path`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, *argv], env=env, cwd=ROOT,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.proc.poll()

    def wait(self, timeout: float = WAIT_LIMIT) -> int:
        """Wait for it to exit: its exit code (``-N``: killed by signal N)."""
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        """What it wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process (by pid), if it still runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: nothing of the process runs again (no clean stop, no write); reaped."""
        self.send(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_LIMIT)

    def stop(self) -> None:
        """SIGSTOP: the process is frozen (no heartbeat, no write) until :meth:`cont`."""
        self.send(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT: a stopped process goes on where it was."""
        self.send(signal.SIGCONT)

    def terminate(self) -> int:
        """SIGCONT (in case it is stopped) + SIGTERM, a clean stop: its exit code."""
        self.send(signal.SIGCONT)
        self.send(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT_LIMIT)

    def _kill_group(self) -> None:
        if self.proc.poll() is None:  # the group's leader is not reaped: its pgid is ours
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=WAIT_LIMIT)


class WorkerProc(Proc):
    """One ``python -m pgdurable.worker`` process; :attr:`app_name` is the
    application_name of its connections."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.app_name = env["PGAPPNAME"]
        super().__init__(name, argv, env, log_path)


class Fleet:
    """The processes of one test (see the module docstring)."""

    def __init__(self, dsn: str, log_dir: Path, app: str, **defaults: Any) -> None:
        unknown = set(defaults) - set(DEFAULTS) - {"env"}
        if unknown:
            raise TypeError(f"unknown fleet option(s): {sorted(unknown)}")
        self.dsn, self.log_dir, self.app = dsn, log_dir, app
        self._defaults = {**DEFAULTS, **defaults}
        self._env: dict[str, str] = self._defaults.pop("env", {})
        self.all: list[Proc] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment of every process: PYTHONPATH (tests/ and the checkout) and
        the test database as PGDURABLE_DSN (also for a test's own subprocess)."""
        return {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}",
                "PGDURABLE_DSN": self.dsn, "PGDURABLE_LOG": "INFO", **self._env}

    @property
    def workers(self) -> list[WorkerProc]:
        return [p for p in self.all if isinstance(p, WorkerProc)]

    def _log_path(self, name: str) -> Path:
        if any(p.name == name for p in self.all):
            raise ValueError(f"this fleet already has a process named {name!r}")
        return self.log_dir / f"{name}.log"

    def start(self, name: str, *, app: str | None = None, env: dict[str, str] | None = None,
              args: tuple[str, ...] = (), **options: Any) -> WorkerProc:
        """Start worker ``name`` of ``app`` (default: the fleet's); ``options``
        (queues, ttl, poll, concurrency, grace) override the fleet's defaults,
        ``env`` adds to its environment, ``args`` to its command line."""
        unknown = set(options) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown worker option(s): {sorted(unknown)}")
        o = {**self._defaults, **options}
        argv = ["-m", "pgdurable.worker", app or self.app, "--queues", o["queues"],
                "--lease-ttl", str(o["ttl"]), "--poll", str(o["poll"]),
                "--concurrency", str(o["concurrency"]), "--grace", str(o["grace"]),
                "--worker-id", name, *args]
        w = WorkerProc(name, argv, {**self.env, "PGAPPNAME": f"fleet-{name}",
                                    "FLEET_WORKER": name, **(env or {})},
                       self._log_path(name))
        self.all.append(w)
        return w

    def spawn(self, name: str, *argv: str, env: dict[str, str] | None = None) -> Proc:
        """Start ``python ARGV...`` (a client, a second app process) in the fleet's
        environment; it is logged and cleaned up like a worker."""
        p = Proc(name, list(argv), {**self.env, **(env or {})}, self._log_path(name))
        self.all.append(p)
        return p

    def ready(self, *workers: WorkerProc) -> None:
        """Wait until every one of ``workers`` (default: all) LISTENs, i.e. its
        listener is connected: from then on a NOTIFY reaches it. Fails at once,
        with its log, if one exits first."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for w in workers or tuple(self.workers):
                end = time.monotonic() + WAIT_LIMIT
                while not _one(conn, _LISTENING, w.app_name):
                    if w.poll() is not None:
                        raise AssertionError(f"worker {w.name} exited ({w.returncode}) before "
                                             f"it listened:\n{w.log()}")
                    if time.monotonic() > end:
                        raise AssertionError(f"timed out waiting for worker {w.name} to "
                                             f"listen:\n{w.log()}")
                    time.sleep(0.02)

    def logs(self) -> str:
        """Every process's log, each under its name."""
        return "\n".join(f"--- {p.log_path.name} (pid {p.pid}, exit {p.poll()})\n{p.log()}"
                         for p in self.all)

    def cleanup(self) -> None:
        """SIGKILL every process group still alive (stopped ones too) and reap them all."""
        for p in self.all:
            p._kill_group()


def _one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fleet(app, **defaults): the app (module:attr) the `fleet` fixture's "
        "workers run, and their default options (queues, ttl, poll, concurrency, grace, env)")


@pytest.fixture
def fleet(request: pytest.FixtureRequest, dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    """The worker processes of this test (the app and defaults of its ``fleet`` marker);
    whatever still runs at the end is killed; a failed test prints their logs."""
    marker = request.node.get_closest_marker("fleet")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid} takes `fleet` but has no "
                                "@pytest.mark.fleet('module:app', ...)")
    f = Fleet(dsn, tmp_path, *marker.args, **marker.kwargs)
    request.node.stash[_FLEET] = f
    try:
        yield f
    finally:
        f.cleanup()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report (setup, call or teardown) gets its fleet's logs."""
    report = yield
    f = item.stash.get(_FLEET, None)
    if f is not None and report.failed and f.all:
        report.sections.append(("fleet logs", f.logs()))
    return report
