"""Affinity: a run prefers (or waits for) the worker that holds its stateful service.

Some steps keep something alive in their worker process between steps: a
browser session, a shell, a sandbox, a warm model. The run's state can be
checkpointed; the service cannot. A step that built one pins its run to its
worker::

    browser = BROWSERS.get(ctx.run_id)
    if browser is None:                      # first step, or the holder is gone
        browser = await open_browser(state.get("url"))
        BROWSERS[ctx.run_id] = browser
        await ctx.pin("soft", info={"service": "browser"})

From then on the run's next claims go to that worker while it is present.
Whenever the run is ready (made runnable by a signal, a retry, the end of a
lease window; or its timer is due) only its holder may claim it for ``wait``
seconds after that moment -- the run is *reserved* for it:

* ``"soft"`` -- ``wait`` is a preference window (default :data:`SOFT_WAIT`,
  5 s): a holder that is alive but busy (no free slot) does not starve the
  run; after the window any worker of its queue claims it;
* ``"hard"`` -- ``wait`` is a timeout (default :data:`HARD_WAIT`, 300 s): the
  run waits that long for its holder, then any worker claims it.

A holder that stops cleanly frees its reservations at once; one that is
killed is known gone when its presence lapses, at most its lease TTL after
its last heartbeat tick (the moment its leases expire too). Liveness is the
database's (``pgdurable.worker_presence``, renewed by the worker while it
holds pins), never a client's clock. A run whose lease expired is recovered
by anyone, as always.

A run claimed elsewhere keeps its affinity until its step decides:
``ctx.service_lost`` is true (the service named by ``ctx.affinity`` is in
another process, or in none), the step rebuilds it (from what the state
recorded) and pins again, now to its own worker; or it calls
``ctx.unpin()``. A restarted worker is a new process *instance* even under
the same worker id: its runs see ``service_lost`` too. The affinity of a
finished run stays as the record of its last holder.

``app.start(..., affinity_of=run_id)`` (and ``ctx.start_child(...,
affinity_of=...)``) starts a run with the affinity another run has now: a
follow-up on the same sandbox. The SQL is ``sql/functions/affinity.sql`` (its
statements: :mod:`pgdurable.foundation.queries.affinity`).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from . import jsonb as _json
from .queries import affinity as _q

__all__ = [
    "HARD_WAIT",
    "MAX_INFO_BYTES",
    "MAX_WAIT",
    "SOFT_WAIT",
    "Affinity",
    "Mode",
    "new_instance",
    "parse_affinity",
    "pin_params",
    "same_pin",
]

Mode = Literal["soft", "hard"]
MODES: tuple[Mode, ...] = ("soft", "hard")

#: Default preference window of a soft pin (seconds): how long a ready run
#: waits for its busy holder before any worker of its queue may take it.
SOFT_WAIT = 5.0
#: Default timeout of a hard pin (seconds).
HARD_WAIT = 300.0
#: The longest wait a pin accepts (one day, in seconds).
MAX_WAIT = 86_400.0
#: The largest ``info`` object (bytes of JSON).
MAX_INFO_BYTES = 8192

#: The SQL the engine sends (it reads the answers itself until its branch of issue 39
#: lands): :mod:`pgdurable.foundation.queries.affinity`.
PIN = _q.PIN.sql
PRESENT = _q.PRESENT.sql
STARTED = _q.STARTED.sql
ABSENT = _q.ABSENT.sql


@dataclass(frozen=True)
class Affinity:
    """A run's affinity to the worker process that holds its service.

    ``worker`` (the holder's worker id) and ``instance`` (its process
    instance: a restart under the same id is another), ``mode`` (``"soft"``
    or ``"hard"``), ``wait`` (seconds a ready run is reserved for the holder),
    ``info`` (the JSON object given to :meth:`~pgdurable.RunContext.pin`, or
    ``None``), ``since`` (when it was pinned).
    """

    worker: str
    instance: str
    mode: Mode
    wait: float
    info: dict[str, Any] | None = None
    since: datetime | None = None

    def held_by(self, worker: str | None, instance: str | None) -> bool:
        """Whether this process (``worker``, ``instance``) holds the service."""
        return self.worker == worker and self.instance == instance


def parse_affinity(value: Any) -> Affinity | None:
    """The :class:`Affinity` of a ``pin_run``/claim record (a JSON object), or None."""
    if value is None:
        return None
    since = value.get("since")
    return Affinity(
        worker=str(value["worker"]), instance=str(value["instance"]), mode=value["mode"],
        wait=float(value["wait"]), info=value.get("info"),
        since=datetime.fromisoformat(since) if isinstance(since, str) else since,
    )


def pin_params(mode: object, wait: object, info: object) -> tuple[str, timedelta, str | None]:
    """Validate :meth:`~pgdurable.RunContext.pin` arguments: (mode, wait, info JSON).

    ``wait`` None takes the mode's default; else a timedelta or seconds in
    (0, :data:`MAX_WAIT`]. ``info`` None or a dict (JSON, at most
    :data:`MAX_INFO_BYTES`). TypeError/ValueError otherwise."""
    if mode not in MODES:
        raise ValueError(f"affinity mode must be 'soft' or 'hard', not {mode!r}")
    if wait is None:
        secs = SOFT_WAIT if mode == "soft" else HARD_WAIT
    elif isinstance(wait, timedelta):
        secs = wait.total_seconds()
    elif isinstance(wait, int | float) and not isinstance(wait, bool):
        secs = float(wait)
    else:
        raise TypeError(f"affinity wait must be a timedelta or seconds, not {type(wait).__name__}")
    if not math.isfinite(secs) or not 0 < secs <= MAX_WAIT:
        raise ValueError(f"affinity wait must be more than 0 and at most {MAX_WAIT:g} s, "
                         f"not {wait!r}")
    info_json: str | None = None
    if info is not None:
        if not isinstance(info, dict):
            raise TypeError(f"affinity info must be a dict or None, not {type(info).__name__}")
        info_json = _json.dumps(info, "affinity info")
        if len(info_json.encode()) > MAX_INFO_BYTES:
            raise ValueError(f"affinity info is larger than {MAX_INFO_BYTES} bytes of JSON")
    return str(mode), timedelta(seconds=secs), info_json


def same_pin(current: Affinity | None, worker: str | None, instance: str | None, mode: str,
             wait: timedelta, info_json: str | None) -> bool:
    """Whether pinning again with these values would change nothing (no write needed)."""
    if current is None or not current.held_by(worker, instance):
        return False
    info = None if info_json is None else _json.loads(info_json)
    return (current.mode == mode and math.isclose(current.wait, wait.total_seconds())
            and current.info == info)


def new_instance() -> str:
    """A fresh process-instance id for a worker (random)."""
    return uuid.uuid4().hex
