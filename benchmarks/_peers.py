"""The peers the start benchmarks compare against (``pip install -e '.[bench]'``):
pgqueuer and procrastinate, each driven by a small script of ours doing what
the pgdurable side does. Imported as ``_peers`` (``benchmarks/`` is first on
``sys.path`` when a benchmark runs).

Each peer has an ``install`` (its schema in the scratch database), a worker
(``worker_*``: runs until SIGTERM, calls ``on_job(payload)`` at the start of
every job) and a producer (``*_producer``: an async callable enqueueing one
job with a str payload).
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
from collections.abc import Awaitable, Callable
from typing import Any

Producer = Callable[[str], Awaitable[Any]]
OnJob = Callable[[str], None]

PEERS = ("pgqueuer", "procrastinate")


def available() -> list[str]:
    """The peers installed here (the ``bench`` extra)."""
    return [p for p in PEERS if importlib.util.find_spec(p) is not None]


async def _until_sigterm() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


# -- pgqueuer ---------------------------------------------------------------


# pgqueuer on asyncpg, its primary driver: its psycopg driver shares one
# connection between notifies(timeout=1) and the dequeue, so a job waits up to
# 1 s for the connection after its NOTIFY (measured: p50 ~1,000 ms).


def _asyncpg_args(dsn: str) -> dict[str, Any]:
    """asyncpg.connect() keywords for a libpq DSN (key=value or URL)."""
    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "dbname": "database",
             "password": "password"}
    return {names[k]: (int(v) if k == "port" else v) for k, v in d.items() if k in names}


async def pgqueuer_install(dsn: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(**_asyncpg_args(dsn))
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def pgqueuer_worker(dsn: str, on_job: OnJob, steps: int = 1) -> None:
    """One pgqueuer worker process (its defaults: LISTEN, batch_size 10)."""
    import asyncpg
    from pgqueuer import AsyncpgDriver, PgQueuer
    from pgqueuer.models import Job

    conn = await asyncpg.connect(**_asyncpg_args(dsn))
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("bench")
    async def bench(job: Job) -> None:
        on_job((job.payload or b"").decode())
        for _ in range(steps - 1):  # no checkpoints: pgqueuer has no steps
            await asyncio.sleep(0)

    run = asyncio.create_task(pgq.run())
    await _until_sigterm()
    pgq.shutdown.set()
    await asyncio.wait([run], timeout=5)
    await conn.close()


async def pgqueuer_producer(dsn: str) -> tuple[Producer, Callable[[], Awaitable[None]]]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(**_asyncpg_args(dsn))
    queries = Queries(AsyncpgDriver(conn))

    async def enqueue(payload: str) -> Any:
        return await queries.enqueue("bench", payload.encode())

    return enqueue, conn.close


# -- procrastinate ----------------------------------------------------------


def _procrastinate_app(dsn: str, on_job: OnJob | None = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="bench")
    async def bench(payload: str) -> None:
        if on_job is not None:
            on_job(payload)

    return app


async def procrastinate_install(dsn: str) -> None:
    app = _procrastinate_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def procrastinate_worker(dsn: str, on_job: OnJob, steps: int = 1) -> None:
    app = _procrastinate_app(dsn, on_job)
    async with app.open_async():
        await app.run_worker_async(concurrency=10, wait=True, install_signal_handlers=True)


async def procrastinate_producer(dsn: str) -> tuple[Producer, Callable[[], Awaitable[None]]]:
    app = _procrastinate_app(dsn)
    await app.open_async()
    task = app.tasks["bench"]

    async def enqueue(payload: str) -> Any:
        return await task.defer_async(payload=payload)

    return enqueue, app.close_async


INSTALL = {"pgqueuer": pgqueuer_install, "procrastinate": procrastinate_install}
WORKER = {"pgqueuer": pgqueuer_worker, "procrastinate": procrastinate_worker}
PRODUCER = {"pgqueuer": pgqueuer_producer, "procrastinate": procrastinate_producer}
