"""Sub-agents: a run fans out to child runs, waits for them, and joins their results.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/children.py

``research`` starts one child run per question (``ctx.start_child``: once per
key, even if the step is retried), parks until all of them have finished
(``Wait.children``; no worker slot is held meanwhile) and, in its next step,
reads their outcomes from ``ctx.wake["children"]``. A child that fails is
reported there, it does not fail the parent. ``app.result`` waits (with
LISTEN) for the parent's result from any process; ``app.run_tree`` shows the
tree, as does ``pgdurable run ID --tree``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import Done, RunContext, Wait

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL


@app.task("answer", max_attempts=1)
async def answer(ctx: RunContext, state: dict[str, Any]) -> Any:
    """A sub-agent: answers one question (and refuses one, to show a failed child)."""
    if "?" not in state["q"]:
        raise ValueError(f"not a question: {state['q']!r}")
    return Done(f"{state['q']} -> 42")


@app.task("research")
async def research(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Fan out one child per question, then join."""
    if ctx.step == 0:
        ids = [await ctx.start_child("answer", {"q": q}, key=f"q{i}")
               for i, q in enumerate(state["questions"])]
        return Wait.children(ids, timeout=600, state={**state, "ids": ids})
    outcomes = ctx.wake["children"] if ctx.wake else {}
    answers = [outcomes[i]["result"] for i in state["ids"]
               if outcomes[i]["status"] == "completed"]
    failed = [outcomes[i]["error"]["message"] for i in state["ids"]
              if outcomes[i]["status"] == "failed"]
    return Done({"answers": answers, "failed": failed})


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=8)
        task = asyncio.create_task(worker.run())
        try:
            run_id = await app.start("research", {"questions": [
                "what is six times seven?", "why 42?", "no question here"]})
            result = await app.result(run_id, timeout=60)
            print("result:", result)
            assert len(result["answers"]) == 2 and len(result["failed"]) == 1
            for node in await app.run_tree(run_id):
                print("  " * node.depth + f"{node.id} {node.task} [{node.child_key}] {node.status}")
            info = await app.get_run(run_id)
            assert info.claims == 2  # started, then woken once by its last child
            try:
                await app.result(info.children[2])
            except pgdurable.RunFailed as exc:
                print("the refused question:", exc.error and exc.error["message"])
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
