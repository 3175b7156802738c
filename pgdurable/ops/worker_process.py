"""``python -m pgdurable.worker module:app``: run one worker of an app until SIGTERM.

The worker itself is :class:`pgdurable.engine.worker.Worker` (re-exported
here, and as ``pgdurable.Worker``); this module is the command line entry
point (used by crash tests and ``pgdurable worker``), in the operations layer:
it loads the app object, which the engine never imports.

Command line (used by crash tests and ``pgdurable worker``)::

    python -m pgdurable.worker module:app [--queues a,b] [--concurrency N]
        [--lease-ttl SECONDS] [--poll SECONDS] [--grace SECONDS] [--worker-id ID]
        [--no-listen] [--log-level LEVEL]

Logs go to stderr, one line each (``TIME LEVEL LOGGER: message``). The
``pgdurable`` loggers log at ``--log-level`` (else ``$PGDURABLE_LOG``, else
``INFO``: one line when the worker starts, with its id, queues, concurrency,
tasks and revisions, pooler mode and LISTEN or polling; one per run that fails
for good; warnings); other libraries' at WARNING. ``--log-level WARNING``
quiets the INFO lines.

Shutdown is bounded. At SIGTERM/SIGINT the worker stops claiming and its steps
get ``--grace`` seconds (:class:`Worker`); a step still running then is
cancelled and its run given back. Then the runs whose step did not settle
(an async step that swallows its cancellation) are given back
(:meth:`Worker.abandon`) and the app is closed, each bounded. If code of a
step still runs then (a sync step's thread, which no cancellation reaches; a
task that swallows it), the process does not wait for it: it logs the runs
and threads still busy and ends with ``os._exit(1)``. A watchdog thread armed
at the signal ends the process the same way ``--grace`` +
:data:`WATCHDOG_AFTER_GRACE` seconds after it, whatever still runs (a step
that blocks the event loop once cancelled, a database that does not answer
the last writes): a process asked to stop is gone within that bound. A clean
stop exits 0. Not covered: a step that blocks the event loop before the
signal keeps the signal itself from being handled.

Before it runs, the command freezes the objects made so far (``gc.freeze()``:
the imports, the app, its open pool): they live as long as the process, and a
full collection no longer walks them. In a worker draining runs this cut the
longest garbage-collector pause from 14 ms to 2-3 ms and the collector's CPU
by a third (benchmarks/RESULTS.md); a pause stalls every run the worker holds.
A program that runs :class:`Worker` itself can do the same after start-up.

``--no-listen`` is ``Worker(listen=False)``: no LISTEN connection, work is
found by polling (every ``--poll`` seconds, jittered). Behind PgBouncer in
transaction mode configure the app instead (``pooler="transaction"`` and a
direct ``listen_dsn``, or ``PGDURABLE_POOLER`` / ``PGDURABLE_LISTEN_DSN``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from ..app.durable import Durable
from ..engine.worker import Worker
from ..foundation import metrics
from ..foundation.errors import PgDurableError, ReadOnlyDatabase

__all__ = ["WATCHDOG_AFTER_GRACE", "Worker", "configure_logging", "main"]

T = TypeVar("T")

log = logging.getLogger("pgdurable.worker")

#: Seconds after the grace period at which a process asked to stop ends anyway.
WATCHDOG_AFTER_GRACE = 15.0
#: After the grace period, how long stopped runs may take to settle
#: (:attr:`Worker.settle_limit`; well inside :data:`WATCHDOG_AFTER_GRACE`).
SETTLE_LIMIT = 5.0
#: Bound of each clean-up step after :meth:`Worker.run` returned.
CLEANUP_LIMIT = 3.0
#: The exit code of a stop that left step code running (the process ended it).
EXIT_FORCED = 1


def _load_app(spec: str) -> Durable:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"expected module:app, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # the named module itself (not one it imports)
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise
        raise SystemExit(f"cannot import {module_name!r} for {spec}: {exc}") from None
    app = getattr(module, attr, None)
    if not isinstance(app, Durable):
        raise SystemExit(f"{spec} is not a pgdurable.Durable app")
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m pgdurable.worker module:app [options]``: run one worker until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m pgdurable.worker")
    parser.add_argument("app", help="module:attribute of a pgdurable.Durable app")
    parser.add_argument("--queues", default="default", help="comma-separated queue names")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--lease-ttl", type=float, default=60.0, help="seconds")
    parser.add_argument("--poll", type=float, default=5.0, help="poll interval, seconds")
    parser.add_argument("--grace", type=float, default=30.0, help="shutdown grace, seconds")
    parser.add_argument("--worker-id", default=None)
    parser.add_argument(
        "--no-listen", dest="listen", action="store_false",
        help="poll only, no LISTEN connection (PgBouncer in transaction mode)",
    )
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics on this port (pgdurable[metrics])")
    parser.add_argument("--log-level", default=None,
                        help="level of pgdurable's log lines on stderr: DEBUG, INFO, WARNING, "
                             "ERROR (default: $PGDURABLE_LOG, else INFO)")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = _load_app(args.app)
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port, app.conninfo, schema=app.schema)
    watchdog = _Watchdog()

    async def _main() -> None:
        worker = app.worker(
            queues=[s for s in args.queues.split(",") if s],
            concurrency=args.concurrency,
            lease_ttl=timedelta(seconds=args.lease_ttl),
            poll_interval=args.poll,
            worker_id=args.worker_id,
            listen=args.listen,
        )
        worker.settings.grace = args.grace  # SIGTERM's grace (stop(grace=...) sets its own)
        worker.settle_limit = SETTLE_LIMIT
        watchdog.worker = worker
        worker.on_stop = watchdog.arm
        try:
            try:
                await app.open()
            except PgDurableError as exc:  # nothing answers, a refusal, no schema
                raise _CannotStart(str(exc)) from None
            gc.collect()
            gc.freeze()  # long-lived from here on: full collections skip them
            await worker.run()
            given_back = await _bounded(worker.abandon(), "giving back the runs still held")
            if given_back:
                log.warning("worker %s: gave back %d run(s) whose step did not stop: %s",
                            worker.worker_id, len(given_back), ", ".join(given_back))
        finally:
            await _bounded(app.close(), "closing the app")
        await _exit_if_busy(worker)

    try:
        asyncio.run(_main())
    except _CannotStart as exc:  # one line, no traceback (`pgdurable worker`: exit 2)
        raise SystemExit(f"the worker cannot start: {exc}") from None
    except ReadOnlyDatabase as exc:  # one line, no traceback: exit 1, not retried forever
        raise SystemExit(f"the worker stopped: {exc}") from None


def configure_logging(level: str | None = None) -> None:
    """Log lines on stderr (``TIME LEVEL LOGGER: message``): pgdurable's at
    ``level`` (else ``$PGDURABLE_LOG``, else INFO), other libraries' at WARNING.
    An unknown level is a one-line error (``SystemExit``)."""
    name = (level or os.environ.get("PGDURABLE_LOG") or "INFO").strip().upper()
    value = logging.getLevelName(name)
    if not isinstance(value, int):
        raise SystemExit(f"unknown log level {name!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pgdurable").setLevel(value)


async def _bounded(aw: Awaitable[T], what: str) -> T | None:
    """``await aw`` for at most :data:`CLEANUP_LIMIT` seconds (None, logged, past it)."""
    try:
        async with asyncio.timeout(CLEANUP_LIMIT):
            return await aw
    except TimeoutError:
        log.warning("%s did not finish within %.0f s; going on", what, CLEANUP_LIMIT)
    except Exception as exc:  # the process is stopping: say it, do not hang on it
        log.warning("%s failed: %s", what, exc)
    return None


async def _exit_if_busy(worker: Worker) -> None:
    """After the worker stopped and the app closed: if step code still runs (a
    task that swallows its cancellation, a sync step's thread, an
    ``asyncio.to_thread`` call), ``asyncio.run`` and the interpreter's exit would
    wait for it, possibly for ever. Say what still runs and end the process."""
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current]
    for t in others:
        t.cancel()
    stuck: set[asyncio.Task[Any]] = set()
    if others:
        _, stuck = await asyncio.wait(others, timeout=CLEANUP_LIMIT)
    try:  # what asyncio.run would do next, without its unbounded join
        async with asyncio.timeout(CLEANUP_LIMIT):
            await asyncio.get_running_loop().shutdown_default_executor()
    except TimeoutError:
        pass  # its busy thread is named below
    threads = _busy_threads(("pgdurable-step", "asyncio_"), join_for=1.0)
    if stuck or threads:
        log.warning("worker %s: step code still runs after the stop (runs %s; %d task(s) "
                    "that ignore cancellation; threads %s): ending the process without it",
                    worker.worker_id, ", ".join(worker.active_runs) or "none", len(stuck),
                    "; ".join(threads) or "none")
        _exit(EXIT_FORCED)


def _busy_threads(prefixes: tuple[str, ...] | None, join_for: float = 0.0) -> list[str]:
    """The live non-daemon threads (other than this one and the main thread) whose
    name starts with one of ``prefixes`` (None: any), each with the line it runs,
    after waiting up to ``join_for`` seconds in all for them to end."""
    end = time.monotonic() + join_for
    frames = None
    busy: list[str] = []
    for t in threading.enumerate():
        if t.daemon or t is threading.current_thread() or t is threading.main_thread():
            continue
        if prefixes is not None and not t.name.startswith(prefixes):
            continue
        t.join(max(0.0, end - time.monotonic()))
        if not t.is_alive():
            continue
        frames = sys._current_frames() if frames is None else frames
        frame = frames.get(t.ident) if t.ident is not None else None
        where = "" if frame is None else (
            f" at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        busy.append(t.name + where)
    return busy


def _exit(code: int) -> None:
    """End the process now (``os._exit``): no atexit join of busy threads."""
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


class _Watchdog:
    """Ends the process :data:`WATCHDOG_AFTER_GRACE` seconds after the grace period
    of a stop request (armed by :attr:`Worker.on_stop`), whatever still runs."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._armed = False

    def arm(self, grace: float) -> None:
        if self._armed:
            return
        self._armed = True
        self._loop = asyncio.get_running_loop()
        after = max(0.0, grace) + WATCHDOG_AFTER_GRACE
        threading.Thread(target=self._fire, args=(after,), name="pgdurable-watchdog",
                         daemon=True).start()

    def _fire(self, after: float) -> None:
        time.sleep(after)
        worker = self.worker
        held = worker.active_runs if worker is not None else []
        log.error("worker %s: still running %.0f s after the stop was asked (runs held %s; "
                  "threads %s): ending the process",
                  None if worker is None else worker.worker_id, after,
                  ", ".join(held) or "none", "; ".join(_busy_threads(None)) or "none")
        loop = self._loop
        if held and worker is not None and loop is not None and not loop.is_closed():
            # give them back now if the loop still answers; else their leases lapse
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(worker.abandon(), loop).result(CLEANUP_LIMIT)
        _exit(EXIT_FORCED)


class _CannotStart(Exception):
    """The app could not open its database: said in one line by :func:`main`."""


if __name__ == "__main__":
    main()
