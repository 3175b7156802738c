"""Spend control: budgets drawn from by reservations before each model call.

A budget (``app.budget(key, limit={...}, window=..., policy=...)``) has
limits per unit (:data:`UNITS`), a window (none, rolling, or fixed calendar
buckets) and a policy. A run draws from the budgets attached at its start
(``app.start(..., budgets=[...], budget={...})``: named shared ones and its
own), or else from its nearest ancestor's (children share their parent's).
A step reserves before it spends::

    async with ctx.reserve(usd=0.40, tokens=30_000) as r:
        reply = await model(...)
        r.settle(usd=reply.cost, tokens=reply.usage.total)

Everything is decided by the database (``sql/functions/budgets.sql``): the
reservation is fenced by the run's lease (a zombie's is refused), holds
capacity of every budget in scope so that settled spend plus live
reservations never pass a limit under any concurrency, and is idempotent per
(run, step, reservation key): a replayed step finds its settlement and is not
charged again (``r.replayed``). Leaving the block settles what
:meth:`Reservation.settle` recorded (units not named: the amount reserved)
and returns the rest; an exception releases the whole reservation. A budget
that cannot give the amount parks the run (policy ``park``: no worker held,
woken by the window's refill or by a changed limit, the step then runs again)
or fails it (``fail``: :class:`~pgdurable.BudgetExceeded` naming the budget).
Bad input (an unknown unit, a negative or non-finite amount, an unknown
budget key) is :class:`~pgdurable.InvalidInput` or
:class:`~pgdurable.BudgetNotFound` and writes nothing. See docs/budgets.md.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from datetime import timedelta
from decimal import Decimal
from types import TracebackType
from typing import Any

from ..foundation import metrics
from ..foundation.errors import BudgetExceeded, InvalidInput, LeaseLost, mark_terminal
from ..foundation.queries import budgets as bq
from ..foundation.queries.core import AsyncTarget, one
from .flow import RateLimited

__all__ = ["BUDGET_KIND", "UNITS", "BudgetExhausted", "Reservation", "amounts_json",
           "budget_params", "budget_statement", "budgets_json", "price_params", "settle_buffered", "settle_entry",
           "split_budget"]

#: The units a budget, a reservation or a settlement may name.
UNITS = ("usd", "tokens", "tokens_in", "tokens_out", "calls")
#: The wait kind of a run parked on an exhausted budget (ref: the budget's key).
BUDGET_KIND = "pgdurable.budget"
_POLICIES = ("park", "fail")


def _amount(unit: str, value: object, what: str) -> float | int | Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise InvalidInput(f"{what}: {unit} must be a number, not {value!r}")
    if not math.isfinite(float(value)) or value < 0:
        raise InvalidInput(f"{what}: {unit} must be finite and >= 0, not {value!r}")
    return value


def amounts_json(amounts: Mapping[str, object], what: str, *, empty: bool = True) -> str:
    """``amounts`` ({unit: number >= 0}) as the JSON object the SQL takes; an unknown
    unit, a non-number, a negative or non-finite amount (or no unit when ``empty`` is
    false): :class:`~pgdurable.InvalidInput` before any SQL."""
    if not isinstance(amounts, Mapping):
        raise InvalidInput(f"{what}: amounts must be a mapping of unit -> number")
    if not amounts and not empty:
        raise InvalidInput(f"{what}: name at least one unit ({', '.join(UNITS)})")
    parts = []
    for unit, value in amounts.items():
        if unit not in UNITS:
            raise InvalidInput(f"{what}: unknown unit {unit!r} (known: {', '.join(UNITS)})")
        v = _amount(unit, value, what)
        # a Decimal as its exact text (a JSON number), else json's
        parts.append(f"{json.dumps(unit)}: {v if isinstance(v, Decimal) else json.dumps(v)}")
    return "{" + ", ".join(parts) + "}"


def _key(key: object, what: str) -> str:
    if not isinstance(key, str) or not key or len(key) > 200 or "\x00" in key:
        raise InvalidInput(f"{what}: a budget key is a str of 1 to 200 characters, not {key!r}")
    return key


def budget_params(key: object, limit: Mapping[str, object], window: object, calendar: object,
                  policy: object) -> tuple[Any, ...]:
    """The parameters of ``budget_set``: ``window`` None (all time), a timedelta or
    seconds (> 0: rolling, or fixed calendar buckets from 2000-01-01 UTC with
    ``calendar=True``), ``policy`` park or fail; bad input: InvalidInput."""
    name = _key(key, "budget")
    limits = amounts_json(limit, "budget limit", empty=False)
    if policy not in _POLICIES:
        raise InvalidInput(f"budget policy must be 'park' or 'fail', not {policy!r}")
    if not isinstance(calendar, bool):
        raise InvalidInput("budget calendar= must be a bool")
    if window is None:
        if calendar:
            raise InvalidInput("budget calendar=True needs a window")
        return (name, limits, "none", None, policy)
    if isinstance(window, timedelta):
        length = window
    elif isinstance(window, int | float) and not isinstance(window, bool):
        if not math.isfinite(window):
            raise InvalidInput(f"budget window must be finite, not {window!r}")
        length = timedelta(seconds=window)
    else:
        raise InvalidInput(f"budget window must be None, a timedelta or seconds, not {window!r}")
    if length <= timedelta(0):
        raise InvalidInput(f"budget window must be > 0, not {window!r}")
    return (name, limits, "fixed" if calendar else "rolling", length, policy)


def price_params(model: object, usd_per_token_in: object, usd_per_token_out: object
                 ) -> tuple[Any, ...]:
    """The parameters of ``budget_price_set``; bad input: InvalidInput."""
    if not isinstance(model, str) or not model or len(model) > 200:
        raise InvalidInput(f"price: a model name is a str of 1 to 200 characters, not {model!r}")
    return (model, _amount("usd_per_token_in", usd_per_token_in, "price"),
            _amount("usd_per_token_out", usd_per_token_out, "price"))


def split_budget(budget: object) -> tuple[object, str | None]:
    """``start(budget=...)``: a number is the run's spend limit of ``ctx.spend`` (kept
    as it was); a mapping of units is the run's own ledger budget (its JSON)."""
    if isinstance(budget, Mapping):
        return None, amounts_json(budget, "start(budget=...)", empty=False)
    return budget, None


