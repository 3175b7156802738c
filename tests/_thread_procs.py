"""Subprocess helpers and the test app for tests/test_threads.py and tests/test_stream.py.

The app (``tests._thread_procs:app``) reads its DSN from ``PGDURABLE_DSN``.
Its tasks write a scratch history into ``t_steps`` / ``t_consumed`` (created
by :func:`create_scratch`), with ``clock_timestamp()`` so that overlaps can be
checked afterwards:

* ``chat``: drain the inbox, record each message, then ``Done`` (messages
  that arrive meanwhile start the follow-up run at the handoff). ``{"sleep": s}`` in a message sleeps; the
  file named by ``PGD_BLOCK_FILE`` (if set) blocks a step while it exists.
* ``talker``: emits ``EVENTS_PER_STEP`` events per step for ``STEPS`` steps
  (deterministic payloads); step 2 blocks while ``PGD_BLOCK_FILE`` exists.

Commands (``python -m tests._thread_procs <cmd> ...``):

* ``send <dsn> <thread> <message_id> <json>``: one sync send; prints the delivery.
* ``sender <dsn> <thread> <name> <n>``: n sends of ``{"sender": name, "i": i}``.
* ``follow <dsn> <run_id>``: stream the run; one JSON line per event.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import psycopg

from pgdurable import Continue, Done, Durable, DurableClient, RunContext

STEPS = 4
EVENTS_PER_STEP = 5

SCRATCH = """
CREATE TABLE IF NOT EXISTS public.t_steps (
  run_id uuid, step int, attempt int, started_at timestamptz, ended_at timestamptz);
CREATE TABLE IF NOT EXISTS public.t_consumed (
  run_id uuid, step int, seq bigint, payload jsonb, at timestamptz DEFAULT clock_timestamp());
"""


def create_scratch(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(SCRATCH)


app = Durable(os.environ.get("PGDURABLE_DSN", "postgresql:///unused"), pool_size=4)
app.thread_task("", "chat")
app.thread_task("talk:", "talker")


async def _sql(sql: str, params: tuple[Any, ...]) -> None:
    async with app.pool.connection() as c:
        await c.execute(sql, params)


def _wait_file(path: str | None) -> None:
    while path and os.path.exists(path):
        time.sleep(0.05)


async def _blocked() -> None:
    """Block while the file named by PGD_BLOCK_FILE exists (crash tests kill us here)."""
    await asyncio.to_thread(_wait_file, os.environ.get("PGD_BLOCK_FILE"))


@app.task("chat", max_attempts=10, retry_base=0.05, retry_cap=0.2)
async def chat(ctx: RunContext, state: Any) -> Any:
    await _sql("INSERT INTO public.t_steps VALUES (%s, %s, %s, clock_timestamp(), NULL)",
               (ctx.run_id, ctx.step, ctx.attempt))
    msgs = await ctx.inbox()
    for m in msgs:
        await _sql("INSERT INTO public.t_consumed (run_id, step, seq, payload) VALUES (%s, %s, %s, %s)",
                   (ctx.run_id, ctx.step, m.seq, json.dumps(m.payload)))
        if isinstance(m.payload, dict) and "sleep" in m.payload:
            await asyncio.sleep(float(m.payload["sleep"]))
    await _blocked()
    await _sql("UPDATE public.t_steps SET ended_at = clock_timestamp() "
               "WHERE run_id = %s AND step = %s AND ended_at IS NULL", (ctx.run_id, ctx.step))
    seen = int((state or {}).get("seen", 0)) + len(msgs)
    return Done({"seen": seen}, state={"seen": seen})  # later messages: a follow-up run


@app.task("talker", max_attempts=10, retry_base=0.05, retry_cap=0.2)
async def talker(ctx: RunContext, state: Any) -> Any:
    await _sql("INSERT INTO public.t_steps VALUES (%s, %s, %s, clock_timestamp(), NULL)",
               (ctx.run_id, ctx.step, ctx.attempt))
    for i in range(EVENTS_PER_STEP):
        await ctx.emit({"step": ctx.step, "i": i})
        if ctx.step == 2 and i == 2:
            await _blocked()
    if ctx.step + 1 >= STEPS:
        return Done("talked")
    return Continue(state)


def _say(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def _delivery(d: Any) -> dict[str, Any]:
    return {"action": d.action, "run_id": d.run_id, "seq": d.seq, "duplicate": d.duplicate}


def main(argv: list[str]) -> None:
    cmd, dsn = argv[0], argv[1]
    if cmd == "send":
        with DurableClient(dsn, app=app) as client:
            _say("ready")
            d = client.send(argv[2], json.loads(argv[4]), message_id=argv[3])
            _say(_delivery(d))
        os._exit(0)  # S2: exit right after send returned
    elif cmd == "sender":
        thread, name, n = argv[2], argv[3], int(argv[4])
        out = []
        with DurableClient(dsn, app=app) as client:
            for i in range(n):
                d = client.send(thread, {"sender": name, "i": i}, message_id=f"{name}-{i}")
                out.append(d.action)
        _say({"wake": out.count("wake"), "deliver": out.count("deliver")})
    elif cmd == "follow":
        async def follow() -> None:
            a = Durable(dsn, pool_size=2)
            async with a:
                _say("ready")
                async for ev in a.stream(argv[2], poll=0.5):
                    _say({"seq": ev.seq, "event": ev.event, "final": ev.final,
                          "t": time.monotonic()})
        asyncio.run(follow())
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
