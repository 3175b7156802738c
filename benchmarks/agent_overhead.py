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

Printed per mode, medians over the rounds:

* ``wall``: the run's wall time per turn (start to result: for ``durable`` the
  start, the claim and the result wait included), the overhead per turn (durable
  minus plain) and the ratio to plain;
* ``inside``: the time per turn measured from inside the model function (from
  its first call to its last, over the turns between: what a turn costs once the
  run is going, without the start and the result wait), the overhead per turn,
  and the same over the first and the last 10 % of the turns (a turn's cost
  grows with the history Pydantic AI sends the model).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
#: perf_counter() at each model call of the run going on (runs are sequential)
CALLS: list[float] = []


def make_model(turns: int) -> FunctionModel:
    count = {"n": 0}  # tool results so far in this run (the model is told each turn)

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        CALLS.append(time.perf_counter())
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


class Timing:
    """One run: its wall time and the times between its model calls (one per turn)."""

    def __init__(self, wall: float, calls: list[float]) -> None:
        self.wall = wall
        self.turns = [b - a for a, b in itertools.pairwise(calls)]

    def inside(self, part: slice = slice(None)) -> float:
        """Mean seconds per turn over ``part`` of the turns, from inside the model."""
        turns = self.turns[part]
        return sum(turns) / len(turns)


async def plain(a: Agent[None, str]) -> Timing:
    CALLS.clear()
    t = time.perf_counter()
    await a.run("go", usage_limits=LIMITS)
    return Timing(time.perf_counter() - t, CALLS[:])


async def durable(app: pgdurable.Durable, a: Agent[None, str]) -> Timing:
    CALLS.clear()
    t = time.perf_counter()
    rid = await start_agent(app, a, "go", usage_limits=LIMITS)
    await app.result(rid, timeout=3600)
    return Timing(time.perf_counter() - t, CALLS[:])


async def main_async(dsn: str, turns: int, rounds: int) -> None:
    app = pgdurable.Durable(dsn)
    base = agent(turns, "plain", [])
    streamed = agent(turns, "streamed", [PgDurability(app)])
    quiet = agent(turns, "quiet", [PgDurability(app, stream=False)])
    warm = agent(5, "warm", [PgDurability(app)])  # every agent before the worker: it serves them
    worker = app.worker(lease_ttl=timedelta(seconds=300), poll_interval=0.05)
    task = asyncio.create_task(worker.run())
    times: dict[str, list[Timing]] = {"plain": [], "durable": [], "durable-nostream": []}
    try:
        await plain(base)  # warm-up, both ways
        await durable(app, warm)
        for r in range(rounds):
            times["plain"].append(await plain(base))
            times["durable"].append(await durable(app, streamed))
            times["durable-nostream"].append(await durable(app, quiet))
            print(f"round {r + 1}: " + ", ".join(
                f"{k} {v[-1].wall:.2f} s (inside {v[-1].inside() * turns:.2f} s)"
                for k, v in times.items()), flush=True)
    finally:
        await worker.stop(grace=5)
        await task
        await app.close()
    tenth = max(1, turns // 10)

    def med(k: str, f: Any) -> float:
        return statistics.median(f(t) for t in times[k]) * 1e3

    print(f"\n{turns} turns (a model request + a tool call each), median of {rounds} rounds:")
    for what, f in (("wall", lambda t: t.wall / turns), ("inside", lambda t: t.inside()),
                    ("inside, first 10 %", lambda t: t.inside(slice(None, tenth))),
                    ("inside, last 10 %", lambda t: t.inside(slice(-tenth, None)))):
        base_ms = med("plain", f)
        print(f"  {what}:")
        print(f"    plain              {base_ms:8.3f} ms/turn")
        for k in ("durable", "durable-nostream"):
            ms = med(k, f)
            print(f"    {k:<18} {ms:8.3f} ms/turn   overhead {ms - base_ms:+8.3f} ms/turn"
                  f"   x{ms / base_ms:.2f} of plain")


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
