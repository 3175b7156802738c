"""LangGraph on pgdurable: a checkpointer, one writer per thread, retention, and a
durable graph run that parks on interrupt() and resumes from a signal, its chat
model calls charged to a budget.

Run with a migrated database (no network):
    PGDURABLE_DSN=postgresql://... python examples/langgraph_agent.py

Needs ``pip install 'pgdurable[langgraph]'``.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import pgdurable
from pgdurable.contrib.langgraph import (
    AsyncPgDurableSaver,
    ThreadBusy,
    ainvoke_exclusive,
    register_graph,
    resume_graph,
    run_graph,
)
from pgdurable.retention import prune


class State(TypedDict, total=False):
    request: str
    log: Annotated[list[str], operator.add]
    approved: bool


async def draft(state: State) -> State:
    # a chat model drafts (LangChain's fake model: no network; it reports its usage)
    model = GenericFakeChatModel(messages=iter([AIMessage(
        f"Refund {state['request']}: delivered late.",
        usage_metadata={"input_tokens": 40, "output_tokens": 9, "total_tokens": 49})]))
    reply = await model.ainvoke(f"draft a refund for {state['request']}")
    return {"log": [f"drafted: {reply.content}"]}


def approve(state: State) -> State:
    # parks the durable run: no worker waits; resume_graph(...) answers it
    answer = interrupt({"question": f"refund {state['request']}?"})
    return {"approved": bool(answer.get("approved")), "log": ["a human answered"]}


def act(state: State) -> State:
    return {"log": ["refunded" if state.get("approved") else "refused"]}


def build_graph(saver: AsyncPgDurableSaver) -> Any:
    g = StateGraph(State)
    g.add_node("draft", draft)
    g.add_node("approve", approve)
    g.add_node("act", act)
    g.add_edge(START, "draft")
    g.add_edge("draft", "approve")
    g.add_edge("approve", "act")
    g.add_edge("act", END)
    return g.compile(checkpointer=saver)


async def until_status(app: pgdurable.Durable, run_id: str, *statuses: str) -> pgdurable.RunInfo:
    """Poll the run until it has one of ``statuses``."""
    for _ in range(1200):
        info = await app.get_run(run_id)
        if info.status in statuses:
            return info
        await asyncio.sleep(0.05)
    raise TimeoutError(run_id)


async def main() -> None:
    dsn = pgdurable.resolve_dsn() or ""
    app = pgdurable.Durable(dsn)
    async with app, AsyncPgDurableSaver(dsn) as saver:
        graph = build_graph(saver)

        # 1. a plain checkpointer, one writer per thread: a second caller fails fast
        config: Any = {"configurable": {"thread_id": "direct-1"}}
        async with saver.hold_thread("direct-1"):
            try:
                await ainvoke_exclusive(graph, {"request": "order 1"}, config, wait=False)
            except ThreadBusy as exc:
                print("second writer refused:", exc)
        await ainvoke_exclusive(graph, {"request": "order 1"}, config)  # parks on interrupt
        state = await graph.aget_state(config)
        print("direct thread waits on:", [i.value for i in state.interrupts])

        # 2. retention: keep the last 2 checkpoints of each thread, pruned by `pgdurable prune`
        await saver.set_retention(keep_last=2)
        pruned = await prune(app, "7d")
        print("pruned LangGraph checkpoints:", pruned.graph_checkpoints)

        # 3. a durable graph run: interrupt() parks it, a signal resumes it on any worker;
        #    reserve=: each chat model call holds this much of the run's budgets first and
        #    settles its usage_metadata (stream=False: the fake model streams no usage)
        register_graph(app, graph, name="refunds", stream=False,
                       reserve={"calls": 1, "tokens_in": 1_000, "tokens_out": 500})
        await app.budget("tenant:acme", limit={"calls": 100, "tokens_in": 100_000},
                         policy="fail")
        worker = app.worker(concurrency=2)
        task = asyncio.create_task(worker.run())
        try:
            run_id = await run_graph(app, graph, {"request": "order 2"}, thread_id="refund-2",
                                     budgets=["tenant:acme"])
            parked = await until_status(app, run_id, "waiting")
            print("parked:", parked.state["interrupts"])
            # from anywhere: code, `pgdurable signal langgraph.resume refund-2 --payload ...`
            await resume_graph(app, "refund-2", {"approved": True})
            info = await until_status(app, run_id, "completed", "failed")
            print("result:", info.result)
            assert info.result["log"][-1] == "refunded", info
            spent = {r[0]: r[1] for r in await app.fetchall(
                "SELECT unit, settled FROM pgdurable.budget_usage "
                "WHERE budget_key = 'tenant:acme'", ())}
            print("tenant:acme spent:", spent)  # one call (the draft): 40 tokens in, 9 out
            assert spent == {"calls": 1, "tokens_in": 40, "tokens_out": 9}, spent
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
