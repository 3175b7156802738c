"""A durable task run by leased workers (``sql/functions/effects.sql``:
``durable_step_enter``, ``durable_step_mark``; :mod:`pgdurable.models.durable_runs`)."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, Row, statement

__all__ = ["ENTER", "MARK", "Entered"]


@dataclass(frozen=True, slots=True)
class Entered:
    """Entering step n: whether it is the first step of this claim (``authorize`` is asked
    then), and the id of the reconcile step recorded in flight (None: none)."""

    first_in_claim: bool
    in_flight: str | None


def _entered(r: Row) -> Entered:
    first_in_claim, in_flight = r
    return Entered(bool(first_in_claim), in_flight)


# -- enter step n of a durable run (fenced by token): one Entered (first step of this
# -- claim?, in-flight step id)
ENTER = Query(
    "SELECT first_in_claim, in_flight "
    "FROM pgdurable.durable_step_enter(%s::uuid, %s::bigint, %s::integer)", _entered)
# -- mark reconcile step n in flight before it runs (fenced by token)
MARK = statement("SELECT pgdurable.durable_step_mark(%s::uuid, %s::bigint, %s::integer, %s::text)")
