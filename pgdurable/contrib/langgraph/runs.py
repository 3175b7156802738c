"""A compiled LangGraph graph run as a durable pgdurable run.

::

    register_graph(app, graph, name="support-agent")     # on every worker and client
    run_id = await run_graph(app, graph, {"question": "..."}, thread_id="t-42")
    ...                                                     # interrupt() parks the run
    await resume_graph(app, "t-42", {"approved": True})   # Command(resume=...) as a signal

The graph must be compiled with an :class:`~.saver.AsyncPgDurableSaver`
(``graph.compile(checkpointer=saver)``): LangGraph checkpoints every
super-step in pgdurable's tables, and the run keeps only ``{thread_id, input,
waiting}`` as its own state. Each claim of the run holds the thread's lease
(one writer per thread) and then:

* pending interrupts it was parked on and a resume signal in ``ctx.wake`` ->
  ``graph.ainvoke(Command(resume=payload))``;
* pending interrupts otherwise -> park again (:class:`~pgdurable.Wait` on the
  signal ``("langgraph.resume", thread_id)``: wait = exit, no worker is held);
* a super-step left unfinished (a crash) -> ``graph.ainvoke(None)``: LangGraph
  continues from the last checkpointed super-step, and tasks whose writes
  were saved are not run again. "Unfinished" is read from the snapshot's
  ``tasks``, not its ``next``: ``next`` leaves out tasks whose writes were
  saved, so a crash after a super-step's writes but before its checkpoint
  (LangGraph saves checkpoints in the background) shows an empty ``next``;
* nothing of this run saved yet -> ``graph.ainvoke(input)``.

**Budgets** (``register_graph(..., reserve={...})``): every chat model call
inside the graph reserves from the run's budgets before it is made and settles
the usage it reports (:mod:`.budget`, a LangChain callback handler in the
graph's config); a budget that cannot give it parks the run (woken, the
unfinished super-step runs again) or fails it, by its policy.

When the graph ends, the run completes with the final state values as its
result (JSON; values JSON cannot hold are given as ``str``). The run's
``input`` and the resume payloads are JSON.

**The stream** (``register_graph(..., stream=True)``, the default): the graph
runs with ``astream(..., stream_mode="messages")``, LangGraph's public stream of
the messages its nodes' chat models produce (token by token when the model
streams, else whole); the text of every AI message goes to ``ctx.emit_text``
(buffered: a few ``{"type": "text"}`` rows of the run's output stream, not one
per token). A step continuing after a crash first calls ``ctx.text_so_far()``:
the super-steps LangGraph does not run again do not stream again, so what the
continuation streams is appended after the stored text. A node killed mid-answer
answers again from its start: its text is then stored twice, the cut-off part
and then the whole (LangGraph restarts the node; the text of a node cannot be
resumed mid-way).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Command

from ...runs.steps import Done, RunContext, Wait
from .._budget import check_reserve
from .budget import BudgetCallback
from .saver import DEFAULT_TTL_MS, AsyncPgDurableSaver

if TYPE_CHECKING:
    from ...app.durable import Durable

__all__ = ["RESUME_KIND", "register_graph", "resume_graph", "run_graph"]

#: The signal kind that resumes a parked graph run (ref: the thread id).
RESUME_KIND = "langgraph.resume"
_ATTR = "_pgdurable_graph_task"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _text(message: Any) -> str:
    """The text of an AI message (or chunk) LangGraph streamed; "" for other messages."""
    if not isinstance(message, AIMessage):  # AIMessageChunk is one
        return ""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") if isinstance(b, dict) and b.get("type") == "text"
                   else b if isinstance(b, str) else "" for b in content)


def register_graph(app: Durable, graph: Any, *, name: str = "langgraph", revision: str = "1",
                   max_attempts: int = 3, ttl_ms: int = DEFAULT_TTL_MS,
                   stream: bool = True, reserve: Mapping[str, float] | None = None) -> str:
    """Register ``graph`` as the pgdurable task ``name`` (on workers and clients alike).

    ``ttl_ms`` is the thread lease's TTL: how long a crashed worker keeps the
    thread before another may continue it. ``stream``: the text of the AI
    messages the graph streams goes to the run's output stream
    (``ctx.emit_text``; see the module docstring). ``reserve``: the amounts
    (``{"calls": 1, "tokens_in": 8_000, "usd": 0.05}``) reserved from the run's
    budgets before each chat model call inside the graph and settled from its
    ``usage_metadata`` (:mod:`.budget`); a unit that is not known, or an amount
    that is negative or not a number: :class:`~pgdurable.InvalidInput`.
    Returns ``name``.
    """
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, AsyncPgDurableSaver):
        raise TypeError("register_graph needs a graph compiled with an AsyncPgDurableSaver")
    reserved = check_reserve(reserve, "register_graph")

    async def step(ctx: RunContext, state: dict[str, Any]) -> Done | Wait:
        thread_id = str(state["thread_id"])
        config: RunnableConfig = {"configurable": {"thread_id": thread_id,
                                                   "pgdurable_run_id": ctx.run_id}}
        if reserved is not None:
            config["callbacks"] = [BudgetCallback(ctx, reserved)]
        async with saver.hold_thread(thread_id, wait=True, ttl_ms=ttl_ms):
            snap = await graph.aget_state(config)
            pending = sorted(i.id for i in snap.interrupts)
            wake = ctx.wake or {}
            if pending:
                if wake.get("type") == "signal" and pending == state.get("waiting"):
                    command: Any = Command(resume=wake.get("payload"))
                else:
                    return _park(thread_id, state, snap)
            elif snap.tasks:
                # the super-step of the newest checkpoint is unfinished (a crash). Its
                # tasks whose writes were saved are not in ``snap.next``: when all of
                # them were, ``next`` is empty although the checkpoint that ends the
                # super-step was never saved (LangGraph saves it in the background)
                command = None
            elif await _started(saver, thread_id, ctx.run_id):
                return Done(result=_jsonable(snap.values))
            else:
                command = state.get("input")
            if not stream:
                await graph.ainvoke(command, config)
            else:
                if command is None:  # a continuation: what it streams comes after the stored text
                    await ctx.text_so_far()
                async for message, _ in graph.astream(command, config, stream_mode="messages"):
                    text = _text(message)
                    if text:
                        await ctx.emit_text(text)
            snap = await graph.aget_state(config)
            if snap.interrupts:
                return _park(thread_id, state, snap)
            return Done(result=_jsonable(snap.values))

    app.task(name, revision=revision, max_attempts=max_attempts)(step)
    setattr(graph, _ATTR, name)
    return name


def _park(thread_id: str, state: dict[str, Any], snap: Any) -> Wait:
    waiting = sorted(i.id for i in snap.interrupts)
    interrupts = _jsonable([i.value for i in snap.interrupts])
    return Wait(signal=(RESUME_KIND, thread_id),
                state={**state, "waiting": waiting, "interrupts": interrupts})


async def _started(saver: AsyncPgDurableSaver, thread_id: str, run_id: str) -> bool:
    """True if this run already saved a checkpoint of the thread."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    async for _ in saver.alist(config, filter={"pgdurable_run_id": run_id}, limit=1):
        return True
    return False


