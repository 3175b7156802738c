"""Step liveness: the fenced heartbeat of a running step (``sql/functions/workers.sql``)."""

from __future__ import annotations

from .core import statement

__all__ = ["HEARTBEAT"]

# -- record a step heartbeat (0012), fenced: (run, token, owner, progress JSON)
HEARTBEAT = statement("SELECT pgdurable.record_heartbeat(%s::uuid, %s, %s, %s::jsonb)")
