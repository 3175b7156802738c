"""The ``fleet`` fixture itself (tests/fix_fleet.py): readiness, signals by pid,
logs in a failed test's report, and nothing left running after a failed test."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _waiting import until_sync
from fix_fleet import TESTS, Fleet

pytest_plugins = ["pytester"]
pytestmark = [pytest.mark.crash, pytest.mark.fleet("_crash_app:app")]


def state(pid: int) -> str | None:
    """The process's state letter (``/proc/PID/stat``: R, S, T stopped, Z zombie), or
    None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rpartition(")")[2].split()[0]


def gone(pid: int) -> bool:
    """Killed: no such process, or a zombie its new parent has not reaped yet."""
    return state(pid) in (None, "Z")


def test_a_worker_is_ready_and_signalled_by_pid(fleet: Fleet,
                                                conn: psycopg.Connection[Any]) -> None:
    a, b = fleet.start("a"), fleet.start("b")
    fleet.ready()
    names = {r[0] for r in conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
        "AND query = 'LISTEN pgdurable_cancel'")}
    assert names == {a.app_name, b.app_name} == {"fleet-a", "fleet-b"}
    a.stop()
    until_sync(lambda: state(a.pid) == "T", "a to be stopped")
    a.cont()
    until_sync(lambda: state(a.pid) != "T", "a to go on")
    assert a.terminate() == 0  # a clean stop
    b.kill()
    assert b.returncode == -9
    assert "stopping" in a.log()


@pytest.mark.fleet("_no_such_module:app")
def test_ready_fails_with_the_log_when_a_worker_exits_first(fleet: Fleet) -> None:
    w = fleet.start("a")
    with pytest.raises(AssertionError, match="worker a exited") as failed:
        fleet.ready(w)
    assert "cannot import '_no_such_module'" in str(failed.value)


INNER = '''
import os, sys, time
import pytest

pytestmark = pytest.mark.fleet("unused:app")
CHILD = "import subprocess, sys, time; print('group up', flush=True); " \\
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \\
        "open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(600)"


@pytest.fixture
def dsn():
    return "postgresql://unused"


def test_fails(fleet, tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    group = fleet.spawn("group", "-c", CHILD, str(grandchild))
    stopped = fleet.spawn("stopped", "-c", "print('stopped up', flush=True); "
                          "import time; time.sleep(600)")
    end = time.monotonic() + 60
    while not (grandchild.exists() and grandchild.read_text() and "up" in stopped.log()):
        assert time.monotonic() < end
        time.sleep(0.02)
    stopped.stop()
    with open(os.environ["FLEET_PIDS"], "w") as f:
        f.write(f"{group.pid} {grandchild.read_text()} {stopped.pid}")
    assert False, "this test fails"
'''


def test_a_failed_test_prints_the_logs_and_leaves_no_process(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = pytester.path / "pids"
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("FLEET_PIDS", str(pids))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "fix_fleet", "-p", "no:cacheprovider",
                                           timeout=300)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "fleet logs" in out and "group up" in out and "stopped up" in out
    # the group's leader, its child (the same process group) and a stopped process
    for pid in map(int, pids.read_text().split()):
        until_sync(partial(gone, pid), f"process {pid} to be gone")
