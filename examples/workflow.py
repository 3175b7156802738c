"""A research agent written as ordinary async code (@app.workflow).

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/workflow.py

Each ``ctx.step`` runs its function once per run and checkpoints the JSON
result; ``wait_signal``, ``sleep`` and ``approval`` park the run (no worker is
held) and, when it wakes, the function runs again from the top: recorded steps
return their recorded results at once, without calling the tools again.
The same agent as a state-machine ``@app.task`` is in docs/workflows.md.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import StepPolicy, WorkflowContext

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL

calls: dict[str, int] = {}  # how often each tool really ran (in this process)
pushed: dict[str, str] = {}  # stands in for the git server


def web_search(topic: str) -> list[str]:
    calls["search"] = calls.get("search", 0) + 1
    return [f"https://example.org/{topic}/{i}" for i in range(3)]


async def read(url: str) -> str:
    calls["read"] = calls.get("read", 0) + 1
    return f"notes on {url.rsplit('/', 1)[-1]}"


def push_branch(topic: str, notes: list[str]) -> str:
    calls["push"] = calls.get("push", 0) + 1
    return pushed.setdefault(topic, f"build-{topic}-{len(notes)}")


def find_push(topic: str, notes: list[str]) -> str:
    """Reconcile: the push started but its outcome was never recorded."""
    return pushed[topic]


@app.workflow("research", revision="1")
async def research(ctx: WorkflowContext, topic: str) -> dict[str, Any]:
    sources = await ctx.step("search", web_search, topic)
    notes = [await ctx.step(f"read:{url}", read, url) for url in sources]
    await ctx.emit({"notes": len(notes)})
    build = await ctx.step("push", push_branch, topic, notes,
                           policy=StepPolicy(replay="reconcile", reconcile=find_push))
    try:
        ci = await ctx.wait_signal("ci", build, timeout=timedelta(minutes=30))
    except pgdurable.WaitTimeout:
        return {"topic": topic, "released": False}
    await ctx.sleep(timedelta(milliseconds=100))
    ok = await ctx.approval(f"report:{topic}")
    return {"topic": topic, "build": build, "ci": ci, "approved": ok, "notes": notes}


async def wait_for(run_id: str, kind: str) -> None:
    for _ in range(600):
        info = await app.get_run(run_id)
        if info.status == "waiting" and info.wait_kind == kind:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{run_id} never waited on {kind}")


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=4)
        task = asyncio.create_task(worker.run())
        try:
            run_id = await app.start("research", "postgres")
            await wait_for(run_id, "ci")                 # parked: no worker holds it
            await app.signal("ci", "build-postgres-3", {"conclusion": "success"})
            await wait_for(run_id, "approval")           # replayed from the top, no tool re-ran
            await app.signal("approval", "report:postgres", {"by": "alice"})
            for _ in range(600):
                info = await app.get_run(run_id)
                if info.terminal:
                    break
                await asyncio.sleep(0.05)
            print("result:", info.status, info.result)
            print("tool calls:", calls)
            rows = await app.fetchall(
                "SELECT position, kind, name FROM pgdurable.workflow_steps "
                "WHERE run_id = %s ORDER BY position", (run_id,))
            print("history:", [f"{p}:{k}:{n}" for p, k, n in rows])
            assert info.status == "completed" and info.result["approved"] == {"by": "alice"}
            assert calls == {"search": 1, "read": 3, "push": 1}
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
