"""Retry a workflow that failed while its tool backend was down.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/retry_workflow.py

``research`` searches, then fetches; the fetch tool raises while the backend
is down, and after its in-place attempts the run fails with ``StepFailed``.
Once the backend is back, ``app.retry`` runs the failed step again (the
search is replayed from its record, not called again) and the run completes.
``fallback`` catches the same failure and takes another path: that caught
error is part of its history, and its retry replays it (docs/fork.md, "Retry
and fork of a failed run").
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import StepFailed, StepPolicy, WorkflowContext

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
backend = {"up": False}
calls: list[str] = []  # what the tools were asked, in this process
QUICK = StepPolicy(max_attempts=2, retry_base=0.05)


def search(topic: str) -> list[str]:
    calls.append(f"search {topic}")
    return [f"{topic}/a", f"{topic}/b"]


def fetch(url: str) -> str:
    calls.append(f"fetch {url}")
    if not backend["up"]:
        raise ConnectionError("fetch backend is down")
    return f"<page {url}>"


@app.workflow("research", revision="1")
async def research(ctx: WorkflowContext, topic: str) -> dict[str, Any]:
    hits = await ctx.step("search", search, topic)
    page = await ctx.step("fetch", fetch, hits[0], policy=QUICK)
    return {"hits": hits, "page": page}


@app.workflow("fallback", revision="1")
async def fallback(ctx: WorkflowContext, topic: str) -> dict[str, Any]:
    hits = await ctx.step("search", search, topic)
    try:
        page = await ctx.step("fetch", fetch, hits[0], policy=QUICK)
    except StepFailed as exc:  # handled: recorded, and replayed the same way
        page = f"(no page: {exc.error_type})"
    return {"hits": hits, "page": page}


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=4, poll_interval=0.2)
        task = asyncio.create_task(worker.run())
        try:
            rid = await app.start("research", "durable agents")
            try:
                await app.result(rid, timeout=60)
            except pgdurable.RunFailed as exc:
                print("failed:", exc.error and exc.error["message"])
            handled = await app.start("fallback", "durable agents")
            print("fallback result:", await app.result(handled, timeout=60))
            assert calls.count("fetch durable agents/a") == 4  # 2 attempts per run

            backend["up"] = True  # the backend is fixed
            print("retry:", await app.retry(rid))
            print("result after retry:", await app.result(rid, timeout=60))
            assert calls.count("search durable agents") == 2  # once per run, never again
            assert calls.count("fetch durable agents/a") == 5  # the failed step ran again

            # a completed run cannot be retried; the caught error stays its history
            fork = await app.fork(handled)
            print("fork of fallback:", await app.result(fork, timeout=60))
            assert calls.count("fetch durable agents/a") == 5
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
