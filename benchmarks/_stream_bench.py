"""The processes of ``benchmarks/stream_http.py`` (token streams to browsers).

``python benchmarks/_stream_bench.py pgdurable PORT``: ``pgdurable.http.create_app``
for :data:`app` on 127.0.0.1:PORT (uvicorn, one process), every request allowed.

``python benchmarks/_stream_bench.py relay PORT``: the baseline, a bare LISTEN/NOTIFY
relay: one LISTEN connection on channel ``bench_relay`` fanned out to SSE clients at
``GET /relay/{stream}`` (payload ``"STREAM TOKEN"``), nothing stored.

``python benchmarks/_stream_bench.py produce STREAMS RATE SECONDS START_AT``: the
relay's producer, one ``pg_notify`` per token, ``STREAMS`` streams at ``RATE`` tokens
a second from the wall-clock time ``START_AT`` (what the worker's ``paced`` runs emit).

Every token is the wall-clock time it was emitted (``"%.6f "``): a reader's latency
is its arrival time minus the token. ``PGDURABLE_DSN`` names the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from pgdurable import Done, Durable, RunContext

app = Durable(pool_size=int(os.environ.get("BENCH_POOL_SIZE", "8")))


async def _paced(rate: float, seconds: float, start_at: float) -> AsyncIterator[str]:
    """Tokens at ``rate`` a second for ``seconds`` from ``start_at`` (wall clock)."""
    await asyncio.sleep(max(0.0, start_at - time.time()))
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start_at + i / rate - time.time()))
        yield f"{time.time():.6f} "


@app.task("paced")
async def paced(ctx: RunContext, state: Any) -> Any:
    """Emit the wall-clock time as text tokens at a steady rate (the benchmark's agent)."""
    n = 0
    async for token in _paced(float(state["rate"]), float(state["seconds"]),
                              float(state["start_at"])):
        await ctx.emit_text(token)
        n += 1
    return Done(n)


def _serve_pgdurable(port: int) -> None:
    import uvicorn

    from pgdurable.http import create_app

    uvicorn.run(create_app(app, authorize=lambda request, access: True),
                host="127.0.0.1", port=port, log_level="warning")


def _serve_relay(port: int) -> None:
    import psycopg
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    queues: dict[str, set[asyncio.Queue[str]]] = {}

    async def listen() -> None:
        conn = await psycopg.AsyncConnection.connect(os.environ["PGDURABLE_DSN"],
                                                     autocommit=True)
        await conn.execute("LISTEN bench_relay")
        async for note in conn.notifies():
            stream, _, token = note.payload.partition(" ")
            for q in queues.get(stream, ()):
                q.put_nowait(token)

    async def relay(request: Request) -> StreamingResponse:
        stream = request.path_params["stream"]
        q: asyncio.Queue[str] = asyncio.Queue()
        queues.setdefault(stream, set()).add(q)

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 1000\n\n"
                while True:
                    token = await q.get()
                    yield f"event: text\ndata: {token} \n\n".encode()
            finally:
                queues[stream].discard(q)

        return StreamingResponse(body(), media_type="text/event-stream")

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(listen())
        yield
        task.cancel()

    async def health(request: Request) -> Response:
        return Response("ok")

    server = Starlette(routes=[Route("/relay/{stream}", relay), Route("/health", health)],
                       lifespan=lifespan)
    uvicorn.run(server, host="127.0.0.1", port=port, log_level="warning")


async def _produce(streams: int, rate: float, seconds: float, start_at: float) -> None:
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(os.environ["PGDURABLE_DSN"], min_size=min(streams, 8),
                                   max_size=min(streams, 8), open=False) as pool:
        await pool.wait()

        async def one(stream: int) -> None:
            async for token in _paced(rate, seconds, start_at):
                async with pool.connection() as conn:
                    await conn.execute("SELECT pg_notify('bench_relay', %s)",
                                       (f"{stream} {token.strip()}",))

        await asyncio.gather(*(one(i) for i in range(streams)))


def main() -> None:
    mode = sys.argv[1]
    if mode == "pgdurable":
        _serve_pgdurable(int(sys.argv[2]))
    elif mode == "relay":
        _serve_relay(int(sys.argv[2]))
    elif mode == "produce":
        streams, rate, seconds, start_at = sys.argv[2:6]
        asyncio.run(_produce(int(streams), float(rate), float(seconds), float(start_at)))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
