"""``python -m pgdurable.worker module:app``: run one worker of an app until SIGTERM.

The worker itself is :class:`pgdurable.engine.worker.Worker` (re-exported
here, and as ``pgdurable.Worker``); this module is the command line entry
point (used by crash tests and ``pgdurable worker``), in the operations layer:
it loads the app object, which the engine never imports.

Command line (used by crash tests and ``pgdurable worker``)::

    python -m pgdurable.worker module:app [--queues a,b] [--concurrency N]
        [--lease-ttl SECONDS] [--poll SECONDS] [--grace SECONDS] [--worker-id ID]
        [--no-listen]

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
import gc
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timedelta

from ..app.durable import Durable
from ..engine.worker import Worker
from ..foundation import metrics
from ..foundation.errors import PgDurableError

__all__ = ["Worker", "main"]


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
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("PGDURABLE_LOG", "WARNING"))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app = _load_app(args.app)
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port, app.conninfo)

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
        try:
            try:
                await app.open()
            except PgDurableError as exc:  # nothing answers, a refusal, no schema
                raise _CannotStart(str(exc)) from None
            gc.collect()
            gc.freeze()  # long-lived from here on: full collections skip them
            await worker.run()
        finally:
            await app.close()

    try:
        asyncio.run(_main())
    except _CannotStart as exc:  # one line, no traceback (`pgdurable worker`: exit 2)
        raise SystemExit(f"the worker cannot start: {exc}") from None


class _CannotStart(Exception):
    """The app could not open its database: said in one line by :func:`main`."""


if __name__ == "__main__":
    main()
