"""LangGraph on pgdurable: a checkpointer, one writer per thread, retention, and a
durable graph run that parks on interrupt() and resumes from a signal.

Run with a migrated database (no network):
    PGDURABLE_DSN=postgresql://... python examples/langgraph_agent.py

Needs ``pip install 'pgdurable[langgraph]'``.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

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


def draft(state: State) -> State:
    return {"log": [f"drafted a refund for {state['request']}"]}


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

        # 3. a durable graph run: interrupt() parks it, a signal resumes it on any worker
        register_graph(app, graph, name="refunds")
        worker = app.worker(concurrency=2)
        task = asyncio.create_task(worker.run())
        try:
            run_id = await run_graph(app, graph, {"request": "order 2"}, thread_id="refund-2")
            parked = await until_status(app, run_id, "waiting")
            print("parked:", parked.state["interrupts"])
            # from anywhere: code, `pgdurable signal langgraph.resume refund-2 --payload ...`
            await resume_graph(app, "refund-2", {"approved": True})
            info = await until_status(app, run_id, "completed", "failed")
            print("result:", info.result)
            assert info.result["log"][-1] == "refunded", info
        finally:
            await worker.stop()
            await task


if __name__ == "__main__":
    asyncio.run(main())
