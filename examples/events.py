"""Event-driven agents: triggers with debounce and batches, wait_event, cancel_on.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/events.py

* five chat messages in a burst become ONE agent turn that sees all five
  (``debounce``, keyed by the thread);
* webhook deliveries are handled in batches of at most 10;
* a checkout run parks on ``wait_event`` until its payment event arrives, and a
  second checkout is cancelled by an ``order.cancelled`` event while it is parked.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pgdurable
from pgdurable import Done, Event, RunContext

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
turns: list[list[str]] = []
batches: list[int] = []


@app.on_event("message.received", key="data.thread_id", debounce=timedelta(seconds=0.3),
              max_wait=timedelta(seconds=5))
async def reply(ctx: RunContext, events: list[Event]) -> str:
    """One run per burst of messages on a thread: it sees every message of the burst."""
    texts = [e.data["text"] for e in events]
    turns.append(texts)
    return f"answered {len(texts)} message(s) on {events[0].data['thread_id']}"


@app.on_event("webhook.delivery", key="data.tenant", batch=10,
              batch_timeout=timedelta(seconds=0.3))
async def ingest(ctx: RunContext, events: list[Event]) -> int:
    """At most 10 deliveries per run: a full batch runs at once, the rest after 0.3 s."""
    batches.append(len(events))
    return len(events)


@app.task("checkout")
async def checkout(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Park until the order's payment event (at most an hour), then finish."""
    if ctx.step == 0:
        return ctx.wait_event("payment.succeeded", {"data.order_id": state["order_id"]},
                              timeout=timedelta(hours=1))
    if ctx.event is None:
        return Done({"paid": False})
    return Done({"paid": True, "amount": ctx.event["data"]["amount"]})


async def status_of(run_id: str, *statuses: str) -> pgdurable.RunInfo:
    for _ in range(600):
        info = await app.get_run(run_id)
        if info.status in statuses:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(run_id)


async def main() -> None:
    async with app:
        await app.declare_triggers()  # a worker also does this as it starts
        worker = app.worker(concurrency=8)
        task = asyncio.create_task(worker.run())
        try:
            # a burst of five messages on one thread, one on another
            for i in range(5):
                await app.send_event("message.received",
                                     {"thread_id": "t-1", "text": f"hi {i}"}, id=f"msg-{i}")
            await app.send_event("message.received", {"thread_id": "t-2", "text": "hello"})
            # a retried delivery of msg-4 (same id, same data): nothing happens again
            again = await app.send_event("message.received",
                                         {"thread_id": "t-1", "text": "hi 4"}, id="msg-4")
            assert not again.created
            # 25 webhook deliveries: batches of 10, 10 and 5
            for i in range(25):
                await app.send_event("webhook.delivery", {"tenant": "acme", "n": i})

            # a checkout that waits for its payment...
            paid = await app.start("checkout", {"order_id": "o-1"},
                                   cancel_on=[("order.cancelled", "data.order_id", "o-1")])
            # ... and one whose order is cancelled while it waits
            dropped = await app.start("checkout", {"order_id": "o-2"},
                                      cancel_on=[("order.cancelled", "data.order_id", "o-2")])
            await status_of(paid, "waiting")
            await status_of(dropped, "waiting")
            await app.send_event("payment.succeeded", {"order_id": "o-1", "amount": 42})
            await app.send_event("order.cancelled", {"order_id": "o-2"})
            print("paid:", (await status_of(paid, "completed")).result)
            print("dropped:", (await status_of(dropped, "cancelled")).status)

            for _ in range(600):
                if len(turns) == 2 and sum(batches) == 25:
                    break
                await asyncio.sleep(0.05)
            print("agent turns:", sorted(turns))
            print("batch sizes:", sorted(batches))
            assert sorted(turns) == [["hello"], [f"hi {i}" for i in range(5)]]
            assert sorted(batches) == [5, 10, 10]
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
