"""The dashboard's live updates: one subscription to the process's notifier,
fanned out to every browser tab.

:class:`Broadcaster` subscribes to the engine's channels (a finished step, a
run's end, a new event, a cancel, a wake-up) on the process's notifier for the
dashboard's DSN (:mod:`pgdurable.foundation.notifier`: one LISTEN connection,
shared with the workers, streams and result waiters of an app on the same
DSN in the same event loop) and puts each notification, as a small dict, on
the queue of every subscriber (one per open SSE stream). Tabs never poll the
database; the number of database connections does not grow with the number
of tabs. The subscription is made with the first tab and ended by
:meth:`Broadcaster.close` (the dashboard's shutdown): a tab moving to another
page reconnects its stream at once, and the LISTEN connection stays. A subscriber gets ``{"channel":
"reconnect"}`` ("refresh everything; every later event will reach you") as
soon as the notifier listens: when it subscribes, when the connection is
(re)made, and at each :data:`~pgdurable.foundation.presence.RECHECK` delay
after the notifier announced itself on the watch-only channels
(``pgdurable_steps``, ``pgdurable_done``: see :mod:`pgdurable.foundation.presence`;
a step or a run's end that raced the announcement is read then). A tab whose
queue is full (it stalled) gets a full refresh instead of what it missed:
the fan-out never waits for a tab.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from ...foundation.notifier import Notifier, Subscription, notifier_for

log = logging.getLogger("pgdurable.dashboard")

CHANNELS = ("pgdurable_steps", "pgdurable_done", "pgdurable_events", "pgdurable_cancel",
            "pgdurable_wake")
_QUEUE_SIZE = 256


class Broadcaster:
    """Fan-out of the notifier's notifications to many subscriber queues."""

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        self._dsn = dsn
        self._schema = schema
        self._subs: set[asyncio.Queue[dict[str, Any]]] = set()
        self._notifier: Notifier | None = None
        self._sub: Subscription | None = None
        self.ready = asyncio.Event()  # the notifier listened for it (tests)

    @property
    def connections(self) -> int:
        """LISTEN connections the notifier opened (tests: one per process)."""
        return 0 if self._notifier is None else self._notifier.connects

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        """A new subscriber queue (subscribes to the notifier if needed)."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_QUEUE_SIZE)
        self._subs.add(q)
        if self._sub is None:
            self._notifier = notifier_for(self._dsn, self._schema)  # the running loop's
            self._sub = self._notifier.subscribe(CHANNELS, self._notified, self._listening)
        elif self._sub.ready.is_set():
            # already listening: from now on this subscriber gets every event;
            # what happened before it subscribed, it must re-read (refresh)
            q.put_nowait({"channel": "reconnect"})
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        """Drop a subscriber queue. The subscription stays until :meth:`close`: a
        tab that moves to another page opens its next stream at once."""
        self._subs.discard(q)

    def _listening(self) -> None:
        self.ready.set()
        self._publish({"channel": "reconnect"})

    def _notified(self, n: psycopg.Notify) -> None:
        self._publish(_message(n.channel, n.payload))

    def _publish(self, message: dict[str, Any]) -> None:
        for q in list(self._subs):
            try:
                q.put_nowait(message)
            except asyncio.QueueFull:  # a stalled tab: it gets a full refresh instead
                with contextlib.suppress(asyncio.QueueEmpty):
                    while True:
                        q.get_nowait()
                q.put_nowait({"channel": "reconnect"})

    def reconnect(self) -> None:
        """The notifier's connection follows a Citus cell that moved (foundation/cells.py)."""
        if self._notifier is not None:
            self._notifier.reconnect()

    async def close(self) -> None:
        """End the subscription (every tab's)."""
        self._subs.clear()
        sub, self._sub = self._sub, None
        self.ready.clear()
        if sub is not None:
            await sub.close()


def _message(channel: str, payload: str) -> dict[str, Any]:
    name = channel.removeprefix("pgdurable_")
    if name == "steps":
        return {"channel": name, "runs": [p for p in payload.split(",") if p]}
    if name in ("done", "events", "cancel"):
        return {"channel": name, "runs": [payload]}
    return {"channel": name, "queue": payload}
