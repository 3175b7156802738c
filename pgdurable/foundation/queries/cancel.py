"""Cancel a run (``sql/functions/cancel.sql``): the operators' and the app's request, and
the worker's fenced acknowledgement."""

from __future__ import annotations

from .core import scalar

__all__ = ["ACK_CANCEL", "CANCEL"]

# -- cancel (PD002 if unknown): the resulting status ('cancelled'; 'leased': requested,
# -- its worker stops it; a terminal status: nothing to cancel)
CANCEL = scalar("SELECT pgdurable.cancel_run(%s::uuid)", str)
# -- fenced: the worker stopped the step of a run whose cancel was requested (id, token,
# -- owner, spend; PD000 if nobody requested one): it ends cancelled; the resulting status
ACK_CANCEL = scalar("SELECT pgdurable.ack_cancel(%s::uuid, %s::bigint, %s::text, %s::numeric)",
                    str)
