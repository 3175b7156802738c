"""Signals (``sql/functions/signals.sql``) as the operator surfaces and the SQLAlchemy
integration send them: the same statements as the app's
(:mod:`pgdurable.foundation.run_queries`), with typed answers."""

from __future__ import annotations

from .. import run_queries as rq
from .core import scalar

__all__ = ["SIGNAL", "SIGNAL_RUN"]

# -- send a signal (dedup by signal_id, PD008 on conflict): the ids of the runs it woke,
# -- one per row (none: kept pending)
SIGNAL = scalar(rq.SIGNAL, str)
# -- signal one run (PD002 if unknown): its id if it woke, no row if the signal is kept
# -- pending for it
SIGNAL_RUN = scalar(rq.SIGNAL_RUN, str)
