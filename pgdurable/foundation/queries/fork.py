"""Fork and rewind (``sql/functions/fork.sql``) and the task revisions workers serve
(``sql/functions/workers.sql``)."""

from __future__ import annotations

from dataclasses import dataclass

from .core import Query, Row, nullable, scalar, statement

__all__ = ["FORK", "FORKED_AT", "FORK_FAILED", "REGISTER_WORKER", "REWIND",
           "UNREGISTER_WORKER", "ForkedRun"]


@dataclass(frozen=True)
class ForkedRun:
    """One fork made by :func:`~pgdurable.runs.fork.fork_failed`: the failed ``source`` run
    and its ``fork``."""

    source: str
    fork: str


def _forked(r: Row) -> ForkedRun:
    source, fork = r
    return ForkedRun(str(source), str(fork))


# -- fork one run (0017, 0030; step NULL: its resume point); returns the new run's id.
# -- PD002 / PDF01 / PDF02 / PD000
FORK = scalar("SELECT pgdurable.fork_run(%s::uuid, %s::integer, %s::jsonb, %s, %s, %s)", str)
# -- the checkpoint a fork continues from (its forked_from_step; NULL: not a fork)
FORKED_AT = nullable("SELECT forked_from_step FROM pgdurable.runs WHERE id = %s::uuid", int)
# -- bulk fork of failed runs (0012); one ForkedRun (source, fork) per row
FORK_FAILED = Query("SELECT source, fork FROM pgdurable.fork_failed(%s, %s, %s, %s, %s, %s)",
                    _forked)
# -- rewind a failed/cancelled run in place (0012); returns 'runnable'
REWIND = scalar("SELECT pgdurable.rewind_run(%s::uuid, %s, %s::jsonb, %s, %s, %s)", str)
# -- a worker registers / unregisters the task revisions it serves (0012)
REGISTER_WORKER = statement("SELECT pgdurable.register_worker(%s, %s::text[], %s::text[])")
UNREGISTER_WORKER = statement("SELECT pgdurable.unregister_worker(%s)")
