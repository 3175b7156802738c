"""Durable task definitions: the seed's count task, with a reconcile step.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/durable_task.py
(without a DSN it uses the in-process MemoryDurableStore).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pgdurable import (
    DurableContext,
    DurableStep,
    DurableStore,
    MemoryDurableStore,
    PostgresDurableStore,
    define_durable_task,
)

# Stands in for the business system that keeps the real commit under an idempotency key.
committed: dict[str, int] = {}


def is_state(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("count"), int)


def commit(state: dict[str, Any], ctx: DurableContext[dict[str, str]]) -> dict[str, Any]:
    value = committed.get(ctx.app["key"], state["count"] + 1)
    committed[ctx.app["key"]] = value
    return {"count": value}


def reconcile(state: dict[str, Any], ctx: DurableContext[dict[str, str]]) -> dict[str, Any]:
    if ctx.app["key"] not in committed:
        raise LookupError("no verifiable commit: the application must decide")
    return {"count": committed[ctx.app["key"]]}


task = define_durable_task(
    id="count",
    revision="1",
    is_state=is_state,
    initial_state={"count": 0},
    steps=[
        DurableStep(id="increment", run=lambda s, _ctx: {"count": s["count"] + 1}),
        DurableStep(id="commit", run=commit, replay="reconcile", reconcile=reconcile),
    ],
)


async def demo(store: DurableStore, task_id: str) -> None:
    context = DurableContext(app={"key": task_id})
    print(await task.run(task_id=task_id, store=store, context=context))  # {'count': 2}
    print(await task.run(task_id=task_id, store=store, context=context))  # completed: no steps
    record = await store.load(task_id)
    assert record is not None
    print(record["status"], record["attempt_count"], len(committed))  # completed 1 1


async def main() -> None:
    dsn = os.environ.get("PGDURABLE_DSN")
    task_id = f"demo-{os.getpid()}"
    if dsn is None:
        await demo(MemoryDurableStore(), task_id)
        return
    async with PostgresDurableStore(dsn) as store:
        await demo(store, task_id)


if __name__ == "__main__":
    asyncio.run(main())
