"""The kit's two defineDurableTask examples, line for line, on the kit's own records.

The records are the kit's (camelCase, version 2) in the kit's in-memory store (a
serial lock and structured clones), and the tasks save them back in the kit's
format (``record_format="kit"``), so the kit could resume them too. Each example
prints what the kit's prints (``console_log`` writes values as Node's
``console.log`` does); tests/test_tasks.py compares the two.

Run:  python examples/durable_task_kit.py   (no database needed)
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pgdurable import CancelSignal, DurableStep, define_durable_task

T = TypeVar("T")
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*")


def console_log(value: Any) -> None:
    """Print ``value`` as Node's ``console.log`` shows it (plain JSON values)."""

    def show(v: Any, top: bool = False) -> str:
        if isinstance(v, dict):
            items = [f"{k if _IDENTIFIER.fullmatch(k) else repr(k)}: {show(x)}"
                     for k, x in v.items()]
            return "{ " + ", ".join(items) + " }" if items else "{}"
        if isinstance(v, list):
            return "[ " + ", ".join(show(x) for x in v) + " ]" if v else "[]"
        if isinstance(v, bool):
            return "true" if v else "false"
        if v is None:
            return "null"
        if isinstance(v, str):
            return v if top else repr(v)
        return str(v)

    print(show(value, top=True))


def kit_record() -> dict[str, Any]:
    """The record both examples start from, as the kit writes it."""
    return {"version": 2, "definitionId": "count", "revision": "1", "nextStepIndex": 0,
            "attemptCount": 0, "maxAttempts": 3, "deadlineAtMs": int(time.time() * 1000) + 60_000,
            "status": "ready", "state": {"count": 0}}


class KitStore:
    """The kit's isolated demo store: one serial lock for the process, records
    copied in and out (structuredClone). Not durable, not exclusive across
    processes: like the kit's, a demonstration of the store contract."""

    def __init__(self, records: dict[str, dict[str, Any]]) -> None:
        self.records = records
        self._tail = asyncio.Lock()

    async def exclusive(self, task_id: str, operation: Callable[[], Awaitable[T]]) -> T:
        async with self._tail:
            return await operation()

    async def load(self, task_id: str) -> dict[str, Any] | None:
        record = self.records.get(task_id)
        return None if record is None else copy.deepcopy(record)

    async def save(self, task_id: str, record: Any) -> None:
        self.records[task_id] = copy.deepcopy(dict(record))


def is_state(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("count"), int)


async def count_example() -> dict[str, dict[str, Any]]:
    """先用隔离内存检查点理解一次执行: one safe step, run once. Returns the records."""
    records = {"demo-task": kit_record()}
    store = KitStore(records)
    task = define_durable_task(
        id="count", revision="1", is_state=is_state, record_format="kit",
        steps=[DurableStep(id="increment", replay="safe",
                           run=lambda state, _ctx: {"count": state["count"] + 1})],
    )
    context = {"app": None, "signal": CancelSignal()}
    console_log(await task.run(task_id="demo-task", store=store, context=context))
    console_log(records["demo-task"]["attemptCount"])
    return records


async def reconcile_example() -> dict[str, dict[str, Any]]:
    """同一 run 增加中断后的真实对账策略: a reconcile step; a completed record runs
    nothing. Returns the records."""
    records = {"demo-task": kit_record()}
    store = KitStore(records)
    committed: dict[str, int] = {}  # the business service, keyed by taskId

    async def run(state: Any, ctx: Any) -> Any:
        value = committed.get(ctx["app"]["key"], state["count"] + 1)
        committed[ctx["app"]["key"]] = value
        return {"count": value}

    async def reconcile(state: Any, ctx: Any) -> Any:
        if ctx["app"]["key"] not in committed:
            raise LookupError("没有可核实的提交结果,需要 App 决定后续动作")
        return {"count": committed[ctx["app"]["key"]]}

    task = define_durable_task(
        id="count", revision="1", is_state=is_state, record_format="kit",
        steps=[DurableStep(id="commit", replay="reconcile", run=run, reconcile=reconcile)],
    )
    context = {"app": {"key": "demo-task"}, "signal": CancelSignal()}
    console_log(await task.run(task_id="demo-task", store=store, context=context))
    console_log(await task.run(task_id="demo-task", store=store, context=context))  # 已完成
    console_log(len(committed))
    return records


if __name__ == "__main__":
    asyncio.run(count_example())
    asyncio.run(reconcile_example())
