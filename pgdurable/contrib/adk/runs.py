"""Durable Google ADK runs: an agent's invocation as a pgdurable run on leased workers.

::

    register_agent(app, agent, name="support")           # on every worker and client
    run_id = await run_agent(app, "support", "Where is my order?", user_id="u-7")

A run is a pgdurable task whose step runs ADK's ``Runner.run_async`` on a fresh
in-memory session with :class:`~.plugin.PgDurablePlugin` last among the app's
plugins: every model call and tool call is a recorded effect, so a later claim
(after a crash, a park) runs the invocation again from the top and every recorded
call returns its recorded result without calling the model or the tool again.

**Parking.** An invocation that ends with long-running calls pending (a tool
asking for a confirmation: ``FunctionTool(..., require_confirmation=True)`` or
``tool_context.request_confirmation()``; a ``LongRunningFunctionTool``) parks the
run on the signal ``("approval", "<run id>:<n>")``, holding no worker. The
state records what is pending (``runs.state->'pending'``: position, kind,
tool, args, hint); the signal's payload answers it:

* a confirmation: ``true`` / ``false``, or ``{"confirmed": bool, "payload": ...}``;
* a long-running tool: its final result (an object, else ``{"result": value}``);
* several pending calls: ``{"0": answer, "1": answer}`` by position (or a list).

The next step replays the invocation and the answers given so far (ADK's call
ids are new at each replay: answers go by position) and sends this answer as
the user's ``FunctionResponse``, as ADK's human-in-the-loop protocol says.

**The stream.** Every ADK event goes to the run's output stream
(``event.model_dump(mode="json")``); events that earlier steps emitted are not
emitted again when a later step replays them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps import App
from google.adk.events.event import Event
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools.base_toolset import BaseToolset
from google.genai import types

from ...runs.steps import Done, RunContext, Wait
from .._attempts import check_reconcile
from .plugin import PgDurablePlugin

if TYPE_CHECKING:
    from ...app.durable import Durable

__all__ = ["APPROVAL_KIND", "CONFIRMATION", "answer", "register_agent", "run_agent"]

#: The signal kind a run with pending calls parks on.
APPROVAL_KIND = "approval"
#: ADK's function call that asks the user to confirm a tool call.
CONFIRMATION = "adk_request_confirmation"


@dataclass(frozen=True)
class _Pending:
    call: types.FunctionCall

    @property
    def kind(self) -> str:
        return "confirmation" if self.call.name == CONFIRMATION else "long_running"

    def describe(self, position: int) -> dict[str, Any]:
        args = self.call.args or {}
        if self.kind == "confirmation":
            original = args.get("originalFunctionCall") or {}
            hint = (args.get("toolConfirmation") or {}).get("hint")
            return {"position": position, "kind": self.kind, "tool": original.get("name"),
                    "args": original.get("args"), "hint": hint}
        return {"position": position, "kind": self.kind, "tool": self.call.name, "args": args}


def answer(pending: list[dict[str, Any]], payload: Any) -> list[types.Part]:
    """The user's ``FunctionResponse`` parts for ``pending`` from a signal's ``payload``
    (see the module docstring); ``ValueError`` for a payload that answers nothing."""
    if len(pending) == 1 and not (isinstance(payload, dict) and set(payload) == {"0"}):
        by_position: dict[int, Any] = {0: payload}
    elif isinstance(payload, list):
        by_position = dict(enumerate(payload))
    elif isinstance(payload, dict):
        by_position = {int(k): v for k, v in payload.items() if str(k).isdigit()}
    else:
        raise ValueError(f"the payload answers none of the {len(pending)} pending calls")
    if not by_position:
        raise ValueError(f"the payload answers none of the {len(pending)} pending calls")
    parts = []
    for p in pending:
        if p["position"] not in by_position:
            continue
        value = by_position[p["position"]]
        if p["kind"] == "confirmation":
            if isinstance(value, bool):
                value = {"confirmed": value}
            if not isinstance(value, dict) or not isinstance(value.get("confirmed"), bool):
                raise ValueError(f"a confirmation is true/false or {{'confirmed': bool}}, "
                                 f"not {value!r}")
        elif not isinstance(value, dict):
            value = {"result": value}
        parts.append(types.Part(function_response=types.FunctionResponse(
            id=p["id"], name=p["name"], response=value)))
    return parts


def _event_json(event: Event) -> Any:
    return json.loads(event.model_dump_json(exclude_none=True))


def _final_text(events: list[Event]) -> str | None:
    for event in reversed(events):
        if event.is_final_response() and event.content and event.content.parts:
            text = "".join(p.text or "" for p in event.content.parts)
            if text:
                return text
    return None


def _tool_names(agent: BaseAgent) -> set[str] | None:
    """The names of the tools of ``agent`` and of its sub-agents; None when one of them
    has a toolset (its tools are known only at run time: names are not checked)."""
    names: set[str] = set()
    for t in getattr(agent, "tools", None) or []:
        if isinstance(t, BaseToolset):
            return None
        names.add(str(getattr(t, "name", None) or getattr(t, "__name__", "")))
    for sub in agent.sub_agents:
        more = _tool_names(sub)
        if more is None:
            return None
        names |= more
    return names - {""}


def register_agent(app: Durable, agent: BaseAgent, *, name: str = "agent",
                   app_name: str | None = None, plugins: list[BasePlugin] | None = None,
                   revision: str = "1", max_attempts: int = 3,
                   reconcile: Mapping[str, Callable[..., Any]] | None = None) -> str:
    """Register durable runs of the ADK ``agent`` as the pgdurable task ``name``.

    ``plugins``: your own ADK plugins, run before pgdurable's (a plugin that answers
    a callback itself short-circuits the ones after it, so the recording one comes
    last). ``app_name`` defaults to ``name``. ``reconcile``: tool name ->
    ``fn(**args)``, the tool's replay policy ``reconcile`` (a call found started
    and unfinished after a crash asks ``fn`` for the tool's real result, or
    :data:`~pgdurable.NOT_PERFORMED`, instead of running it again); a name that
    is not a tool of the agent tree: ValueError. ``max_attempts``: attempts of the
    run's step (a model error fails one; the next calls the model again).
    """
    if not isinstance(agent, BaseAgent):
        raise TypeError("register_agent needs a google.adk agent")
    app_name = app_name or name
    reconcilers = check_reconcile(reconcile, _tool_names(agent))

    async def step(ctx: RunContext, state: dict[str, Any]) -> Done | Wait:
        recorder = PgDurablePlugin(ctx, reconcilers)
        try:
            return await _invoke(ctx, state, recorder)
        finally:
            await recorder.close()

    async def _invoke(ctx: RunContext, state: dict[str, Any],
                      recorder: PgDurablePlugin) -> Done | Wait:
        sessions = InMemorySessionService()
        runner = Runner(app=App(name=app_name, root_agent=agent,
                                plugins=[*(plugins or []), recorder]),
                        session_service=sessions)
        user, sid = state["user_id"], ctx.run_id
        await sessions.create_session(app_name=app_name, user_id=user, session_id=sid)
        answers: list[Any] = list(state.get("answers", []))
        wake = ctx.wake or {}
        if state.get("pending") and wake.get("type") == "signal":
            answers.append(wake.get("payload"))
        skip = int(state.get("emitted", 0))  # events earlier steps emitted: not again
        seen = 0
        events: list[Event] = []
        answered: set[str] = set()
        message = types.Content(role="user", parts=[types.Part(text=state["message"])])
        for segment in range(len(answers) + 1):
            async for event in runner.run_async(user_id=user, session_id=sid,
                                                new_message=message):
                events.append(event)
                seen += 1
                if seen > skip:
                    await ctx.emit(_event_json(event))
            pending = [
                _Pending(fc) for ev in events for fc in ev.get_function_calls()
                if ev.long_running_tool_ids and fc.id in ev.long_running_tool_ids
                and fc.id not in answered]
            described = [{**p.describe(i), "id": p.call.id, "name": p.call.name}
                         for i, p in enumerate(pending)]
            if not pending:
                break
            if segment == len(answers):
                parks = int(state.get("parks", 0)) + 1
                ref = f"{ctx.run_id}:{parks}"
                public = [{k: v for k, v in d.items() if k not in ("id", "name")}
                          for d in described]
                await ctx.emit({"type": "approval_requested", "signal": [APPROVAL_KIND, ref],
                                "pending": public})
                return Wait(signal=(APPROVAL_KIND, ref), state={
                    **state, "answers": answers, "parks": parks, "pending": public,
                    "emitted": seen})
            parts = answer(described, answers[segment])
            answered |= {p.function_response.id for p in parts
                         if p.function_response and p.function_response.id}
            message = types.Content(role="user", parts=parts)
        return Done(result={"final_output": _final_text(events),
                            "model_calls": recorder.model_calls,
                            "tool_calls": recorder.tool_calls})

    app.task(name, revision=revision, max_attempts=max_attempts)(step)
    return name


async def run_agent(app: Durable, name: str, message: str, *, user_id: str = "user",
                    idempotency_key: str | None = None, queue: str = "default",
                    metadata: dict[str, Any] | None = None) -> str:
    """Start a durable run of the ADK agent registered as ``name`` on the user's
    ``message``; return the run id."""
    if not isinstance(message, str):
        raise TypeError("message must be the user's message (a str)")
    if not isinstance(user_id, str) or not user_id or "\x00" in user_id:
        raise ValueError("user_id must be a non-empty str without NUL")
    return await app.start(name, state={"user_id": user_id, "message": message},
                           idempotency_key=idempotency_key, queue=queue, metadata=metadata)
