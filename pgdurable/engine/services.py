"""Plug-in services: the periodic duties a worker runs that the engine does not know.

The layer that builds a worker (``Durable.worker()`` in ``app/durable.py``) hands it
services: the schedule ticker (``runs/schedules.py``), the writing of the app's event
triggers (``runs/events.py``) and the registration of the task revisions it serves
(``runs/fork.py``) today. The engine imports none of them; it only calls the protocols
below (``tests/test_import_graph.py`` checks that it imports no ``runs.schedules``,
``runs.events`` or ``runs.fork``).

A :class:`Service` is started when the worker starts, in order, before its first claim
(a start that raises a transient database error is asked again for the app's
``open_timeout``; any other error stops the worker from starting), and stopped when it
stops, in reverse order, after its runs are settled (a stop is bounded by the service
and logs its own errors).

A :class:`LoopService` also rides on the claim loop, which costs it no query of its own
while the worker is idle: its :attr:`~LoopService.probe` (a SQL expression of one
parameter, the worker's queues, answering the seconds until it is next due, NULL for
never) is a column of the loop's idle query and its answer goes to
:meth:`~LoopService.note`; the loop sleeps no longer than :meth:`~LoopService.timeout`
allows and calls :meth:`~LoopService.on_wake` each time it wakes (the service does what
is due then, nothing otherwise).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["LoopService", "Service"]


@runtime_checkable
class Service(Protocol):
    """A duty started and stopped with the worker (see the module docstring)."""

    async def start(self, worker_id: str) -> None:
        """The worker ``worker_id`` starts (before its first claim)."""

    async def stop(self, worker_id: str) -> None:
        """The worker stops (its runs settled); bounded, errors logged."""


@runtime_checkable
class LoopService(Service, Protocol):
    """A service with a due time, served by the claim loop (see the module docstring)."""

    #: A SQL expression of one parameter (``%s::text[]``, the worker's queues) answering
    #: the seconds until the service is next due; None: it adds no column.
    probe: str | None

    def note(self, seconds: float | None) -> None:
        """The probe's answer (None: nothing due)."""

    def timeout(self, timeout: float) -> float:
        """The claim loop's sleep ``timeout``, shortened to the service's next due time."""

    async def on_wake(self) -> None:
        """The claim loop woke: do what is due now (no query when nothing is)."""
