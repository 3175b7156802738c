"""Overhead of a durable Pydantic AI run: per recorded model + tool turn.

One command::

    .venv/bin/python benchmarks/agent_overhead.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres]
        [--turns 1000] [--rounds 3]

The same agent (a scripted ``FunctionModel`` that calls the tool ``step`` once per
turn, ``--turns`` turns, then answers; the tool returns at once) run two ways in
each round, alternately, in one process against a scratch database:

* ``plain``: ``await agent.run(...)``, no durability (the baseline);
* ``durable``: ``start_agent`` + one in-process worker, until ``app.result``: every
  model response and every tool result is a recorded, fenced checkpoint (two per
  turn), the agent's events go to the run's output stream (``stream=True``, the
  default; ``durable-nostream`` without it).

Printed per mode: the median wall time per turn over the rounds, and the overhead
per turn (durable minus plain), with the ratio to plain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from _scratch import drop_scratch, scratch_dsn
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel
from pydantic_ai.usage import UsageLimits

import pgdurable
from pgdurable.contrib.pydantic_ai import PgDurability, start_agent

DB = "pgdurable_bench_agent_overhead"


def make_model(turns: int) -> FunctionModel:
    count = {"n": 0}  # tool results so far in this run (the model is told each turn)

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if any(p.part_kind == "user-prompt" for p in last.parts):
            count["n"] = 0
        else:
            count["n"] += 1
        n = count["n"]
        if n < turns:
            return ModelResponse(parts=[ToolCallPart("step", {"i": n}, tool_call_id=f"c{n}")])
        return ModelResponse(parts=[TextPart(f"done after {n} turns")])

    async def stream(messages: list[ModelMessage],
                     info: AgentInfo) -> AsyncIterator[str | DeltaToolCalls]:
        for part in reply(messages, info).parts:
            if isinstance(part, TextPart):
                yield part.content
            elif isinstance(part, ToolCallPart):
                yield {0: DeltaToolCall(name=part.tool_name, json_args=json.dumps(part.args),
                                        tool_call_id=part.tool_call_id)}

    return FunctionModel(reply, stream_function=stream)


def step(i: int) -> int:
    """One tool call."""
    return i + 1


def agent(turns: int, name: str, capabilities: list[Any]) -> Agent[None, str]:
    a = Agent(make_model(turns), name=name, capabilities=capabilities)
    a.tool_plain(step)
    return a


LIMITS = UsageLimits(request_limit=None, tool_calls_limit=None)


async def plain(a: Agent[None, str]) -> float:
    t = time.perf_counter()
    await a.run("go", usage_limits=LIMITS)
    return time.perf_counter() - t


async def durable(app: pgdurable.Durable, a: Agent[None, str]) -> float:
    t = time.perf_counter()
    rid = await start_agent(app, a, "go", usage_limits=LIMITS)
    await app.result(rid, timeout=3600)
    return time.perf_counter() - t


async def main_async(dsn: str, turns: int, rounds: int) -> None:
    app = pgdurable.Durable(dsn)
    base = agent(turns, "plain", [])
    streamed = agent(turns, "streamed", [PgDurability(app)])
    quiet = agent(turns, "quiet", [PgDurability(app, stream=False)])
    warm = agent(5, "warm", [PgDurability(app)])  # every agent before the worker: it serves them
    worker = app.worker(lease_ttl=timedelta(seconds=300), poll_interval=0.05)
    task = asyncio.create_task(worker.run())
    times: dict[str, list[float]] = {"plain": [], "durable": [], "durable-nostream": []}
    try:
        await plain(base)  # warm-up, both ways
        await durable(app, warm)
        for r in range(rounds):
            times["plain"].append(await plain(base))
            times["durable"].append(await durable(app, streamed))
            times["durable-nostream"].append(await durable(app, quiet))
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                  flush=True)
    finally:
        await worker.stop(grace=5)
        await task
        await app.close()
    per = {k: statistics.median(v) / turns for k, v in times.items()}
    print(f"\n{turns} turns (a model request + a tool call each), median of {rounds} rounds:")
    print(f"  plain              {per['plain'] * 1e3:8.3f} ms/turn")
    for k in ("durable", "durable-nostream"):
        over = per[k] - per["plain"]
        print(f"  {k:<18} {per[k] * 1e3:8.3f} ms/turn   overhead {over * 1e3:7.3f} ms/turn"
              f"   x{per[k] / per['plain']:.2f} of plain")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--turns", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    dsn = scratch_dsn(a.dsn, DB)
    try:
        asyncio.run(main_async(dsn, a.turns, a.rounds))
    finally:
        drop_scratch(a.dsn, DB)


if __name__ == "__main__":
    main()
