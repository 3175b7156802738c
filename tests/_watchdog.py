"""A test that runs too long says where it is.

``WATCHDOG_AFTER`` seconds into a test (``PGDURABLE_TEST_WATCHDOG`` overrides
it), :func:`arm` prints, to the terminal (a hung suite may never show the
test's captured output) and again into that captured output (shown with the
failure, next to pytest-timeout's dump): every thread's stack and every
asyncio task's stack of every running event loop, so that a hang in CI (a
worker that does not stop, a statement that never returns) is seen where it
is. pytest-timeout (``timeout`` in ``pyproject.toml``) later fails the test.
:func:`watchdog` is the autouse fixture (``tests/conftest.py`` imports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator

import pytest

WATCHDOG_AFTER = float(os.environ.get("PGDURABLE_TEST_WATCHDOG", "120"))


def _threads() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = io.StringIO()
    for ident, frame in sys._current_frames().items():
        out.write(f"--- thread {names.get(ident, ident)}\n")
        out.write("".join(traceback.format_stack(frame)))
    return out.getvalue()


def _running_loops() -> list[asyncio.AbstractEventLoop]:
    return [o for o in gc.get_objects()
            if isinstance(o, asyncio.AbstractEventLoop) and o.is_running()]


def _tasks(loop: asyncio.AbstractEventLoop) -> str:
    """Every task's stack, read in the loop's own thread (5 s, else: blocked)."""
    got: list[str] = []
    answered = threading.Event()

    def read() -> None:
        try:
            out = io.StringIO()
            for t in asyncio.all_tasks(loop):
                out.write(f"--- task {t.get_name()}: {t.get_coro()!r}\n")
                t.print_stack(file=out)
            got.append(out.getvalue())
        finally:
            answered.set()

    loop.call_soon_threadsafe(read)
    if not answered.wait(5.0):
        return "(the event loop did not answer within 5 s: it is blocked)\n"
    return got[0] if got else ""


def arm(test: str, write: Callable[[str], None]) -> threading.Timer:
    """Start the watchdog of ``test``; ``cancel()`` the timer when the test ends."""

    def bark() -> None:
        report = [f"\n=== watchdog: {test} still running after {WATCHDOG_AFTER:.0f} s ===\n",
                  _threads()]
        report += [_tasks(loop) for loop in _running_loops()]
        write("".join(report))
        # and into the test's captured output, so that the failure's report
        # (what a shortened CI log keeps) has every task's stack too
        sys.stdout.write("".join(report))
        sys.stdout.flush()

    timer = threading.Timer(WATCHDOG_AFTER, bark)
    timer.daemon = True
    timer.start()
    return timer


@pytest.fixture(autouse=True)
def watchdog(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test still running after ``WATCHDOG_AFTER`` seconds prints its stacks."""
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")

    def write(text: str) -> None:  # to the terminal, past the test's captured output
        with (capture.global_and_fixture_disabled() if capture is not None
              else contextlib.nullcontext()):
            (reporter.write if reporter is not None else sys.stderr.write)(text)
            sys.stderr.flush()

    timer = arm(request.node.nodeid, write)
    try:
        yield
    finally:
        timer.cancel()