def budget_statement(sql: str, params: tuple[Any, ...], budgets: Iterable[str] | None,
                     own: str | None) -> tuple[str, tuple[Any, ...]]:
    """A start statement as is without budgets, else wrapped to attach ``budgets`` (keys)
    and the run's ``own`` limits in the same statement (an unknown key: the start is
    rolled back, :class:`~pgdurable.BudgetNotFound`)."""
    if budgets is None and own is None:
        return sql, params
    if isinstance(budgets, str) or (budgets is not None and not isinstance(budgets, Iterable)):
        raise InvalidInput("start(budgets=...) must be a list of budget keys")
    keys = sorted({_key(k, "start(budgets=...)") for k in budgets or ()})
    return bq.BUDGET_STARTED.format(start=sql), (*params, keys, own)


def settle_entry(run_id: str, token: int, step: int, rkey: str, amounts_json: str,
                 model: str | None) -> str:
    """One buffered settlement as the JSON object ``pgdurable._budget_settle_many`` reads
    (``amounts_json``: from :func:`amounts_json`, checked already)."""
    return (f'{{"run": {json.dumps(run_id)}, "token": {int(token)}, "step": {int(step)}, '
            f'"rkey": {json.dumps(rkey)}, "amounts": {amounts_json}, '
            f'"model": {json.dumps(model)}}}')


async def settle_buffered(db: AsyncTarget, ctx: Any, owner: str) -> None:
    """Write the settlements ``ctx`` buffered now (fenced: LeaseLost), when its step ends
    otherwise than by a checkpoint (a park, a failure, a stop): the spend happened."""
    settles = ctx._take_settles()
    if settles is not None:
        await one(db, bq.SETTLE_PENDING, (ctx.run_id, ctx.token, owner, settles))


async def write_settlements(ctx: Any) -> None:
    """Write what the step's reservations settled so far now (fenced by the lease), not
    with the step's checkpoint. For a model call whose answer is recorded durably before
    the step ends (an effect, a framework's own checkpoint): were its settlement left to
    ride the checkpoint, a crash in between would keep the answer and lose the charge."""
    app, owner = ctx._attached()
    await settle_buffered(app, ctx, owner)


def budgets_json(budgets: Iterable[str] | None, own: str | None) -> str | None:
    """One start's budgets for ``start_many`` (``{"keys": [...], "own": {...}}``), or None
    without any; bad keys: InvalidInput."""
    if budgets is None and own is None:
        return None
    if isinstance(budgets, str) or (budgets is not None and not isinstance(budgets, Iterable)):
        raise InvalidInput("start(budgets=...) must be a list of budget keys")
    keys = sorted({_key(k, "start(budgets=...)") for k in budgets or ()})
    return (f'{{"keys": {json.dumps(keys)}' + ("" if own is None else f', "own": {own}')
            + "}")


