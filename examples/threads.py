"""Threads and streams: one agent run per conversation, follow-ups routed to it, output followed live.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/threads.py

``app.send("chat:42", message)`` starts the thread's run if none owns it
("wake") or appends to the owner's inbox ("deliver"), atomically, so three
web processes receiving messages for the same conversation at once start one
run, never three. The run drains its inbox at step boundaries, streams what it
produces with ``ctx.emit``, and any client follows that stream from any
process with ``app.stream`` / ``app.stream_thread``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pgdurable
from pgdurable import Done, RunContext

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
app.thread_task("chat:", "agent")  # threads "chat:..." run the task "agent"


@app.task("agent")
async def agent(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Answer every message in the inbox, token by token; park until the next one."""
    history = list(state.get("history", []))
    for msg in await ctx.inbox():  # consumed with this step's checkpoint
        words = f"you said: {msg.payload['text']}".split()
        for word in words:
            await ctx.emit({"token": word})  # a retried step overwrites, never duplicates
        history.append(msg.payload["text"])
        if msg.payload["text"] == "bye":
            return Done({"turns": len(history)}, state={"history": history})
    return ctx.wait_inbox(state={"history": history})  # a send wakes it


async def main() -> None:
    async with app:
        worker = app.worker(concurrency=4)
        task = asyncio.create_task(worker.run())
        try:
            first = await app.send("chat:42", {"text": "hello"})
            print(first)  # Delivery(action='wake', run_id=..., seq=1, ...)
            again = await app.send("chat:42", {"text": "how are you"}, message_id="m-2")
            assert again.action == "deliver" and again.run_id == first.run_id
            # a retried HTTP request with the same message id is stored once
            assert (await app.send("chat:42", {"text": "how are you"}, message_id="m-2")).duplicate
            await app.send("chat:42", {"text": "bye"})
            tokens = []
            async for ev in app.stream(first.run_id):  # replay from 0, then live, until the end
                if ev.final:
                    print("end:", ev.event["status"], ev.event["result"])
                else:
                    tokens.append(ev.event["token"])
            print(" ".join(tokens))
            rows = await app.fetchall(
                "SELECT thread_key, run_id::text, inbox_depth, stream_position "
                "FROM pgdurable.thread_owners", ())
            print("threads:", rows)
            assert tokens[:3] == ["you", "said:", "hello"]
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
