"""A workflow that awaits a remote MCP task without holding a worker (docs/mcp.md, client side).

``agent`` calls the remote tool ``report``; the remote answers with a task handle,
so the run parks (the taskId is in its checkpoint) and a ``TaskPoller`` polls
``tasks/get`` at the remote's hinted interval, waking the run when the task
needs input (answered here with ``answer_input``, as a human would) and when it
ends. The "remote" is an MCP server of this same script (a DurableTasks
server, reached in-process by the SDK's client); in production it is a URL.

Run: PGDURABLE_DSN=postgresql://... python examples/mcp_client.py
"""

import asyncio
import os
from datetime import timedelta

from mcp import Client
from mcp.server.mcpserver import MCPServer

from pgdurable import Durable, WorkflowContext
from pgdurable.contrib.mcp import (
    DurableTasks,
    TaskContext,
    TaskPoller,
    TasksClient,
    answer_input,
    call_tool,
    pending_input,
)

app = Durable(os.environ["PGDURABLE_DSN"])

# -- the remote MCP server (elsewhere, in production) ------------------------
remote_tasks = DurableTasks(app, poll_interval=timedelta(milliseconds=100))


@remote_tasks.tool()
async def report(ctx: TaskContext, topic: str) -> str:
    answer = await ctx.elicit(f"Publish the report on {topic}?", key="publish")
    await ctx.sleep(0.2)
    return f"report on {topic}: {'published' if answer.get('action') == 'accept' else 'kept'}"


remote = MCPServer("reports", extensions=[remote_tasks])


def connector(url: str) -> Client:
    return Client(remote, extensions=[TasksClient()])  # a URL in production: the default


# -- the agent ----------------------------------------------------------------
@app.workflow("agent")
async def agent(ctx: WorkflowContext, topic: str) -> str:
    result = await call_tool(ctx, app, "http://reports.example/mcp", "report", {"topic": topic},
                             connector=connector)
    return str(result["content"][0]["text"])


async def main() -> None:
    async with app:
        worker = app.worker(poll_interval=0.2)
        poller = TaskPoller(app, idle=0.1, connector=connector)
        running = [asyncio.create_task(worker.run()), asyncio.create_task(poller.run())]
        run_id = await app.start("agent", "postgres")
        while (pending := await pending_input(app, run_id)) is None or pending.state != "asked":  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # the run is parked meanwhile: no worker holds it
        print("the remote asks:", pending.input_requests["publish"]["params"]["message"])
        await answer_input(app, run_id, {"publish": {"action": "accept", "content": {}}})
        result = await app.result(run_id, timeout=60)
        print(result)
        assert result == "report on postgres: published"
        running[1].cancel()
        await worker.stop()
        await running[0]


if __name__ == "__main__":
    asyncio.run(main())
