"""The budget ledger (``sql/functions/budgets.sql``, ``sql/views/budgets.sql``):
named budgets, prices, the fenced reserve/settle/release of a step, the start
that attaches budgets, and what the command line shows."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from .core import Listing, Query, record, scalar, statement

__all__ = ["BUDGET_STARTED", "GAUGES", "PRICE_SET", "PRUNE_LEDGER", "RELEASE", "RESERVE",
           "RESERVE_SETTLING",
           "Reserved", "SET", "SETTLE", "SETTLE_PENDING", "USAGE", "Usage"]


@dataclass(frozen=True, slots=True)
class Reserved:
    """The answer of ``budget_reserve``: ``status`` (reserved, settled, unbudgeted,
    exhausted, too_large); for exhausted and too_large the budget, its policy, when
    capacity is expected back, in seconds from now on the database clock (None: only
    a raised limit helps) and how much."""

    status: str
    budget_key: str | None
    policy: str | None
    retry_in: float | None
    detail: str | None


# -- create or change a named budget (key, limits JSON, window kind, window length,
# -- policy) and wake the runs parked on it; PD000 on bad input
SET = statement(
    "SELECT pgdurable.budget_set(%s::text, %s::jsonb, %s::text, %s::interval, %s::text)"
)
# -- set a model's price (model, usd per input token, usd per output token)
PRICE_SET = statement("SELECT pgdurable.budget_price_set(%s::text, %s::numeric, %s::numeric)")
# -- fenced (run, token, owner): hold amounts (step, key, amounts JSON); answers Reserved
RESERVE: Query[Reserved] = record(
    "SELECT status, budget_key, policy, "
    "extract(epoch FROM retry_at - pgdurable.now())::float8, detail FROM pgdurable.budget_reserve("
    "%s::uuid, %s::bigint, %s::text, %s::integer, %s::text, %s::jsonb)", Reserved)
# -- fenced (run, token, owner): settle the step's buffered settlements (a JSON array of
# -- {run, token, step, rkey, amounts, model}), then hold amounts (step, key, amounts
# -- JSON), in one statement; answers Reserved
RESERVE_SETTLING: Query[Reserved] = record(
    "SELECT status, budget_key, policy, "
    "extract(epoch FROM retry_at - pgdurable.now())::float8, detail "
    "FROM pgdurable.budget_reserve_settling("
    "%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::integer, %s::text, %s::jsonb)", Reserved)
# -- fenced (run, token, owner): settle the step's buffered settlements (JSON array) now;
# -- answers how many
SETTLE_PENDING: Query[int] = scalar(
    "SELECT pgdurable.budget_settle_pending(%s::uuid, %s::bigint, %s::text, %s::jsonb)", int)
# -- fenced: charge the reservation (step, key) its actual amounts (model or NULL);
# -- answers 'settled' or 'none'
SETTLE: Query[str] = scalar(
    "SELECT pgdurable.budget_settle(%s::uuid, %s::bigint, %s::text, %s::integer, %s::text, "
    "%s::jsonb, %s::text)", str)
# -- fenced: give the reservation (step, key) back; answers how many holds went
RELEASE: Query[int] = scalar(
    "SELECT pgdurable.budget_release(%s::uuid, %s::bigint, %s::text, %s::integer, %s::text)",
    int)
# -- retention: delete up to n ledger rows of pruned runs that no window counts (their
# -- settlements folded into budget_ledger_pruned); how many went
PRUNE_LEDGER: Query[int] = scalar("SELECT pgdurable.budget_prune_ledger(%s::integer)", int)
# -- wraps a start statement (run_id, created): attach named budgets (keys) and the
# -- run's own (limits JSON or NULL) in the same statement; PD016 for an unknown key
BUDGET_STARTED = (
    "SELECT b.id, s.created FROM ({start}) AS s(run_id, created), "
    "LATERAL (SELECT pgdurable.budget_started_run(s.run_id, %s::text[], %s::jsonb) AS id) b"
)
# -- every budget and unit: limit, window, settled in the window, held (the CLI);
# -- runs' own budgets (run:<id>) only with the flag
USAGE = Listing("""
SELECT budget_key, unit, limit_amount, window_kind, window_length, policy, settled, held,
       limit_amount - settled - held AS available
  FROM pgdurable.budget_usage
 WHERE %s::boolean OR budget_key NOT LIKE 'run:%%'
 ORDER BY budget_key, unit
""")


@dataclass(frozen=True, slots=True)
class Usage:
    """One named budget's unit: its limit (None: not limited), settled in the window,
    held by live reservations."""

    budget_key: str
    unit: str
    limit_amount: Decimal | None
    settled: Decimal
    held: Decimal


# -- the named budgets' units for the Prometheus gauges (foundation/metrics.py)
GAUGES: Query[Usage] = record(
    "SELECT budget_key, unit, limit_amount, settled, held FROM pgdurable.budget_usage "
    "WHERE budget_key NOT LIKE 'run:%' ORDER BY budget_key, unit", Usage)
