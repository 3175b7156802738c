"""A framework's model call charged to the run's budgets: reserve before, settle after.

The integrations (:mod:`.openai_agents`, :mod:`.langgraph`) take ``reserve=``, the
amounts (``{unit: number}``, units of :data:`pgdurable.runs.budgets.UNITS`) held
from the run's budgets before each model call, and settle what the call's usage
says: the token units the reservation names (``tokens`` = in + out) and
``calls`` = 1; a unit the usage does not measure (``usd`` without a price, a
usage the framework did not report) is charged what was reserved. With ``usd``
in ``reserve`` the settlement names the call's model, and the database prices
its tokens from ``pgdurable.budget_prices`` (``app.set_price``). See
docs/budgets.md, "Framework integrations".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..runs.budgets import amounts_json

__all__ = ["check_reserve", "usage_amounts"]


def check_reserve(reserve: Mapping[str, float] | None, what: str) -> dict[str, float] | None:
    """``reserve`` as a plain dict (None: no budget is charged); an unknown unit, a
    negative, non-finite or non-numeric amount, or no unit at all:
    :class:`~pgdurable.InvalidInput` before anything is registered."""
    if reserve is None:
        return None
    amounts_json(reserve, f"{what}(reserve=...)", empty=False)
    return dict(reserve)


def usage_amounts(input_tokens: Any, output_tokens: Any, reserved: Mapping[str, float],
                  *, measured: bool = True) -> dict[str, float]:
    """What one model call spent in the units ``reserved`` names: ``tokens_in``,
    ``tokens_out``, ``tokens`` (both) and ``calls`` (1); with ``usd`` reserved, the
    measured ``tokens_in`` and ``tokens_out`` always (the database prices them).
    ``measured`` false (the framework returned no usage): only ``calls``; the other
    units are then charged what was reserved."""
    tin, tout = float(input_tokens or 0), float(output_tokens or 0)
    spent = {"calls": 1.0}
    keep = set(reserved)
    if measured:
        spent |= {"tokens_in": tin, "tokens_out": tout, "tokens": tin + tout}
        if "usd" in reserved:
            keep |= {"tokens_in", "tokens_out"}
    return {u: v for u, v in spent.items() if u in keep}
