"""An MCP server whose long tool is a pgdurable run (docs/mcp.md, server side).

``deploy`` is a durable tool: ``tools/call`` answers with a task handle whose id
is a run; the body runs on a pgdurable worker (here in this process; in
production ``python -m pgdurable.worker yourmodule:app`` beside any number of
``MCPServer`` processes). It asks for a confirmation (``input_required``), which
``tasks/update`` answers. The client is the MCP SDK's own, connected in-process.

Run: PGDURABLE_DSN=postgresql://... python examples/mcp_server.py
"""

import asyncio
import os
from datetime import timedelta

from mcp import Client
from mcp.server.mcpserver import MCPServer

from pgdurable import Durable
from pgdurable.contrib.mcp import DurableTasks, TaskContext, TasksClient

app = Durable(os.environ["PGDURABLE_DSN"])
tasks = DurableTasks(app, ttl=timedelta(hours=1), poll_interval=timedelta(milliseconds=200))


@tasks.tool(description="Deploy a service once a human confirms.")
async def deploy(ctx: TaskContext, service: str) -> str:
    ctx.report(f"building {service}")
    build = await ctx.step("build", lambda: f"{service}-build-7")     # recorded
    answer = await ctx.elicit(f"Deploy {build}?", {                     # parks: input_required
        "type": "object", "properties": {"ok": {"type": "boolean"}}}, key="confirm")
    if not (answer.get("content") or {}).get("ok"):
        return f"{build} not deployed"
    await ctx.sleep(0.2)                                                 # parks: no worker held
    return f"{build} deployed"


server = MCPServer("deployer", extensions=[tasks], middleware=[tasks.legacy])


async def main() -> None:
    async with app:
        worker = app.worker(poll_interval=0.2)
        running = asyncio.create_task(worker.run())
        async with Client(server, extensions=[TasksClient()]) as client:
            created = await client.session.call_tool("deploy", {"service": "api"},
                                                     allow_claimed=True)
            task_id = created.model_dump(by_alias=True)["taskId"]
            print("task", task_id, "(a run)")
            while (task := await tasks.get(task_id))["status"] != "input_required":  # noqa: ASYNC110 - polling tasks/get is the protocol
                await asyncio.sleep(0.1)
            print("asks:", task["inputRequests"]["confirm"]["params"]["message"])
            await tasks.answer(task_id, {"confirm": {"action": "accept", "content": {"ok": True}}})
            while (task := await tasks.get(task_id))["status"] not in ("completed", "failed"):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            print(task["status"], task["result"]["content"][0]["text"])
            assert task["result"]["content"][0]["text"] == "api-build-7 deployed"
        await worker.stop()
        await running


if __name__ == "__main__":
    asyncio.run(main())
