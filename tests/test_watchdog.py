"""The suite's own hang guard: a test that hangs prints its stacks, then fails, and the
suite goes on (tests/_watchdog.py, pytest-timeout; CI relies on both)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_a_hung_test_prints_its_stacks_then_fails_and_the_suite_goes_on(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from _watchdog import watchdog  # noqa: F401\n")
    (tmp_path / "test_hangs.py").write_text(
        "import threading, time\n"
        "def parked_forever():\n"
        "    threading.Event().wait()\n"
        "def test_hangs():\n"
        "    threading.Thread(target=parked_forever, name='side-thread', daemon=True).start()\n"
        "    time.sleep(600)\n"
        "def test_after():\n"
        "    pass\n")
    (tmp_path / "test_hangs_async.py").write_text(
        "import asyncio, pytest\n"
        "@pytest.mark.asyncio\n"
        "async def test_hangs_in_the_loop():\n"
        "    asyncio.get_running_loop().create_task(asyncio.Event().wait(), name='stuck-task')\n"
        "    await asyncio.sleep(600)\n")
    env = {**os.environ, "PGDURABLE_TEST_WATCHDOG": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=4",
         "-o", "timeout_method=signal", "test_hangs.py", "test_hangs_async.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert "=== watchdog: test_hangs.py::test_hangs still running after 1 s ===" in out, out
    assert "--- thread side-thread" in out and "parked_forever" in out, out  # every thread
    assert "time.sleep(600)" in out, out  # where the test itself was
    # an asyncio test: every task of the running loop, with where it waits
    assert ("=== watchdog: test_hangs_async.py::test_hangs_in_the_loop still running "
            "after 1 s ===") in out, out
    assert "--- task stuck-task" in out and "await asyncio.sleep(600)" in out, out
    # the stacks are in the failure's report too (its captured stdout)
    assert out.count("--- task stuck-task") == 2, out
    assert out.count("--- thread side-thread") >= 2, out  # (the next test lists it too)
    assert "Timeout" in out and "2 failed, 1 passed" in out, out  # failed, and went on
    assert p.returncode == 1