async def run_graph(app: Durable, graph: Any, input: Any, *, thread_id: str,
                    idempotency_key: str | None = None, queue: str = "default",
                    budgets: Iterable[str] | None = None,
                    budget: Mapping[str, float] | None = None) -> str:
    """Start a durable run of ``graph`` (registered with :func:`register_graph`) on
    ``thread_id`` with the JSON ``input``; return the run id. ``budgets`` (named
    budgets' keys) and ``budget`` (the run's own limits) as for
    :meth:`Durable.start`: what ``register_graph(..., reserve=...)`` draws from."""
    name = getattr(graph, _ATTR, None)
    if name is None:
        raise ValueError("register the graph first: register_graph(app, graph, name=...)")
    if not isinstance(thread_id, str) or not thread_id:
        raise ValueError("thread_id must be a non-empty str")
    return await app.start(name, state={"thread_id": thread_id, "input": input},
                           idempotency_key=idempotency_key, queue=queue, budgets=budgets,
                           budget=budget)


async def resume_graph(app: Durable, thread_id: str, value: Any, *,
                       signal_id: str | None = None) -> list[str]:
    """Deliver ``Command(resume=value)`` to the run parked on ``thread_id`` (a signal:
    any worker continues it); returns the ids of the runs woken. A resume sent
    before the run parks is kept for it."""
    return await app.signal(RESUME_KIND, thread_id, value, signal_id=signal_id)