class BudgetExhausted(RateLimited):
    """Raised by ``ctx.reserve`` when a budget whose policy is ``park`` cannot give the
    amount: the worker parks the run on the signal ``("pgdurable.budget", key)`` (sent
    when the budget is changed) with a timer at the window's refill (none when only a
    raised limit helps); the step runs again when it wakes."""

    def __init__(self, budget: str, retry_in: float | None, detail: str | None) -> None:
        super().__init__(0 if retry_in is None else retry_in,
                         f"budget {budget!r} exhausted: {detail}")
        #: The budget's key.
        self.budget = budget
        self._timer = retry_in is not None

    def parking(self) -> tuple[str | None, str | None, timedelta | None]:
        """Park on the budget's signal, with the refill's timer when there is one."""
        return BUDGET_KIND, self.budget, (
            timedelta(seconds=self.retry_after) if self._timer else None)


class Reservation:
    """A reservation of a step (``ctx.reserve``): an async (or, in a sync step, a
    plain) context manager. ``status`` after entering: ``reserved``, ``replayed``
    (an earlier attempt of this step settled it: nothing is held or charged again)
    or ``unbudgeted`` (the run's tree has no budget: nothing recorded)."""

    def __init__(self, ctx: Any, amounts: Mapping[str, object], key: str) -> None:
        self._ctx = ctx
        self._json = amounts_json(amounts, "reserve", empty=False)
        self.key = key
        self.step: int = ctx.step
        self.status = "new"
        self._actual: str | None = None
        self._model: str | None = None

    @property
    def replayed(self) -> bool:
        """True when an earlier attempt of this step settled this reservation."""
        return self.status == "replayed"

    def settle(self, *, model: str | None = None, **amounts: object) -> None:
        """Record the actual spend, charged when the block ends (the rest is returned);
        units not named are charged what was reserved. With ``model`` and
        ``tokens_in``/``tokens_out`` but no ``usd``, usd comes from the price table
        (``app.set_price``). Bad amounts: InvalidInput at once."""
        self._actual = amounts_json(amounts, "settle")
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidInput("settle(model=...) must be a non-empty str")
        self._model = model

    def _ident(self) -> tuple[Any, ...]:
        ctx = self._ctx
        if ctx._app is None or ctx._owner is None:
            raise RuntimeError("this RunContext is not attached to a worker")
        return (ctx.run_id, ctx.token, ctx._owner, self.step, self.key)

    async def __aenter__(self) -> Reservation:
        ident = self._ident()
        settles = self._ctx._take_settles()
        if settles is None:
            ans = await one(self._ctx._app, bq.RESERVE, (*ident, self._json))
        else:  # this step's earlier settlements first, in the same statement
            ans = await one(self._ctx._app, bq.RESERVE_SETTLING,
                            (*ident[:3], settles, *ident[3:], self._json))
        metrics.budget_reserved("replayed" if ans.status == "settled" else ans.status)
        if ans.status in ("reserved", "unbudgeted"):
            self.status = ans.status
            return self
        if ans.status == "settled":
            self.status = "replayed"
            return self
        budget = ans.budget_key or "?"
        if ans.status == "exhausted" and ans.policy == "park":
            raise BudgetExhausted(budget, ans.retry_in, ans.detail)
        exc = BudgetExceeded(f"budget {budget!r}: {ans.detail}")
        exc.budget = budget
        raise mark_terminal(exc)  # not retried (a workflow's step re-raises it)

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.status != "reserved":
            return
        ctx = self._ctx
        if et is None:
            # buffered: written with the step's checkpoint (or its next reservation), in
            # that transaction; until then the whole reservation stays held
            if ctx._settles is None:
                ctx._settles = []
            ctx._settles.append(settle_entry(ctx.run_id, ctx.token, self.step, self.key,
                                             self._actual or "{}", self._model))
            self.status = "settled"
            return
        with contextlib.suppress(LeaseLost):  # the run is not ours: its holds are dead
            await one(ctx._app, bq.RELEASE, self._ident())
        self.status = "released"

    def __enter__(self) -> Reservation:
        result: Reservation = self._ctx._call_sync(self.__aenter__())
        return result

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._ctx._call_sync(self.__aexit__(et, ev, tb))
