"""``ctx.effect(key, fn)``: a step's side effect, recorded at most once per run and key.

:meth:`StepEffects.effect` begins the effect (fenced ``effect_begin``), runs
``fn`` (async on the loop, sync in a thread) and records its outcome (fenced
``effect_finish``, retried over lost connections while the lease is trusted).
An effect found ``started`` by an earlier attempt follows its replay policy:
run again ("safe") or ask ``reconcile`` (:func:`reconcile_effect`; it answers
the real outcome or :data:`NOT_PERFORMED`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from ..foundation.effects import NOT_PERFORMED, NotPerformed
from ..foundation.errors import EffectFailed, ReconcileFailed, mark_terminal
from ..foundation.jsonb import dumps
from ..foundation.jsonb import exc_message as _exc_message
from ..foundation.jsonb import jsonb_str as _jsonb_str
from ..foundation.queries import effects as eq
from ..foundation.queries.core import Database
from ..runs.steps import EffectFn, in_thread
from .state import Held, fenced

__all__ = ["NOT_PERFORMED", "NotPerformed", "StepEffects", "call_effect", "reconcile_effect"]


async def call_effect(fn: Callable[[], Any]) -> Any:
    """Call a no-argument function: async on the loop, sync in a thread."""
    if inspect.iscoroutinefunction(fn):
        return await fn()
    value = await in_thread(fn)
    if inspect.isawaitable(value):
        value = await value
    return value


async def reconcile_effect(key: str, reconcile: EffectFn) -> str | NotPerformed:
    """Replay policy "reconcile" of an effect found started by an earlier attempt.

    Calls ``reconcile`` (never ``fn``): returns the JSON text of the real
    outcome it reports (to record as the effect's result), or
    :data:`NOT_PERFORMED` when it says the effect never happened (the caller
    then runs ``fn``). If it raises (or returns non-JSON), raises a terminal
    :class:`ReconcileFailed`: nothing is recorded and the effect stays
    ``started`` for the application to inspect.
    """
    try:
        value = await call_effect(reconcile)
        if value is NOT_PERFORMED:
            return NotPerformed.NOT_PERFORMED
        return dumps(value, f"effect {key!r} reconciled result")
    except Exception as exc:
        raise mark_terminal(ReconcileFailed(
            f"reconcile of effect {key!r} failed: {type(exc).__name__}: {exc}; its first "
            "attempt started and never recorded an outcome, so it is not re-run"
        )) from exc


class StepEffects:
    """Records a step's effects (a part of :class:`~pgdurable.engine.worker.Worker`)."""

    def __init__(self, db: Database, owner: str) -> None:
        self.db, self.owner = db, owner

    async def _finish(self, a: Held, key: str, ok: bool, text: str | None,
                      error: str | None) -> None:
        await fenced(self.db, a, eq.EFFECT_FINISH, (*a.ident(self.owner), key, ok, text, error))

    async def effect(
        self, a: Held, key: str, fn: EffectFn, reconcile: EffectFn | None = None
    ) -> Any:
        """``ctx.effect(key, fn, reconcile)`` of run ``a`` (see the module docstring)."""
        begun = await fenced(self.db, a, eq.EFFECT_BEGIN, (*a.ident(self.owner), key))
        assert begun is not None
        if begun.status == "started" and begun.replay and reconcile is not None:
            # started by an earlier attempt, outcome unknown: policy "reconcile"
            text = await reconcile_effect(key, reconcile)
            if isinstance(text, str):
                await self._finish(a, key, True, text, None)
                return json.loads(text)
            # NOT_PERFORMED: fn runs now, under this token (effect_begin took the row over)
        elif begun.status == "succeeded":
            return begun.result
        elif begun.status == "failed":
            error = begun.error or {}
            raise EffectFailed(f"effect {key!r} failed earlier: {error.get('type')}: "
                               f"{error.get('message', '')}")
        # from here on the effect may have happened: its outcome is recorded
        # (retried over lost connections while the lease is trusted), never
        # left 'started' for a replay to perform it again
        try:
            value = await call_effect(fn)
        except Exception as exc:
            await self._finish(a, key, False, None, _effect_error(exc))
            raise
        try:
            text = dumps(value, f"effect {key!r} result")
        except (TypeError, ValueError) as exc:
            await self._finish(a, key, False, None, _effect_error(exc))
            raise mark_terminal(EffectFailed(
                f"effect {key!r} ran but its result cannot be stored ({exc}); it is recorded "
                "as failed and not performed again"
            )) from exc
        await self._finish(a, key, True, text, None)
        return json.loads(text)


def _effect_error(exc: BaseException) -> str:
    """The ``effects.error`` JSON of ``exc`` (any exception text is storable)."""
    return dumps({"type": _jsonb_str(type(exc).__name__), "message": _exc_message(exc)})
