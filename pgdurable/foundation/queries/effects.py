"""A step's recorded effects (``sql/functions/effects.sql``): ``ctx.effect`` begins an
effect and finishes it, both fenced by the lease (:mod:`pgdurable.engine.step_effects`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .core import Query, Row, statement

__all__ = ["EFFECT_BEGIN", "EFFECT_FINISH", "EffectBegun"]


@dataclass(frozen=True, slots=True)
class EffectBegun:
    """An effect as :data:`EFFECT_BEGIN` found or started it: ``status`` (``'started'``,
    ``'succeeded'``, ``'failed'``), the stored ``result`` or ``error``, and ``replay``
    (started by an earlier attempt: its outcome is unknown)."""

    status: str
    result: Any
    error: Any
    replay: bool


def _begun(r: Row) -> EffectBegun:
    status, result, error, replay = r
    return EffectBegun(status, result, error, bool(replay))


# -- fenced: begin effect (id, token, owner, key), or find it recorded: an EffectBegun
# -- (replay: found started by an earlier attempt)
EFFECT_BEGIN = Query(
    "SELECT status, result, error, replay "
    "FROM pgdurable.effect_begin(%s::uuid, %s::bigint, %s::text, %s::text)", _begun)
# -- fenced: record an effect's outcome (id, token, owner, key, ok, result, error); nothing
EFFECT_FINISH = statement(
    "SELECT pgdurable.effect_finish(%s::uuid, %s::bigint, %s::text, %s::text, %s::boolean, "
    "%s::jsonb, %s::jsonb)")
