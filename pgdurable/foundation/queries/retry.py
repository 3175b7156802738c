"""Retry a failed or cancelled run (``sql/functions/retry.sql``)."""

from __future__ import annotations

from .core import scalar

__all__ = ["RETRY"]

# -- retry a failed or cancelled run (0007); returns the new status ('runnable').
# -- PD002 (RunNotFound) for an unknown id, PD000 (InvalidInput) for any other status
RETRY = scalar("SELECT pgdurable.retry_run(%s::uuid)", str)
