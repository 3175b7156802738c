"""A durable MCP tool's round trip through a task vs the same tool called synchronously.

One command::

    .venv/bin/python benchmarks/mcp_tasks.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--calls 200] [--poll-ms 10]

One process, against a scratch database: an MCP server (the SDK's ``MCPServer``
over Streamable HTTP, stateless, under uvicorn on a local port), one pgdurable
worker, and the SDK's client (2026-07-28, one open client). The tool doubles a
number and returns at once. Three modes, interleaved call by call (``--calls``
of each):

* ``sync`` (the baseline): the tool as a plain MCP tool, run inside the server
  process by ``tools/call``;
* ``task``: the tool as a durable tool (``DurableTasks``), ``tools/call`` from a
  client that declares the Tasks extension: the run is started and registered
  in one transaction and the ``CreateTaskResult`` returned (``created``); the
  client then polls ``tasks/get`` at the hinted ``pollIntervalMs``
  (``--poll-ms``) until the task is completed (``result``);
* ``await``: the same durable tool from a client that does not declare the
  extension: the server waits for the run's end (``app.result``, woken by
  ``pgdurable_done``) and answers ``tools/call`` with the result.

Printed per mode: p50 and p99 of the latency (ms) and the ratios of the p50s
to ``sync``'s. The ``task`` result latency includes up to one poll interval of
waiting: with ``--poll-ms 10`` it is the worker's claim, the run and its
completion that dominate.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from datetime import timedelta
from typing import Any

import uvicorn
from _scratch import drop_scratch, scratch_dsn
from mcp import Client
from mcp.server.mcpserver import MCPServer

import pgdurable
from pgdurable.contrib.mcp import DurableTasks, TaskContext
from pgdurable.contrib.mcp.client import (  # the client's own request models
    TasksClient,
    _AnyResult,
    _dump,
    _GetTask,
    _TaskParams,
)

DB = "pgdurable_bench_mcp_tasks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(app: pgdurable.Durable, poll_ms: int) -> MCPServer:
    tasks = DurableTasks(app, poll_interval=timedelta(milliseconds=poll_ms))

    @tasks.tool(description="Double n (durable).")
    async def double(ctx: TaskContext, n: int) -> dict[str, int]:
        return {"n": n * 2}

    server = MCPServer("bench", extensions=[tasks], middleware=[tasks.legacy])

    @server.tool(description="Double n (synchronous).")
    def double_sync(n: int) -> dict[str, int]:
        return {"n": n * 2}

    return server


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main_async(dsn: str, calls: int, poll_ms: int) -> None:
    app = pgdurable.Durable(dsn)
    server = build(app, poll_ms)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    asgi = server.streamable_http_app(stateless_http=True, json_response=True)
    web = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(web.serve())
    worker = app.worker(poll_interval=0.5)
    working = asyncio.create_task(worker.run())
    for _ in range(3000):  # up to 30 s for uvicorn to listen
        if web.started:
            break
        await asyncio.sleep(0.01)
    times: dict[str, list[float]] = {"sync": [], "created": [], "result": [], "await": []}
    try:
        async with Client(url, extensions=[TasksClient()], mode="2026-07-28",
                          cache=None) as tasks_client, \
                Client(url, mode="2026-07-28", cache=None) as plain:
            for i in range(calls + 5):  # 5 warm-up calls of each, not counted
                t = time.perf_counter()
                got = await plain.call_tool("double_sync", {"n": i})
                sync = time.perf_counter() - t
                assert got.structured_content == {"n": i * 2} or got.content, got

                t = time.perf_counter()
                created = await tasks_client.session.call_tool("double", {"n": i},
                                                               allow_claimed=True)
                made = time.perf_counter() - t
                data: dict[str, Any] = created.model_dump(by_alias=True)
                task_id = str(data["taskId"])
                while True:
                    task = _dump(await tasks_client.session.send_request(
                        _GetTask(params=_TaskParams(taskId=task_id)), _AnyResult))
                    if task["status"] == "completed":
                        break
                    if task["status"] in ("failed", "cancelled"):
                        raise RuntimeError(f"task {task_id} {task['status']}")
                    await asyncio.sleep(int(task.get("pollIntervalMs") or poll_ms) / 1000)
                result = time.perf_counter() - t

                t = time.perf_counter()
                awaited = await plain.call_tool("double", {"n": i})
                waited = time.perf_counter() - t
                assert awaited.structured_content == {"n": i * 2}, awaited
                if i >= 5:
                    times["sync"].append(sync)
                    times["created"].append(made)
                    times["result"].append(result)
                    times["await"].append(waited)
    finally:
        await worker.stop(grace=5)
        await working
        web.should_exit = True
        await serving
        await app.close()
    base = statistics.median(times["sync"])
    print(f"\n{calls} calls of each, interleaved (poll interval hint {poll_ms} ms):")
    for label, key in (("sync tools/call", "sync"), ("task: tools/call -> created", "created"),
                       ("task: tools/call -> result", "result"),
                       ("await: tools/call -> result", "await")):
        v = times[key]
        print(f"  {label:<30} p50 {pct(v, 0.5) * 1e3:8.2f} ms   p99 {pct(v, 0.99) * 1e3:8.2f} ms"
              f"   x{statistics.median(v) / base:.1f} of sync")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--poll-ms", type=int, default=10)
    a = ap.parse_args()
    dsn = scratch_dsn(a.dsn, DB)
    try:
        asyncio.run(main_async(dsn, a.calls, a.poll_ms))
    finally:
        drop_scratch(a.dsn, DB)


if __name__ == "__main__":
    main()
