"""Budgets for a durable graph run: a LangChain callback handler that reserves from
the run's budgets before each chat model (or LLM) call and settles its usage.

``register_graph(app, graph, reserve={"calls": 1, "tokens_in": 8_000})`` runs the
graph with a :class:`BudgetCallback` in its config (``callbacks``), LangChain's
public hook around every model call made inside the graph's nodes:

* ``on_chat_model_start`` / ``on_llm_start`` -- ``ctx.reserve(**reserve)``, before
  the model is called. A budget that cannot give it raises out of the model call
  (the handler has ``raise_error``): the node fails, ``graph.ainvoke`` raises, and
  the run parks (policy ``park``; woken, the unfinished super-step runs again) or
  fails with :class:`~pgdurable.BudgetExceeded` (``fail``);
* ``on_llm_end`` -- settles the ``usage_metadata`` of the AIMessage(s) of the
  :class:`~langchain_core.outputs.LLMResult` (``input_tokens``, ``output_tokens``;
  an LLM's ``llm_output["token_usage"]`` when there is no message), usd priced
  under the model's ``ls_model_name`` (else its class name) when ``reserve``
  names usd. A call whose usage was not reported (a model that streams without
  usage) is charged ``calls`` and, for the other units, what was reserved;
* ``on_llm_error`` -- releases the reservation.

The reservation key is the LangGraph task's (``langgraph_checkpoint_ns``: the
node and its task id, the same when LangGraph runs the task again from its
checkpoint) and the call's number in the task: a node that settled a call and
was cut by a crash runs again and finds its settlement, so the call is not
charged twice; a node whose writes were saved is not run again at all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, LLMResult

from ...runs.budgets import Reservation, write_settlements
from ...runs.steps import RunContext
from .._budget import usage_amounts

__all__ = ["BudgetCallback"]


def _model_name(serialized: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None,
                kwargs: Mapping[str, Any]) -> str | None:
    """The model's name in the price table: LangChain's ``ls_model_name``, else the
    model's class name (the last part of its serialized id)."""
    name = (metadata or {}).get("ls_model_name")
    if isinstance(name, str) and name:
        return name
    ident = (serialized or {}).get("id")
    if isinstance(ident, list) and ident and isinstance(ident[-1], str):
        return ident[-1]
    named = kwargs.get("name")
    return named if isinstance(named, str) and named else None


def _usage(response: LLMResult) -> tuple[int, int] | None:
    """(input, output) tokens of a model call's result; None when it reported none."""
    tin = tout = 0
    found = False
    for generations in response.generations:
        for g in generations:
            message = g.message if isinstance(g, ChatGeneration) else None
            usage = message.usage_metadata if isinstance(message, AIMessage) else None
            if usage:
                found = True
                tin += int(usage.get("input_tokens") or 0)
                tout += int(usage.get("output_tokens") or 0)
    if not found:
        token_usage = (response.llm_output or {}).get("token_usage")
        if isinstance(token_usage, Mapping) and token_usage:
            found = True
            tin = int(token_usage.get("prompt_tokens") or token_usage.get("input_tokens") or 0)
            tout = int(token_usage.get("completion_tokens")
                       or token_usage.get("output_tokens") or 0)
    return (tin, tout) if found else None


class BudgetCallback(AsyncCallbackHandler):
    """Reserve ``reserve`` from the run's budgets before each model call of the graph
    and settle its usage after (see the module docstring). One per run step."""

    raise_error = True  # a budget that says no stops the model call

    def __init__(self, ctx: RunContext, reserve: Mapping[str, float]) -> None:
        self.ctx = ctx
        self.reserve = dict(reserve)
        self._open: dict[UUID, tuple[Reservation, str | None]] = {}
        self._calls: dict[str, int] = {}

    def _key(self, metadata: Mapping[str, Any] | None) -> str:
        task = str((metadata or {}).get("langgraph_checkpoint_ns") or "")
        n = self._calls.get(task, 0) + 1
        self._calls[task] = n
        if len(task) > 150:  # a deep subgraph's namespace: its digest (keys are <= 200)
            task = hashlib.sha256(task.encode()).hexdigest()
        return f"model:{task}#{n}" if task else f"model:#{n}"

    async def _start(self, run_id: UUID, serialized: Mapping[str, Any] | None,
                     metadata: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> None:
        r = self.ctx.reserve(key=self._key(metadata), **self.reserve)
        await r.__aenter__()  # parks or fails here, before the model is called
        self._open[run_id] = (r, _model_name(serialized, metadata, kwargs))

    async def on_chat_model_start(self, serialized: dict[str, Any],
                                  messages: list[list[Any]], *, run_id: UUID,
                                  parent_run_id: UUID | None = None,
                                  tags: list[str] | None = None,
                                  metadata: dict[str, Any] | None = None,
                                  **kwargs: Any) -> None:
        await self._start(run_id, serialized, metadata, kwargs)

    async def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *,
                           run_id: UUID, parent_run_id: UUID | None = None,
                           tags: list[str] | None = None,
                           metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        await self._start(run_id, serialized, metadata, kwargs)

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID,
                         parent_run_id: UUID | None = None, tags: list[str] | None = None,
                         **kwargs: Any) -> None:
        opened = self._open.pop(run_id, None)
        if opened is None:
            return
        r, model = opened
        usage = _usage(response)
        spent = usage_amounts(*(usage or (0, 0)), self.reserve, measured=usage is not None)
        r.settle(model=model if "usd" in self.reserve and usage is not None else None,
                 **spent)
        await r.__aexit__(None, None, None)
        # written now (not with the step's checkpoint): LangGraph saves the node's writes
        # before the step ends, and a node not run again must still be charged
        await write_settlements(self.ctx)

    async def on_llm_error(self, error: BaseException, *, run_id: UUID,
                           parent_run_id: UUID | None = None, tags: list[str] | None = None,
                           **kwargs: Any) -> None:
        opened = self._open.pop(run_id, None)
        if opened is not None:
            await opened[0].__aexit__(type(error), error, error.__traceback__)
