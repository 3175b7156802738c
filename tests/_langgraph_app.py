"""A LangGraph graph run by pgdurable workers in real-process tests
(tests/test_contrib_langgraph_runs.py), and a sync graph for the one-writer
tests (``python tests/_langgraph_app.py invoke THREAD WAIT TAG``).

Every node records what it does in the scratch table ``test_ledger(event, pid,
tag)`` that the test creates, committed before the node goes on, so the test
reads from the database which side effects ran and how often.

Graph ``agent`` (run by workers): tool -> crash -> ask -> finish.

* ``tool`` -- the side effect: a ledger row ``tool``; then a chat model
  (LangChain's ``GenericFakeChatModel``, a token per word and space) says
  :data:`TOOL_TEXT`;
* ``crash`` -- with ``kill`` in the state: the first time (no ``killed`` row
  yet) waits until the writes of ``tool`` are saved (LangGraph saves them in
  the background while the next super-step runs) and its text is stored,
  records ``killed`` and SIGKILLs its own process mid-graph. In a process with ``LG_HOLD_STEP=N`` in
  its environment, the saver holds back the save of the checkpoint of step N,
  so the process dies between a super-step's writes and its checkpoint;
* ``ask`` -- with ``ask`` in the state: ``interrupt({"q": ...})``; the answer
  goes into the state;
* ``finish`` -- a ledger row ``finish``; the chat model says :data:`FINISH_TEXT`.

Graph ``metered`` (budgets; ``metered-stream``: the same, streamed): think -> pause ->
answer; ``think`` and ``answer`` each call a chat model that reports :data:`USAGE`
(streamed, LangChain's fake model reports none), and the graph reserves
:data:`METERED` before each call. A test arms ``in:think`` (die after think's call
was settled, before its writes) or ``after:think`` (die in ``pause`` once think's
writes are saved) in ``test_kills`` (tests/_agent_ledger.py).

Graph ``steps`` (sync, one-writer tests): gate -> s1 -> s2 -> s3; ``gate``
waits on ``pg_advisory_lock(GATE)`` (the test holds it) after recording
``gate``; every checkpoint carries ``writer`` (the tag) in its metadata.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import sys
import time
from typing import Annotated, Any, TypedDict

import psycopg
from _agent_ledger import maybe_die
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import pgdurable
from pgdurable.contrib.langgraph import (
    AsyncPgDurableSaver,
    PgDurableSaver,
    ThreadBusy,
    invoke_exclusive,
    register_graph,
)
from pgdurable.foundation.db import resolve_dsn

GATE = 918_273
TOOL_TEXT = "I checked order A-17: it was delivered on Monday, so a refund is due. "
FINISH_TEXT = "The refund is on its way; you will see it within three days."


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    kill: bool
    ask: bool
    answer: Any


def ledger(event: str, tag: str = "") -> None:
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        conn.execute("INSERT INTO test_ledger (event, pid, tag) VALUES (%s, %s, %s)",
                     (event, os.getpid(), tag))


def _count(event: str) -> int:
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM test_ledger WHERE event = %s",
                           (event,)).fetchone()
        return int(row[0]) if row else 0


async def say(text: str) -> None:
    """A chat model call that streams ``text`` (a token per word and space)."""
    await GenericFakeChatModel(messages=iter([AIMessage(text)])).ainvoke("go on")


async def tool(state: State) -> State:
    ledger("tool")
    await say(TOOL_TEXT)
    return {"log": ["tool"]}


def _await_tool_writes(thread: str) -> None:
    """Return once the writes of ``tool`` (the task of checkpoint step 0) are saved:
    LangGraph saves them in the background while the next super-step runs."""
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        while conn.execute("SELECT EXISTS (SELECT FROM pgdurable.lg_writes w "
                           "JOIN pgdurable.lg_checkpoints c USING (thread_id, checkpoint_ns, "
                           "checkpoint_id) WHERE c.metadata->>'step' = '0' "
                           "AND c.thread_id = %s)", (thread,)).fetchone() != (True,):
            time.sleep(0.01)


def _await_tool_text(run_id: str) -> None:
    """Return once the text ``tool`` streamed in run ``run_id`` is stored (a flush every
    100 ms)."""
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        while conn.execute("SELECT string_agg(event->>'text', '' ORDER BY seq) "
                           "FROM pgdurable.run_events WHERE run_id = %s "
                           "AND event->>'type' = 'text'", (run_id,)).fetchone() != (TOOL_TEXT,):
            time.sleep(0.01)


def crash(state: State, config: RunnableConfig) -> State:
    if state.get("kill") and _count("killed") == 0:
        _await_tool_writes(str(config["configurable"]["thread_id"]))
        _await_tool_text(str(config["configurable"]["pgdurable_run_id"]))
        ledger("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"log": ["crash-survived"]}


def ask(state: State) -> State:
    if not state.get("ask"):
        return {"log": ["no-ask"]}
    answer = interrupt({"q": "approve?"})
    return {"log": ["asked"], "answer": answer}


async def finish(state: State) -> State:
    ledger("finish")
    await say(FINISH_TEXT)
    return {"log": ["finish"]}


def agent_graph(checkpointer: Any) -> Any:
    g = StateGraph(State)
    for name, fn in (("tool", tool), ("crash", crash), ("ask", ask), ("finish", finish)):
        g.add_node(name, fn)
    g.add_edge(START, "tool")
    g.add_edge("tool", "crash")
    g.add_edge("crash", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    return g.compile(checkpointer=checkpointer)


# -- graph ``metered`` (budgets): think -> pause -> answer ----------------------------

#: What ``metered`` reserves before each chat model call; :data:`USAGE` is what the
#: model reports (its ``usage_metadata``; usd priced under "GenericFakeChatModel").
METERED = {"calls": 1, "tokens_in": 100, "tokens_out": 50, "usd": 0.05}
USAGE: Any = {"input_tokens": 11, "output_tokens": 4, "total_tokens": 15}


class Metered(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


async def _model(tag: str) -> None:
    """A chat model call reporting :data:`USAGE`; a ledger row ``model`` once it answered."""
    await GenericFakeChatModel(messages=iter([AIMessage(f"{tag} said", usage_metadata=USAGE)])
                               ).ainvoke("go on")
    ledger("model", tag)


async def think(state: Metered) -> Metered:
    await _model("think")
    maybe_die("in:think")  # after the call was settled, before the node's writes
    return {"log": ["think"]}


def pause(state: Metered, config: RunnableConfig) -> Metered:
    if _armed("after:think"):  # once think's writes are saved
        _await_tool_writes(str(config["configurable"]["thread_id"]))
        maybe_die("after:think")
    return {"log": ["pause"]}


async def answer(state: Metered) -> Metered:
    await _model("answer")
    return {"log": ["answer"]}


def _armed(point: str) -> bool:
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        return conn.execute("SELECT FROM test_kills WHERE point = %s", (point,)).fetchone() \
            is not None


def metered_graph(checkpointer: Any) -> Any:
    g = StateGraph(Metered)
    for name, fn in (("think", think), ("pause", pause), ("answer", answer)):
        g.add_node(name, fn)
    g.add_edge(START, "think")
    g.add_edge("think", "pause")
    g.add_edge("pause", "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=checkpointer)


#: The metered graphs of an app built by :func:`build`, by id(app) and name.
METERED_GRAPHS: dict[tuple[int, str], Any] = {}


class _HeldSaver(AsyncPgDurableSaver):
    """Never saves the checkpoint of step ``LG_HOLD_STEP`` (its save waits forever)."""

    async def aput(self, config: Any, checkpoint: Any, metadata: Any,
                   new_versions: Any) -> Any:
        if str(metadata.get("step")) == os.environ.get("LG_HOLD_STEP"):
            await asyncio.sleep(3600)
        return await super().aput(config, checkpoint, metadata, new_versions)


def build(dsn: str | None = None) -> tuple[pgdurable.Durable, Any]:
    """The app and its graph (registered as task ``agent``; thread lease TTL 2 s)."""
    dsn = dsn or resolve_dsn() or ""
    app = pgdurable.Durable(dsn)
    graph = agent_graph(_HeldSaver(dsn))
    register_graph(app, graph, name="agent", ttl_ms=2000)
    for name, stream in (("metered", False), ("metered-stream", True)):
        metered = metered_graph(AsyncPgDurableSaver(dsn))
        register_graph(app, metered, name=name, ttl_ms=2000, stream=stream, reserve=METERED)
        METERED_GRAPHS[id(app), name] = metered
    return app, graph


app: pgdurable.Durable | None = None
graph: Any = None
if os.environ.get("PGDURABLE_DSN"):
    app, graph = build()


# -- the sync graph for the one-writer tests --------------------------------
class Steps(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def _gate(state: Steps) -> Steps:
    ledger("gate", os.environ.get("WRITER", ""))
    with psycopg.connect(resolve_dsn() or "", autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))
    return {"log": ["gate"]}


def steps_graph(saver: PgDurableSaver) -> Any:
    g = StateGraph(Steps)
    g.add_node("gate", _gate)
    names = ["gate"]
    for i in range(1, 4):
        name = f"s{i}"
        g.add_node(name, lambda s, n=name: {"log": [n]})
        g.add_edge(names[-1], name)
        names.append(name)
    g.add_edge(START, "gate")
    g.add_edge(names[-1], END)
    return g.compile(checkpointer=saver)


def main(argv: list[str]) -> int:
    _, thread, wait, tag = argv
    os.environ["WRITER"] = tag
    with PgDurableSaver(resolve_dsn() or "") as saver:
        config: Any = {"configurable": {"thread_id": thread, "writer": tag}}
        try:
            invoke_exclusive(steps_graph(saver), {"log": [f"start-{tag}"]}, config,
                             wait=wait == "wait", ttl_ms=2000)
        except ThreadBusy as exc:
            print(f"busy: {exc}", flush=True)
            return 3
    ledger("done", tag)
    return 0


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "invoke":
    sys.exit(main(sys.argv[1:]))
