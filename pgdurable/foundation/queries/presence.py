"""Listener presence on the watch-only channels (``sql/functions/workers.sql``,
:mod:`pgdurable.foundation.presence`)."""

from __future__ import annotations

from datetime import datetime

from .core import Query, column

__all__ = ["ANNOUNCE"]

# -- announce a listener on (channel, ttl seconds): its NOTIFYs are sent until then;
# -- returns until
ANNOUNCE: Query[datetime] = column("SELECT pgdurable.listen_presence(%s, %s)")
