"""Token streams (``sql/functions/text_stream.sql``): a process's tick of durable rows and
live tails, a step stopped by double-texting, a step's text so far
(:mod:`pgdurable.runs.text`)."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, Row, nullable, statement

__all__ = ["STOP", "TEXT_SO_FAR", "TICK", "Ticked"]


@dataclass(frozen=True, slots=True)
class Ticked:
    """One stream of a tick: its run, the status (``'ok'``, ``'busy'``, ``'lost'``: the
    fence, ``'gap'``), the seq of its last durable row and how much text it has stored,
    and an interrupt asked for by double-texting (None: none)."""

    run_id: str
    status: str
    seq: int | None
    have: int | None
    interrupt: str | None


def _ticked(r: Row) -> Ticked:
    run_id, status, seq, have, interrupt = r
    return Ticked(str(run_id), status, None if seq is None else int(seq),
                  None if have is None else int(have), interrupt)


# -- one tick: durable rows and live tails of many streams (fenced); a Ticked per stream,
# -- in the order of the arrays
TICK = Query(
    "SELECT run_id, status, seq, have, interrupt FROM pgdurable.stream_tick("
    "%s::uuid[], %s::bigint[], %s::text[], %s::integer[], %s::integer[], %s::text[], "
    "%s::boolean[], %s::bigint[])", _ticked)
# -- fenced: stop the step (interrupt keeps its text, rollback discards it), release the
# -- run; its answer is not read
STOP = statement(
    "SELECT pgdurable.stop_step(%s::uuid, %s::bigint, %s::text, %s::integer, %s::text, "
    "%s::integer, %s::text)")
# -- the step's text so far (its generation: after its last marker), in order ('' if none)
TEXT_SO_FAR = nullable("""
SELECT coalesce(string_agg(e.event->>'text', '' ORDER BY e.seq), '')
  FROM pgdurable.runs r JOIN pgdurable.run_events e ON e.run_id = r.id
 WHERE r.id = %s::uuid AND e.step = %s AND e.idx IS NULL AND e.event->>'type' = 'text'
   AND e.seq > (SELECT coalesce(max(m.seq), 0) FROM pgdurable.run_events m
                 WHERE m.run_id = r.id AND m.step = %s AND m.idx IS NULL
                   AND m.event->>'type' IN ('interrupted', 'rollback'))
""", str)
