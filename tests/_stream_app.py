"""The app of the token-stream tests (tests/test_streams.py, the browser test, the
benchmark): a thread task that answers every message with a long scripted text,
streamed with ``ctx.emit_text`` (``chat``: one run that parks on its inbox; ``once``: a run
per answer), and a run task that streams one answer.

``STREAM_DELAY`` (seconds between two tokens, default 0.005) paces the answers."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from _stream_script import script, tokens

from pgdurable import Done, Durable, RunContext

app = Durable()
app.thread_task("chat:", "chat")
app.thread_task("strict:", "chat", double_text="reject")  # a route's own strategy
app.thread_task("once:", "once")  # a run per answer: a follow-up run by lease transfer
DELAY = float(os.environ.get("STREAM_DELAY", "0.005"))


@app.task("chat")
async def chat(ctx: RunContext, state: Any) -> Any:
    history = list((state or {}).get("history", []))
    msgs = await ctx.inbox()
    if msgs:
        prompt = "+".join(str(m.payload["text"]) for m in msgs)
        words = int(msgs[-1].payload.get("words", 60))
        for tok in tokens(script(prompt, words)):
            await ctx.emit_text(tok)
            await asyncio.sleep(DELAY)
        history.append({"answered": [m.message_id for m in msgs], "prompt": prompt})
    return ctx.wait_inbox(state={"history": history})


@app.task("once")
async def once(ctx: RunContext, state: Any) -> Any:
    """Answers what its inbox holds, then ends: a message sent meanwhile is answered by
    the follow-up run the thread's lease is transferred to."""
    msgs = await ctx.inbox()
    prompt = "+".join(str(m.payload["text"]) for m in msgs)
    for tok in tokens(script(prompt, int(msgs[-1].payload.get("words", 60)) if msgs else 0)):
        await ctx.emit_text(tok)
        await asyncio.sleep(DELAY)
    return Done({"answered": [m.message_id for m in msgs], "prompt": prompt})


@app.task("long")
async def long(ctx: RunContext, state: Any) -> Any:
    text = script(str(state["prompt"]), int(state.get("words", 200)))
    for tok in tokens(text):
        await ctx.emit_text(tok)
        await asyncio.sleep(float(state.get("delay", DELAY)))
    return Done(len(text))
