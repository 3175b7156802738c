"""Signals: argument validation and payload parsing shared by every sender.

A signal ``(kind, ref, payload)`` wakes the runs parked on ``Wait(signal=(kind,
ref))``; one that arrives before its run parks is kept (until its TTL) and
handed over when the run parks. The senders -- :meth:`pgdurable.Durable.signal`
and :meth:`~pgdurable.Durable.signal_run`, their sync twins on
:class:`pgdurable.DurableClient`, the webhook app (:mod:`pgdurable.ops.webhooks`),
the CLI (``pgdurable signal``) and the SQLAlchemy integration -- validate their
arguments here, before any SQL, and then call one SQL function of
``sql/0005_signals.sql`` (``send_signal`` / ``signal_run``).

Delivery rules (each one tested):

* **One transaction**: the signal row, the woken runs and the NOTIFY (once per
  queue) commit together.
* **Before park**: kept pending (default TTL one day), consumed by the next run
  that parks on ``(kind, ref)`` -- or, for :meth:`signal_run`, by that run when
  it parks on ``kind``. Never lost, never delivered twice.
* **Dedup** (``signal_id``): sending the same id again with the same kind, ref
  and payload changes nothing and returns the run ids the first send woke
  (empty if it was kept pending). The same id with other content raises
  :class:`~pgdurable.SignalConflict` and changes nothing. Dedup lasts as long as
  the signal row, in ``pgdurable.signals`` or, an hour after it was consumed, in
  the partitioned ``pgdurable.signal_history`` (docs/scaling.md): retention
  (``prune_runs``, or dropping a history partition) deletes a run's signals with
  the run, and expired pending ones; after that the same id counts as new.
* **Timeout race**: a signal and a wait's timeout racing yield exactly one
  outcome. If the timeout wins, the signal is not consumed: it stays pending
  until its TTL (``pgdurable.signals.consumed_at IS NULL``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from . import jsonb as _json
from .run_queries import check_name, check_run_id

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_SIGNAL_TTL",
    "MAX_SIGNAL_TTL",
    "parse_payload",
    "MAX_SIGNALS",
    "signal_params",
    "signal_run_params",
    "signals_params",
]

#: Largest signal payload accepted by default (bytes of compact JSON).
DEFAULT_MAX_PAYLOAD = 1024 * 1024
#: How long a signal that found no waiting run is kept for a later park.
DEFAULT_SIGNAL_TTL = timedelta(days=1)
#: The longest TTL accepted (about 1,000 years; ``None`` keeps a signal with no
#: expiry). ``now() + ttl`` must stay a timestamp that PostgreSQL can store.
MAX_SIGNAL_TTL = timedelta(days=365_000)
#: The most signals one ``signal_many`` sends (one statement and transaction).
MAX_SIGNALS = 10_000


def _check_common(
    payload: object, signal_id: object, ttl: object, max_bytes: int | None
) -> str:
    if signal_id is not None:
        check_name(signal_id, "signal_id")
    if ttl is not None:
        if not isinstance(ttl, timedelta):
            raise TypeError("ttl must be a timedelta or None")
        if ttl.total_seconds() <= 0:
            raise ValueError("ttl must be a positive timedelta (or None: no expiry)")
        if ttl > MAX_SIGNAL_TTL:
            raise ValueError(f"ttl must be at most {MAX_SIGNAL_TTL.days} days "
                             "(or None: no expiry)")
    try:
        return _json.dumps(payload, "payload", max_bytes=max_bytes)
    except RecursionError:  # json.dumps recurses per level of nesting
        raise ValueError("payload is nested too deeply") from None


def signal_params(
    kind: object,
    ref: object,
    payload: object,
    signal_id: object,
    ttl: object,
    max_bytes: int | None = DEFAULT_MAX_PAYLOAD,
) -> tuple[Any, ...]:
    """Validate a broadcast signal; return the parameters of ``run_queries.SIGNAL``.

    ``TypeError``/``ValueError`` (naming the argument) for an empty or non-str
    kind/ref/signal_id, a NUL, a non-JSON payload or one over ``max_bytes``.
    """
    check_name(kind, "signal kind")
    check_name(ref, "signal ref")
    text = _check_common(payload, signal_id, ttl, max_bytes)
    return (kind, ref, text, signal_id, ttl)


def signal_run_params(
    run_id: object,
    kind: object,
    payload: object,
    signal_id: object,
    ttl: object,
    max_bytes: int | None = DEFAULT_MAX_PAYLOAD,
) -> tuple[Any, ...]:
    """Validate a run-addressed signal; return the parameters of ``run_queries.SIGNAL_RUN``."""
    rid: uuid.UUID = check_run_id(run_id)
    check_name(kind, "signal kind")
    text = _check_common(payload, signal_id, ttl, max_bytes)
    return (rid, kind, text, signal_id, ttl)


def parse_payload(raw: str | bytes, max_bytes: int = DEFAULT_MAX_PAYLOAD) -> Any:
    """Parse a JSON payload given as text (CLI, webhook body).

    Empty (or all-whitespace) input is ``None``. Raises ``ValueError`` with a
    one-line reason for input over ``max_bytes``, invalid UTF-8, invalid JSON
    (also JSON nested deeper than Python's recursion limit), NaN/Infinity, a
    NUL character (which jsonb cannot store) or a lone surrogate (``"\\ud800"``).
    """
    size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise ValueError(f"payload is {size} bytes; the limit is {max_bytes}")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise ValueError("payload is not valid UTF-8") from None
    if not text.strip():
        return None

    def no_constant(name: str) -> Any:
        raise ValueError(f"payload is not valid JSON: {name} is not allowed")

    try:
        value = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"payload is not valid JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    except RecursionError:  # e.g. "[[[[...]]]]": json.loads recurses per level
        raise ValueError("payload is nested too deeply") from None
    _json.validate(value, "payload")  # also refuses lone surrogates, naming the path
    return value


def signals_params(
    signals: object,
    ttl: object,
    max_bytes: int | None = DEFAULT_MAX_PAYLOAD,
) -> tuple[Any, ...] | None:
    """Validate a batch of broadcast signals; return the parameters of
    ``queries.signals.SIGNALS`` (None for an empty batch).

    Each signal is a tuple ``(kind, ref)``, ``(kind, ref, payload)`` or ``(kind, ref,
    payload, signal_id)``, checked as :func:`signal_params` checks one; anything else is a
    ``TypeError``, more than :data:`MAX_SIGNALS` a ``ValueError``.
    """
    if isinstance(signals, str | bytes | dict) or not isinstance(signals, Iterable):
        raise TypeError("signals must be an iterable of (kind, ref[, payload[, signal_id]]) "
                        "tuples")
    kinds: list[Any] = []
    refs: list[Any] = []
    payloads: list[str] = []
    ids: list[Any] = []
    for i, item in enumerate(signals):
        if not isinstance(item, tuple) or not 2 <= len(item) <= 4:
            raise TypeError(f"signals[{i}] must be a (kind, ref[, payload[, signal_id]]) tuple")
        kind, ref, payload, signal_id = (*item, None, None)[:4]
        params = signal_params(kind, ref, payload, signal_id, ttl, max_bytes)
        kinds.append(params[0])
        refs.append(params[1])
        payloads.append(params[2])
        ids.append(params[3])
        if len(kinds) > MAX_SIGNALS:
            raise ValueError(f"signals: at most {MAX_SIGNALS} per call")
    if not kinds:
        return None
    return (kinds, refs, payloads, ids if any(x is not None for x in ids) else None, ttl)
