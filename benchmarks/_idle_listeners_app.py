"""The process measured by benchmarks/idle_listeners.py (public API only, so that the
code before the notifier runs it too).

``python benchmarks/_idle_listeners_app.py <dsn> <run_id> <warmup> <window>`` runs, in
one event loop, with default options: a worker, a stream follower of ``run_id``, a
``result()`` waiter of it and the dashboard (uvicorn) with one live page (SSE). Every
``AsyncConnection.execute`` of the process is counted (patched before pgdurable is
imported); a connection that ever ran ``LISTEN`` is a listening connection. After
``warmup`` seconds it prints ``{"measuring": true}``, then, ``window`` seconds later,
one JSON line: the window, the process's CPU seconds in it, the listening connections,
the statements they ran in it and all statements the process ran in it.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from typing import Any

import httpx
import psycopg
import uvicorn

_calls: list[tuple[float, int, str]] = []  # (monotonic, id(conn), first word)
_listening: set[int] = set()
_execute = psycopg.AsyncConnection.execute


async def _counted(self: psycopg.AsyncConnection[Any], query: Any, *args: Any,
                   **kwargs: Any) -> Any:
    text = query if isinstance(query, str) else str(query)
    word = text.split(None, 1)[0].upper() if text.strip() else ""
    if word == "LISTEN":
        _listening.add(id(self))
    _calls.append((time.monotonic(), id(self), word))
    return await _execute(self, query, *args, **kwargs)


psycopg.AsyncConnection.execute = _counted  # type: ignore[method-assign,assignment]

from pgdurable import Done, Durable, RunContext  # noqa: E402
from pgdurable.dashboard import create_app  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def main(dsn: str, rid: str, warmup: float, window: float) -> None:
    app = Durable(dsn, pool_size=4)

    @app.task("idle", revision="1")
    async def idle(ctx: RunContext, state: Any) -> Any:
        return Done(None)

    async with app:
        worker = app.worker()
        working = asyncio.create_task(worker.run())
        port = _port()
        server = uvicorn.Server(uvicorn.Config(create_app(dsn), host="127.0.0.1", port=port,
                                               log_level="warning"))
        serving = asyncio.create_task(server.serve())
        page_open = asyncio.Event()

        async def follow() -> None:
            async for _ in app.stream(rid):
                pass

        async def page() -> None:
            while not server.started:  # noqa: ASYNC110 (uvicorn has no event for it)
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(timeout=None) as client, \
                    client.stream("GET", f"http://127.0.0.1:{port}/events") as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        page_open.set()

        tasks = [asyncio.create_task(follow()), asyncio.create_task(app.result(rid)),
                 asyncio.create_task(page())]
        await page_open.wait()
        await asyncio.sleep(warmup)  # connections made, first announcements and re-reads over
        print(json.dumps({"measuring": True}), flush=True)
        t0, cpu0 = time.monotonic(), time.process_time()
        await asyncio.sleep(window)
        t1, cpu1 = time.monotonic(), time.process_time()
        inside = [(c, w) for t, c, w in _calls if t0 <= t < t1]
        print(json.dumps({
            "window": t1 - t0, "cpu": cpu1 - cpu0, "listening": len(_listening),
            "listener_statements": sum(1 for c, _ in inside if c in _listening),
            "listener_kinds": sorted({w for c, w in inside if c in _listening}),
            "statements": len(inside),
        }), flush=True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.should_exit = True
        await serving
        await worker.stop(grace=1)
        await working


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
