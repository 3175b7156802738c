"""What a budget costs a framework's model call (issue 42): a durable OpenAI Agents SDK
run and a durable LangGraph run, each with ``reserve=`` (every model call reserved from
a budget before and settled from its usage after) against the same run without it, in
the same run of the benchmark.

One command::

    .venv/bin/python benchmarks/budget_integrations.py
        [--dsn postgresql://postgres@127.0.0.1:5432/postgres] [--calls 100] [--rounds 5]

``--dsn`` names a maintenance database; the benchmark creates (and afterwards drops)
its scratch database ``pgdurable_bench_budget_integrations`` and migrates it. One
in-process worker runs every run; in each round the plain and the metered run of each
framework alternate (the order flips every round).

* OpenAI Agents: an agent on the SDK's ``ScriptedModel`` that calls a tool ``--calls``
  times, then answers (``--calls`` + 1 model calls, each a recorded effect; the tool
  calls too), ``register_agent`` with and without ``reserve=``;
* LangGraph: a graph whose one node calls LangChain's ``GenericFakeChatModel``
  ``--calls`` times (each reporting its usage), ``register_graph(..., stream=False)``
  with and without ``reserve=`` (the callback handler).

Printed per framework: the wall time per model call (start to result over the model
calls: the start, the claim and the result wait included), plain and metered, with
their spread over the rounds, the extra time per call and the ratio of the medians.
The reservation draws from two budgets (a named one and the run's own) in four units
(calls, tokens_in, tokens_out, usd priced from the price table).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any, TypedDict

from _driver import load, spread
from _scratch import drop_scratch, scratch_dsn

import pgdurable

DB = "pgdurable_bench_budget_integrations"
RESERVE = {"calls": 1, "tokens_in": 1_000, "tokens_out": 500, "usd": 0.01}
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


def openai_agents(app: pgdurable.Durable, calls: int, runs: int) -> None:
    from agents import Agent, RunConfig, function_tool
    from agents.testing import (
        ModelCall,
        ModelStep,
        ScriptedModel,
        assistant_message,
        function_call,
    )
    from agents.usage import Usage

    from pgdurable.contrib.openai_agents import register_agent

    def turn(call: ModelCall) -> list[Any]:
        items = call.input if isinstance(call.input, list) else []
        done = sum(1 for i in items if (i if isinstance(i, dict) else i.model_dump()).get(
            "type") == "function_call_output")
        if done < calls:
            return [function_call("step", {"i": done}, call_id=f"c-{done}")]
        return [assistant_message("done")]

    @function_tool
    def step(i: int) -> str:
        """One step."""
        return f"ok {i}"

    model = ScriptedModel([ModelStep.respond(turn) for _ in range((calls + 1) * runs)],
                          default_usage=Usage(requests=1, input_tokens=70, output_tokens=12,
                                              total_tokens=82))
    agent = Agent(name="bench", model=model, tools=[step])
    config = RunConfig(tracing_disabled=True)
    register_agent(app, agent, name="oa-plain", run_config=config, max_turns=calls + 5)
    register_agent(app, agent, name="oa-metered", run_config=config, max_turns=calls + 5,
                   reserve=RESERVE)


class State(TypedDict, total=False):
    n: int


def langgraph(app: pgdurable.Durable, dsn: str, calls: int) -> dict[str, Any]:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph

    from pgdurable.contrib.langgraph import AsyncPgDurableSaver, register_graph

    usage: Any = {"input_tokens": 70, "output_tokens": 12, "total_tokens": 82}

    async def talk(state: State) -> State:
        for _ in range(calls):
            await GenericFakeChatModel(messages=iter([AIMessage("ok", usage_metadata=usage)])
                                       ).ainvoke("go on")
        return {"n": calls}

    graphs = {}
    for name, reserve in (("lg-plain", None), ("lg-metered", RESERVE)):
        g = StateGraph(State)
        g.add_node("talk", talk)
        g.add_edge(START, "talk")
        g.add_edge("talk", END)
        graphs[name] = g.compile(checkpointer=AsyncPgDurableSaver(dsn))
        register_graph(app, graphs[name], name=name, stream=False, reserve=reserve)
    return graphs


async def timed(app: pgdurable.Durable, start: Any, calls: int) -> float:
    """ms per model call of one run, start to result."""
    t = time.perf_counter()
    rid = await start()
    await app.result(rid, timeout=600)
    return (time.perf_counter() - t) * 1000 / calls


async def main(dsn: str, calls: int, rounds: int) -> None:
    from pgdurable.contrib.langgraph import run_graph
    from pgdurable.contrib.openai_agents import run_agent

    app = pgdurable.Durable(dsn, pool_size=8)
    openai_agents(app, calls, rounds * 2 + 2)
    graphs = langgraph(app, dsn, calls)
    async with app:
        await app.budget("tenant", limit={"calls": 1e9, "usd": 1e9})
        for model in ("ScriptedModel", "GenericFakeChatModel"):
            await app.set_price(model, usd_per_token_in=0.000002, usd_per_token_out=0.000008)
        worker = app.worker(concurrency=1, poll_interval=0.05)
        running = asyncio.create_task(worker.run())
        n = 0

        def oa(task: str) -> Any:
            async def start() -> str:
                nonlocal n
                n += 1
                budgets = {"budgets": ["tenant"], "budget": {"usd": 1e6}} \
                    if task.endswith("metered") else {}
                return await run_agent(app, task, "go", session_id=f"s-{n}", **budgets)
            return start

        def lg(task: str) -> Any:
            async def start() -> str:
                nonlocal n
                n += 1
                budgets = {"budgets": ["tenant"], "budget": {"usd": 1e6}} \
                    if task.endswith("metered") else {}
                return await run_graph(app, graphs[task], {"n": 0}, thread_id=f"t-{n}",
                                       **budgets)
            return start

        try:
            await timed(app, oa("oa-metered"), calls + 1)  # warm-up, not counted
            await timed(app, lg("lg-metered"), calls)
            times: dict[str, list[float]] = {k: [] for k in (
                "oa-plain", "oa-metered", "lg-plain", "lg-metered")}
            for r in range(rounds):
                order = ["plain", "metered"] if r % 2 == 0 else ["metered", "plain"]
                for kind in order:
                    times[f"oa-{kind}"].append(await timed(app, oa(f"oa-{kind}"), calls + 1))
                for kind in order:
                    times[f"lg-{kind}"].append(await timed(app, lg(f"lg-{kind}"), calls))
        finally:
            await worker.stop()
            await running
        settled = await app.fetchall(
            "SELECT unit, settled FROM pgdurable.budget_usage WHERE budget_key = 'tenant' "
            "ORDER BY unit", ())
    print(f"{calls} model calls a run, {rounds} rounds, {load()}")
    for fw, label in (("oa", "OpenAI Agents"), ("lg", "LangGraph")):
        p, m = statistics.median(times[f"{fw}-plain"]), statistics.median(times[f"{fw}-metered"])
        print(f"{label}: ms per model call, plain {spread(times[f'{fw}-plain'])}; "
              f"with reserve= {spread(times[f'{fw}-metered'])}; "
              f"+{m - p:.2f} ms a call, x{m / p:.2f}")
    print("settled on the named budget:", {u: float(s) for u, s in settled})


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    bench = scratch_dsn(args.dsn, DB)
    try:
        asyncio.run(main(bench, args.calls, args.rounds))
    finally:
        drop_scratch(args.dsn, DB)
