"""Signals and waits (``sql/functions/signals.sql``): send a signal (to a wait, or to one
run), and park a run until a signal or a timer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .core import Query, Row, scalar

__all__ = ["PARK", "SIGNAL", "SIGNALS", "SIGNAL_RUN", "Parked", "Woken"]


@dataclass(frozen=True, slots=True)
class Parked:
    """A park's answer: the resulting status, and the wake time with the seconds until
    it on the database's clock (both None without a timer)."""

    status: str
    wake_at: datetime | None
    wake_in: float | None


def _parked(r: Row) -> Parked:
    status, wake_at, wake_in = r
    return Parked(status, wake_at, None if wake_in is None else float(wake_in))


# -- send a signal (dedup by signal_id, PD008 on conflict): the ids of the runs it woke,
# -- one per row (none: kept pending)
SIGNAL = scalar(
    "SELECT pgdurable.send_signal(%s::text, %s::text, %s::jsonb, %s::text, %s::interval)", str)
@dataclass(frozen=True, slots=True)
class Woken:
    """A run that a batch of signals woke: the signal's 0-based position in the batch, and
    the run's id."""

    index: int
    run_id: str


def _woken(r: Row) -> Woken:
    n, run_id = r
    return Woken(int(n) - 1, str(run_id))


# -- send many signals in one statement and transaction (each as send_signal; one NOTIFY
# -- per queue): a Woken per run woken
SIGNALS = Query(
    "SELECT n, run_id FROM pgdurable.send_signals(%s::text[], %s::text[], %s::text[]::jsonb[], "
    "%s::text[], %s::interval)", _woken)
# -- signal one run (PD002 if unknown): its id if it woke, no row if the signal is kept
# -- pending for it
SIGNAL_RUN = scalar(
    "SELECT pgdurable.signal_run(%s::uuid, %s::text, %s::jsonb, %s::text, %s::interval)", str)
# -- fenced: park the run (id, token, owner, state, spend, kind, ref, wake_at, wake_in)
# -- until a signal (kind, ref) or a timer; a Parked
PARK = Query(
    "SELECT status, wake_at, extract(epoch FROM wake_at - pgdurable.now())::float8 "
    "FROM pgdurable.park_run(%s::uuid, %s::bigint, %s::text, %s::jsonb, %s::numeric, "
    "%s::text, %s::text, %s::timestamptz, %s::interval)", _parked)
