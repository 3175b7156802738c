"""One process with every kind of listener, for tests/test_notifier.py.

``python -m tests._notifier_proc <dsn> <run_id>`` runs, in one event loop:

* a worker of the app below (task ``quick``, queue ``default``; it polls once
  an hour, so only a NOTIFY or a reconnect makes it claim);
* a stream follower of ``run_id`` (``poll=3600``);
* a result waiter of ``run_id`` (``results.POLL`` an hour, no presence re-reads);
* the dashboard, served by uvicorn in the same loop, and one live page on it
  (an SSE stream of ``/events``).

It prints one JSON line per thing that happens: ``{"listening": {"pid",
"connects"}}`` each time the notifier listens (a probe subscriber's
``on_recheck``), ``{"event": ...}`` per stream event, ``{"result": ...}``,
``{"sse": ...}`` per live-page message, ``{"ready": {"pid"}}`` once the
worker, the stream, the waiter and the page all listen, and ``{"stopped":
true}`` after ``stop`` is read on stdin.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from typing import Any

import httpx
import uvicorn

from pgdurable import Done, Durable, RunContext
from pgdurable.foundation import presence
from pgdurable.ops.dashboard import create_app
from pgdurable.runs import results
from tests._waiting import until

ALL = {"pgdurable_wake", "pgdurable_cancel", "pgdurable_events", "pgdurable_done",
       "pgdurable_steps"}


def out(msg: dict[str, Any]) -> None:
    print(json.dumps(msg, default=str), flush=True)


async def _now(value: bool) -> bool:
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def main(dsn: str, rid: str) -> None:
    presence.RECHECK = ()  # only a notification or a reconnect makes a waiter read again
    results.POLL = 3600.0
    app = Durable(dsn, pool_size=4)

    @app.task("quick", revision="1")
    async def quick(ctx: RunContext, state: Any) -> Any:
        return Done({"ok": True})

    async with app:
        notifier = app.notifier()
        assert notifier is not None
        probe = notifier.subscribe(["pgdurable_wake"], None, lambda: out(
            {"listening": {"pid": notifier.backend_pid, "connects": notifier.connects}}))
        worker = app.worker(poll_interval=3600, lease_ttl=600)
        working = asyncio.create_task(worker.run())
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(dsn), host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="on"))
        serving = asyncio.create_task(server.serve())
        first_event, first_sse = asyncio.Event(), asyncio.Event()

        async def follow() -> None:
            async for ev in app.stream(rid, poll=3600):
                out({"event": {"seq": ev.seq, "event": ev.event, "final": ev.final}})
                first_event.set()

        async def wait_result() -> None:
            out({"result": await app.result(rid)})

        async def page() -> None:
            await until(lambda: _now(server.started), "the dashboard to serve")
            async with httpx.AsyncClient(timeout=None) as client, \
                    client.stream("GET", f"http://127.0.0.1:{port}/events") as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        out({"sse": json.loads(line[6:])})
                        first_sse.set()

        tasks = [asyncio.create_task(f()) for f in (follow, wait_result, page)]
        await first_event.wait()
        await first_sse.wait()
        # the probe, the worker, the stream, the waiter and the page, all listened
        await until(lambda: _now(notifier.subscribers == 5 and ALL <= set(notifier.channels)),
                    "every subscriber to listen")
        out({"ready": {"pid": notifier.backend_pid}})
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.should_exit = True
        await serving
        await worker.stop(grace=2)
        await working
        await probe.close()
    out({"stopped": True})


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
