"""A durable task definition run by leased workers, with ctx.effect and
app.with_idempotency.

Run with a migrated database:
    PGDURABLE_DSN=postgresql://... python examples/durable_task_worker.py
"""

from __future__ import annotations

import asyncio
import os
import uuid
from datetime import timedelta
from typing import Any

from pgdurable import Durable, DurableStep, RunInfo, define_durable_task
from pgdurable.models.durable_runs import DurableRunContext

# Stands in for the payment provider, which keeps charges under an idempotency key.
provider: dict[str, dict[str, Any]] = {}


def is_order(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("order"), str)


def price(state: dict[str, Any], ctx: DurableRunContext) -> dict[str, Any]:
    return {**state, "amount": 42}


async def charge(state: dict[str, Any], ctx: DurableRunContext) -> dict[str, Any]:
    key = f"charge:{state['order']}"

    def call_provider() -> dict[str, Any]:
        return provider.setdefault(key, {"charge_id": f"ch_{len(provider) + 1}",
                                         "amount": state["amount"]})

    def look_up() -> dict[str, Any]:  # started, outcome unknown: ask the provider
        if key not in provider:
            raise LookupError("no such charge")
        return provider[key]

    # recorded with the run under its lease: a retried step gets the stored result
    result = await ctx.effect(key, call_provider, reconcile=look_up)
    return {**state, "charge": result}


def reconcile_charge(state: dict[str, Any], ctx: DurableRunContext) -> dict[str, Any]:
    # the step was marked in flight and never confirmed: find the real outcome
    key = f"charge:{state['order']}"
    if key not in provider:
        raise LookupError("cannot tell whether the charge happened")  # -> ReconcileFailed
    return {**state, "charge": provider[key]}


order_task = define_durable_task(
    id="order", revision="1", is_state=is_order, max_attempts=3,
    deadline=timedelta(minutes=10),
    steps=[
        DurableStep(id="price", run=price),
        DurableStep(id="charge", run=charge, replay="reconcile", reconcile=reconcile_charge),
        DurableStep(id="ship", run=lambda s, ctx: {**s, "shipped": True}),
    ],
)

app = Durable(os.environ.get("PGDURABLE_DSN"))
app.register(order_task, context={"shop": "example"})


async def wait_done(run_id: str) -> RunInfo:
    for _ in range(1200):  # up to a minute
        info = await app.get_run(run_id)
        if info.terminal:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(f"run {run_id} did not finish")


async def main() -> None:
    async with app:
        order = f"o-{uuid.uuid4().hex[:8]}"
        run_id = await app.start(order_task.id, state={"order": order})
        worker = app.worker(poll_interval=0.5)
        running = asyncio.create_task(worker.run())
        info = await wait_done(run_id)
        await worker.stop(grace=5)
        await running
        print(info.status, info.result)  # completed {'order': ..., 'charge': {...}, 'shipped': True}
        assert info.status == "completed" and info.result["shipped"] is True

        # outside runs: one execution per key across processes
        calls: list[int] = []

        async def send_receipt() -> dict[str, Any]:
            calls.append(1)
            return {"receipt": order}

        results = await asyncio.gather(*(
            app.with_idempotency(f"receipt:{order}", send_receipt, ttl=timedelta(days=1))
            for _ in range(5)
        ))
        print(results[0], "executions:", len(calls))  # {'receipt': ...} executions: 1
        assert len(calls) == 1 and all(r == results[0] for r in results)


if __name__ == "__main__":
    asyncio.run(main())
