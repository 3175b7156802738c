"""A framework's model or tool call as an effect whose error is not its final outcome.

``ctx.effect(key, fn)`` records an exception of ``fn`` as the effect's outcome:
every later call under ``key`` raises :class:`~pgdurable.EffectFailed` without
calling ``fn``. Right for a side effect that must never run twice, wrong for a
model that dropped a connection once: the step's retry must call it again.

:func:`attempted_effect` records attempt ``n`` of a call under ``key`` (``n = 1``)
or ``"key#n"``, as a workflow step's attempts are (:mod:`pgdurable.models.workflows`).
An attempt recorded as failed is passed over (not called again) and the next
one is made; one found started and never finished (a crash) follows its replay
policy (``reconcile``, else ``fn`` again); a recorded success is returned. Each
attempt of the step records at most one failure (the error propagates and
fails the step's attempt), so the failed records of a call are bounded by the
task's ``max_attempts``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ..foundation.errors import EffectFailed, is_terminal
from ..runs.steps import EffectFn, RunContext, in_thread

__all__ = ["attempted_effect", "check_reconcile", "reconcile_call"]


async def attempted_effect(ctx: RunContext, key: str, fn: EffectFn,
                           reconcile: EffectFn | None = None) -> Any:
    """``ctx.effect(key, fn, reconcile=...)`` whose failures are retried (module docstring)."""
    n = 1
    while True:
        called = False

        async def attempt() -> Any:
            nonlocal called
            called = True
            if inspect.iscoroutinefunction(fn):
                return await fn()
            value = await in_thread(fn)
            return await value if inspect.isawaitable(value) else value

        try:
            return await ctx.effect(key if n == 1 else f"{key}#{n}", attempt,
                                    reconcile=reconcile)
        except EffectFailed as exc:
            if called or is_terminal(exc):
                raise  # this attempt's own failure (or one that must not be retried)
            n += 1  # an earlier attempt failed: it is not called again, the next one is made


def check_reconcile(reconcile: Mapping[str, Callable[..., Any]] | None,
                    tools: set[str] | None) -> dict[str, Callable[..., Any]]:
    """The ``reconcile=`` mapping of a ``register_agent``: tool name -> callable, every
    name one of ``tools`` (None: not known before the run, not checked); TypeError /
    ValueError otherwise."""
    if reconcile is None:
        return {}
    if not isinstance(reconcile, Mapping):
        raise TypeError("reconcile must map tool names to functions")
    for name, fn in reconcile.items():
        if not callable(fn):
            raise TypeError(f"reconcile[{name!r}] must be callable")
        if tools is not None and name not in tools:
            raise ValueError(f"reconcile names {name!r}, which is not a tool of the agent "
                             f"(its tools: {sorted(tools)})")
    return dict(reconcile)


async def reconcile_call(reconcile: Callable[..., Any], args: Mapping[str, Any]) -> Any:
    """A tool call's reconcile: ``reconcile(**args)`` (the call's arguments as
    keywords; async, or sync in a worker thread), which returns the tool's real
    result or :data:`~pgdurable.NOT_PERFORMED` (the call never happened: it runs now)."""
    if inspect.iscoroutinefunction(reconcile):
        return await reconcile(**args)
    value = await in_thread(functools.partial(reconcile, **args))
    return await value if inspect.isawaitable(value) else value
