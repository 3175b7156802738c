"""Token streams to the browser: ctx.emit_text, the HTTP endpoints, a scoped token.

Run with a migrated database:  PGDURABLE_DSN=postgresql://... python examples/streaming.py

A thread task answers each message token by token with ``ctx.emit_text``
(buffered: a live tail every ~20 ms, a stored row every ~100 ms). The ASGI
app of ``pgdurable.http.create_app`` takes the message and streams the answer
as Server-Sent Events; a browser would hold the scoped token the send returns
(read-only, this thread only). Here httpx calls the app in-process.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import httpx

import pgdurable
from pgdurable import RunContext
from pgdurable.http import create_app

app = pgdurable.Durable()  # DSN from PGDURABLE_DSN / DATABASE_URL
app.stream_secrets = [secrets.token_hex(32)]  # in production: PGDURABLE_STREAM_SECRETS
app.thread_task("chat:", "agent", double_text="interrupt")


@app.task("agent")
async def agent(ctx: RunContext, state: dict[str, Any]) -> Any:
    """Answer the inbox token by token; park until the next message."""
    for msg in await ctx.inbox():
        for word in f"you said: {msg.payload['text']}".split():
            await ctx.emit_text(word + " ")  # an LLM's tokens, streamed
            await asyncio.sleep(0.01)
    return ctx.wait_inbox(state=state)


async def main() -> None:
    api = create_app(app, authorize=lambda request, access: True)  # your session check here
    async with app, httpx.AsyncClient(transport=httpx.ASGITransport(app=api),
                                      base_url="http://agent") as http:
        w = app.worker()
        t = asyncio.create_task(w.run())
        sent = (await http.post("/threads/chat%3A42/messages",
                                json={"message": {"text": "hello there"}, "message_id": "m1"})).json()
        token = sent["token"]  # read-only, for this thread: safe to hand to a browser
        sse = await http.get("/threads/chat%3A42/stream", params={"message": "m1"},
                             headers={"Authorization": f"Bearer {token}"})
        text = "".join(json.loads(line[6:])["text"] for block in sse.text.split("\n\n")
                       if "event: text" in block for line in block.splitlines()
                       if line.startswith("data: "))
        print(repr(text))  # 'you said: hello there '
        await w.stop()
        await t


if __name__ == "__main__":
    asyncio.run(main())
