"""Cancel a run (``sql/functions/cancel.sql``) as the operator surfaces send it: the app's
statement (:mod:`pgdurable.foundation.run_queries`), with a typed answer."""

from __future__ import annotations

from .. import run_queries as rq
from .core import scalar

__all__ = ["CANCEL"]

# -- cancel (PD002 if unknown): the resulting status ('cancelled'; 'leased': requested,
# -- its worker stops it; a terminal status: nothing to cancel)
CANCEL = scalar(rq.CANCEL, str)
